"""The pure fold: each guarded transition, refusals, and replay."""

from __future__ import annotations

import pytest

from ledger.events import Event, OperationState
from ledger.fold import Decision, current_dispatch_id, decide, journal_entry, replay
from ledger.states import RecoveryState as S
from tests import helpers

OP = "refund:c1:v1"


def run(events: list[Event]) -> tuple[OperationState | None, list[Decision]]:
    state: OperationState | None = None
    decisions = []
    for n, event in enumerate(events):
        d = decide(state, event, f"t:0:{n}")
        decisions.append(d)
        state = d.state
    return state, decisions


def admitted() -> OperationState:
    i = helpers.intent()
    state, _ = run([i, helpers.admission(i)])
    assert state is not None
    return state


def test_intent_creates_not_admitted_and_requests_admission() -> None:
    d = decide(None, helpers.intent(), "intents:0:0")
    assert d.state is not None and d.state.state == S.NOT_ADMITTED and d.state.version == 1
    assert [o.topic for o in d.outputs] == ["admission-requests"]
    assert d.outputs[0].key == "ap-1"


def test_admission_dispatches_with_epoch_as_fencing_token() -> None:
    state = admitted()
    assert state.state == S.EFFECT_PENDING
    assert state.epoch == 1 and state.admitted_approval_id == "ap-1"
    i = helpers.intent()
    _, ds = run([i, helpers.admission(i)])
    dispatch = ds[1].outputs[0].event
    assert dispatch.kind == "EXECUTE" and dispatch.fencing_token == 1


def test_rejected_admission_needs_reauthorisation_with_reason() -> None:
    i = helpers.intent()
    state, _ = run([i, helpers.admission(i, admitted=False, reason="approval has expired")])
    assert state is not None
    assert state.state == S.NEEDS_REAUTHORISATION and state.reason == "approval has expired"
    assert state.reauthorisations == 1


def test_receipt_commits_then_postcondition_verifies() -> None:
    state = admitted()
    d = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "receipts:0:1")
    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    verify = [o.event for o in d.outputs if o.topic == "dispatches"]
    assert [v.kind for v in verify] == ["VERIFY"]
    d2 = decide(
        d.state,
        helpers.readback(OP, current_dispatch_id(d.state), "MATCH", kind="POSTCONDITION"),
        "readbacks:0:1",
    )
    assert d2.state is not None and d2.state.state == S.OUTCOME_VERIFIED


def test_postcondition_mismatch_keeps_operation_out_of_verified() -> None:
    state = admitted()
    state = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:1").state
    assert state is not None
    d = decide(
        state,
        helpers.readback(OP, current_dispatch_id(state), "MISMATCH", "POSTCONDITION"),
        "b:0:1",
    )
    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    assert any(o.event.kind == "POSTCONDITION_MISMATCH" for o in d.outputs)


def test_readback_on_resume_writes_recovery_receipt() -> None:
    state = admitted()
    d = decide(
        state, helpers.readback(OP, current_dispatch_id(state), on_resume=True), "readbacks:0:2"
    )
    receipts = [o.event for o in d.outputs if o.topic == "recovery-receipts"]
    assert len(receipts) == 1
    r = receipts[0]
    assert r.action == "COMPLETE" and r.parameter_digest == state.parameter_digest
    assert "prior admission" in r.authority and r.checkpoint_version == state.version


def test_ambiguous_receipt_holds_unknown_outcome_and_queues_reconciliation() -> None:
    state = admitted()
    d = decide(state, helpers.receipt(OP, current_dispatch_id(state), "AMBIGUOUS"), "r:0:1")
    assert d.state is not None and d.state.state == S.UNKNOWN_OUTCOME
    assert [o.topic for o in d.outputs if o.topic == "reconciliation"] == ["reconciliation"]
    # A later ambiguous note does not move it, and nothing is dispatched.
    d2 = decide(d.state, helpers.receipt(OP, current_dispatch_id(d.state), "AMBIGUOUS"), "r:0:2")
    assert d2.outcome == "NOOP" and not any(o.topic == "dispatches" for o in d2.outputs)


def test_absent_readback_re_executes_the_same_admitted_operation() -> None:
    state = admitted()
    d = decide(
        state, helpers.readback(OP, current_dispatch_id(state), "ABSENT", on_resume=True), "b:0:1"
    )
    assert d.state is not None and d.state.state == S.EFFECT_PENDING
    dispatches = [o.event for o in d.outputs if o.topic == "dispatches"]
    assert len(dispatches) == 1 and dispatches[0].kind == "EXECUTE"
    assert dispatches[0].parameter_digest == state.parameter_digest
    assert any(o.topic == "recovery-receipts" and o.event.action == "EXECUTE" for o in d.outputs)


