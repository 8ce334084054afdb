"""Per-operation failures as the pure core decides them (issue 11, item 6).

* an intent for a sink that is not registered is refused before admission
  (no state, no admission request), and replay refuses it the same way;
* a sink the relay could not reach (``UNREACHABLE``) holds the operation in
  UNKNOWN_OUTCOME with its admission intact;
* repeated ABSENT readbacks have a re-execution budget, then hold;
* the relay's retry of a request that never left: backoff, then hold.
"""

from __future__ import annotations

import pytest

from ledger.contracts import RetryBudget, after_unreached
from ledger.errors import LedgerError
from ledger.events import Disposition, OperatingEvent, OperationState
from ledger.fold import (
    MAX_ABSENT_RETRIES,
    MAX_UNAVAILABLE,
    Decision,
    current_dispatch_id,
    decide,
    journal_entry,
    replay,
    replay_decisions,
)
from ledger.states import RecoveryState as S
from ledger.states import allowed
from tests import helpers

OP = "refund:c1:v1"
PROBLEM = "sink 'paymnets' is not registered in /run/sinks.json (registered: payments)"


def admitted() -> OperationState:
    i = helpers.intent()
    state = decide(None, i, "i:0:0").state
    state = decide(state, helpers.admission(i), "a:0:0").state
    assert state is not None and state.state == S.EFFECT_PENDING
    return state


def op_events(d: Decision) -> list[OperatingEvent]:
    return [o.event for o in d.outputs if isinstance(o.event, OperatingEvent)]


def hops_allowed(d: Decision) -> bool:
    return all(allowed(*hop) for hop in d.hops)


# ---------------------------------------------------------------- unknown sink


def test_an_intent_for_an_unregistered_sink_is_refused_before_admission() -> None:
    d = decide(None, helpers.intent(), "intents:0:0", sink_problem=PROBLEM)
    assert d.outcome == "REFUSED" and d.state is None
    assert not [o for o in d.outputs if o.topic == "admission-requests"]
    (event,) = op_events(d)
    assert event.kind == "UNKNOWN_SINK" and event.operation_id == OP
    assert PROBLEM in event.reason and "approval ap-1 was not used" in event.reason
    assert "publish the intent again" in event.reason


def test_the_same_operation_id_is_free_after_the_refusal() -> None:
    refused = decide(None, helpers.intent(), "intents:0:0", sink_problem=PROBLEM)
    again = decide(refused.state, helpers.intent(), "intents:0:1")
    assert again.outcome == "APPLIED" and again.state is not None
    assert [o.topic for o in again.outputs] == ["admission-requests"]


def test_a_reauthorisation_for_an_unregistered_sink_is_refused_too() -> None:
    i = helpers.intent()
    state = decide(None, i, "i:0:0").state
    state = decide(state, helpers.admission(i, admitted=False, reason="expired"), "a:0:0").state
    assert state is not None and state.state == S.NEEDS_REAUTHORISATION
    renewed = helpers.intent(approval="ap-2")
    d = decide(state, renewed, "i:0:1", sink_problem=PROBLEM)
    assert d.outcome == "REFUSED" and d.state == state
    assert "approval ap-2 was not used" in op_events(d)[0].reason
    ok = decide(state, renewed, "i:0:2")
    assert ok.outcome == "APPLIED" and ok.state is not None and ok.state.state == S.NOT_ADMITTED


def test_a_duplicate_of_a_known_operation_stays_a_no_op() -> None:
    state = admitted()
    d = decide(state, helpers.intent(), "i:0:9", sink_problem=PROBLEM)
    assert d.outcome == "NOOP" and not d.outputs


def test_replay_refuses_with_the_recorded_observation() -> None:
    i = helpers.intent()
    refused = decide(None, i, "intents:0:0", sink_problem=PROBLEM)
    applied = decide(None, i, "intents:0:1")
    entries = [
        journal_entry(refused, i, i.to_bytes(), "intents", 0, 0, sink_problem=PROBLEM),
        journal_entry(applied, i, i.to_bytes(), "intents", 0, 1),
    ]
    assert entries[0].sink_problem == PROBLEM
    _, steps = replay_decisions(entries)
    assert [step[3].outcome for step in steps] == ["REFUSED", "APPLIED"]
    assert replay(entries)[OP] == applied.state


# ---------------------------------------------------------------- unreachable sink


def test_an_unreachable_sink_holds_the_operation_with_its_admission() -> None:
    state = admitted()
    r = helpers.receipt(OP, current_dispatch_id(state), "UNREACHABLE")
    r = r.model_copy(update={"detail": "ConnectError: refused; tried 6 times over 15.5 s"})
    d = decide(state, r, "receipts:0:1")
    assert d.state is not None and d.state.state == S.UNKNOWN_OUTCOME and hops_allowed(d)
    assert d.state.admitted_approval_id == "ap-1"
    assert d.state.observation_status == "UNREACHABLE"
    assert "could not be reached (ConnectError: refused" in d.state.reason
    assert d.state.reason.startswith("held for a person: payments could not be reached")
    assert "The request never left" in d.state.reason and "reconcile run" in d.state.reason
    assert [o.topic for o in d.outputs] == ["reconciliation"]
    # Once the sink is back, a readback that finds it absent executes it again.
    back = decide(d.state, helpers.readback(OP, current_dispatch_id(d.state), "ABSENT"), "b:0:1")
    assert back.state is not None and back.state.state == S.EFFECT_PENDING
    assert [(a.value, b.value) for a, b in back.hops] == [
        ("UNKNOWN_OUTCOME", "ADMITTED"),
        ("ADMITTED", "EFFECT_PENDING"),
    ]


