"""The mission's plan and report helpers (pure: no broker)."""

from __future__ import annotations

import dataclasses

import pytest

from ledger.events import JournalEntry, OperationState
from ledger.fold import decide, journal_entry
from sinks.registry import load_manifest
from testbed.gameday import RELEASE_MANIFEST
from testbed.mission.plan import (
    BOOKING_SEAMS,
    CALLBACK_RATE,
    GATEWAY_UPGRADE_VERSION,
    GOODWILL_MIN_FEE_MINOR,
    MISSION_SINKS,
    PAYMENT_GATEWAY_V4,
    PLAIN_SEAMS,
    SEAM_STAGE,
    SINK_FAULT_MODES,
    Case,
    MissionOptions,
    OpFaults,
    eligible,
    plan,
)
from testbed.mission.report import (
    JournalRow,
    lost_transitions,
    percentile,
    readback_latencies,
    split_by_failover,
)
from tests.helpers import admission, claim, intent, readback, receipt


def test_the_plan_is_a_function_of_the_seed_and_not_of_the_mode() -> None:
    options = MissionOptions(cases=200, seed=3)
    assert plan(options) == plan(options)
    assert plan(options) == plan(dataclasses.replace(options, mode="checkpoint-only"))
    assert plan(options) == plan(dataclasses.replace(options, instances=2))
    assert plan(options) != plan(dataclasses.replace(options, seed=4))


def test_every_seam_and_sink_fault_mode_is_planned_once_the_rates_allow() -> None:
    cases = plan(MissionOptions(cases=300, crash_rate=0.05, seed=7))
    seams = [op.seam for c in cases for op in (c.refund, c.notify) if op.seam]
    modes = [op.sink_fault for c in cases for op in (c.refund, c.notify) if op.sink_fault]
    assert set(seams) == set(PLAIN_SEAMS)
    assert set(modes) == set(SINK_FAULT_MODES)
    booked = [c.callback.seam for c in cases if c.callback is not None and c.callback.seam]
    assert booked and booked[0] == "after_reserve_before_confirm"
    assert set(booked) <= set(BOOKING_SEAMS) and set(SEAM_STAGE) == set(PLAIN_SEAMS) | set(booked)
    # about crash_rate of the 600 operations (binomial, five standard deviations)
    assert abs(len(seams) - 30) < 5 * (600 * 0.05 * 0.95) ** 0.5
    assert not any(c.notify.race for c in cases)  # races are on refunds only


def test_side_operations_are_planned_from_the_case() -> None:
    cases = plan(MissionOptions(cases=400, seed=7))
    with_credit = [c for c in cases if c.goodwill is not None]
    assert with_credit and all(c.fee_minor >= GOODWILL_MIN_FEE_MINOR for c in with_credit)
    assert all(c.goodwill is None for c in cases if c.fee_minor < GOODWILL_MIN_FEE_MINOR)
    booked = sum(c.callback is not None for c in cases)
    assert abs(booked - 400 * CALLBACK_RATE) < 5 * (400 * CALLBACK_RATE) ** 0.5
    # the first compensation fault planned is a rejection (a failure to count)
    planned = [c.reversal.sink_fault for c in cases if c.reversal.sink_fault]
    assert planned and planned[0] == "reject"
    case = with_credit[0]
    ops = case.operations()
    assert ops[case.goodwill_op] == ops[case.reversal_op] == "credits"
    assert case.reversal_op == f"goodwill-reversal:{case.number:05d}:v1"
    assert Case(1, "c", "a", 500, 50, False, False).operations() == {
        "refund:00001:v1": "payments",
        "notify:00001:v1": "mailer",
    }
    assert MISSION_SINKS["credits"].compensable
    assert MISSION_SINKS["credits"].consequence == "reversible-internal"
    assert MISSION_SINKS["callbacks"].reservation


def test_the_gateway_upgrade_is_in_the_release_manifest() -> None:
    """The mission's upgrade is a release the manifest names, with the same contract."""
    releases = load_manifest(RELEASE_MANIFEST).sinks["payments"].versions
    release = releases[str(GATEWAY_UPGRADE_VERSION)]
    assert release.contract == PAYMENT_GATEWAY_V4
    # what may have left under version 1 is held; what has not left goes on
    assert set(release.resumes["1"]) == {"ADMITTED", "EFFECT_COMMITTED"}


def test_no_faults_at_rate_zero() -> None:
    cases = plan(MissionOptions(cases=100, crash_rate=0.0, seed=1))
    assert all(
        op.seam is None and op.sink_fault is None and not op.race
        for c in cases
        for op in (
            c.refund,
            c.notify,
            c.goodwill or OpFaults(),
            c.reversal,
            c.callback or OpFaults(),
        )
    )


