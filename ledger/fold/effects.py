"""Effects: receipts from the relay and readbacks from relay and reconcilers.

An observation of the effect moves the operation: committed (then verified
by a postcondition readback, dispatched as a ``VERIFY`` or, when the relay
read it right after the effect, carried by the committed receipt itself),
unknown (held for reconciliation), or absent (the same admitted operation is
dispatched again).
"""

from __future__ import annotations

from dataclasses import replace

from ledger.events import EffectReceipt, OperationState, Readback
from ledger.fold.core import (
    STAY,
    Decision,
    Observation,
    Output,
    _dispatch,
    _move,
    _noop,
    _op_event,
    _reconciliation,
    _reconciliation_done,
    _recovery_receipt,
    current_dispatch_id,
)
from ledger.states import RecoveryState as S

#: "Unavailable" answers from a sink after which an operation is abandoned. An
#: absence observed by readback does not count here: the request may never
#: have left (its sender crashed), and executing the same admitted operation
#: again under its idempotency key is safe.
MAX_UNAVAILABLE = 5

#: Re-executions of the same admitted operation after its effect was observed
#: absent: the next absence holds it in UNKNOWN_OUTCOME for a person (an
#: ``ABSENT_RETRIES_EXHAUSTED`` operating event), so that an attempt that dies
#: every time (a relay crash-looping on it) cannot re-dispatch for ever. A
#: readback release of a held operation counts too; only an attributable
#: disposition ``ABSENT`` starts a new budget.
MAX_ABSENT_RETRIES = 5


def _committed_opening(
    state: OperationState,
    ref: str,
    obs: Observation,
    *,
    effect_id: str | None,
    postcondition: str,
    uncertainty: str = "none",
    owner: str | None = None,
    release: str | None = None,
) -> Decision | list[Output]:
    """How every observation of a committed effect opens.

    Returns:
        The no-op :class:`Decision` when the effect is already recorded as
        committed; else the first outputs: the resume's recovery receipt
        (``action="COMPLETE"``, with the given postcondition, uncertainty,
        owner and release) when ``obs`` is a resume, and the end of
        reconciliation when the outcome was unknown.
    """
    if state.state in (S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED):
        return _noop(state, "effect already recorded as committed")
    outputs: list[Output] = []
    if obs.on_resume:
        outputs.append(
            _recovery_receipt(
                state,
                ref,
                obs,
                action="COMPLETE",
                effect_id=effect_id,
                postcondition=postcondition,
                uncertainty=uncertainty,
                owner=owner,
                release=release,
            )
        )
    if state.state == S.UNKNOWN_OUTCOME:
        outputs.append(_reconciliation_done(state))
    return outputs


def _committed(
    state: OperationState,
    ref: str,
    obs: Observation,
    *,
    effect_id: str | None,
) -> Decision:
    """The effect is observed committed: record it and dispatch its verification."""
    outputs = _committed_opening(
        state, ref, obs, effect_id=effect_id, postcondition="pending: verification dispatched"
    )
    if isinstance(outputs, Decision):
        return outputs
    # The resume's recovery receipt is the one above: the verification that
    # follows is the operation's ordinary one (one receipt per resume).
    verify, n = _dispatch(state, "VERIFY")
    outputs.append(verify)
    return _move(
        state,
        S.EFFECT_COMMITTED,
        ref,
        f"effect committed ({obs.source})",
        outputs,
        refused="an effect was observed for an operation never admitted",
        effect_id=effect_id,
        **obs.fields(),
        dispatches=n,
        recovery_receipts=state.recovery_receipts + (1 if obs.on_resume else 0),
    )


