"""One input to one operation: :func:`decide` routes it by kind."""

from __future__ import annotations

from ledger.events import (
    AdmissionDecision,
    Claim,
    CompensationTally,
    Disposition,
    EffectReceipt,
    Event,
    Intent,
    OperationState,
    Readback,
)
from ledger.fold.admissions import _admission
from ledger.fold.claims import _claim
from ledger.fold.compensation import CompensationFacts
from ledger.fold.core import Decision, _refuse
from ledger.fold.dispositions import _disposition
from ledger.fold.effects import _readback, _receipt
from ledger.fold.intents import _intent
from ledger.fold.tally import decide_tally, with_release


def decide(
    state: OperationState | None,
    event: Event,
    ref: str,
    *,
    sink_problem: str | None = None,
    resumed_by: str | None = None,
    compensation: CompensationFacts | None = None,
) -> Decision:
    """Apply one input event to one operation's state.

    Args:
        state: current state of the operation the event is keyed by, or
            ``None`` when the ledger has never seen it.
        event: an Intent, AdmissionDecision, EffectReceipt, Readback, Claim,
            Disposition or CompensationTally (any other event is refused as
            ``BAD_INPUT``). A decision that abandons a compensation whose
            claim its original's tally granted also returns that claim
            (:func:`ledger.fold.tally.with_release`).
        ref: the input's position, ``topic:partition:offset``; IDs of the
            outputs are derived from it, so replay yields the same IDs.
        sink_problem: what the processor observed of an intent's sink.
        resumed_by: the restarted processor (e.g. ``processor-0``) that
            resumes this operation with this admission decision: it restored
            the operation waiting for admission (NOT_ADMITTED, no dispatch
            written) after a crash or a takeover. The decision then writes a
            recovery receipt. Recorded in the journal, so replay decides the same.
        compensation: what the processor observed of the original an intent
            ``compensates`` (see :mod:`ledger.fold.compensation`), or, for a
            tally request, of the original it is keyed by (:mod:`ledger.fold.tally`).

    Returns:
        The :class:`Decision`: the new state, ``APPLIED``/``REFUSED``/``NOOP``,
        the hops taken and the records to write with the state. Never raises
        for bad input: a forbidden or malformed input is a ``REFUSED``
        decision with an operating event, and the state it carries is the
        state before.
    """
    if isinstance(event, Intent):
        return _intent(state, event, ref, sink_problem, compensation)
    if isinstance(event, CompensationTally):
        return with_release(state, decide_tally(state, event, ref, compensation), ref)
    if state is None:
        op = getattr(event, "operation_id", None)
        return _refuse(
            None, ref, op, "UNKNOWN_OPERATION", f"no operation {op!r} is known to the ledger"
        )
    if isinstance(event, AdmissionDecision):
        return with_release(state, _admission(state, event, ref, resumed_by=resumed_by), ref)
    if isinstance(event, EffectReceipt):
        return with_release(state, _receipt(state, event, ref), ref)
    if isinstance(event, Readback):
        return with_release(state, _readback(state, event, ref), ref)
    if isinstance(event, Claim):
        return _claim(state, event, ref)
    if isinstance(event, Disposition):
        return with_release(state, _disposition(state, event, ref), ref)
    return _refuse(
        state, ref, state.operation_id, "BAD_INPUT", f"{event.KIND} is not a processor input"
    )
