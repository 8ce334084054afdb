"""A recovery receipt for every resume (issue 14 item 4), in the pure fold."""

from __future__ import annotations

from ledger.events import Dispatch, OperationState, RecoveryReceipt
from ledger.fold import current_dispatch_id, decide, journal_entry, replay
from ledger.states import RecoveryState as S
from tests import helpers

OP = "refund:c1:v1"


def receipts_of(decision_outputs: tuple) -> list[RecoveryReceipt]:  # type: ignore[type-arg]
    return [o.event for o in decision_outputs if isinstance(o.event, RecoveryReceipt)]


def waiting() -> OperationState:
    d = decide(None, helpers.intent(), "intents:0:0")
    assert d.state is not None and d.state.state == S.NOT_ADMITTED
    return d.state


def test_admission_met_by_a_restarted_processor_writes_one_execute_receipt() -> None:
    state = waiting()
    d = decide(
        state, helpers.admission(helpers.intent()), "admissions:0:4", resumed_by="processor-1"
    )
    assert d.state is not None and d.state.state == S.EFFECT_PENDING
    (r,) = receipts_of(d.outputs)
    assert r.action == "EXECUTE" and r.claimant == "processor-1"
    assert r.checkpoint_version == state.version
    assert r.observation_status == "ABSENT" and "no dispatch" in r.observation_source
    assert "prior admission" in r.authority and r.authority_policy_version == 1
    assert r.postcondition.startswith("pending") and r.uncertainty == "none"
    assert d.state.recovery_receipts == 1
    dispatches = [o.event for o in d.outputs if isinstance(o.event, Dispatch)]
    assert [x.kind for x in dispatches] == ["EXECUTE"]
    assert r.postcondition.endswith(f"({dispatches[0].dispatch_id})")


def test_admission_without_a_resume_writes_no_receipt() -> None:
    d = decide(waiting(), helpers.admission(helpers.intent()), "admissions:0:4")
    assert receipts_of(d.outputs) == [] and d.state is not None
    assert d.state.recovery_receipts == 0


def test_refused_admission_on_resume_writes_a_reauthorise_receipt() -> None:
    refused = helpers.admission(helpers.intent(), admitted=False, reason="approval has expired")
    d = decide(waiting(), refused, "admissions:0:4", resumed_by="processor-0")
    assert d.state is not None and d.state.state == S.NEEDS_REAUTHORISATION
    (r,) = receipts_of(d.outputs)
    assert r.action == "REAUTHORISE" and "approval has expired" in r.authority
    assert r.release_condition is not None and d.state.recovery_receipts == 1


def test_replay_decides_the_resume_from_the_journal() -> None:
    i = helpers.intent()
    first = decide(None, i, "intents:0:0")
    a = helpers.admission(i)
    second = decide(first.state, a, "admissions:0:1", resumed_by="processor-2")
    entries = [
        journal_entry(first, i, i.to_bytes(), "intents", 0, 0),
        journal_entry(second, a, a.to_bytes(), "admissions", 0, 1, resumed_by="processor-2"),
    ]
    assert entries[1].resumed_by == "processor-2"
    assert replay(entries)[OP] == second.state


def effect_pending() -> OperationState:
    d = decide(waiting(), helpers.admission(helpers.intent()), "admissions:0:1")
    assert d.state is not None
    return d.state


def test_a_resumed_readback_of_a_committed_effect_writes_exactly_one_receipt() -> None:
    state = effect_pending()
    rb = helpers.readback(OP, current_dispatch_id(state), on_resume=True)
    committed = decide(state, rb, "readbacks:0:2")
    assert committed.state is not None and committed.state.state == S.EFFECT_COMMITTED
    (r,) = receipts_of(committed.outputs)
    assert r.action == "COMPLETE" and r.observation_status == "COMMITTED"
    verify = [o.event for o in committed.outputs if isinstance(o.event, Dispatch)]
    assert [v.kind for v in verify] == ["VERIFY"] and not verify[0].on_resume
    # Its verification is the ordinary one: the answer writes no second receipt.
    match = helpers.readback(OP, verify[0].dispatch_id, "MATCH", "POSTCONDITION", on_resume=False)
    verified = decide(committed.state, match, "readbacks:0:3")
    assert verified.state is not None and verified.state.state == S.OUTCOME_VERIFIED
    assert receipts_of(verified.outputs) == [] and verified.state.recovery_receipts == 1


def committed() -> OperationState:
    state = effect_pending()
    d = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "receipts:0:2")
    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    return d.state


def test_a_resumed_verification_that_matches_writes_a_verified_receipt() -> None:
    state = committed()
    rb = helpers.readback(OP, current_dispatch_id(state), "MATCH", "POSTCONDITION", on_resume=True)
    d = decide(state, rb, "readbacks:0:3")
    (r,) = receipts_of(d.outputs)
    assert r.action == "COMPLETE" and r.postcondition.startswith("verified")
    assert r.effect_id == "payments-1" and r.uncertainty == "none"


def test_a_resumed_verification_that_cannot_verify_still_writes_its_receipt() -> None:
    state = committed()
    rb = helpers.readback(
        OP, current_dispatch_id(state), "UNSUPPORTED", "POSTCONDITION", on_resume=True
    )
    d = decide(state, rb, "readbacks:0:3")
    assert d.outcome == "APPLIED" and d.state is not None
    assert d.state.state == S.EFFECT_COMMITTED and d.state.recovery_receipts == 1
    (r,) = receipts_of(d.outputs)
    assert r.action == "COMPLETE" and r.observation_status == "POSTCONDITION UNSUPPORTED"
    assert "not verified" in r.uncertainty
    # Not on resume: nothing to report, as before.
    plain = helpers.readback(OP, current_dispatch_id(state), "UNSUPPORTED", "POSTCONDITION")
    assert decide(state, plain, "readbacks:0:4").outcome == "NOOP"


def test_a_resumed_verification_that_mismatches_names_an_owner() -> None:
    state = committed()
    rb = helpers.readback(
        OP, current_dispatch_id(state), "MISMATCH", "POSTCONDITION", on_resume=True
    )
    d = decide(state, rb, "readbacks:0:3")
    (r,) = receipts_of(d.outputs)
    assert r.uncertainty_owner == "operator" and "does not match" in r.uncertainty
    kinds = [o.event.kind for o in d.outputs if o.topic == "operating-events"]  # type: ignore[union-attr]
    assert kinds == ["POSTCONDITION_MISMATCH"]
