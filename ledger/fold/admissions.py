"""Admission decisions: admitted and dispatched (two hops), or reauthorisation needed."""

from __future__ import annotations

from typing import TypedDict

from ledger.events import AdmissionDecision, OperationState
from ledger.fold.core import Decision, _dispatch, _move, _noop, _refuse
from ledger.states import RecoveryState as S


class _AdmittedFields(TypedDict):
    epoch: int
    admitted_approval_id: str
    admitted_policy_version: int
    admitted_at_ms: int
    approval_expires_at_ms: int | None


def _admission(state: OperationState, d: AdmissionDecision, ref: str) -> Decision:
    """Admit and dispatch the pending operation, or send it for reauthorisation."""
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
    if not d.admitted:
        return _move(
            state,
            S.NEEDS_REAUTHORISATION,
            ref,
            d.reason,
            reauthorisations=state.reauthorisations + 1,
        )
    admission = _AdmittedFields(
        epoch=state.epoch + 1,
        admitted_approval_id=d.approval_id,
        admitted_policy_version=d.policy_version,
        admitted_at_ms=d.evaluated_at_ms,
        approval_expires_at_ms=d.approval_expires_at_ms,
    )
    out, n = _dispatch(state.model_copy(update=dict(admission)), "EXECUTE")
    # Admitted, then dispatched in the same transaction (the outbox): two hops.
    return _move(
        state,
        (S.ADMITTED, S.EFFECT_PENDING),
        ref,
        f"admitted under approval {d.approval_id} (policy {d.policy_version}); dispatched",
        (out,),
        **admission,
        dispatches=n,
    )
