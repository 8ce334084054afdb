"""Reading back what a stranded operation waits for: its verification, or its effect.

A stranded EFFECT_COMMITTED operation (:mod:`ledger.stranded`,
``committed_unverified``) waits for a postcondition readback that never
came (its verification failed, e.g. after a ``committed`` disposition while
the sink was away, and nothing asks again). :func:`reverify` asks the
sink's postcondition query once more and records the answer as a
``POSTCONDITION`` :class:`~ledger.events.Readback` of the operation's
current dispatch, with its current fencing token; the processor then
decides with the fold as for any verification (``MATCH``: OUTCOME_VERIFIED;
anything else is noted in the journal and changes no state, so the operation
stays stranded, its age still counting).
Only a query is sent: never the effect's request, so nothing can happen
twice. ``ledger reconcile run`` does this for every such operation, the
console's "read back now" for one.

:func:`read_back_now` is the console's action: the effect readback of an
UNKNOWN_OUTCOME operation (as ``ledger reconcile run`` does for the queue),
or the verification of a committed one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import closing
from typing import Any

from consumers.reader import current_states
from consumers.reconciler import reconcile_once
from ledger.clock import clock_for
from ledger.contracts import judge_postcondition, postcondition_request
from ledger.errors import InvalidStateError, SinkConfigError, SinkError
from ledger.events import OperationState, Readback
from ledger.fold import current_dispatch_id
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from sinks.client import postcondition_source
from sinks.port import open_sink
from sinks.registry import load_sinks

#: Verdicts of a verification that settle the operation (the rest leave it stranded).
SETTLED = frozenset({"MATCH"})


def _verification(
    settings: LedgerSettings, st: OperationState, sinks: dict[str, Any]
) -> tuple[str, str, str]:
    """Ask ``st``'s sink its postcondition query: ``(status, detail, source)``."""
    endpoint = sinks.get(st.sink)
    if endpoint is None:
        return "UNKNOWN", f"sink {st.sink!r} is not registered", f"{st.sink} postcondition"
    try:
        params: dict[str, Any] = json.loads(st.params_json)
    except ValueError as exc:
        return "UNKNOWN", f"parameters unreadable: {exc}", f"{st.sink} postcondition"
    ask = postcondition_request(endpoint.contract, params)
    source = f"{st.sink} {postcondition_source(ask.query, ask.subject)}"
    if not ask.offered:
        status, detail = judge_postcondition(endpoint.contract, params, None, st.operation_id)
        return status, detail, source
    try:
        client = open_sink(
            endpoint,
            timeout_s=endpoint.deadline_s(settings.sink_timeout_s),
            name=st.sink,
            max_response_bytes=settings.sink_max_response_bytes,
        )
    except SinkConfigError as exc:
        return "UNKNOWN", exc.message, source
    with closing(client):
        try:
            observation = client.postcondition(ask.query, ask.subject)
        except SinkError as exc:
            return "UNKNOWN", f"{type(exc).__name__}: {exc}", source
    if not observation.sent:
        return "UNKNOWN", f"not reached: {observation.detail}", source
    status, detail = judge_postcondition(endpoint.contract, params, observation, st.operation_id)
    return status, detail, source


