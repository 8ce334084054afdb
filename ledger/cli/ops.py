"""Operators' commands: intents, forks, claims, state, policy and the ledger clock.

Operators' commands: intents, forks, claims, state, policy and the ledger clock
(approvals are :mod:`ledger.cli.approvals`, reconciliation :mod:`ledger.cli.reconcile`,
the audit :mod:`ledger.cli.audit`).

Commands that publish wait (by default) for the processor's decision and say
what it was, since the ledger decides asynchronously.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from consumers import reader
from consumers.unconsumed import awaiting_processor
from ledger import topics
from ledger.cli.approvals import approve_cmd, revoke_cmd
from ledger.cli.common import (
    EXIT_ENDED_ELSEWHERE,
    EXIT_ERROR,
    EXIT_TIMEOUT,
    EXIT_UNKNOWN_OPERATION,
    OTHER_LEDGER_HINT,
    current_settings,
    echo_json,
    fail,
    instant_text,
    reader_ready,
)
from ledger.cli.inputs import POLICY_VERSION
from ledger.cli.inputs import WAIT_OPTION as _WAIT
from ledger.cli.inputs import in_grammar as _in_grammar
from ledger.cli.inputs import non_blank as _non_blank
from ledger.cli.inputs import publisher as _publisher
from ledger.cli.inputs import ready as _ready
from ledger.cli.inputs import report_decision as _report_decision
from ledger.cli.stages import held_on_this_host
from ledger.clock import ManualClock, clock_for
from ledger.credentials import keys_dir
from ledger.errors import LedgerError, OperationEndedElsewhereError, WaitTimeoutError
from ledger.identity import amount_of
from ledger.settings import LedgerSettings
from producers.outcomes import OutcomeReader
from producers.waiting import parse_states
from sinks.registry import load_sinks


def _outcome_watch(settings: LedgerSettings, operation_id: str) -> Any:
    """A watch on the operation's outcomes, opened before its intent is published.

    ``None`` on a host without the outcome public key (the decision is then
    read from the journal, which needs the stages' key and read rights).
    """
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
    try:
        st = pub.wait_for(operation_id, until, timeout_s)
    except OperationEndedElsewhereError as exc:
        fail(exc.message, EXIT_ENDED_ELSEWHERE)
    except WaitTimeoutError as exc:
        fail(exc.message, EXIT_TIMEOUT)
    click.echo(f"{st.state}: {operation_id} ({st.reason})")


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
    states = reader.current_states(settings)
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
    settings = current_settings()
    _ready(settings)
    in_force = reader.policy_in_force(settings)
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
    settings = current_settings()
    _ready(settings)
    now_ms = clock_for(settings.clock, settings.run_dir).now_ms()
    effective_at_ms, in_force = reader.policy_effective_at(settings, now_ms)
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
    settings = current_settings()
    reader_ready(settings)  # reads only: creates no key
    states = reader.current_states(settings)
    if not states:
        _no_authentic_state(settings)
    if operation_id is not None:
        st = states.get(operation_id)
        if st is None and operation_id in reader.read_latest(settings, "state", authentic=False):
            fail(
                f"operation {operation_id!r} is in the ledger, but its state record cannot be "
                "verified with the keys here (LEDGER_KEYS_DIR): it is held, not absent. Restore "
                "the keys folder the ledger's records were sealed with; `ledger audit` lists "
                "what it cannot verify",
                EXIT_ERROR,
            )
        if st is None:
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
    if topics.non_empty_topics(settings, ["state"]):
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
    settings = current_settings()
    _ready(settings)
    if expected_version == "current":
        st = reader.current_states(settings).get(operation_id)
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
)
