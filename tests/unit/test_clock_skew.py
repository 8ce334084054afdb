"""A game day's ``skew``: one component reads the ledger clock shifted, from the moment it is set.

Production hooks hand a stage the clock its settings name; the testbed's
hooks shift it by the component's skew file, read at every reading, so a
running stage sees a new skew at its next reading.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.hooks import NO_FAULTS
from ledger.clock import ManualClock
from testbed import faults


@pytest.fixture
def clock(tmp_path: Path) -> ManualClock:
    manual = ManualClock(tmp_path / "clock")
    manual.set_ms(600_000)
    return manual


def test_production_hooks_hand_back_the_clock_itself(clock: ManualClock) -> None:
    assert NO_FAULTS.clock(clock) is clock


def test_a_skew_shifts_only_its_component_and_from_the_next_reading(
    tmp_path: Path, clock: ManualClock
) -> None:
    kernel = faults.ArmedFaults(tmp_path, "authority-0", "authority").clock(clock)
    relay = faults.ArmedFaults(tmp_path, "relay-0", "relay").clock(clock)
    assert (kernel.now_ms(), relay.now_ms()) == (600_000, 600_000)

    faults.set_skew(tmp_path, "authority", 7200)
    assert (kernel.now_ms(), relay.now_ms()) == (7_800_000, 600_000)

    clock.advance(10)  # the ledger clock still moves under the skew
    assert kernel.now_ms() == 7_810_000

    faults.set_skew(tmp_path, "authority", -0.5)  # replaces, in milliseconds
    assert kernel.now_ms() == 609_500
    faults.set_skew(tmp_path, "authority", 0)
    assert kernel.now_ms() == 610_000


def test_hooks_without_a_component_never_shift(tmp_path: Path, clock: ManualClock) -> None:
    faults.set_skew(tmp_path, "relay", 60)
    assert faults.ArmedFaults(tmp_path, "relay-0").clock(clock) is clock


def test_an_unreadable_skew_file_is_no_skew(tmp_path: Path, clock: ManualClock) -> None:
    path = faults.set_skew(tmp_path, "relay", 60)
    path.write_text("{not json")
    assert faults.skew_ms(tmp_path, "relay") == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_skew_is_a_finite_number(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        faults.set_skew(tmp_path, "relay", bad)