def reverify(
    settings: LedgerSettings,
    operation_ids: Iterable[str],
    say: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Ask again the verification of EFFECT_COMMITTED operations, and record each answer.

    An operation no longer EFFECT_COMMITTED (settled meanwhile) is skipped.

    Args:
        settings: ledger settings.
        operation_ids: the operations to verify (e.g. the stranded
            ``committed_unverified`` ones).
        say: where a line per operation goes.

    Returns:
        One ``{"operation_id", "sink", "observed", "detail", "kind":
        "POSTCONDITION"}`` per operation verified (``observed``: ``MATCH``,
        ``MISMATCH``, ``UNKNOWN`` or ``UNSUPPORTED``).

    Raises:
        LocalFileError: the sink registry or the clock file is corrupted.
        LedgerError: ``ledger.state`` could not be read, or a readback not published.
    """
    wanted = list(operation_ids)
    if not wanted:
        return []
    sinks = load_sinks(settings.sinks_path())
    now = clock_for(settings.clock, settings.run_dir).now_ms()
    states = current_states(settings)
    results: list[dict[str, Any]] = []
    publisher = LedgerPublisher(settings, client_id="reconciler")
    try:
        for op in wanted:
            st = states.get(op)
            if st is None or st.state != S.EFFECT_COMMITTED:
                continue
            status, detail, source = _verification(settings, st, sinks)
            publisher.publish_readback(
                Readback(
                    operation_id=op,
                    dispatch_id=current_dispatch_id(st),
                    kind="POSTCONDITION",
                    status=status,  # type: ignore[arg-type]  # pydantic checks the Literal when the model is built
                    source=f"{source} (reconciler: stranded verification)",
                    effect_id=st.effect_id,
                    observed_at_ms=now,
                    detail=detail,
                    # The operation's ordinary verification asked again, not a
                    # resume: an answer that verifies nothing changes no state
                    # (a NOOP), so the operation stays stranded and counted.
                    on_resume=False,
                    observer="reconciler",
                    fencing_token=st.epoch,
                )
            )
            say(f"{op}: verification {status} ({detail})")
            results.append(
                {
                    "operation_id": op,
                    "sink": st.sink,
                    "observed": status,
                    "detail": detail,
                    "kind": "POSTCONDITION",
                }
            )
    finally:
        publisher.close()
    return results


def read_back_now(settings: LedgerSettings, operation_id: str) -> str:
    """The console's "read back now": one readback that may move the operation on.

    UNKNOWN_OUTCOME: the effect readback ``ledger reconcile run`` makes for
    the queue (every open item is read back in that pass). EFFECT_COMMITTED:
    the verification (:func:`reverify`). Anything else: nothing is asked.

    Args:
        settings: ledger settings.
        operation_id: the operation.

    Returns:
        One line saying what was observed (or why nothing was asked).

    Raises:
        LedgerError: the ledger or the sink registry could not be read.
    """
    st = current_states(settings).get(operation_id)
    if st is None:
        return f"not read back: no operation {operation_id!r} in the ledger"
    if st.state == S.EFFECT_COMMITTED:
        (done,) = reverify(settings, [operation_id]) or (None,)
        if done is None:
            return f"not read back: {operation_id} is no longer EFFECT_COMMITTED"
        return f"{operation_id}: verification {done['observed']} ({done['detail']})"
    if st.state == S.UNKNOWN_OUTCOME:
        for row in reconcile_once(settings, only={operation_id}):
            if row["operation_id"] == operation_id:
                return f"{operation_id}: readback {row['observed']} ({row['detail']})"
        return f"{operation_id}: not queued for reconciliation yet; nothing was read back"
    raise InvalidStateError(
        f"{operation_id} is {st.state}: only UNKNOWN_OUTCOME or EFFECT_COMMITTED can be read "
        "back from here (a readback never re-sends the effect)",
        operation_id=operation_id,
        expected="UNKNOWN_OUTCOME or EFFECT_COMMITTED",
        observed=str(st.state),
    )


#: Observations of an unknown outcome that release it (the rest leave it held).
RELEASING = frozenset({"COMMITTED", "ABSENT"})


def run_pass(
    settings: LedgerSettings, say: Callable[[str], None] = lambda _: None
) -> tuple[list[dict[str, Any]], list[str]]:
    """One ``ledger reconcile run``: read back the queue, verify the stranded, say what is left.

    1. Every open unknown outcome is read back (:func:`reconcile_once`).
    2. The ledger's stranded operations are found (:mod:`consumers.stranding`);
       the ``committed_unverified`` ones are verified again (:func:`reverify`).
    3. What is left open: each unknown outcome whose readback did not
       release it (not ``COMMITTED`` nor ``ABSENT``), each stranded operation
       a verification did not settle (not ``MATCH``), and every other
       stranded one (in flight, not admitted, held: the remedy is not a
       readback), each said on ``say`` with its remedy.

    Returns:
        ``(results, left)``: one row per readback or verification recorded
        (``{"operation_id", "sink", "observed", "detail"}``, verifications
        with ``"kind": "POSTCONDITION"``), and the operations left open,
        sorted (empty: nothing it owns remains unknown or stranded).

    Raises:
        LedgerError: as :func:`reconcile_once` and :func:`reverify`.
    """
    from consumers.stranding import ledger_stranded

    results = reconcile_once(settings, say)
    left = {r["operation_id"] for r in results if r["observed"] not in RELEASING}
    stranded = ledger_stranded(settings)
    verified = reverify(settings, [s.operation_id for s in stranded if s.read_back], say)
    results += verified
    settled = {r["operation_id"] for r in verified if r["observed"] in SETTLED}
    for s in stranded:
        if s.operation_id not in settled:
            left.add(s.operation_id)
            say(f"{s.operation_id}: {s.sentence}")
    return results, sorted(left)
