"""Claims: a resumer fences the operation (compare-and-swap on its version)."""

from __future__ import annotations

from ledger.events import Claim, DispatchKind, OperationState
from ledger.fold.core import STAY, Decision, Output, _dispatch, _move, _refuse
from ledger.states import IN_FLIGHT
from ledger.states import RecoveryState as S


def _claim(state: OperationState, c: Claim, ref: str) -> Decision:
    """Fence a resumer in (new epoch and owner) and read the effect back first."""
    if c.expected_version != state.version:
        return _refuse(
            state,
            ref,
            state.operation_id,
            "STALE_CLAIM",
            f"claim by {c.worker} rejected: it read version {c.expected_version}, "
            f"current is {state.version}",
        )
    claimed = state.model_copy(update={"epoch": state.epoch + 1, "owner": c.worker})
    outputs: list[Output] = []
    n = state.dispatches
    if S(state.state) in IN_FLIGHT and state.state != S.ADMITTED:
        kind: DispatchKind = "VERIFY" if state.state == S.EFFECT_COMMITTED else "READBACK"
        out, n = _dispatch(claimed, kind, on_resume=True)
        outputs.append(out)
    # A claim is a self-loop: it fences (new epoch and owner), the recovery
    # state and its reason stay as they were.
    return _move(
        state,
        STAY,
        ref,
        f"claim by {c.worker} accepted at version {state.version}; fencing token now "
        f"{claimed.epoch}",
        outputs,
        epoch=claimed.epoch,
        owner=c.worker,
        dispatches=n,
        reason=state.reason,
    )
