"""``ledger upgrade check`` on a real ledger: an operation interrupted mid-flight.

The relay is killed after the sink committed and before the receipt, so the
operation rests in EFFECT_PENDING. A proposed release that drops readback
(contract version 2) would strand it; the release the manifest lets resume
it (version 3) would not.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from consumers.reader import current_states
from ledger.cli import main
from ledger.settings import LedgerSettings
from testbed.gameday import RELEASE_MANIFEST, GameDay
from testbed.scenario import load
from tests.helpers import PROJECT_ROOT

pytestmark = pytest.mark.integration

SCENARIO = (
    PROJECT_ROOT / "tests" / "testbed" / "scenarios" / "u02-upgrade-hold-names-both-versions.json"
)
MANIFEST = json.loads(RELEASE_MANIFEST.read_text())


def _check(monkeypatch: pytest.MonkeyPatch, settings: LedgerSettings, *args: str) -> Any:
    for name, value in settings.model_dump().items():
        if value is not None:
            monkeypatch.setenv(f"LEDGER_{name.upper()}", str(value))
    return CliRunner().invoke(main, ["upgrade", "check", *args])


def _proposal(tmp_path: Path, version: int) -> Path:
    path = tmp_path / f"payments-v{version}.json"
    contract = MANIFEST["sinks"]["payments"]["versions"][str(version)]["contract"]
    path.write_text(
        json.dumps({"sink": "payments", "contract_version": version, "contract": contract})
    )
    return path


def test_upgrade_check_lists_what_a_release_would_strand(
    ledger_settings: LedgerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = load(SCENARIO)
    game = GameDay(scenario, ledger_settings, ledger_settings.run_dir, lambda _line: None)
    try:
        for name, spec in scenario.sinks.items():
            game.harness.start_sink(name, spec.contract)
        for step in scenario.steps[:4]:  # approve, fault, intent, run: the relay dies
            game.step(step.kind, step.args)
        op = "refund:case-u02:v1"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            st = current_states(game.settings).get(op)
            if (
                st is not None
                and str(st.state) == "EFFECT_PENDING"
                and game.harness.effects("payments", op)
            ):
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"{op} never rested in EFFECT_PENDING with its effect at the sink")

        held = _check(
            monkeypatch, game.settings, "--contract", str(_proposal(tmp_path, 2)), "--json"
        )
        assert held.exit_code == 1, held.output
        report = json.loads(held.output)
        assert report["current_version"] == 1 and report["proposed_version"] == 2
        assert [(s["operation_id"], s["state"]) for s in report["stranded"]] == [
            (op, "EFFECT_PENDING")
        ]
        reason = report["stranded"][0]["reason"]
        assert "version 1" in reason and "version 2" in reason

        allowed = _check(monkeypatch, game.settings, "--contract", str(_proposal(tmp_path, 3)))
        assert allowed.exit_code == 0, allowed.output
        assert "0 of 1 in-flight operation(s) would be stranded" in allowed.output

        bad = tmp_path / "bad.json"
        bad.write_text('{"contract": {"readback": "maybe"}}')
        refused = _check(monkeypatch, game.settings, "--contract", str(bad))
        assert refused.exit_code == 2, refused.output
    finally:
        game.publisher.close()
        game.harness.stop()
