"""Read-only commands on the real broker: they write nothing, and say which ledger they
read when it looks empty or its records cannot be authenticated (a fresh user's trial)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli import main
from ledger.cli.common import EXIT_ERROR, EXIT_OK, EXIT_UNKNOWN_OPERATION
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration

#: Every command that only reads the ledger, with the exit status it has on an empty one.
READERS: tuple[tuple[list[str], int], ...] = (
    (["state"], EXIT_OK),
    (["state", "--json"], EXIT_OK),
    (["history", "refund:nobody:v1"], EXIT_UNKNOWN_OPERATION),
    (["audit", "--no-sinks"], EXIT_OK),
    (["reconcile", "list"], EXIT_OK),
    (["topics", "list"], EXIT_OK),
)


def _env(monkeypatch: pytest.MonkeyPatch, settings: LedgerSettings, run_dir: Path) -> None:
    for name, value in settings.model_dump().items():
        if value is not None:
            monkeypatch.setenv(f"LEDGER_{name.upper()}", str(value))
    monkeypatch.setenv("LEDGER_RUN_DIR", str(run_dir))


def test_readers_of_an_empty_ledger_write_nothing_and_name_the_prefix(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh-run"
    _env(monkeypatch, ledger_settings, fresh)
    for command, code in READERS:
        result = CliRunner().invoke(main, command)
        assert result.exit_code == code, (command, result.output)
    result = CliRunner().invoke(main, ["state"])
    assert f"no operations in the ledger (topic prefix {ledger_settings.topic_prefix!r}" in (
        result.stdout
    )
    assert not fresh.exists(), sorted(fresh.rglob("*"))


def test_readers_pointed_at_another_run_folder_say_so_and_write_nothing(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pub = LedgerPublisher(ledger_settings)  # seals with the key in ledger_settings.run_dir
    try:
        approve(pub, "ap-read-only")  # a reviewer's signature: checked without the run folder
        pub.publish_claim("refund:read-only:v1", "worker-a", 1)  # sealed with its resumer key
    finally:
        pub.close()
    wrong = tmp_path / "wrong-run"
    _env(monkeypatch, ledger_settings, wrong)
    for command, _ in READERS:
        if command[0] == "topics":
            continue
        result = CliRunner().invoke(main, command)
        assert result.exit_code == EXIT_ERROR, (command, result.output)
        assert f"no stage keys at {wrong / 'keys' / 'stage-keys.json'}" in result.stderr
        assert "(records in claims)" in result.stderr  # the sealed topic that holds records
    assert not wrong.exists(), sorted(wrong.rglob("*"))
    # With the right run folder the same ledger reads.
    monkeypatch.setenv("LEDGER_RUN_DIR", str(ledger_settings.run_dir))
    result = CliRunner().invoke(main, ["audit", "--no-sinks"])
    assert result.exit_code == EXIT_OK, result.output
