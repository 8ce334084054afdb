"""Clock readings far from a stage's other sources are refused and never latch (issue 26)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from consumers.localfiles import LastGoodClock
from ledger.clock import (
    CEILING_MS,
    DEFAULT_MAX_SKEW_S,
    MAX_ADVANCE_S,
    ClockVerdict,
    ManualClock,
    judge_reading,
    reading_bounds,
)
from ledger.settings import LedgerSettings
from tests.helpers import keyed

SKEW_MS = 300_000
FAR = 2**62
DAY_MS = 24 * 3600 * 1000


def judge(reading: int, last: int | None, elapsed: int = 0, witness: int | None = None):
    return judge_reading(
        reading,
        last_ms=last,
        elapsed_ms=elapsed,
        witness_ms=witness,
        max_behind_ms=SKEW_MS,
        max_ahead_ms=SKEW_MS,
    )


# ------------------------------------------------------------------ the pure decision


def test_a_far_future_reading_is_refused_and_the_expected_time_stands() -> None:
    verdict = judge(FAR, last=1_700_000_000_000, elapsed=2_000)
    assert not verdict.accepted
    assert verdict.now_ms == 1_700_000_002_000 == verdict.reference_ms
    assert verdict.reason is not None and "year 3000" in verdict.reason


def test_a_reading_within_the_skew_is_accepted_and_time_never_goes_back() -> None:
    assert judge(1_000_100, last=1_000_000, elapsed=50) == ClockVerdict(True, 1_000_100, 1_000_050)
    assert judge(999_000, last=1_000_000).now_ms == 1_000_000  # a little behind: time stands


def test_a_reading_far_ahead_or_behind_the_expected_time_is_refused() -> None:
    last = 1_700_000_000_000
    for reading in (last + SKEW_MS + 1, last - SKEW_MS - 1):
        verdict = judge(reading, last=last)
        assert not verdict.accepted and verdict.now_ms == last


def test_the_records_time_confirms_a_reading_the_stage_did_not_expect() -> None:
    """A stage started on a wrong wall clock follows the corrected one (no latch either way)."""
    wrong, right = 4_102_444_800_000, 1_700_000_000_000  # year 2100; 2023
    verdict = judge(right, last=wrong, elapsed=1_000, witness=right - 2_000)
    assert verdict.accepted and verdict.now_ms == right
    # A far-future witness never carries a reading past the ceiling.
    assert not judge(FAR, last=right, witness=FAR).accepted


def test_a_clock_behind_the_records_time_is_refused_even_from_the_start() -> None:
    """A host clock 30 days behind since boot agrees with itself, not with the records:
    it must not keep an approval that lapsed current (attacker trial: one was paid)."""
    right = 1_700_000_000_000
    behind = right - 30 * DAY_MS
    first = judge(behind, last=None, witness=right)
    assert not first.accepted and first.now_ms == right and "behind" in (first.reason or "")
    later = judge(behind + 1_000, last=first.now_ms, elapsed=1_000, witness=right + 1_000)
    assert not later.accepted and later.now_ms == right + 1_000
    # A reading ahead of old records (a backlog) is not refused for it.
    assert judge(right, last=None, witness=right - DAY_MS).accepted
    # Once the host's clock is right again, its readings are accepted.
    assert judge(right + 2_000, last=later.now_ms, elapsed=1_000, witness=right + 1_500).accepted


def test_a_first_reading_past_the_ceiling_fails_closed() -> None:
    """No time known yet: every limit counts as passed (never 0, which would make all current)."""
    assert judge(FAR, last=None) == ClockVerdict(
        False, CEILING_MS, None, judge(FAR, last=None).reason, keep=False
    )
    assert judge(FAR, last=None, witness=1_700_000_000_000).now_ms == 1_700_000_000_000
    assert judge(-1, last=None).now_ms == CEILING_MS


def test_the_manual_clock_may_advance_by_days_but_not_past_ten_years() -> None:
    behind, ahead, elapses = reading_bounds("manual", 300)
    assert not elapses and ahead == int(MAX_ADVANCE_S * 1000) and behind == SKEW_MS

    def manual(reading: int, last: int | None) -> ClockVerdict:
        return judge_reading(
            reading,
            last_ms=last,
            elapsed_ms=0,
            witness_ms=None,
            max_behind_ms=behind,
            max_ahead_ms=ahead,
        )

    assert manual(30 * DAY_MS, last=0).accepted
    assert manual(ahead, last=0).accepted
    assert not manual(ahead + 1, last=0).accepted
    assert not manual(FAR, last=0).accepted and manual(FAR, last=5).now_ms == 5


@given(
    last=st.integers(0, CEILING_MS),
    elapsed=st.integers(0, 10 * DAY_MS),
    reading=st.integers(-(2**63), 2**63 - 1),
    witness=st.none() | st.integers(0, 2**63 - 1),
)
def test_a_refused_reading_is_never_the_time(
    last: int, elapsed: int, reading: int, witness: int | None
) -> None:
    verdict = judge(reading, last=last, elapsed=elapsed, witness=witness)
    assert 0 <= verdict.now_ms <= max(CEILING_MS, last + elapsed)
    behind_witness = (
        witness is not None
        and witness <= CEILING_MS
        and 0 <= reading <= CEILING_MS  # out of range: rule 1 first
        and reading < witness - SKEW_MS
    )
    if not verdict.accepted:
        assert verdict.reason
        if behind_witness:  # the later time decides (fail closed)
            assert witness is not None and verdict.now_ms == max(last + elapsed, witness)
        else:
            assert verdict.now_ms == last + elapsed
    else:
        assert not behind_witness and verdict.now_ms in (reading, last)


@given(
    last=st.integers(0, CEILING_MS // 2),
    # beyond the bound from any expected time (last + step, step up to SKEW_MS)
    glitch=st.integers(CEILING_MS // 2 + 2 * SKEW_MS + 1, 2**63 - 1),
    step=st.integers(0, SKEW_MS),
)
def test_one_wild_reading_does_not_latch(last: int, glitch: int, step: int) -> None:
    """After any refused reading, the next reading near the expected time is accepted."""
    refused = judge(glitch, last=last, elapsed=step)
    assert not refused.accepted
    after = judge(last + 2 * step, last=refused.now_ms, elapsed=step)
    assert after.accepted and after.now_ms == last + 2 * step


# ------------------------------------------------------------------ the stage's clock


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.s = 100.0

    def __call__(self) -> float:
        return self.s


def test_the_stage_clock_refuses_reports_once_and_recovers(tmp_path: Path) -> None:
    manual = ManualClock(tmp_path / "clock")
    refused: list[tuple[int, ClockVerdict]] = []
    counted: list[int] = []
    clock = LastGoodClock(
        manual,
        component="test",
        kind="manual",
        on_refused=lambda r, v: refused.append((r, v)),
        on_each_refusal=lambda: counted.append(1),
    )
    manual.advance(3600)
    assert clock.now_ms() == 3_600_000
    manual.set_ms(FAR)
    assert clock.now_ms() == 3_600_000 and clock.now_ms() == 3_600_000
    assert [r for r, _ in refused] == [FAR] and len(counted) == 2 and clock.refusing is not None
    manual.set_ms(3_600_000)
    manual.advance(2 * 24 * 3600)  # a scenario's two days
    assert clock.now_ms() == 3_600_000 + 2 * DAY_MS and clock.refusing is None
    manual.set_ms(FAR)
    clock.now_ms()
    assert len(refused) == 2  # a new run of refusals is reported again


def test_a_far_future_first_reading_decides_closed_once_and_never_latches(tmp_path: Path) -> None:
    """The attacker's order (new-user trial): the clock file holds 2^62 ms before the stage
    first reads it. That reading decides with the ceiling (every limit has passed), but the
    ceiling is not kept: the sane readings after it are the stage's time again."""
    manual = ManualClock(tmp_path / "clock")
    refused: list[tuple[int, ClockVerdict]] = []
    clock = LastGoodClock(
        manual, component="test", kind="manual", on_refused=lambda r, v: refused.append((r, v))
    )
    manual.set_ms(FAR)
    assert clock.now_ms() == CEILING_MS and [r for r, _ in refused] == [FAR]
    assert judge(FAR, last=None).keep is False
    manual.set_ms(200_000)
    assert clock.now_ms() == 200_000 and clock.refusing is None
    manual.advance(10)
    assert clock.now_ms() == 210_000


