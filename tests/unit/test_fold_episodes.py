"""Every record names what it answers: dispositions and admission decisions (issue 26).

A disposition names the unknown-outcome episode it answers and an admission
decision the admission request it answers (both: the state version at which
the operation entered the state, ``OperationState.entered_version``). The
fold applies them only there; an authentic copy appended in a later episode
changes nothing and is reported as ``REPLAYED``.
"""

from __future__ import annotations

from ledger.authority import evaluate
from ledger.events import Disposition, OperatingEvent, OperationState
from ledger.fold import Decision, current_dispatch_id, decide
from ledger.states import RecoveryState as S
from tests import helpers

OP = "refund:c1:v1"


def _apply(state: OperationState | None, event: object, ref: str) -> OperationState:
    d = decide(state, event, ref)  # type: ignore[arg-type]
    assert d.outcome == "APPLIED", d.reason
    assert d.state is not None
    return d.state


def _replayed(d: Decision) -> str:
    events = [o.event for o in d.outputs if isinstance(o.event, OperatingEvent)]
    assert [e.kind for e in events] == ["REPLAYED"], d.outputs
    assert d.outcome == "REFUSED"
    return events[0].reason


def _unknown() -> OperationState:
    """An admitted refund whose first attempt ended ambiguous (UNKNOWN_OUTCOME)."""
    i = helpers.intent(OP)
    s = _apply(None, i, "intents:0:0")
    assert s.entered_version == 1
    s = _apply(s, helpers.admission(i), "admissions:0:0")
    s = _apply(s, helpers.receipt(OP, current_dispatch_id(s), "AMBIGUOUS"), "receipts:0:0")
    assert s.state == S.UNKNOWN_OUTCOME and s.entered_version == s.version
    return s


def _disposition(decision: str, episode: int | None) -> Disposition:
    return Disposition(
        disposition_id=f"d-{decision}-{episode}",
        operation_id=OP,
        decision=decision,  # type: ignore[arg-type]
        by="operator-1",
        evidence="checked the provider",
        disposed_at_ms=9_000,
        episode=episode,
    )


def test_a_disposition_from_an_earlier_episode_changes_nothing_in_a_later_one() -> None:
    first = _unknown()
    absent = _disposition("ABSENT", first.entered_version)
    again = _apply(first, absent, "dispositions:0:0")
    assert again.state == S.EFFECT_PENDING
    # The re-execution is ambiguous too: a second unknown-outcome episode.
    second = _apply(
        again, helpers.receipt(OP, current_dispatch_id(again), "AMBIGUOUS"), "receipts:0:1"
    )
    assert second.state == S.UNKNOWN_OUTCOME and second.entered_version != first.entered_version
    # The same authentic disposition, appended again: refused, nothing dispatched.
    d = decide(second, absent, "dispositions:0:1")
    assert d.state == second
    assert not [o for o in d.outputs if o.topic == "dispatches"]
    reason = _replayed(d)
    assert f"answers episode {first.entered_version}" in reason
    assert f"in episode {second.entered_version}" in reason and "reconcile dispose" in reason
    # A disposition of the current episode still applies.
    assert _apply(second, _disposition("ABANDON", second.entered_version), "d:0:2").state == (
        S.ABANDONED
    )


def test_a_claim_during_an_episode_keeps_it() -> None:
    held = _unknown()
    claimed = _apply(held, helpers.claim(OP, "w2", held.version), "claims:0:0")
    assert claimed.version == held.version + 1
    assert claimed.entered_version == held.entered_version
    released = _apply(claimed, _disposition("COMMITTED", held.entered_version), "d:0:0")
    assert released.state == S.EFFECT_COMMITTED


