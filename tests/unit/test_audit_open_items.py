"""The audit's open items: what an operator must look at, and why."""

from __future__ import annotations

from ledger.audit import open_items
from ledger.events import OperationState
from ledger.states import RecoveryState as S
from tests import helpers


def _state(op: str, state: S, reason: str = "r") -> OperationState:
    return helpers.state(op, state, reason=reason)


def test_a_committed_effect_the_postcondition_contradicted_is_open() -> None:
    """Committed by a disposition, then the sink's postcondition says otherwise: nothing
    in the ledger moves it on, so the audit lists it (after the other open states)."""
    states = {
        "refund:held:v1": _state("refund:held:v1", S.UNKNOWN_OUTCOME),
        "refund:disposed:v1": _state(
            "refund:disposed:v1", S.EFFECT_COMMITTED, "committed by disposition of ops-alex"
        ),
        "refund:on-its-way:v1": _state("refund:on-its-way:v1", S.EFFECT_COMMITTED),
        "refund:done:v1": _state("refund:done:v1", S.OUTCOME_VERIFIED),
    }
    mismatched = {
        "refund:disposed:v1": "account a8 shows 0 credit(s)",
        "refund:done:v1": "an earlier mismatch, since verified",
    }
    items = open_items(states, {}, 0, mismatched)
    assert [(i.operation_id, i.state) for i in items] == [
        ("refund:held:v1", "UNKNOWN_OUTCOME"),
        ("refund:disposed:v1", "EFFECT_COMMITTED"),
    ]
    assert "account a8 shows 0 credit(s)" in items[1].reason
    assert "ops-alex" in items[1].reason
    # Without the operating events, only the resting states are open.
    assert [i.operation_id for i in open_items(states, {}, 0)] == ["refund:held:v1"]
