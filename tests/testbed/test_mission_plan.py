"""The mission's plan and report helpers (pure: no broker)."""

from __future__ import annotations

import dataclasses

import pytest

from ledger.events import JournalEntry, OperationState
from ledger.fold import decide, journal_entry
from testbed.mission.plan import (
    SEAM_STAGE,
    SINK_FAULT_MODES,
    Case,
    MissionOptions,
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
    assert set(seams) == set(SEAM_STAGE)
    assert set(modes) == set(SINK_FAULT_MODES)
    # about crash_rate of the 600 operations (binomial, five standard deviations)
    assert abs(len(seams) - 30) < 5 * (600 * 0.05 * 0.95) ** 0.5
    assert not any(c.notify.race for c in cases)  # races are on refunds only


def test_no_faults_at_rate_zero() -> None:
    cases = plan(MissionOptions(cases=100, crash_rate=0.0, seed=1))
    assert all(
        op.seam is None and op.sink_fault is None and not op.race
        for c in cases
        for op in (c.refund, c.notify)
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