def _committed_and_read_back(
    state: OperationState, r: EffectReceipt, ref: str, obs: Observation
) -> Decision:
    """The effect is committed and its postcondition was read back in the same record.

    The relay read the postcondition right after the sink committed and
    recorded both in one receipt (schema version 4), so no ``VERIFY`` is
    dispatched. The verdict leads where the ``VERIFY`` path would have led: a
    ``MATCH`` takes the operation on to OUTCOME_VERIFIED (two hops, each
    checked: ``EFFECT_PENDING -> EFFECT_COMMITTED -> OUTCOME_VERIFIED``); a
    ``MISMATCH`` leaves it EFFECT_COMMITTED with a ``POSTCONDITION_MISMATCH``
    operating event. A resume writes its one recovery receipt here, naming
    the postcondition it found. An effect already recorded as committed
    is left as it is (its ``VERIFY`` is already on its way), as on that path.
    """
    op = state.operation_id
    check_source = r.postcondition_source or f"{r.sink} postcondition"
    check_detail = r.postcondition_detail or ""
    checked_at_ms = (
        r.postcondition_observed_at_ms
        if r.postcondition_observed_at_ms is not None
        else r.observed_at_ms
    )
    matched = r.postcondition_status == "MATCH"
    outputs = _committed_opening(
        state,
        ref,
        obs,
        effect_id=r.effect_id,
        postcondition=f"{'verified' if matched else 'mismatch'}: {check_detail}",
        uncertainty=(
            "none"
            if matched
            else f"the business outcome at {state.sink} does not match the committed "
            f"effect: {check_detail}"
        ),
        owner=None if matched else "operator",
        release=None if matched else "a person's review of the mismatch",
    )
    if isinstance(outputs, Decision):
        return outputs
    receipts = state.recovery_receipts + (1 if obs.on_resume else 0)
    if matched:
        return _move(
            state,
            (S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED),
            ref,
            f"effect committed ({obs.source}) and postcondition verified ({check_source})",
            outputs,
            refused="an effect was observed for an operation never admitted",
            effect_id=r.effect_id,
            observation_source=check_source,
            observation_status="VERIFIED",
            observed_at_ms=checked_at_ms,
            recovery_receipts=receipts,
        )
    outputs.append(_op_event(ref, op, "POSTCONDITION_MISMATCH", f"{check_source}: {check_detail}"))
    return _move(
        state,
        S.EFFECT_COMMITTED,
        ref,
        f"effect committed ({obs.source}); postcondition mismatch: {check_detail}",
        outputs,
        refused="an effect was observed for an operation never admitted",
        effect_id=r.effect_id,
        **obs.fields(),
        recovery_receipts=receipts,
    )


def _unknown(
    state: OperationState,
    ref: str,
    obs: Observation,
    *,
    why: str,
    label: str = "outcome unknown",
) -> Decision:
    """The outcome cannot be observed: hold it for reconciliation (never a retry).

    ``label`` starts the reason (``outcome unknown``, or ``held for a person``
    when the outcome is known absent but the ledger will not try again alone).
    """
    if state.state == S.UNKNOWN_OUTCOME:
        return _noop(state, f"still unknown: {why}")
    outputs: list[Output] = []
    if obs.on_resume:
        outputs.append(
            _recovery_receipt(
                state,
                ref,
                obs,
                action="RECONCILE",
                effect_id=None,
                postcondition="not checked: effect state unknown",
                uncertainty=f"whether the effect committed at {state.sink}",
                owner="reconciliation",
                release="a readback that observes the effect, or an attributable disposition",
            )
        )
    return _move(
        state,
        S.UNKNOWN_OUTCOME,
        ref,
        f"{label}: {why}",
        outputs,
        refused=why,
        after=lambda new: (_reconciliation(new),),
        **obs.fields(),
        recovery_receipts=state.recovery_receipts + (1 if obs.on_resume else 0),
    )


