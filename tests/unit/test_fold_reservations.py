"""The fold and the ends of a reservation: confirmed, cancelled, expired, each journaled."""

from __future__ import annotations

from ledger.events import EffectReceipt, OperationState, RecoveryReceipt
from ledger.fold import current_dispatch_id, decide, journal_entry
from ledger.states import RecoveryState as S
from tests import helpers

OP = "refund:c1:v1"


def admitted() -> OperationState:
    i = helpers.intent()
    state = decide(None, i, "intents:0:0").state
    state = decide(state, helpers.admission(i), "admissions:0:0").state
    assert state is not None and state.state == S.EFFECT_PENDING
    return state


def reservation_receipt(
    state: OperationState, status: str, reservation: str, detail: str, *, on_resume: bool = False
) -> EffectReceipt:
    return helpers.receipt(OP, current_dispatch_id(state), status, on_resume).model_copy(
        update={"reservation": reservation, "detail": detail}
    )


def test_a_cancelled_reservation_needs_reauthorisation_with_the_reason_and_no_effect() -> None:
    state = admitted()
    r = reservation_receipt(
        state, "CANCELLED", "CANCELLED", "hold cancelled at payments: approval ap-1 was revoked"
    )

    d = decide(state, r, "receipts:0:5")

    assert d.state is not None and d.state.state == S.NEEDS_REAUTHORISATION
    assert "revoked" in d.state.reason and "reservation cancelled" in d.state.reason
    assert d.state.effect_id is None
    assert d.state.reauthorisations == state.reauthorisations + 1
    entry = journal_entry(d, r, r.to_bytes(), "receipts", 0, 5)
    assert entry.outcome == "APPLIED" and entry.hops == ("EFFECT_PENDING->NEEDS_REAUTHORISATION",)
    assert "revoked" in entry.reason
    assert not [o for o in d.outputs if isinstance(o.event, RecoveryReceipt)]


def test_a_cancellation_met_on_resume_writes_a_recovery_receipt_for_reauthorisation() -> None:
    state = admitted()
    r = reservation_receipt(
        state, "CANCELLED", "CANCELLED", "policy version changed", on_resume=True
    )

    d = decide(state, r, "receipts:0:5")

    (receipt,) = [o.event for o in d.outputs if isinstance(o.event, RecoveryReceipt)]
    assert receipt.action == "REAUTHORISE" and receipt.effect_id is None
    assert d.state is not None and d.state.recovery_receipts == 1


def test_an_expired_hold_is_journaled_and_moves_nothing() -> None:
    state = admitted()
    r = reservation_receipt(state, "EXPIRED", "EXPIRED", "hold expired at payments; reserved again")

    d = decide(state, r, "receipts:0:5")

    assert d.outcome == "NOOP" and d.state is not None and d.state.state == S.EFFECT_PENDING
    entry = journal_entry(d, r, r.to_bytes(), "receipts", 0, 5)
    assert "released the reservation hold by itself" in entry.reason


def test_a_confirmed_reservation_commits_and_says_so() -> None:
    state = admitted()
    r = reservation_receipt(state, "COMMITTED", "CONFIRMED", "reservation confirmed at payments")

    d = decide(state, r, "receipts:0:5")

    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    assert "reservation confirmed" in d.reason


def test_a_cancellation_after_the_effect_committed_changes_nothing() -> None:
    state = admitted()
    committed = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "receipts:0:5").state
    assert committed is not None
    r = reservation_receipt(committed, "CANCELLED", "CANCELLED", "late")

    d = decide(committed, r, "receipts:0:6")

    assert d.outcome == "NOOP" and d.state is not None and d.state.state == S.EFFECT_COMMITTED


def test_a_new_approval_after_a_cancellation_admits_the_same_operation_again() -> None:
    state = admitted()
    r = reservation_receipt(state, "CANCELLED", "CANCELLED", "approval ap-1 was revoked")
    cancelled = decide(state, r, "receipts:0:5").state
    fresh = helpers.intent(approval="ap-2")

    d = decide(cancelled, fresh, "intents:0:9")

    assert d.state is not None and d.state.state == S.NOT_ADMITTED
    assert [o.topic for o in d.outputs] == ["admission-requests"]
