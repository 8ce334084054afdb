"""Compensation as its own operation: the fold's refusals, the link, the kernel's classes."""

from __future__ import annotations

import pytest

from ledger.authority import POLICY_ENGINE, REASON_ADMITTED, REASON_CONSUMED, evaluate
from ledger.events import Intent, OperationState
from ledger.fold import (
    CompensationFacts,
    compensation_counts,
    current_dispatch_id,
    decide,
    journal_entry,
    replay,
)
from ledger.states import RecoveryState as S
from tests import helpers

ORIGINAL = "credit:c1:v1"
REVERSAL = "credit-reversal:c1:v1"


def compensation(approval: str | None = "ap-2", compensates: str = ORIGINAL) -> Intent:
    i = helpers.intent(REVERSAL, approval=approval, sink="credits")
    return i.model_copy(update={"compensates": compensates})


def facts(
    state: str | None = "OUTCOME_VERIFIED",
    consequence: str | None = "reversible-internal",
    compensable: bool = True,
) -> CompensationFacts:
    return CompensationFacts(
        original_state=state,
        original_sink="credits",
        consequence=consequence,
        compensable=compensable,
    )


def test_a_settled_reversible_original_lets_the_compensation_request_admission() -> None:
    d = decide(None, compensation(), "intents:0:0", compensation=facts())
    assert d.state is not None and d.state.state == S.NOT_ADMITTED
    assert d.state.compensates == ORIGINAL
    (request,) = [o.event for o in d.outputs]
    assert request.compensates == ORIGINAL and request.approval_id == "ap-2"


@pytest.mark.parametrize(
    "observed, words",
    [
        (facts(state="EFFECT_PENDING"), "has not settled"),
        (facts(state="UNKNOWN_OUTCOME"), "has not settled"),
        (facts(state=None), "not known"),
        (facts(consequence="irreversible"), "irreversible"),
        (facts(compensable=False), "not compensable"),
        (facts(consequence=None), "not registered"),
        (None, "not observed"),
    ],
)
def test_a_compensation_that_may_not_proceed_is_abandoned_with_the_reason(
    observed: CompensationFacts | None, words: str
) -> None:
    d = decide(None, compensation(), "intents:0:0", compensation=observed)
    assert d.outcome == "APPLIED" and d.state is not None
    assert d.state.state == S.ABANDONED and words in d.state.reason
    assert d.hops == ((S.NOT_ADMITTED, S.ABANDONED),)
    assert not [o for o in d.outputs if o.topic == "admission-requests"]  # no approval used


def test_an_effect_committed_original_counts_as_settled() -> None:
    d = decide(None, compensation(), "intents:0:0", compensation=facts(state="EFFECT_COMMITTED"))
    assert d.state is not None and d.state.state == S.NOT_ADMITTED


def test_a_compensation_naming_itself_is_abandoned() -> None:
    d = decide(None, compensation(compensates=REVERSAL), "intents:0:0", compensation=facts())
    assert d.state is not None and d.state.state == S.ABANDONED
    assert "names itself" in d.state.reason


def test_republishing_with_another_original_is_drift() -> None:
    first = decide(None, compensation(), "intents:0:0", compensation=facts())
    assert first.state is not None
    d = decide(first.state, compensation(compensates="credit:c9:v1"), "intents:0:1")
    assert d.outcome == "REFUSED" and "drift" in d.reason
    # It says what differs: the digest does not bind the link, so two equal
    # digests in the message read as no drift at all (a fresh-user trial).
    assert "this intent names credit:c9:v1" in d.reason and "digest" not in d.reason
    same = decide(first.state, compensation(), "intents:0:2")
    assert same.outcome == "NOOP"


def test_replay_decides_with_the_journaled_facts() -> None:
    i = compensation()
    d = decide(None, i, "intents:0:0", compensation=facts(state="EFFECT_PENDING"))
    entry = journal_entry(d, i, i.to_bytes(), "intents", 0, 0, compensation=facts("EFFECT_PENDING"))
    assert entry.compensation_facts is not None
    replayed = replay([entry])[REVERSAL]
    assert replayed == d.state and replayed.state == S.ABANDONED