def test_parameter_drift_is_refused_and_state_untouched() -> None:
    state = admitted()
    drifted = helpers.intent(amount=7000)
    d = decide(state, drifted, "intents:0:9")
    assert d.outcome == "REFUSED" and d.state == state
    assert [o.event.kind for o in d.outputs] == ["PARAMETER_DRIFT"]


def test_republish_naming_another_sink_is_drift_with_an_operating_event() -> None:
    state = admitted()
    elsewhere = helpers.intent(sink="refunds")
    d = decide(state, elsewhere, "intents:0:9")
    assert d.outcome == "REFUSED" and d.state == state
    assert [o.event.kind for o in d.outputs] == ["PARAMETER_DRIFT"]
    assert "sink refunds" in d.outputs[0].event.reason


def test_an_operation_recorded_with_a_version_1_digest_keeps_working() -> None:
    # Intents of earlier releases carry a digest without the sink (version 1).
    old = helpers.intent(digest_version=1)
    assert len(old.parameter_digest) == 64
    state, _ = run([old, helpers.admission(old)])
    assert state is not None and state.state == S.EFFECT_PENDING
    # A newer publisher re-sends the same request (a version-2 digest): not drift.
    same = decide(state, helpers.intent(), "intents:0:9")
    assert same.outcome != "REFUSED" and same.state == state
    # Another sink is drift even though a version-1 digest does not bind it.
    for other in (helpers.intent(sink="refunds"), helpers.intent(sink="refunds", digest_version=1)):
        d = decide(state, other, "intents:0:10")
        assert d.outcome == "REFUSED" and [o.event.kind for o in d.outputs] == ["PARAMETER_DRIFT"]
    # Other parameters under version 2 are drift too.
    d = decide(state, helpers.intent(amount=7000), "intents:0:11")
    assert d.outcome == "REFUSED"


def test_bad_digest_is_refused_as_bad_input() -> None:
    forged = helpers.intent().model_copy(update={"parameter_digest": "0" * 64})
    d = decide(None, forged, "intents:0:1")
    assert d.outcome == "REFUSED" and d.state is None
    assert d.outputs[0].event.kind == "BAD_INPUT"


@pytest.mark.parametrize(
    "op", ["refund:26\n:v1", "refund 1:v1", "refund:\u202e1:v1", "refund:\x00:v1", "r" * 201, ""]
)
def test_intent_with_an_operation_id_outside_the_grammar_is_refused(op: str) -> None:
    d = decide(None, helpers.intent(op=op), "intents:0:1")
    assert d.outcome == "REFUSED" and d.state is None
    assert [o.event.kind for o in d.outputs] == ["BAD_INPUT"]
    assert "operation ID" in d.outputs[0].event.reason


def test_effect_for_unadmitted_operation_is_a_forbidden_transition() -> None:
    state = decide(None, helpers.intent(), "i:0:0").state
    assert state is not None
    d = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:1")
    assert d.outcome == "REFUSED" and d.state == state
    event = d.outputs[0].event
    assert event.kind == "FORBIDDEN_TRANSITION"
    assert event.attempted_transition == "NOT_ADMITTED->EFFECT_COMMITTED"


def test_unknown_operation_is_refused() -> None:
    d = decide(None, helpers.claim("nope", "w", 1), "claims:0:0")
    assert d.outcome == "REFUSED" and d.outputs[0].event.kind == "UNKNOWN_OPERATION"


def test_claims_are_compare_and_swap_and_bump_the_epoch() -> None:
    state = admitted()
    v = state.version
    a = decide(state, helpers.claim(OP, "a", v), "c:0:1")
    assert a.outcome == "APPLIED" and a.state is not None
    assert a.state.epoch == state.epoch + 1 and a.state.owner == "a"
    b = decide(a.state, helpers.claim(OP, "b", v), "c:0:2")
    assert b.outcome == "REFUSED" and b.state == a.state
    readbacks = [o.event for o in a.outputs if o.topic == "dispatches"]
    assert readbacks and readbacks[0].kind == "READBACK"
    assert readbacks[0].fencing_token == a.state.epoch


