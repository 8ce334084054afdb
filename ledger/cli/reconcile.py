"""``ledger reconcile ...``: unknown outcomes: list them, read them back now, dispose of them.

A disposition waits (by default) for the processor's decision and says what
it was, as every publishing command does (:mod:`ledger.cli.ops`).
"""

from __future__ import annotations

import json

import click

from consumers import reader
from consumers.reconciler import open_items
from consumers.reverify import run_pass
from ledger.cli.common import (
    EXIT_UNKNOWN_OPERATION,
    EXIT_WORK_OPEN,
    current_settings,
    echo_json,
    fail,
    reader_ready,
)
from ledger.cli.inputs import WAIT_OPTION, report_decision
from ledger.cli.inputs import in_grammar as _in_grammar
from ledger.cli.inputs import non_blank as _non_blank
from ledger.cli.inputs import publisher as _publisher
from ledger.cli.inputs import ready as _ready
from ledger.cli.reconcile_text import run_lines
from ledger.clock import age_s, clock_for
from producers.publisher import build_disposition


@click.group("reconcile")
def reconcile_group() -> None:
    """Unknown outcomes: list them, retry readback, record attributable dispositions."""


@reconcile_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the open items as JSON.")
def reconcile_list(as_json: bool) -> None:
    """Show the operations held in UNKNOWN_OUTCOME: age, sink, last observation.

    Ages are on the ledger clock (LEDGER_CLOCK), the clock the stages record
    observations with, and never negative. With --json: {"clock", "now_ms",
    "items": [{"operation_id", "sink", "action", "version", "age_s",
    "observed_at_ms", "observation_status", "observation_source", "reason"}]}.
    """
    settings = current_settings()
    reader_ready(settings)  # reads only: creates no key
    now = clock_for(settings.clock, settings.run_dir).now_ms()
    items = open_items(settings)
    rows = [
        {
            "operation_id": st.operation_id,
            "sink": st.sink,
            "action": st.action,
            "version": st.version,
            "age_s": age_s(now, st.observed_at_ms),
            "observed_at_ms": st.observed_at_ms,
            "observation_status": st.observation_status,
            "observation_source": st.observation_source,
            "reason": st.reason,
        }
        for st in items
    ]
    if as_json:
        echo_json({"clock": settings.clock, "now_ms": now, "items": rows})
        return
    if not rows:
        click.echo("no unknown outcomes open")
        return
    click.echo("OPERATION\tSINK\tAGE_S\tLAST OBSERVATION")
    for row in rows:
        age = "-" if row["age_s"] is None else f"{row['age_s']:g}"
        click.echo(
            f"{row['operation_id']}\t{row['sink']}\t{age}\t"
            f"{row['observation_status']} via {row['observation_source']}"
        )


@reconcile_group.command("run")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print the readbacks and verifications recorded as JSON: [{"operation_id", "sink", '
    '"observed", "detail"}], a verification with "kind": "POSTCONDITION".',
)
def reconcile_run(as_json: bool) -> None:
    """Drain the reconciliation queue once.

    Drain the reconciliation queue once: read back every open unknown outcome
    whose sink offers readback, verify again every stranded EFFECT_COMMITTED
    operation (a postcondition query, never the effect's request), and record
    each observation in the ledger.

    Exits 0 only when nothing it owns is left open; exits 8 while an unknown
    outcome stays unknown after its readback, or an operation is stranded
    (LEDGER_STRANDED_*_S: in flight without a live owner, committed without
    its verification, not admitted without a decision, held behind a refused
    record, an intent the processor has not consumed), each named on stderr
    with its remedy; so a scheduled run alarms.
    Standard output has a line per readback or verification recorded, then
    one saying what is left open (--json: the rows as JSON).
    """
    settings = current_settings()
    # run_pass checks the topics itself, waiting for a broker that is away
    results, left = run_pass(settings, say=lambda text: click.echo(text, err=True))
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        click.echo("\n".join(run_lines(results, left)))
    if left:
        fail(
            f"{len(left)} operation(s) left open: {', '.join(left[:20])}; the lines above say "
            "why. One whose sink did not answer stays held: run 'ledger reconcile run' again "
            "once the sink answers, or, after checking the sink yourself, decide it with "
            "'ledger reconcile dispose OP --decision committed|absent|abandon'; a stranded "
            "one names its remedy in 'ledger audit'",
            EXIT_WORK_OPEN,
        )


@reconcile_group.command("dispose")
@click.argument("operation_id", callback=_in_grammar)
@click.option(
    "--decision",
    type=click.Choice(["committed", "absent", "abandon"], case_sensitive=False),
    required=True,
    help="committed: the effect happened; absent: it did not (the same admitted operation "
    "is executed again); abandon: give the operation up.",
)
@click.option(
    "--by",
    required=True,
    callback=_non_blank,
    help="Operator who decides; signs with their key (ledger operator add).",
)
@click.option("--evidence", required=True, callback=_non_blank, help="What the decision rests on.")
@WAIT_OPTION
def reconcile_dispose(
    operation_id: str, decision: str, by: str, evidence: str, wait_s: float
) -> None:
    """Record an attributable disposition of an unknown outcome.

    The operation must be in the ledger (exit 5 otherwise, nothing published);
    the processor refuses a disposition of an operation that is not in
    UNKNOWN_OUTCOME (exit 1 with --wait-s). The disposition names the
    unknown-outcome episode the operation is in now (read from its state):
    it is applied only in that episode, never in a later one.
    """
    settings = current_settings()
    _ready(settings)
    state = reader.current_states(settings).get(operation_id)
    if state is None:
        fail(
            f"no operation {operation_id!r} in the ledger (topic prefix "
            f"{settings.topic_prefix!r}); nothing was published",
            EXIT_UNKNOWN_OPERATION,
        )
    pub = _publisher(settings)
    try:
        now = clock_for(settings.clock, settings.run_dir).now_ms()
        # The disposition answers the episode the operation is in now; in a
        # later one (a copy appended again) the processor ignores it.
        pub.publish_disposition(
            build_disposition(
                operation_id, decision, by, evidence, now, episode=state.entered_version
            )
        )
        position = pub.last_position
    finally:
        pub.close()
    if wait_s > 0 and position is not None:
        report_decision(settings, position, wait_s)


#: The reconciliation commands, in the order ``ledger --help`` lists them.
COMMANDS: tuple[click.Command, ...] = (reconcile_group,)