def _verified(op: str, compensates: str | None, dispatched: bool = True) -> OperationState:
    i = helpers.intent(op).model_copy(update={"compensates": compensates})
    state = decide(None, i, "intents:0:0", compensation=facts()).state
    assert state is not None
    if not dispatched:
        return state
    state = decide(state, helpers.admission(i), "admissions:0:0").state
    assert state is not None
    return decide(state, helpers.receipt(op, current_dispatch_id(state)), "receipts:0:0").state  # type: ignore[return-value]


def test_counts_link_the_original_and_count_failures_against_attempts() -> None:
    ok = _verified(REVERSAL, ORIGINAL)
    assert ok.state == S.EFFECT_COMMITTED
    i = helpers.intent("credit-reversal:c2:v1").model_copy(update={"compensates": "credit:c2:v1"})
    pending = decide(None, i, "intents:0:0", compensation=facts()).state
    pending = decide(pending, helpers.admission(i), "admissions:0:0").state
    assert pending is not None
    unknown = decide(
        pending,
        helpers.receipt(i.operation_id, current_dispatch_id(pending), status="AMBIGUOUS"),
        "receipts:0:0",
    ).state
    assert unknown is not None and unknown.state == S.UNKNOWN_OUTCOME
    refused = decide(
        None,
        compensation().model_copy(update={"operation_id": "credit-reversal:c3:v1"}),
        "intents:0:1",
        compensation=facts(consequence="irreversible"),
    ).state
    assert refused is not None
    plain = _verified(ORIGINAL, None)
    counts = compensation_counts({s.operation_id: s for s in (ok, unknown, refused, plain)})
    assert counts.compensated_by == {ORIGINAL: REVERSAL}
    assert (counts.settled, counts.attempts, counts.failures, counts.refused) == (1, 2, 1, 1)


# ------------------------------------------------------------ the authority kernel


def _request(compensates: str | None = ORIGINAL):  # type: ignore[no-untyped-def]
    return helpers.admission_request(op=REVERSAL).model_copy(update={"compensates": compensates})


def _decide(reviewer: str, consequence: str | None, use=None, compensates=ORIGINAL):  # type: ignore[no-untyped-def]
    approval = helpers.approval().model_copy(update={"reviewer": reviewer})
    return evaluate(
        approval,
        _request(compensates),
        use=use,
        now_ms=1000,
        policy_version=1,
        decided_by="k",
        consequence=consequence,
    )


def test_reversible_internal_is_compensated_under_a_standing_policy_approval() -> None:
    assert _decide(POLICY_ENGINE, "reversible-internal").decision.reason == REASON_ADMITTED


def test_reversible_external_needs_a_person_not_the_policy_engine() -> None:
    refused = _decide(POLICY_ENGINE, "reversible-external").decision
    assert not refused.admitted and "fresh review" in refused.reason
    assert _decide("reviewer-1", "reversible-external").decision.admitted


@pytest.mark.parametrize("consequence", ["irreversible", None])
def test_irreversible_or_unknown_class_is_never_compensated(consequence: str | None) -> None:
    refused = _decide("reviewer-1", consequence).decision
    assert not refused.admitted and "compensation of" in refused.reason


def test_an_ordinary_request_is_not_subject_to_the_classes() -> None:
    assert _decide(POLICY_ENGINE, "irreversible", compensates=None).decision.admitted


def test_the_originals_consumed_approval_cannot_admit_its_compensation() -> None:
    original = helpers.admission_request(op=ORIGINAL)
    use = evaluate(helpers.approval(), original, now_ms=1000, policy_version=1, decided_by="k").use
    assert use is not None and use.operation_id == ORIGINAL
    again = _decide("reviewer-1", "reversible-internal", use=use).decision
    assert not again.admitted and again.reason == REASON_CONSUMED