def test_eligibility_is_a_pure_decision_over_the_case() -> None:
    base = Case(1, "customer-1", "acct-1", 500, 50, False, False)
    assert eligible(base)
    assert not eligible(dataclasses.replace(base, charged_day=2))
    assert not eligible(dataclasses.replace(base, already_refunded=True))
    assert base.refund_op == "refund:00001:v1" and base.notify_op == "notify:00001:v1"


@pytest.mark.parametrize(
    "bad",
    [{"crash_rate": 1.5}, {"cases": 0}, {"instances": 9}, {"window": 0}, {"race_rate": -1.0}],
)
def test_bad_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MissionOptions(**bad)  # type: ignore[arg-type]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 50) is None


def _rows(events: list[tuple[object, float]]) -> list[JournalRow]:
    state = None
    rows = []
    for offset, (event, at) in enumerate(events):
        decision = decide(state, event, f"in:0:{offset}")  # type: ignore[arg-type]
        entry: JournalEntry = journal_entry(
            decision,
            event,  # type: ignore[arg-type]
            event.to_bytes(),  # type: ignore[attr-defined]
            "in",
            0,
            offset,
        )
        rows.append(JournalRow.of(entry, at))
        state = decision.state or state
    return rows


def test_readback_latency_runs_from_the_resume_to_the_deciding_readback() -> None:
    op = "refund:c1:v1"
    i = intent(op)
    rb = readback(op, f"{op}#2.2", on_resume=True).model_copy(update={"fencing_token": 2})
    rows = _rows([(i, 100.0), (admission(i), 100.1), (claim(op, "w", 2), 200.0), (rb, 200.75)])
    assert rows[2].claim_id == "c-w"
    samples, unattributed = readback_latencies(rows, [])
    assert samples == [750.0] and unattributed == 0
    # a later crash for the operation, before the readback, is the resume's start
    samples, _ = readback_latencies(rows, [{"operation_id": op, "at": 200.5}])
    assert samples == [250.0]
    # so is a later restart of the relay that read it back (not of another process)
    samples, _ = readback_latencies(rows, [], [(200.6, "relay-0"), (200.7, "relay-1")])
    assert samples == [150.0]
    # the reconciler's end-of-run readbacks are not resumes after a crash
    late = rb.model_copy(update={"observer": "reconciler"})
    rows = _rows([(i, 100.0), (admission(i), 100.1), (claim(op, "w", 2), 200.0), (late, 900.0)])
    assert readback_latencies(rows, []) == ([], 0)


def _state_after(rows: list[JournalRow]) -> dict[str, OperationState]:
    from ledger.fold import replay

    return replay(r.entry for r in rows)


def test_an_effect_the_journal_does_not_record_is_a_lost_transition() -> None:
    op = "refund:c1:v1"
    i = intent(op)
    pending = _rows([(i, 100.0), (admission(i), 100.1)])
    committed = _rows([(i, 100.0), (admission(i), 100.1), (receipt(op, f"{op}#1.1"), 100.5)])
    assert _state_after(committed)[op].state == "EFFECT_COMMITTED"
    effect = {"payments": {op: 1}}
    assert lost_transitions(committed, _state_after(committed), effect) == set()
    assert lost_transitions(pending, _state_after(pending), {"payments": {op: 0}}) == set()
    # the sink holds the refund but the journal stops before it: lost
    assert lost_transitions(pending, _state_after(pending), effect) == {op}
    # ledger.state behind the journal (a journaled transition lost from the state)
    assert lost_transitions(committed, _state_after(pending), effect) == {op}
    # an effect of an operation the ledger never saw
    assert lost_transitions([], {}, {"mailer": {"notify:c9:v1": 1}}) == {"notify:c9:v1"}


def test_readback_latencies_split_by_whether_the_resume_met_a_failover() -> None:
    resumes = [(10.0, 10.5, 500.0), (20.0, 21.0, 1000.0), (29.0, 31.0, 2000.0), (50.0, 50.1, 100.0)]
    windows = [
        {"kind": "leader-kill", "start": 20.5, "end": 30.0},
        {"kind": "partition", "start": 0.0, "end": None, "note": "skipped: not root"},
        {"kind": "full-restart", "start": 45.0, "end": None},  # never healed: open-ended
    ]
    during, outside = split_by_failover(resumes, windows)
    assert during == [1000.0, 2000.0, 100.0]
    assert outside == [500.0]
    assert split_by_failover(resumes, []) == ([], [500.0, 1000.0, 2000.0, 100.0])
