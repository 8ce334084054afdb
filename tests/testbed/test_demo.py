"""The main job: ``ledger demo``'s four cases through real processes on Kafka."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ledger.cli import main
from ledger.settings import LedgerSettings
from testbed.demo import EXPECTED, run_demo
from testbed.runs import RunLedger, inspect_lines

pytestmark = pytest.mark.integration


def test_demo_observes_the_article_report(ledger_settings: LedgerSettings) -> None:
    lines: list[str] = []
    ledgers: list[RunLedger] = []
    report = run_demo(ledger_settings, lines.append, verbose=True, ledgers=ledgers)
    assert report == EXPECTED
    assert list(report) == list(EXPECTED)
    # The crashes were real: a stage process died at its seam in every case.
    crashes = [line for line in lines if "crashed (SIGKILL at a seam)" in line]
    assert len(crashes) == 4, lines
    # --verbose showed the transitions as they were journaled.
    assert any("-> OUTCOME_VERIFIED" in line for line in lines)
    # Each case's ledger can be read afterwards with the variables the demo prints.
    assert [run.label for run in ledgers] == [f"case {name}" for name in EXPECTED]
    for run in ledgers:
        env = {
            "LEDGER_BOOTSTRAP_SERVERS": ledger_settings.bootstrap_servers,
            "LEDGER_PARTITIONS": str(ledger_settings.partitions),
            "LEDGER_TOPIC_PREFIX": run.settings.topic_prefix,
            "LEDGER_RUN_DIR": str(run.settings.run_dir),
            "LEDGER_CLOCK": run.settings.clock,
        }
        assert f"LEDGER_TOPIC_PREFIX={run.settings.topic_prefix} " in "\n".join(inspect_lines(run))
        op = run.operation_ids[0]
        result = CliRunner().invoke(main, ["state", op], env=env)
        assert result.exit_code == 0, (run.label, result.output)
        assert json.loads(result.stdout)["operation_id"] == op