def test_an_unreachable_receipt_after_the_operation_moved_on_is_noted_only() -> None:
    state = admitted()
    committed = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:1").state
    assert committed is not None
    d = decide(
        committed, helpers.receipt(OP, current_dispatch_id(committed), "UNREACHABLE"), "r:0:2"
    )
    assert d.outcome == "NOOP"


def test_giving_up_on_an_unavailable_sink_says_so() -> None:
    state = admitted()
    for n in range(MAX_UNAVAILABLE):
        d = decide(
            state, helpers.receipt(OP, current_dispatch_id(state), "UNAVAILABLE"), f"u:0:{n}"
        )
        assert d.state is not None
        state = d.state
    assert state.state == S.ABANDONED
    (event,) = op_events(d)
    assert event.kind == "SINK_UNAVAILABLE" and "unavailable 5 times" in event.reason


# ---------------------------------------------------------------- absent budget


def absent(state: OperationState, n: int, *, on_resume: bool = False) -> Decision:
    rb = helpers.readback(OP, current_dispatch_id(state), "ABSENT", on_resume=on_resume)
    return decide(state, rb, f"readbacks:0:{n}")


def test_absences_re_execute_within_the_budget_then_hold() -> None:
    state = admitted()
    for n in range(MAX_ABSENT_RETRIES):
        d = absent(state, n, on_resume=True)
        assert d.state is not None and d.state.state == S.EFFECT_PENDING
        assert d.state.absent_retries == n + 1
        assert [o.event.kind for o in d.outputs if o.topic == "dispatches"] == ["EXECUTE"]
        state = d.state
    d = absent(state, 99, on_resume=True)
    assert d.state is not None and d.state.state == S.UNKNOWN_OUTCOME and hops_allowed(d)
    assert not [o for o in d.outputs if o.topic == "dispatches"]
    assert f"after {MAX_ABSENT_RETRIES} re-executions" in d.state.reason
    (event,) = op_events(d)
    assert event.kind == "ABSENT_RETRIES_EXHAUSTED" and "reconcile dispose" in event.reason
    assert {o.topic for o in d.outputs} >= {"reconciliation", "recovery-receipts"}


def test_a_held_operation_past_the_budget_is_released_only_by_a_person() -> None:
    state = admitted()
    for n in range(MAX_ABSENT_RETRIES + 1):
        d = absent(state, n)
        assert d.state is not None
        state = d.state
    assert state.state == S.UNKNOWN_OUTCOME
    again = absent(state, 50)  # a reconciler's or a resume's readback
    assert again.outcome == "NOOP" and again.state == state
    assert [e.kind for e in op_events(again)] == ["ABSENT_RETRIES_EXHAUSTED"]
    disposition = Disposition(
        disposition_id="d1",
        operation_id=OP,
        decision="ABSENT",
        by="operator-1",
        evidence="relay fixed",
        disposed_at_ms=5000,
        episode=state.entered_version,
    )
    released = decide(state, disposition, "dispositions:0:0")
    assert released.state is not None and released.state.state == S.EFFECT_PENDING
    assert released.state.absent_retries == 0
    assert [o.event.kind for o in released.outputs if o.topic == "dispatches"] == ["EXECUTE"]


def test_unavailable_answers_do_not_spend_the_absence_budget() -> None:
    state = admitted()
    for n in range(MAX_UNAVAILABLE - 1):
        d = decide(
            state, helpers.receipt(OP, current_dispatch_id(state), "UNAVAILABLE"), f"u:0:{n}"
        )
        assert d.state is not None
        state = d.state
    assert state.absent_retries == 0 and state.state == S.EFFECT_PENDING


# ---------------------------------------------------------------- relay retry budget


def test_a_request_that_never_left_is_retried_with_doubling_backoff() -> None:
    budget = RetryBudget(attempts=6, first_backoff_ms=500, max_backoff_ms=3000)
    delays = [after_unreached(budget, failures=n).delay_ms for n in range(1, 6)]
    assert delays == [500, 1000, 2000, 3000, 3000]
    assert all(after_unreached(budget, failures=n).retry for n in range(1, 6))


def test_the_spent_budget_holds_and_says_why() -> None:
    decision = after_unreached(RetryBudget(attempts=3), failures=3, waited_ms=1500)
    assert not decision.retry and decision.delay_ms == 0
    assert "tried 3 times over 1.5 s" in decision.reason
    assert "never left" in decision.reason


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"first_backoff_ms": -1}])
def test_an_unusable_budget_is_refused(bad: dict[str, int]) -> None:
    with pytest.raises(LedgerError, match="retry budget"):
        RetryBudget(**bad)
