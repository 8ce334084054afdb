"""The mission on LangGraph: a worker SIGKILLed at every step, the ledger beside its control.

Eight cases, one kill point each (:data:`testbed.engine_mission.KILL_POINTS`
in turn), one worker life for all of them and one to finish them: with the
ledger no operation has a second effect at its sink; the control, whose
nodes call the sinks directly with a fresh key per attempt, has one for each
case killed right after its effect call returned.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.settings import LedgerSettings
from testbed.engine_mission import KILL_POINTS, facts, kill_point, run_mission

pytestmark = pytest.mark.integration

CASES = 8


def test_killed_at_every_step_the_ledger_makes_no_duplicate_and_the_control_does(
    ledger_settings: LedgerSettings, tmp_path: Path
) -> None:
    points = [kill_point(c) for c in range(CASES)]
    report = run_mission(ledger_settings, CASES, window=CASES, work=tmp_path / "work", create=False)
    ledger, control = report["ledger"], report["control"]
    for mode in (ledger, control):
        assert mode["finished"] == CASES and not mode["errors"], mode
        assert mode["kills"] == CASES, mode  # every case's worker died at its point once
        assert mode["lives"] == 2, mode
    calls_killed = sum(1 for p in points if p.startswith("call:"))
    assert calls_killed >= 2 and len(set(points)) >= len(KILL_POINTS) - 2, points
    assert ledger["at_sinks"]["extra_effects"] == 0, ledger
    eligible = sum(1 for c in range(CASES) if facts(c)["eligible"])
    assert ledger["at_sinks"]["effects"] == 2 * eligible, ledger  # a refund and a notification
    assert ledger["outcomes"] == {"VERIFIED": eligible, "COMMITTED": eligible}, ledger
    assert control["at_sinks"]["effects"] == 2 * eligible + calls_killed, control
    assert control["at_sinks"]["extra_effects"] == calls_killed, control
    assert report["side_by_side"]["duplicate effects (extra, counted by the sinks)"] == {
        "ledger": 0,
        "control": calls_killed,
    }
