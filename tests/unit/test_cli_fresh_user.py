"""Findings of a fresh user's trial of the ``ledger`` CLI, each pinned by a test."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli import main
from ledger.settings import LedgerSettings
from testbed.runs import RunLedger, inspect_lines

# ---------------------------------------------------------------- 1. inspecting a finished run


def _run(tmp_path: Path, prefix: str, ops: list[str]) -> RunLedger:
    settings = LedgerSettings(
        topic_prefix=prefix, run_dir=tmp_path / "run folder" / prefix, clock="manual"
    )
    return RunLedger(f"case {prefix}", settings, list(ops))


def test_inspect_lines_name_the_prefix_run_folder_and_commands_to_paste(tmp_path: Path) -> None:
    run = _run(tmp_path, "demo-race-abc123", ["refund:case-race:v1"])
    lines = inspect_lines(run)
    text = "\n".join(lines)
    assert "topic prefix demo-race-abc123" in lines[0]
    assert str(run.settings.run_dir) in lines[0]
    export = next(line for line in lines if "export " in line).split("export ", 1)[1]
    # The line is valid shell: the run folder with a space comes back as one word.
    words = dict(w.split("=", 1) for w in shlex.split(export))
    assert words == {
        "LEDGER_TOPIC_PREFIX": "demo-race-abc123",
        "LEDGER_RUN_DIR": str(run.settings.run_dir),
        "LEDGER_CLOCK": "manual",
    }
    assert "ledger state" in text
    assert "ledger history refund:case-race:v1" in text
    assert "ledger audit" in text


@contextlib.contextmanager
def _no_broker(settings: LedgerSettings, say: Any, keep: bool = False) -> Iterator[LedgerSettings]:
    yield settings


def test_demo_says_each_cases_ledger_and_ends_with_ok(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import testbed.cli
    import testbed.demo

    def fake_run_demo(
        settings: LedgerSettings, say: Any, verbose: bool = False, ledgers: Any = None
    ) -> dict[str, dict[str, Any]]:
        for name in ("one-aaaaaa", "two-bbbbbb"):
            ledgers.append(_run(tmp_path, name, [f"refund:{name}"]))
        return {case: dict(fields) for case, fields in testbed.demo.EXPECTED.items()}

    monkeypatch.setattr(testbed.cli, "running_broker", _no_broker)
    monkeypatch.setattr(testbed.demo, "run_demo", fake_run_demo)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 0, result.output
    for name in ("one-aaaaaa", "two-bbbbbb"):
        assert f"topic prefix {name}" in result.stderr
        assert f"export LEDGER_TOPIC_PREFIX={name} " in result.stderr
        assert f"ledger history refund:{name}" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("OK: all ")
    assert "ledger broker start" in result.stderr  # the records outlive a stopped broker


def test_demo_with_a_mismatch_ends_with_failed_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import testbed.cli
    import testbed.demo

    def fake_run_demo(
        settings: LedgerSettings, say: Any, verbose: bool = False, ledgers: Any = None
    ) -> dict[str, dict[str, Any]]:
        ledgers.append(_run(tmp_path, "one-aaaaaa", []))
        report = {case: dict(fields) for case, fields in testbed.demo.EXPECTED.items()}
        report["consume_once_claim"]["accepted_resumers"] = 2
        return report

    monkeypatch.setattr(testbed.cli, "running_broker", _no_broker)
    monkeypatch.setattr(testbed.demo, "run_demo", fake_run_demo)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 1
    assert "MISMATCH consume_once_claim.accepted_resumers" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("FAILED: 1 of ")
    assert "topic prefix one-aaaaaa" in result.stderr
    assert "OK:" not in result.stderr


def test_gameday_run_says_each_scenarios_ledger(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import testbed.cli
    import testbed.gameday

    good = sorted((Path(__file__).parents[1] / "testbed" / "scenarios").iterdir())[0]

    def fake_run_files(
        paths: list[Path], base: LedgerSettings, say: Any, ledgers: Any = None
    ) -> list[dict[str, Any]]:
        ledgers.append(_run(tmp_path, "gameday-g01-cccccc", ["refund:g01"]))
        return [{"name": "g01", "passed": True, "failures": []}]

    monkeypatch.setattr(testbed.cli, "running_broker", _no_broker)
    monkeypatch.setattr(testbed.gameday, "run_files", fake_run_files)
    result = CliRunner().invoke(main, ["gameday", "run", str(good)])
    assert result.exit_code == 0, result.output
    assert "topic prefix gameday-g01-cccccc" in result.stderr
    assert "export LEDGER_TOPIC_PREFIX=gameday-g01-cccccc " in result.stderr
    assert "ledger history refund:g01" in result.stderr
    assert result.stdout.strip() == "PASS  g01"


# ---------------------------------------------------------------- 4. an intent for an unknown sink

_SINK_PROBLEM = "sink 'bogus' is not registered in /run/sinks.json (registered: payments)"


def _refused_before_the_operation_existed() -> Any:
    from ledger.events import JournalEntry

    return JournalEntry(
        operation_id="op1",
        seq=0,
        kind="Intent",
        outcome="REFUSED",
        reason=f"intent for op1 refused before admission: {_SINK_PROBLEM}; approval a1 was "
        "not used",
        input_topic="intents",
        input_partition=2,
        input_offset=0,
        input_event=b"",
        sink_problem=_SINK_PROBLEM,
    )


@pytest.mark.parametrize(
    ("from_state", "to_state", "words"),
    [
        (None, None, "(no state)"),
        (None, "PROPOSED", "(new) -> PROPOSED"),
        ("ADMITTED", "ADMITTED", "ADMITTED"),
        ("ADMITTED", "EFFECT_PENDING", "ADMITTED -> EFFECT_PENDING"),
    ],
)
def test_a_journal_move_is_said_in_words_never_none(
    from_state: str | None, to_state: str | None, words: str
) -> None:
    from ledger.history import journal_move

    entry = _refused_before_the_operation_existed().model_copy(
        update={"from_state": from_state, "to_state": to_state}
    )
    assert journal_move(entry) == words


def test_history_line_of_an_unknown_sink_refusal_names_the_sinks_not_none() -> None:
    from ledger.history import describe

    line = describe(_refused_before_the_operation_existed())
    assert "None" not in line
    assert "REFUSED Intent (no state)" in line
    assert "'bogus'" in line and "registered: payments" in line


def test_intent_publish_says_the_refusal_of_an_unknown_sink_without_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import click

    import consumers.reader
    from ledger.cli.ops import _report_decision

    monkeypatch.setattr(
        consumers.reader,
        "wait_for_decision",
        lambda *args, **kwargs: _refused_before_the_operation_existed(),
    )

    @click.command()
    def report() -> None:
        _report_decision(LedgerSettings(), ("intents", 2, 0), 5.0)

    result = CliRunner().invoke(report, [])
    assert result.exit_code == 1
    assert result.stdout.startswith("REFUSED: op1 (no state) (intent for op1 refused")
    assert "None" not in result.stdout
    assert "'bogus'" in result.stdout and "registered: payments" in result.stdout