def test_a_disposition_that_names_no_episode_applies_only_to_an_episode_that_names_none() -> None:
    held = _unknown()
    reason = _replayed(decide(held, _disposition("ABSENT", None), "dispositions:0:0"))
    assert "answers no episode" in reason
    # A state written before version 5 (no entered_version): as before.
    legacy = held.model_copy(update={"entered_version": None})
    assert _apply(legacy, _disposition("ABSENT", None), "d:0:1").state == S.EFFECT_PENDING
    assert decide(legacy, _disposition("ABSENT", held.version), "d:0:2").outcome == "REFUSED"


def _cancelled_then_back_to_the_first_approval() -> tuple[OperationState, object]:
    """Admitted under ap-1, reservation cancelled, ap-2 refused, back to ap-1 (pending)."""
    i = helpers.intent(OP)
    s = _apply(None, i, "intents:0:0")
    admitted = helpers.admission(i, request=s.entered_version)
    s = _apply(s, admitted, "admissions:0:0")
    s = _apply(s, helpers.receipt(OP, current_dispatch_id(s), "CANCELLED"), "receipts:0:0")
    assert s.state == S.NEEDS_REAUTHORISATION
    s = _apply(s, helpers.intent(OP, approval="ap-2"), "intents:0:1")
    i2 = helpers.intent(OP, approval="ap-2")
    s = _apply(s, helpers.admission(i2, admitted=False, request=s.entered_version), "a:0:1")
    assert s.state == S.NEEDS_REAUTHORISATION
    s = _apply(s, i, "intents:0:2")  # back to ap-1: a new admission request
    assert s.state == S.NOT_ADMITTED and s.approval_id == "ap-1"
    return s, admitted


def test_an_admission_decision_answers_only_the_request_pending() -> None:
    pending, old = _cancelled_then_back_to_the_first_approval()
    d = decide(pending, old, "admissions:0:5")  # type: ignore[arg-type]
    assert d.state == pending and not [o for o in d.outputs if o.topic == "dispatches"]
    reason = _replayed(d)
    assert "answers the request of state version 1" in reason
    assert f"in episode {pending.entered_version}" in reason
    # The kernel's answer to the pending request is applied.
    fresh = helpers.admission(helpers.intent(OP), request=pending.entered_version, at=7000)
    assert _apply(pending, fresh, "admissions:0:6").state == S.EFFECT_PENDING


def test_a_claim_while_waiting_for_admission_does_not_lose_the_kernels_answer() -> None:
    i = helpers.intent(OP)
    s = _apply(None, i, "intents:0:0")
    s = _apply(s, helpers.claim(OP, "resumer", s.version), "claims:0:0")
    assert s.version == 2 and s.entered_version == 1
    assert _apply(s, helpers.admission(i, request=1), "admissions:0:0").state == S.EFFECT_PENDING


def test_a_decision_that_names_no_request_applies_only_to_a_request_of_an_earlier_release() -> None:
    i = helpers.intent(OP)
    s = _apply(None, i, "intents:0:0")
    reason = _replayed(decide(s, helpers.admission(i, request=None), "admissions:0:0"))
    assert "answers no request" in reason and "kernel runs this release" in reason
    legacy = s.model_copy(update={"entered_version": None})
    assert _apply(legacy, helpers.admission(i, request=None), "a:0:1").state == S.EFFECT_PENDING
    # The new kernel answering a request of an earlier release: its state version.
    assert _apply(legacy, helpers.admission(i, request=1), "a:0:2").state == S.EFFECT_PENDING
    assert decide(legacy, helpers.admission(i, request=0), "a:0:3").outcome == "REFUSED"


def test_the_kernel_names_the_request_in_its_decision_and_use() -> None:
    request = helpers.admission_request(OP).model_copy(update={"state_version": 7})
    grant = helpers.approval("ap-1", policy=1)
    result = evaluate(grant, request, now_ms=1_000, policy_version=1, decided_by="authority-0")
    assert result.decision.admitted, result.decision.reason
    assert result.decision.request_state_version == 7
    assert result.use is not None and result.use.request_state_version == 7