def test_reauthorisation_with_new_approval_is_not_drift() -> None:
    i = helpers.intent()
    state, _ = run([i, helpers.admission(i, admitted=False, reason="policy version changed")])
    again = helpers.intent(approval="ap-2")
    d = decide(state, again, "i:0:5")
    assert d.outcome == "APPLIED" and d.state is not None
    assert d.state.state == S.NOT_ADMITTED and d.state.approval_id == "ap-2"
    assert d.outputs[0].key == "ap-2"


def test_replay_of_journal_reproduces_state() -> None:
    i = helpers.intent()
    events: list[Event] = [i, helpers.admission(i)]
    state, decisions = run(events)
    assert state is not None
    events.append(helpers.receipt(OP, current_dispatch_id(state)))
    state2 = decide(state, events[-1], "t:0:2")
    decisions.append(state2)
    entries = [
        journal_entry(d, e, e.to_bytes(), "t", 0, n)
        for n, (d, e) in enumerate(zip(decisions, events, strict=True))
    ]
    assert replay(entries)[OP] == state2.state


def test_only_unavailable_answers_count_towards_giving_up() -> None:
    from ledger.fold import MAX_ABSENT_RETRIES, MAX_UNAVAILABLE

    # Absences observed by readback (the request may never have left) never
    # abandon: the same admitted operation is executed again each time (up to
    # its own budget, see test_fold_budgets).
    state = admitted()
    for n in range(MAX_ABSENT_RETRIES):
        d = decide(state, helpers.readback(OP, current_dispatch_id(state), "ABSENT"), f"r:0:{n}")
        assert d.state is not None and d.state.state == S.EFFECT_PENDING
        assert [o.event.kind for o in d.outputs if o.topic == "dispatches"] == ["EXECUTE"]
        state = d.state
    assert state.unavailable == 0
    # A sink that keeps answering "unavailable" is given up on.
    for n in range(MAX_UNAVAILABLE):
        d = decide(
            state, helpers.receipt(OP, current_dispatch_id(state), "UNAVAILABLE"), f"u:0:{n}"
        )
        assert d.state is not None
        state = d.state
    assert state.state == S.ABANDONED and state.unavailable == MAX_UNAVAILABLE
    assert "unavailable 5 times" in state.reason


def test_an_unavailable_answer_does_not_release_an_unknown_outcome() -> None:
    """A 503 on a resumed request is not a readback: the held operation stays held
    (found by the fold property test: AMBIGUOUS, then UNAVAILABLE on resume)."""
    state = admitted()
    held = decide(state, helpers.receipt(OP, current_dispatch_id(state), "AMBIGUOUS"), "r:0:1")
    assert held.state is not None and held.state.state == S.UNKNOWN_OUTCOME
    unavailable = helpers.receipt(OP, current_dispatch_id(held.state), "UNAVAILABLE", True)
    d = decide(held.state, unavailable, "r:0:2")
    assert d.outcome == "NOOP" and not any(o.topic == "dispatches" for o in d.outputs)
    # An ABSENT readback still releases it (the same admitted operation again).
    b = helpers.readback(OP, current_dispatch_id(held.state), "ABSENT", on_resume=True)
    again = decide(held.state, b, "b:0:3")
    assert again.state is not None and again.state.state == S.EFFECT_PENDING


def test_a_remembered_digest_check_never_passes_a_forged_or_drifted_intent() -> None:
    # The fold remembers digest checks it made (a pure function of the
    # intent's fields); an intent that differs in any field the check reads
    # is checked on its own, and a drifted re-publication is still refused.
    from ledger.fold import intent_digest_problem

    good = helpers.intent()
    assert intent_digest_problem(good) is None
    assert intent_digest_problem(good) is None  # remembered
    forged = [
        good.model_copy(update={"params_json": good.params_json.replace("5000", "5001")}),
        good.model_copy(update={"amount_minor": 1}),
        good.model_copy(update={"sink": "refunds"}),
        good.model_copy(update={"subject": "customer-2"}),
        good.model_copy(update={"parameter_digest": "v2:" + "0" * 64}),
    ]
    for intent in forged:
        assert intent_digest_problem(intent) is not None, intent
    recorded = decide(None, good, "intents:0:1").state
    drifted = helpers.intent(amount=7000)
    d = decide(recorded, drifted, "intents:0:2")
    assert d.outcome == "REFUSED" and "DRIFT" in str(d.outputs[0].event)
