"""Operators' and auditors' commands: intents, forks, claims, state, policy,
reconciliation, audit and the ledger clock (approvals are :mod:`ledger.cli.approvals`).

Commands that publish wait (by default) for the processor's decision and say
what it was, since the ledger decides asynchronously.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ledger.cli.approvals import approve_cmd, revoke_cmd
from ledger.cli.common import (
    EXIT_ENDED_ELSEWHERE,
    EXIT_ERROR,
    EXIT_TIMEOUT,
    EXIT_UNKNOWN_OPERATION,
    EXIT_WORK_OPEN,
    OTHER_LEDGER_HINT,
    current_settings,
    echo_json,
    fail,
    instant_text,
    reader_ready,
)
from ledger.cli.inputs import POLICY_VERSION
from ledger.cli.inputs import in_grammar as _in_grammar
from ledger.cli.inputs import non_blank as _non_blank
from ledger.cli.inputs import publisher as _publisher
from ledger.cli.inputs import ready as _ready
from ledger.settings import LedgerSettings


def _report_decision(
    settings: LedgerSettings, position: tuple[str, int, int], wait_s: float
) -> None:
    """Print the processor's journaled decision on an input.

    Exits :data:`~ledger.cli.common.EXIT_ERROR` when it refused the input,
    :data:`~ledger.cli.common.EXIT_TIMEOUT` when no decision came in time.
    """
    from consumers.reader import wait_for_decision
    from ledger.history import journal_move

    topic, partition, offset = position
    entry = wait_for_decision(settings, topic, partition, offset, wait_s)
    if entry is None:
        click.echo(
            f"no decision within {wait_s:g} s: is the processor running ('ledger processor')?",
            err=True,
        )
        sys.exit(EXIT_TIMEOUT)
    click.echo(f"{entry.outcome}: {entry.operation_id} {journal_move(entry)} ({entry.reason})")
    if entry.outcome == "REFUSED":
        sys.exit(EXIT_ERROR)


def _outcome_watch(settings: LedgerSettings, operation_id: str) -> Any:
    """A watch on the operation's outcomes, opened before its intent is published.

    ``None`` on a host without the outcome public key (the decision is then
    read from the journal, which needs the stages' key and read rights).
    """
    from producers.outcomes import OutcomeReader

    if not settings.outcome_public_path().exists():
        return None
    return OutcomeReader(settings).watch(operation_id)


def _report_answer(watch: Any, position: tuple[str, int, int], wait_s: float) -> None:
    """Print the processor's answer to an intent from the signed outcome channel.

    Prints ``KIND: OPERATION STATE (reason)``. Exits
    :data:`~ledger.cli.common.EXIT_ERROR` when the intent was refused (the
    remedy on the next line), :data:`~ledger.cli.common.EXIT_TIMEOUT` when
    no answer came in time.
    """
    _, partition, offset = position
    waited = watch.wait(wait_s, answer_to=(partition, offset), answer_only=True)
    found = waited.outcome
    if found is None:
        click.echo(
            f"no answer within {wait_s:g} s: is the processor running ('ledger processor')? "
            "The intent may still be decided: publish it again to find out (always safe)",
            err=True,
        )
        sys.exit(EXIT_TIMEOUT)
    click.echo(f"{found.kind}: {found.operation_id} {found.state or '-'} ({found.reason})")
    if found.kind == "REFUSED":
        click.echo(f"{found.refusal_kind}: {found.remedy}", err=True)
        sys.exit(EXIT_ERROR)


def _states_option(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> frozenset[str] | None:
    """``--until STATE[,STATE]``: the recovery states named (case-insensitive)."""
    from producers.waiting import parse_states

    if value is None:
        return None
    try:
        return frozenset(str(s) for s in parse_states(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _wait_until(pub: Any, operation_id: str, until: frozenset[str], timeout_s: float) -> None:
    """Wait for ``--until``; print the state reached, or exit with the documented code.

    Prints ``STATE: OPERATION (reason)``. Exits
    :data:`~ledger.cli.common.EXIT_ENDED_ELSEWHERE` when the operation rests
    in another state, :data:`~ledger.cli.common.EXIT_TIMEOUT` when none of
    the states came within ``timeout_s`` seconds.
    """
    from ledger.errors import OperationEndedElsewhereError, WaitTimeoutError

    try:
        st = pub.wait_for(operation_id, until, timeout_s)
    except OperationEndedElsewhereError as exc:
        fail(exc.message, EXIT_ENDED_ELSEWHERE)
    except WaitTimeoutError as exc:
        fail(exc.message, EXIT_TIMEOUT)
    click.echo(f"{st.state}: {operation_id} ({st.reason})")


_WAIT = click.option(
    "--wait-s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="How long to wait for the processor's decision; 0 publishes without waiting.",
)


# ---------------------------------------------------------------------- intents


@click.group("intent")
def intent_group() -> None:
    """Publish intents (what services do through producers.LedgerPublisher)."""


@intent_group.command("publish")
@click.option(
    "--operation-id",
    required=True,
    callback=_in_grammar,
    help="Stable operation ID, e.g. refund:1842:v3.",
)
@click.option("--sink", required=True, help="Sink name, as registered in the sink registry.")
@click.option("--action", required=True, help="Action, e.g. refund.")
@click.option(
    "--params",
    "params_json",
    required=True,
    help='JSON object, e.g. \'{"account":"a","amount_minor":5000,"currency":"GBP"}\'.',
)
@click.option("--actor", required=True, help="Requesting actor (service or person).")
@click.option("--subject", required=True, help="Represented subject, e.g. the customer.")
@click.option("--purpose", required=True, help="Declared purpose.")
@click.option(
    "--decision-version",
    type=click.IntRange(min=0),
    required=True,
    help="Version of the decision behind the operation (part of its identity, e.g. the v3 in "
    "refund:1842:v3).",
)
@click.option("--approval-id", default=None, help="Approval to admit the operation with.")
@click.option(
    "--compensates",
    default=None,
    metavar="OPERATION_ID",
    help="The settled operation this one compensates: a new operation with its own ID and "
    "approval, linked to it. Refused (ABANDONED) for an irreversible or unsettled original or "
    "a sink whose contract is not compensable.",
)
@_WAIT
@click.option(
    "--until",
    default=None,
    metavar="STATE[,STATE]",
    callback=_states_option,
    help="After the decision, wait until the operation is in one of these recovery states "
    "(e.g. OUTCOME_VERIFIED) and print it; exit 4 if it rests in another one "
    "(NEEDS_REAUTHORISATION, ABANDONED, UNKNOWN_OUTCOME ...), 3 if --timeout passes first.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="With --until: how long to wait for one of its states, in seconds.",
)
def intent_publish(
    operation_id: str,
    sink: str,
    action: str,
    params_json: str,
    actor: str,
    subject: str,
    purpose: str,
    decision_version: int,
    approval_id: str | None,
    compensates: str | None,
    wait_s: float,
    until: frozenset[str] | None,
    timeout_s: float,
) -> None:
    """Publish one intent and print the processor's answer to it.

    Prints the operation ID and its parameter digest, then waits for the
    processor's answer on the signed outcome channel (a host with the
    outcome public key, LEDGER_OUTCOME_PUBLIC_KEY_FILE: no secret and no
    internal topic needed): 'KIND: OPERATION STATE (reason)', e.g. 'PENDING:
    ... NOT_ADMITTED (intent recorded)', 'VERIFIED: ...' for a settled
    operation published again, or 'REFUSED: ...' (an unknown sink, parameter
    drift) with its remedy and exit status 1. Without that key it reads the
    processor's decision from the journal ('APPLIED' or 'REFUSED'). With --until, then
    waits for the operation to reach one of those states and prints
    'STATE: OPERATION (reason)'; exit status 4 when it rests in another
    state, 3 when --timeout passes first (see 'ledger --help' for every code).

    \b
    Example:
      ledger intent publish --operation-id refund:1842:v3 --sink payments \\
        --action refund --params '{"account":"a","amount_minor":5000}' \\
        --actor svc --subject customer-1842 --purpose remediation \\
        --decision-version 3 --approval-id review-1842 --until OUTCOME_VERIFIED
    """
    from ledger.errors import LedgerError
    from ledger.identity import amount_of
    from sinks.registry import load_sinks

    try:
        params = json.loads(params_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--params") from exc
    if not isinstance(params, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--params")
    # A value of the wrong form is bad input (exit 2), said before Kafka is asked
    # (the operation ID's grammar is checked as the option is parsed: _in_grammar).
    try:
        amount_of(params)
    except LedgerError as exc:
        raise click.BadParameter(exc.message, param_hint="--params") from exc
    settings = current_settings()
    _ready(settings)
    if sink not in load_sinks(settings.sinks_path()):
        click.echo(
            f"warning: sink {sink!r} is not in {settings.sinks_path()}; the processor will "
            "refuse the intent before admission (the approval stays unused): register the sink "
            "('ledger sink serve') or correct the name, then publish again",
            err=True,
        )
    pub = _publisher(settings)
    watch = _outcome_watch(settings, operation_id) if wait_s > 0 else None
    try:
        result = pub.publish(
            operation_id=operation_id,
            sink=sink,
            action=action,
            params=params,
            actor=actor,
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
            approval_id=approval_id,
            compensates=compensates,
        )
        position = pub.last_position
        click.echo(json.dumps(result.__dict__))
        if wait_s > 0 and position is not None:
            if watch is not None:
                _report_answer(watch, position, wait_s)
            else:
                _report_decision(settings, position, wait_s)
        if until is not None:
            _wait_until(pub, operation_id, until, timeout_s)
    finally:
        if watch is not None:
            watch.close()
        pub.close()


@click.command("fork")
@click.argument("operation_id")
@click.option(
    "--new-operation-id",
    required=True,
    callback=_non_blank,
    help="The fork's own operation ID (must not exist in the ledger).",
)
@click.option(
    "--approval-id",
    default=None,
    help="The fork's own approval (none is inherited; without one it waits for reauthorisation).",
)
@click.option(
    "--params",
    "params_json",
    default=None,
    help="The fork's parameters as a JSON object (default: the original's).",
)
@click.option(
    "--decision-version",
    type=click.IntRange(min=0),
    default=None,
    help="The fork's decision version (default: the original's).",
)
@click.option("--actor", default=None, help="Who forks (default: the original's actor).")
@_WAIT
def fork_cmd(
    operation_id: str,
    new_operation_id: str,
    approval_id: str | None,
    params_json: str | None,
    decision_version: int | None,
    actor: str | None,
    wait_s: float,
) -> None:
    """Fork OPERATION_ID: a new operation, linked to it, exploring another branch.

    The fork has its own operation ID, approval, admission and effects: it
    inherits no admission (an approval the original consumed is refused) and
    no claim over the original's effects, and the original's state is not
    touched. Its intent names the original (forked_from); 'ledger history'
    shows the link both ways. Prints the fork's ID and digest, then the
    processor's decision. An unknown OPERATION_ID exits 5; a new ID that
    already exists exits 1. --params replaces the parameters as a whole (give
    every field). A fork forked without --approval-id waits in
    NEEDS_REAUTHORISATION: admit it as any such operation, by publishing its
    intent again with a fresh approval ('ledger intent publish' with the
    fork's ID, the same parameters and --approval-id); forking again onto
    the same ID is refused.

    \b
    Example:
      ledger fork refund:1842:v3 --new-operation-id refund:1842:v3-fork1 \\
        --approval-id review-1842-fork
    """
    from consumers.reader import current_states

    params: dict[str, Any] | None = None
    if params_json is not None:
        try:
            params = json.loads(params_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--params") from exc
        if not isinstance(params, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--params")
    settings = current_settings()
    _ready(settings)
    states = current_states(settings)
    original = states.get(operation_id)
    if original is None:
        fail(
            f"no operation {operation_id!r} in the ledger: only a recorded operation can be "
            "forked ('ledger state' lists them)",
            EXIT_UNKNOWN_OPERATION,
        )
    if new_operation_id in states:
        fail(
            f"operation {new_operation_id!r} already exists in the ledger: a fork of "
            f"{operation_id} needs a new operation ID",
            EXIT_ERROR,
        )
    pub = _publisher(settings)
    try:
        result = pub.fork(
            original,
            new_operation_id,
            existing=states,
            approval_id=approval_id,
            params=params,
            decision_version=decision_version,
            actor=actor,
        )
        position = pub.last_position
        click.echo(json.dumps({**result.__dict__, "forked_from": operation_id}))
        if wait_s > 0 and position is not None:
            _report_decision(settings, position, wait_s)
    finally:
        pub.close()


# ---------------------------------------------------------------------- authority


@click.group("policy")
def policy_group() -> None:
    """The policy version in force (approvals under older versions admit nothing new)."""


@policy_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def policy_show(as_json: bool) -> None:
    """Show the policy version in force, who set it and since when.

    Read from the ledger's policy topic as the authority kernel reads it
    (authentic changes, the latest by effective time); with none published,
    the configured LEDGER_POLICY_VERSION is in force.
    """
    from consumers.reader import policy_in_force
    from ledger.clock import clock_for

    settings = current_settings()
    _ready(settings)
    in_force = policy_in_force(settings)
    now = clock_for(settings.clock, settings.run_dir).now_ms()
    if as_json:
        shown = (
            {"version": settings.policy_version, "set_by": None, "effective_at_ms": None}
            if in_force is None
            else in_force.model_dump(include={"version", "set_by", "effective_at_ms"})
        )
        echo_json(shown)
    elif in_force is None:
        click.echo(
            f"policy {settings.policy_version} in force "
            "(LEDGER_POLICY_VERSION; no change published)"
        )
    else:
        click.echo(
            f"policy {in_force.version} in force, set by {in_force.set_by} at "
            + instant_text(in_force.effective_at_ms, now)
            + " on the ledger clock"
        )
    from ledger.cli.stages import held_on_this_host

    for stage, (_, sample) in sorted(held_on_this_host(settings).items()):
        held = sample.get(POLICY_HOLD)
        if held is not None:
            version = settings.policy_version if in_force is None else in_force.version
            click.echo(
                f"HELD: {stage} holds every admission on a policy record it cannot verify "
                f"({held}); restore the keys it was sealed with, or set the policy again "
                f"with a trusted key: ledger policy set {version + 1} --by OPERATOR",
                err=True,
            )
            raise click.exceptions.Exit(EXIT_ERROR)


#: The key under which the authority kernel's status file names a held policy.
POLICY_HOLD = "(policy: every approval)"


@policy_group.command("set")
@click.argument("version", type=POLICY_VERSION)
@click.option(
    "--by",
    required=True,
    callback=_non_blank,
    help="Operator who changes it; signs with their key (ledger operator add).",
)
def policy_set(version: int, by: str) -> None:
    """Publish VERSION (1 or more) as the policy in force.

    Approvals granted under any other version admit nothing new from then on.
    Setting an earlier version again is a new change. Changes take effect in
    order of their effective time (now, or just after the change in force),
    so a copy of an old change appended to the topic changes nothing.
    """
    from consumers.reader import policy_effective_at
    from ledger.clock import clock_for

    settings = current_settings()
    _ready(settings)
    now_ms = clock_for(settings.clock, settings.run_dir).now_ms()
    effective_at_ms, in_force = policy_effective_at(settings, now_ms)
    if in_force is not None and effective_at_ms != now_ms:
        click.echo(
            f"note: policy {in_force.version} in force since {in_force.effective_at_ms} ms, "
            f"not before this clock's {now_ms} ms; this change takes effect at "
            f"{effective_at_ms} ms",
            err=True,
        )
    pub = _publisher(settings)
    try:
        pub.publish_policy(version, by, effective_at_ms)
    finally:
        pub.close()
    click.echo(f"policy {version} in force")


# ---------------------------------------------------------------------- state and claims


@click.command("state")
@click.argument("operation_id", required=False, callback=_in_grammar)
@click.option(
    "--json", "as_json", is_flag=True, help="Print every operation as JSON (one is always JSON)."
)
def state_cmd(operation_id: str | None, as_json: bool) -> None:
    """Show the recovery state of one operation (JSON), or a table of all.

    Columns: operation ID, recovery state, state version (what a claim must
    name), fencing epoch, and the reason of the latest transition. With
    --json: {"topic_prefix", "operations": [state, ...]}, each state as
    OPERATION alone prints it. An operation not in the ledger exits 5, saying
    'not yet processed' when its intent waits for the processor.
    """
    from consumers.reader import current_states, read_latest

    settings = current_settings()
    reader_ready(settings)  # reads only: creates no key
    states = current_states(settings)
    if not states:
        _no_authentic_state(settings)
    if operation_id is not None:
        st = states.get(operation_id)
        if st is None and operation_id in read_latest(settings, "state", authentic=False):
            fail(
                f"operation {operation_id!r} is in the ledger, but its state record cannot be "
                "verified with the keys here (LEDGER_KEYS_DIR): it is held, not absent. Restore "
                "the keys folder the ledger's records were sealed with; `ledger audit` lists "
                "what it cannot verify",
                EXIT_ERROR,
            )
        if st is None:
            from consumers.unconsumed import awaiting_processor

            if awaiting_processor(settings, operation_id):
                fail(
                    f"operation {operation_id!r}: not yet processed (the processor has not "
                    "consumed its intent, which is on the intents topic; is the processor "
                    "running? `ledger status`)",
                    EXIT_UNKNOWN_OPERATION,
                )
            fail(
                f"no operation {operation_id!r} in the ledger (topic prefix "
                f"{settings.topic_prefix!r}); an intent refused before admission (an unknown "
                f"sink) leaves no state: `ledger history {operation_id}` shows what happened",
                EXIT_UNKNOWN_OPERATION,
            )
        echo_json(st.model_dump(mode="json"))
        return
    if as_json:
        echo_json(
            {
                "topic_prefix": settings.topic_prefix,
                "operations": [st.model_dump(mode="json") for _, st in sorted(states.items())],
            }
        )
        return
    if not states:
        click.echo(
            f"no operations in the ledger (topic prefix {settings.topic_prefix!r}: its topics "
            f"exist and hold no operation); {OTHER_LEDGER_HINT}"
        )
        return
    click.echo("OPERATION\tSTATE\tVERSION\tEPOCH\tREASON")
    for op, st in sorted(states.items()):
        click.echo(f"{op}\t{st.state}\t{st.version}\t{st.epoch}\t{st.reason}")


def _no_authentic_state(settings: LedgerSettings) -> None:
    """Fail (exit 1) when the state topic holds records but none was authentic.

    That is a run folder whose keys did not seal this ledger (another run's,
    or a new one): every record is refused, and the ledger would look empty.
    """
    from ledger.credentials import keys_dir
    from ledger.topics import non_empty_topics

    if non_empty_topics(settings, ["state"]):
        fail(
            f"{settings.topic('state')} holds records but none is sealed by a key in "
            f"{keys_dir(settings)}, so every one is refused as unauthenticated: LEDGER_RUN_DIR "
            "(or LEDGER_KEYS_DIR) names another run folder than the stages that wrote the "
            f"ledger with topic prefix {settings.topic_prefix!r} used (`ledger audit` lists the "
            f"refused records); {OTHER_LEDGER_HINT}",
            EXIT_ERROR,
        )


@click.command("claim")
@click.argument("operation_id", callback=_in_grammar)
@click.option(
    "--worker", required=True, callback=_non_blank, help="Who claims ownership of the resume."
)
@click.option(
    "--expected-version",
    default="current",
    show_default=True,
    help="State version the claimant read ('current' reads it now).",
)
@_WAIT
def claim_cmd(operation_id: str, worker: str, expected_version: str, wait_s: float) -> None:
    """Claim an operation for resume: compare-and-swap on its state version.

    An accepted claim bumps the operation's fencing token and makes the ledger
    read the effect back before anything else; a claim naming an old version
    is rejected (exit status 1).
    """
    from consumers.reader import current_states

    settings = current_settings()
    _ready(settings)
    if expected_version == "current":
        st = current_states(settings).get(operation_id)
        if st is None:
            fail(f"no operation {operation_id!r} in the ledger", EXIT_UNKNOWN_OPERATION)
        version = st.version
    else:
        try:
            version = int(expected_version)
        except ValueError as exc:
            raise click.BadParameter(
                "takes an integer or 'current'", param_hint="--expected-version"
            ) from exc
    pub = _publisher(settings)
    try:
        claim_id = pub.publish_claim(operation_id, worker, version)
        position = pub.last_position
    finally:
        pub.close()
    click.echo(json.dumps({"claim_id": claim_id, "expected_version": version}))
    if wait_s > 0 and position is not None:
        _report_decision(settings, position, wait_s)


# ---------------------------------------------------------------------- clock


@click.group("clock")
def clock_group() -> None:
    """The ledger clock: show it; move the manual one (LEDGER_CLOCK=manual) forward.

    The system clock (LEDGER_CLOCK=system) is the default and cannot be moved;
    the manual ledger clock is for testbeds (demo, game days, tests).
    """


#: What ``ledger clock`` says of the system clock.
SYSTEM_CLOCK_NOTE = (
    "the clock is the system clock (LEDGER_CLOCK=system, the default): it cannot be "
    "moved; 'ledger clock advance' moves only the manual ledger clock of a testbed "
    "(LEDGER_CLOCK=manual, LEDGER_TESTBED=true)"
)


@clock_group.command("show")
@click.option("--json", "as_json", is_flag=True, help='Print {"clock", "now_ms"} as JSON.')
def clock_show(as_json: bool) -> None:
    """Print the ledger time in seconds (the system clock's is said to be one)."""
    from ledger.clock import clock_for

    s = current_settings()
    try:
        clock = clock_for(s.clock, s.run_dir)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    now_ms = clock.now_ms()
    if as_json:
        echo_json({"clock": s.clock, "now_ms": now_ms})
        return
    now_s = now_ms / 1000
    if s.clock == "system":
        click.echo(f"{now_s:.3f} ({SYSTEM_CLOCK_NOTE})")
    else:
        click.echo(f"{now_s:g}")


@clock_group.command("advance", context_settings={"ignore_unknown_options": True})
@click.argument("seconds", type=float)
def clock_advance(seconds: float) -> None:
    """Move the manual ledger clock forward by SECONDS (it never goes back)."""
    from ledger.clock import ManualClock

    s = current_settings()
    if s.clock != "manual":
        raise click.ClickException(
            SYSTEM_CLOCK_NOTE if s.clock == "system" else f"unknown clock {s.clock!r}"
        )
    try:
        now = ManualClock(s.run_dir / "clock").advance(seconds)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="SECONDS") from exc
    click.echo(f"{now / 1000:g}")


# ---------------------------------------------------------------------- reconciliation


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
    from consumers.reconciler import open_items
    from ledger.clock import age_s, clock_for

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
    """Drain the reconciliation queue once: read back every open unknown outcome
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
    from consumers.reverify import run_pass
    from ledger.cli.reconcile_text import run_lines

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
@_WAIT
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
    from consumers.reader import current_states
    from ledger.clock import clock_for
    from producers.publisher import build_disposition

    settings = current_settings()
    _ready(settings)
    state = current_states(settings).get(operation_id)
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
        _report_decision(settings, position, wait_s)


# ---------------------------------------------------------------------- audit


def audit_lines(report: Any) -> list[str]:
    """An audit report as text: verdict with its coverage, when it ran, facts split
    by coverage, violations, open items with their history commands, refused
    records and the offsets read.

    Args:
        report: a :class:`ledger.audit.AuditReport`.

    Returns:
        Lines without newlines.
    """
    from ledger.history import iso_time

    data = report.to_dict()
    cov = data["coverage"]
    lines = [
        f"{report.verdict}: {len(report.violations)} violation(s) in {cov['facts']} facts checked",
        f"ran at {iso_time(report.started_at_ms) or '—'} (wall clock, UTC)"
        + (f", took {report.took_s:.1f} s" if report.took_s is not None else ""),
        f"{report.operations} operations, {report.journal_entries} journal entries replayed",
        f"facts checked: {cov['ledger_facts']} in the ledger's records, "
        + (
            f"{cov['sink_facts']} against sink readback"
            if cov["sink_readback"] and cov["sink_facts"]
            else "none against sink readback (no registered sink with readback answered for "
            "an operation of this ledger)"
            if cov["sink_readback"]
            else "none against sink readback (--no-sinks: sinks not read back)"
        ),
    ]
    for unread in report.sink_unread:
        lines.append(
            f"not read back at {unread['sink']}: {unread['operations']} operation(s) "
            f"({unread['reason']}); their facts were checked against the ledger only"
        )
    for v in report.violations:
        lines.append(f"  {v.invariant}\t{v.operation_id or '-'}\t{v.evidence}")
    for why in report.unverified:
        lines.append(f"not verified: {why}")
    items = report.open_items
    lines.append(
        f"{len(items)} open item(s)"
        + (" (age on the wall clock since the latest state record):" if items else "")
    )
    for i in items:
        age = f"{i.age_s:.0f}" if i.age_s is not None else "?"
        lines.append(
            f"  {i.operation_id}\t{i.state}\t{i.sink}\tage {age} s\t{i.reason}\t"
            f"({i.history_command})"
        )
    unauthentic = report.unauthenticated_records
    lines.append(
        f"{len(unauthentic)} unauthenticated record(s), refused by every reader"
        + (":" if unauthentic else "")
    )
    for r in unauthentic[:50]:
        lines.append(f"  {r['topic']}:{r['partition']}:{r['offset']}\t{r['reason']}")
    if len(unauthentic) > 50:
        lines.append(f"  ... and {len(unauthentic) - 50} more (--json lists them all)")
    for r in report.replayed_records:
        lines.append(f"replayed: {r['topic']}:{r['partition']}:{r['offset']}\t{r['reason']}")
    chain = data.get("journal_chain") or {}
    if chain:
        lines.append(
            f"journal chain: {chain['heads_checked']} witnessed head(s) checked; witness file: "
            f"{chain['witness'] or 'none'}; each partition's chain starts at:"
        )
        for c in chain["partitions"]:
            lines.append(
                f"  journal:{c['partition']}: "
                + (
                    f"offset {c['starts_at']} (chain_seq {c['seq']})"
                    if c["starts_at"] is not None
                    else "no chained entry"
                )
                + (f", after {c['unchained']} unchained entries" if c["unchained"] else "")
            )
    lines.append("offsets covered (topic: partition:end offset, read from the beginning):")
    for topic, parts in data["offsets"].items():
        lines.append(f"  {topic}: " + " ".join(f"{p}:{end}" for p, end in parts.items()))
    return lines


@click.command("audit")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-sinks", is_flag=True, help="Do not ask sinks how many effects they hold.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write the report as a self-contained HTML page (inline plots) to FILE.",
)
@click.option(
    "--histories",
    is_flag=True,
    help="With --html: also write the history of every open item to history/*.html next to "
    "FILE, and link each open item to it (one read of the ledger per item).",
)
@click.option(
    "--witness",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    multiple=True,
    metavar="FILE",
    help="Check the journal's hash chains against the heads witnessed in FILE (JSON lines "
    "the processor appends; repeat it for the files of several processor hosts; default: "
    "LEDGER_WITNESS_FILE when it exists). Required once heads were published: without it "
    "the verdict is NOT VERIFIED.",
)
def audit_cmd(
    as_json: bool,
    no_sinks: bool,
    html_path: Path | None,
    histories: bool,
    witness: tuple[Path, ...],
) -> None:
    """Replay the whole ledger with the processor's own fold and check its invariants.

    Exits 0 when the verdict is CLEAN, 1 otherwise; each violation names the
    operation and the evidence. Every record's seal is checked too: records
    no trusted writer produced are listed (they were refused; an admission
    or effect resting on one is a violation). The verdict says what it
    covers: 'ledger and sink readback' when at least one fact was checked
    against a sink's readback, 'ledger only; no sink readback' when none
    was (no registered sink with readback answered), or 'ledger only, sink
    readback off' with --no-sinks; the facts checked are split the same way. The
    report says when it ran (wall clock, UTC), the end offset it read to on
    every topic partition, and lists every open item (held unknown outcomes,
    reauthorisation pending, abandoned: operation, state, sink, age, reason,
    and the 'ledger history OP' command that shows it). An operation stranded
    short of where it should rest (LEDGER_STRANDED_*_S) is an open item and
    makes the verdict STRANDED, exit 1; an operation whose outcome is unknown
    (held in UNKNOWN_OUTCOME, or committed and contradicted by its sink's
    postcondition) makes it OPEN, exit 1; reauthorisation pending and
    abandoned ones are listed and leave it CLEAN. With --html
    FILE the report is also written as one self-contained HTML page and
    'wrote FILE' is said on stderr when --json keeps stdout for the JSON;
    --histories also writes the history of every open item next to it
    (history/*.html) and links each item to it.

    Every journal partition is a hash chain: the audit checks each one end
    to end and against the heads the processor published (the heads topic,
    and the witness file, --witness FILE or LEDGER_WITNESS_FILE), and names
    every deleted, truncated or rewritten range, and heads deleted from the
    heads topic that the witness still holds, as a 'journal-chain'
    violation. Once heads were published the witness is required: without
    it, or with one holding fewer or older heads than the heads topic, the
    verdict is NOT VERIFIED (exit 1), naming what is missing.
    """
    from consumers.auditor import run_audit

    if histories and html_path is None:
        raise click.UsageError("--histories needs --html FILE (the pages are linked from it)")
    settings = current_settings()
    reader_ready(settings)  # reads only: creates no key
    report = run_audit(settings, read_sinks=not no_sinks, witness=witness or None)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in audit_lines(report):
            click.echo(line)
    if html_path is not None:
        from ledger.cli.html import audit_html

        data = {**report.to_dict(), "ledger": settings.topic_prefix}
        try:
            if histories:
                from ledger.cli.history import write_histories

                links = write_histories(
                    settings, [i.operation_id for i in report.open_items], html_path.parent
                )
                for item in data["open_items"]:
                    item["history_href"] = links.get(item["operation_id"])
            html_path.write_text(audit_html(data), encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(
                f"cannot write the HTML report to {html_path}: {exc.strerror or exc}; "
                "choose a writable --html path"
            ) from exc
        click.echo(f"wrote {html_path}", err=as_json)
    sys.exit(0 if report.settled else 1)


#: The operators' and auditors' commands, in the order ``ledger --help`` lists them.
COMMANDS: tuple[click.Command, ...] = (
    intent_group,
    fork_cmd,
    approve_cmd,
    revoke_cmd,
    policy_group,
    state_cmd,
    claim_cmd,
    clock_group,
    reconcile_group,
    audit_cmd,
)