def _absent_retry(
    state: OperationState, ref: str, obs: Observation, *, by_person: bool = False
) -> Decision:
    """The effect is known absent: execute the same admitted operation again.

    Within budgets: ``MAX_UNAVAILABLE`` "unavailable" answers abandon the
    operation; more than ``MAX_ABSENT_RETRIES`` re-executions after observed
    absences hold it in UNKNOWN_OUTCOME. ``by_person``: the absence is an
    attributable disposition, which always re-executes and starts a new budget.
    """
    op = state.operation_id
    counts_absence = obs.status != "UNAVAILABLE" and not by_person
    absent_retries = 0 if by_person else state.absent_retries + (1 if counts_absence else 0)
    if counts_absence and absent_retries > MAX_ABSENT_RETRIES:
        return _absent_budget_spent(state, ref, obs)
    if state.state == S.EFFECT_PENDING:
        unavailable = state.unavailable + (1 if obs.status == "UNAVAILABLE" else 0)
        if unavailable >= MAX_UNAVAILABLE:
            why = f"{state.sink} answered unavailable {unavailable} times; giving up ({obs.source})"
            return _move(
                state,
                S.ABANDONED,
                ref,
                why,
                (_op_event(ref, op, "SINK_UNAVAILABLE", f"{op}: {why}"),),
                unavailable=unavailable,
            )
        out, n = _dispatch(state, "EXECUTE", on_resume=obs.on_resume)
        outputs: list[Output] = []
        if obs.on_resume:
            outputs.append(
                _recovery_receipt(
                    state,
                    ref,
                    obs,
                    action="EXECUTE",
                    effect_id=None,
                    postcondition="pending: effect re-dispatched",
                )
            )
        outputs.append(out)
        return _move(
            state,
            STAY,
            ref,
            f"effect absent ({obs.source}); same admitted operation dispatched again",
            outputs,
            dispatches=n,
            unavailable=unavailable,
            absent_retries=absent_retries,
            **obs.fields(),
            recovery_receipts=state.recovery_receipts + (1 if obs.on_resume else 0),
        )
    if state.state == S.UNKNOWN_OUTCOME:
        out, n = _dispatch(state, "EXECUTE", on_resume=True)
        reason = f"effect observed absent ({obs.source}); same admitted operation dispatched again"
        outputs = [
            _recovery_receipt(
                state,
                ref,
                obs,
                action="EXECUTE",
                effect_id=None,
                postcondition="pending: effect re-dispatched",
            ),
            _reconciliation_done(state),
            out,
        ]
        # Readmitted by the observation, then dispatched again: two hops.
        return _move(
            state,
            (S.ADMITTED, S.EFFECT_PENDING),
            ref,
            reason,
            outputs,
            dispatches=n,
            absent_retries=absent_retries,
            **obs.fields(),
            recovery_receipts=state.recovery_receipts + 1,
        )
    return _noop(state, f"absence observed while {state.state}: nothing to do")


def _absent_budget_spent(state: OperationState, ref: str, obs: Observation) -> Decision:
    """Absent again after ``MAX_ABSENT_RETRIES`` re-executions: hold it for a person."""
    op = state.operation_id
    why = (
        f"the effect at {state.sink} was observed absent again after {state.absent_retries} "
        f"re-executions of the same admitted operation (last: {obs.source}); every attempt "
        "ended without an outcome, so it is not sent again automatically. Find why (the relay's "
        "log and operating events), then 'ledger reconcile dispose --decision absent' to "
        "execute it again or '--decision abandon'"
    )
    event = _op_event(ref, op, "ABSENT_RETRIES_EXHAUSTED", f"{op}: {why}")
    if state.state == S.UNKNOWN_OUTCOME:
        return _noop(state, f"still held: {why}", event)
    if state.state != S.EFFECT_PENDING:
        return _noop(state, f"absence observed while {state.state}: nothing to do")
    decision = _unknown(state, ref, obs, why=why, label="held for a person")
    return replace(decision, outputs=(*decision.outputs, event))


def _reservation_cancelled(
    state: OperationState, r: EffectReceipt, ref: str, source: str
) -> Decision:
    """The relay cancelled a reservation because the admission no longer stood.

    The hold was released at the sink and no effect was made: the operation
    waits for fresh authority (NEEDS_REAUTHORISATION, the reason naming why
    the admission was withdrawn); a new approval re-admits it, and the relay
    reserves again under the same key.
    """
    if state.state != S.EFFECT_PENDING:
        return _noop(state, f"reservation cancellation noted while {state.state}: {r.detail}")
    outputs: list[Output] = []
    obs = Observation(source, "CANCELLED", r.observed_at_ms, r.on_resume, r.observer)
    if r.on_resume:
        outputs.append(
            _recovery_receipt(
                state,
                ref,
                obs,
                action="REAUTHORISE",
                effect_id=None,
                postcondition=f"reservation released at {r.sink}: no effect",
                owner="reviewer",
                release="a new approval for the same operation and digest",
            )
        )
    return _move(
        state,
        S.NEEDS_REAUTHORISATION,
        ref,
        f"reservation cancelled at {r.sink}: {r.detail}",
        outputs,
        refused="a reservation was cancelled for an operation not in flight",
        reauthorisations=state.reauthorisations + 1,
        recovery_receipts=state.recovery_receipts + (1 if r.on_resume else 0),
    )


