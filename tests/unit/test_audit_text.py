"""``ledger audit`` text: the verdict names its coverage, open items name their history."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.audit import AuditReport, OpenItem
from ledger.cli import main
from ledger.cli.audit import audit_lines


def _report(sinks: bool) -> AuditReport:
    report = AuditReport(operations=2, journal_entries=9)
    report.checked["state"] += 2
    report.checked["single-effect"] += 4 if sinks else 2
    report.sink_readback = sinks
    report.sink_facts = 2 if sinks else 0
    report.started_at_ms = 1_796_000_000_000
    report.took_s = 1.25
    report.offsets = {"journal": {0: 9, 1: 0}, "state": {0: 4, 1: 0}}
    report.open_items = [
        OpenItem("refund:7:v1", "UNKNOWN_OUTCOME", "payments", "timed out", 0, 61.4),
        OpenItem("refund:8:v1", "ABANDONED", "payments", "operator gave up", None, None),
    ]
    return report


def _settled(sinks: bool) -> AuditReport:
    report = _report(sinks)
    report.open_items = [i for i in report.open_items if i.state != "UNKNOWN_OUTCOME"]
    return report


def test_the_verdict_and_the_facts_say_which_coverage() -> None:
    on, off = audit_lines(_settled(True)), audit_lines(_settled(False))
    assert on[0] == "CLEAN (ledger and sink readback): 0 violation(s) in 6 facts checked"
    assert off[0] == "CLEAN (ledger only, sink readback off): 0 violation(s) in 4 facts checked"
    assert "facts checked: 4 in the ledger's records, 2 against sink readback" in on
    assert any(line.startswith("facts checked: 4 in the ledger's records, none") for line in off)
    assert on[1] == "ran at 2026-11-30T00:53:20.000+00:00 (wall clock, UTC), took 1.2 s"


def test_open_items_and_offsets_are_listed() -> None:
    lines = audit_lines(_report(True))
    assert "2 open item(s) (age on the wall clock since the latest state record):" in lines
    assert (
        "  refund:7:v1\tUNKNOWN_OUTCOME\tpayments\tage 61 s\ttimed out\t"
        "(ledger history refund:7:v1)" in lines
    )
    assert any(line.startswith("  refund:8:v1\tABANDONED\tpayments\tage ? s") for line in lines)
    assert "  journal: 0:9 1:0" in lines and "  state: 0:4 1:0" in lines


def test_an_open_unknown_outcome_is_not_clean_with_or_without_sink_readback() -> None:
    for sinks in (True, False):
        report = _report(sinks)  # UNKNOWN_OUTCOME open: nobody knows if the effect happened
        assert report.clean and not report.settled  # sound evidence, an outcome unknown
        assert report.verdict.startswith("OPEN: 1 operation whose outcome is unknown")
        assert audit_lines(report)[0].startswith("OPEN: ")
        assert report.to_dict()["verdict"] == report.verdict
    mismatched = _settled(False)
    mismatched.open_items.append(
        OpenItem("refund:9:v1", "EFFECT_COMMITTED", "payments", "postcondition mismatch", 0, 5.0)
    )
    assert mismatched.verdict.startswith("OPEN: 1 operation") and not mismatched.settled
    settled = _settled(False)  # abandoned only: its outcome is known (no effect)
    assert settled.settled and settled.verdict.startswith("CLEAN")


def test_audit_no_sinks_exits_1_while_an_unknown_outcome_is_open(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import consumers.auditor
    import ledger.cli.audit

    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(ledger.cli.audit, "reader_ready", lambda settings: None)
    reports = {"open": _report(False), "settled": _settled(False)}
    for kind, report in reports.items():
        monkeypatch.setattr(consumers.auditor, "run_audit", lambda *a, r=report, **k: r)
        result = CliRunner().invoke(main, ["audit", "--no-sinks"])
        assert result.exit_code == (1 if kind == "open" else 0), result.output
        head = result.output.splitlines()[0]
        assert head.startswith("OPEN: " if kind == "open" else "CLEAN (ledger only"), head
