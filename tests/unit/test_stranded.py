"""The one definition of a stranded operation, kind by kind (ledger/stranded.py)."""

from __future__ import annotations

import pytest

from ledger.states import RecoveryState as S
from ledger.stranded import (
    Evidence,
    StrandedBounds,
    StrandedReason,
    evaluate,
    order,
    summarise,
)

BOUNDS = StrandedBounds(in_flight_s=60, committed_s=120, not_admitted_s=30, held_s=10)
NOW = 1_000_000


def judge(state: S, age_s: float, **evidence: object):  # type: ignore[no-untyped-def]
    since = NOW - int(age_s * 1000)
    return evaluate("op-1", str(state), "payments", Evidence(since, **evidence), NOW, BOUNDS)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "bound_s", "reason", "evidence"),
    [
        (S.EFFECT_PENDING, 60, StrandedReason.IN_FLIGHT_WITHOUT_OWNER, {"owner_live": False}),
        (S.ADMITTED, 60, StrandedReason.IN_FLIGHT_WITHOUT_OWNER, {}),
        (S.EFFECT_PENDING, 60, StrandedReason.IN_FLIGHT_OVERDUE, {"owner_live": True}),
        (S.EFFECT_COMMITTED, 120, StrandedReason.COMMITTED_UNVERIFIED, {}),
        (S.NOT_ADMITTED, 30, StrandedReason.NOT_ADMITTED_UNDECIDED, {}),
        (S.OUTCOME_VERIFIED, 10, StrandedReason.HELD_REFUSED_RECORD, {"held": "state:0:7"}),
    ],
)
def test_each_kind_is_stranded_only_past_its_own_bound(
    state: S, bound_s: float, reason: StrandedReason, evidence: dict[str, object]
) -> None:
    assert judge(state, bound_s, **evidence) is None  # at the bound: not yet
    found = judge(state, bound_s + 1, **evidence)
    assert found is not None
    assert (found.reason, found.state, found.bound_s) == (reason, str(state), bound_s)
    assert found.age_s == pytest.approx(bound_s + 1)
    assert found.since_ms == NOW - (bound_s + 1) * 1000
    assert found.remedy and found.remedy in found.sentence


@pytest.mark.parametrize(
    "state", [S.OUTCOME_VERIFIED, S.ABANDONED, S.UNKNOWN_OUTCOME, S.NEEDS_REAUTHORISATION]
)
def test_resting_states_are_never_stranded_however_old(state: S) -> None:
    assert judge(state, 10**6) is None


def test_committed_rests_at_a_sink_that_cannot_verify_or_that_contradicted_it() -> None:
    assert judge(S.EFFECT_COMMITTED, 10**6, verifiable=False) is None
    assert judge(S.EFFECT_COMMITTED, 10**6, mismatched=True) is None


def test_only_a_committed_unverified_operation_offers_a_read_back() -> None:
    committed = judge(S.EFFECT_COMMITTED, 10**6)
    pending = judge(S.EFFECT_PENDING, 10**6)
    assert committed is not None and committed.read_back
    assert pending is not None and not pending.read_back


def test_unknown_age_is_not_judged_and_a_time_ahead_counts_as_zero() -> None:
    assert evaluate("op", "EFFECT_PENDING", "s", Evidence(None), NOW, BOUNDS) is None
    ahead = Evidence(NOW + 10**9)
    assert evaluate("op", "EFFECT_PENDING", "s", ahead, NOW, BOUNDS) is None
    zero = StrandedBounds(0, 0, 0, 0)
    found = evaluate("op", "EFFECT_PENDING", "s", Evidence(NOW - 1), NOW, zero)
    assert found is not None and found.age_s == pytest.approx(0.001)


def test_a_negative_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="in_flight_s"):
        StrandedBounds(in_flight_s=-1)


def test_summary_names_every_reason_and_the_oldest_age() -> None:
    items = [
        judge(S.EFFECT_PENDING, 100),
        judge(S.EFFECT_PENDING, 400),
        judge(S.NOT_ADMITTED, 50),
    ]
    summary = summarise(i for i in items if i is not None)
    assert summary.total == 3
    assert summary.count[StrandedReason.IN_FLIGHT_WITHOUT_OWNER] == 2
    assert summary.oldest_age_s[StrandedReason.IN_FLIGHT_WITHOUT_OWNER] == pytest.approx(400)
    assert summary.count[StrandedReason.HELD_REFUSED_RECORD] == 0
    assert set(summary.count) == set(StrandedReason)


def test_order_is_oldest_first() -> None:
    young, old = judge(S.EFFECT_PENDING, 100), judge(S.NOT_ADMITTED, 500)
    assert young is not None and old is not None
    assert order([young, old]) == [old, young]
    assert old.to_dict()["reason"] == "not_admitted_undecided"


def test_an_intent_past_the_processors_committed_offset_is_stranded_past_its_bound() -> None:
    from ledger.stranded import UNPROCESSED, PublishedIntent, unconsumed

    bounds = StrandedBounds(intents_s=20)
    at = {0: 5, 1: None}  # partition 1: the group never committed there
    intents = [
        PublishedIntent("consumed", 0, 4, NOW - 90_000),  # below the committed offset
        PublishedIntent("old", 0, 5, NOW - 30_000),
        PublishedIntent("young", 0, 6, NOW - 10_000),  # within its bound
        PublishedIntent("never-committed", 1, 0, NOW - 21_000),
        PublishedIntent("old", 0, 7, NOW - 25_000),  # published again: counted once
        PublishedIntent("no-time", 1, 1, None),
    ]
    found = unconsumed(intents, at, NOW, bounds)
    assert [(s.operation_id, s.age_s) for s in found] == [("old", 30.0), ("never-committed", 21.0)]
    assert {s.reason for s in found} == {StrandedReason.INTENT_NOT_CONSUMED}
    assert {s.state for s in found} == {UNPROCESSED} and found[0].bound_s == 20
    assert "not yet processed" in found[0].sentence and "ledger status" in found[0].sentence
    assert unconsumed(intents, {0: 8, 1: 2}, NOW, bounds) == []  # all consumed
