"""Admission decisions: admitted and dispatched (two hops), or reauthorisation needed.

A decision names the admission request it answers (``request_state_version``,
the request's ``state_version``) and is applied only while that request is
pending: the operation is NOT_ADMITTED in the episode the request was
written in (``entered_version``; for a state written before schema version 5,
its current version). An authentic decision appended again later (after a
cancelled reservation sent the operation back for a new approval, say)
changes nothing and is reported (``REPLAYED``). A decision written before
schema version 2 names no request: it applies only to a request pending
since before this release (a state without ``entered_version``).
"""

from __future__ import annotations

from typing import TypedDict

from ledger.events import AdmissionDecision, OperationState
from ledger.fold.core import (
    Decision,
    Observation,
    Output,
    _dispatch,
    _move,
    _noop,
    _recovery_receipt,
    _refuse,
    _replayed,
    dispatch_id,
)
from ledger.states import RecoveryState as S


class _AdmittedFields(TypedDict):
    epoch: int
    admitted_approval_id: str
    admitted_policy_version: int
    admitted_at_ms: int
    approval_expires_at_ms: int | None


def _resume_observation(
    state: OperationState, d: AdmissionDecision, resumed_by: str
) -> Observation:
    """What a resumer knows of the effect of an operation still waiting for admission.

    The dispatch is written atomically with the admission (the outbox), and
    the operation's state (NOT_ADMITTED, no dispatch) says none was: the
    ledger's own record is the authoritative source that no request left.
    """
    return Observation(
        f"ledger outbox: no dispatch written before the resume (state {state.state} at "
        f"version {state.version}, {state.dispatches} dispatches)",
        "ABSENT",
        d.evaluated_at_ms,
        True,
        resumed_by,
    )


def _unanswered(state: OperationState, d: AdmissionDecision) -> str | None:
    """What ``d`` answers when it is not the request pending for ``state`` (else ``None``).

    Args:
        state: the operation, NOT_ADMITTED.
        d: an admission decision for its approval and digest.

    Returns:
        ``None`` when ``d`` answers the pending request; else what it
        answers, in words (``the request of state version 3``).
    """
    pending = state.entered_version
    if d.request_state_version is None:
        if pending is None:
            return None  # both written before requests were named: as before
        return "no request (written before decisions named the request they answer)"
    if d.request_state_version == (state.version if pending is None else pending):
        return None
    return f"the request of state version {d.request_state_version}"


def _admission(
    state: OperationState, d: AdmissionDecision, ref: str, *, resumed_by: str | None = None
) -> Decision:
    """Admit and dispatch the pending operation, or send it for reauthorisation.

    ``resumed_by``: a restarted processor resumes the operation with this
    decision (see :func:`~ledger.fold.decide`); the decision writes a
    recovery receipt (EXECUTE when admitted, REAUTHORISE when refused).
    """
    if state.state != S.NOT_ADMITTED:
        return _noop(state, f"admission decision ignored: operation is {state.state}")
    if d.approval_id != state.approval_id or d.parameter_digest != state.parameter_digest:
        return _refuse(
            state,
            ref,
            state.operation_id,
            "BAD_INPUT",
            f"admission decision for approval {d.approval_id} does not match the pending "
            f"request (approval {state.approval_id})",
        )
    problem = _unanswered(state, d)
    if problem is not None:
        return _replayed(
            state,
            ref,
            f"admission decision ({'admitted' if d.admitted else 'refused'}) by {d.decided_by}",
            problem,
            "The pending request waits for the authority kernel's answer to it; if none comes, "
            "check that the kernel runs this release (decisions name their request), or "
            "re-publish the intent with a new approval after reauthorisation",
        )
    receipts: list[Output] = []
    if not d.admitted:
        if resumed_by is not None:
            receipts.append(
                _recovery_receipt(
                    state,
                    ref,
                    _resume_observation(state, d, resumed_by),
                    action="REAUTHORISE",
                    effect_id=None,
                    postcondition="not checked: nothing dispatched",
                    claimant=resumed_by,
                    authority=(
                        f"admission refused by {d.decided_by} under approval {d.approval_id} "
                        f"(policy {d.policy_version}): {d.reason}"
                    ),
                    release="a new approval for this operation (reauthorisation)",
                )
            )
        return _move(
            state,
            S.NEEDS_REAUTHORISATION,
            ref,
            d.reason,
            receipts,
            reauthorisations=state.reauthorisations + 1,
            recovery_receipts=state.recovery_receipts + len(receipts),
        )
    admission = _AdmittedFields(
        epoch=state.epoch + 1,
        admitted_approval_id=d.approval_id,
        admitted_policy_version=d.policy_version,
        admitted_at_ms=d.evaluated_at_ms,
        approval_expires_at_ms=d.approval_expires_at_ms,
    )
    admitted = state.model_copy(update=dict(admission))
    out, n = _dispatch(admitted, "EXECUTE")
    if resumed_by is not None:
        receipts.append(
            _recovery_receipt(
                admitted.model_copy(update={"version": state.version}),
                ref,
                _resume_observation(state, d, resumed_by),
                action="EXECUTE",
                effect_id=None,
                postcondition=f"pending: effect dispatched ({dispatch_id(admitted, n)})",
                claimant=resumed_by,
            )
        )
    # Admitted, then dispatched in the same transaction (the outbox): two hops.
    return _move(
        state,
        (S.ADMITTED, S.EFFECT_PENDING),
        ref,
        f"admitted under approval {d.approval_id} (policy {d.policy_version}); dispatched"
        + (f" on resume by {resumed_by}" if resumed_by is not None else ""),
        (*receipts, out),
        **admission,
        dispatches=n,
        recovery_receipts=state.recovery_receipts + len(receipts),
    )