def _receipt(state: OperationState, r: EffectReceipt, ref: str) -> Decision:
    """What the sink answered the relay: committed, rejected, unavailable or unknown."""
    op = state.operation_id
    if r.status == "ATTEMPTED":
        return _noop(state, f"attempt {r.attempt_id} recorded before sending")
    if r.status == "STALE_TOKEN":
        return _noop(
            state,
            f"sink {r.sink} refused fencing token {r.fencing_token}",
            _op_event(ref, op, "STALE_TOKEN", f"{r.sink} refused stale fencing token: {r.detail}"),
        )
    stale = r.dispatch_id != current_dispatch_id(state)
    if stale and r.status != "COMMITTED":
        return _noop(state, f"receipt for superseded dispatch {r.dispatch_id} ({r.status})")
    source = f"{r.sink} receipt ({'resume' if r.on_resume else 'submit'})"
    if r.reservation is not None:
        source = f"{source}, reservation {r.reservation.lower()}"
    if r.status == "EXPIRED":
        # Journaled (the journal entry keeps this reason): the sink released an
        # unconfirmed hold by itself; the relay reserved again under the same key.
        return _noop(state, f"{r.sink} released the reservation hold by itself: {r.detail}")
    if r.status == "CANCELLED":
        return _reservation_cancelled(state, r, ref, source)
    if r.status == "COMMITTED":
        obs = Observation(source, "COMMITTED", r.observed_at_ms, r.on_resume, r.observer)
        if r.postcondition_status is not None:
            return _committed_and_read_back(state, r, ref, obs)
        return _committed(state, ref, obs, effect_id=r.effect_id)
    if r.status == "REJECTED":
        if state.state != S.EFFECT_PENDING:
            return _noop(state, f"rejection ignored while {state.state}")
        return _move(state, S.ABANDONED, ref, f"{r.sink} rejected the request: {r.detail}")
    if r.status == "UNAVAILABLE":
        if state.state != S.EFFECT_PENDING:
            # "Unavailable" says this request was not performed; it says
            # nothing of an earlier attempt whose outcome is unknown (a sink
            # may shed load before it looks up the idempotency key). Only a
            # readback or a person's disposition releases UNKNOWN_OUTCOME.
            return _noop(state, f"unavailable answer noted while {state.state}: not evidence")
        return _absent_retry(
            state,
            ref,
            Observation(source, "UNAVAILABLE", r.observed_at_ms, r.on_resume, r.observer),
        )
    if r.status == "UNREACHABLE":
        if state.state != S.EFFECT_PENDING:
            return _noop(state, f"unreachable sink noted while {state.state}")
        return _unknown(
            state,
            ref,
            Observation(source, "UNREACHABLE", r.observed_at_ms, r.on_resume, r.observer),
            label="held for a person",
            why=(
                f"{r.sink} could not be reached ({r.detail}). The request never left and "
                f"the admission under approval {state.admitted_approval_id} stands: start the "
                "sink or fix its entry in the sink registry, then 'ledger reconcile run' (a "
                "readback that finds it absent executes the same admitted operation), or "
                "'ledger reconcile dispose --decision absent' (execute it) or '--decision abandon'"
            ),
        )
    if r.status == "KEY_REUSED":
        decision = _unknown(
            state,
            ref,
            Observation(source, "KEY_REUSED", r.observed_at_ms, r.on_resume, r.observer),
            why=f"{r.sink} holds this operation ID with other parameters",
        )
        drift = _op_event(ref, op, "PARAMETER_DRIFT_AT_SINK", f"{r.sink}: {r.detail}")
        return replace(decision, outputs=(*decision.outputs, drift))
    return _unknown(
        state,
        ref,
        Observation(source, r.status, r.observed_at_ms, r.on_resume, r.observer),
        why=f"{r.sink}: {r.detail}",
    )