def test_the_system_clock_decides_with_its_monotonic_time_while_refusing() -> None:
    ticks = Ticks()
    wall = [1_700_000_000_000]

    class Wall:
        def now_ms(self) -> int:
            return wall[0]

    clock = LastGoodClock(Wall(), component="test", kind="system", monotonic=ticks)
    assert clock.now_ms() == 1_700_000_000_000
    ticks.s += 10
    wall[0] = FAR
    assert clock.now_ms() == 1_700_000_010_000  # 10 s later on the monotonic clock
    ticks.s += 5
    wall[0] = 1_700_000_015_000
    assert clock.now_ms() == 1_700_000_015_000 and clock.refused == 1


def test_the_system_clock_follows_a_corrected_wall_clock_the_records_confirm() -> None:
    ticks = Ticks()
    wall = [4_102_444_800_000]  # started in 2100

    class Wall:
        def now_ms(self) -> int:
            return wall[0]

    clock = LastGoodClock(Wall(), component="test", kind="system", monotonic=ticks)
    assert clock.now_ms() == 4_102_444_800_000
    wall[0] = 1_700_000_000_000  # corrected
    assert clock.now_ms() == 4_102_444_800_000  # nothing confirms it yet
    clock.observe(1_699_999_999_000)  # a record just read
    ticks.s += 1
    assert clock.now_ms() == 1_700_000_000_000


def test_the_skew_is_a_setting(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert LedgerSettings().clock_max_skew_s == DEFAULT_MAX_SKEW_S == 300
    monkeypatch.setenv("LEDGER_CLOCK_MAX_SKEW_S", "60")
    assert LedgerSettings().clock_max_skew_s == 60


def test_the_relay_reports_a_refused_reading_once_and_counts_each(tmp_path: Path) -> None:
    from consumers.relay import Relay

    relay = Relay(keyed(LedgerSettings(run_dir=tmp_path, clock="manual")))
    manual = ManualClock(tmp_path / "clock")
    manual.set_ms(7000)
    assert relay.clock.now_ms() == 7000
    manual.set_ms(FAR)
    assert relay.clock.now_ms() == 7000 and relay.clock.now_ms() == 7000
    assert [(key, e.kind) for key, e in relay.notes.pending] == [("clock", "CLOCK_REFUSED")]
    assert str(FAR) in relay.notes.pending[0][1].reason
    counted = relay.metrics.registry.get_sample_value(
        "ledger_clock_readings_refused_total", {"stage": "relay", "clock": "manual"}
    )
    assert counted == 2
    manual.set_ms(8000)
    assert relay.clock.now_ms() == 8000
