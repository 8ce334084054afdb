"""The main job: ``ledger demo``'s four cases through real processes on Kafka."""

from __future__ import annotations

import pytest

from ledger.settings import LedgerSettings
from testbed.demo import EXPECTED, run_demo

pytestmark = pytest.mark.integration


def test_demo_observes_the_article_report(ledger_settings: LedgerSettings) -> None:
    lines: list[str] = []
    report = run_demo(ledger_settings, lines.append, verbose=True)
    assert report == EXPECTED
    assert list(report) == list(EXPECTED)
    # The crashes were real: a stage process died at its seam in every case.
    crashes = [line for line in lines if "crashed (SIGKILL at a seam)" in line]
    assert len(crashes) == 4, lines
    # --verbose showed the transitions as they were journaled.
    assert any("-> OUTCOME_VERIFIED" in line for line in lines)