def _readback(state: OperationState, b: Readback, ref: str) -> Decision:
    """What a readback found: the effect (committed, absent, unknown) or its postcondition."""
    op = state.operation_id
    if b.status == "STALE_TOKEN":
        return _noop(
            state,
            f"readback refused for stale token {b.fencing_token}",
            _op_event(ref, op, "STALE_TOKEN", f"{b.source}: {b.detail}"),
        )
    if b.dispatch_id != current_dispatch_id(state) and b.status != "COMMITTED":
        return _noop(state, f"readback for superseded dispatch {b.dispatch_id} ({b.status})")
    if b.kind == "POSTCONDITION":
        if state.state != S.EFFECT_COMMITTED:
            return _noop(state, f"postcondition {b.status} noted while {state.state}")
        if b.status == "MATCH":
            receipts = (
                (
                    _recovery_receipt(
                        state,
                        ref,
                        Observation(
                            b.source, "VERIFIED", b.observed_at_ms, b.on_resume, b.observer
                        ),
                        action="COMPLETE",
                        effect_id=state.effect_id,
                        postcondition=f"verified: {b.detail}",
                    ),
                )
                if b.on_resume
                else ()
            )
            return _move(
                state,
                S.OUTCOME_VERIFIED,
                ref,
                f"postcondition verified ({b.source})",
                receipts,
                observation_source=b.source,
                observation_status="VERIFIED",
                observed_at_ms=b.observed_at_ms,
                recovery_receipts=state.recovery_receipts + len(receipts),
            )
        if b.status == "MISMATCH":
            mismatch = _op_event(ref, op, "POSTCONDITION_MISMATCH", f"{b.source}: {b.detail}")
            if b.on_resume:
                return _resumed_unverified(state, b, ref, mismatch)
            return _noop(state, f"postcondition mismatch: {b.detail}", mismatch)
        if b.on_resume:
            return _resumed_unverified(state, b, ref)
        return _noop(state, f"postcondition not verifiable at {state.sink} ({b.status})")
    if b.status == "COMMITTED":
        return _committed(
            state,
            ref,
            Observation(b.source, "COMMITTED", b.observed_at_ms, b.on_resume, b.observer),
            effect_id=b.effect_id,
        )
    if b.status == "ABSENT":
        return _absent_retry(
            state,
            ref,
            Observation(b.source, "ABSENT", b.observed_at_ms, b.on_resume, b.observer),
        )
    if state.state != S.EFFECT_PENDING:
        return _noop(state, f"readback {b.status} noted while {state.state}")
    return _unknown(
        state,
        ref,
        Observation(b.source, b.status, b.observed_at_ms, b.on_resume, b.observer),
        why=f"readback {b.status}: {b.detail}",
    )


def _resumed_unverified(state: OperationState, b: Readback, ref: str, *extra: Output) -> Decision:
    """A resume's verification that did not verify: its recovery receipt says what is left.

    The state stays EFFECT_COMMITTED (a self-loop that counts the receipt);
    a mismatch is a person's to look at, an unverifiable postcondition (no
    query at the sink, or no answer) leaves the business outcome unproven.
    """
    mismatch = b.status == "MISMATCH"
    uncertainty = (
        f"the business outcome at {state.sink} does not match the committed effect: {b.detail}"
        if mismatch
        else f"whether the business outcome holds: the postcondition at {state.sink} was not "
        f"verified ({b.status}: {b.detail})"
    )
    receipt = _recovery_receipt(
        state,
        ref,
        Observation(b.source, f"POSTCONDITION {b.status}", b.observed_at_ms, True, b.observer),
        action="COMPLETE",
        effect_id=state.effect_id,
        postcondition=f"{b.status.lower()}: {b.detail}",
        uncertainty=uncertainty,
        owner="operator" if mismatch else None,
        release=(
            "a person's review of the mismatch"
            if mismatch
            else "a postcondition readback that matches, if the sink offers one"
        ),
    )
    return _move(
        state,
        STAY,
        ref,
        f"resumed verification: postcondition {b.status} ({b.source})",
        (receipt, *extra),
        reason=state.reason,
        recovery_receipts=state.recovery_receipts + 1,
    )
