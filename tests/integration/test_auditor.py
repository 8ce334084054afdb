"""The auditor on a real ledger: sound before and after compaction, and a
deliberately corrupted ledger is caught (forged dispatch, second receipt,
missing recovery receipt)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from consumers.auditor import run_audit
from ledger.cli import main
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Dispatch, EffectReceipt, JournalEntry
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from testbed.compaction import force_compaction
from testbed.harness import Harness
from tests.helpers import stage_seal
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration


def _raw(
    settings: LedgerSettings, topic: str, key: str, value: bytes | None, *, sealed: bool = True
) -> None:
    """Write a hand-made record: sealed with its writer role's key (an insider who
    holds it, whom only consistency can catch) or, with ``sealed=False``, as an outsider."""
    producer = Producer(client_config(settings, partitioner="murmur2_random"))
    headers = stage_seal(settings, topic, key, value) if sealed else None
    producer.produce(settings.topic(topic), key=key.encode(), value=value, headers=headers)
    assert producer.flush(10) == 0


def test_audit_is_clean_then_catches_corruption(ledger_settings: LedgerSettings) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-1")
        approve(pub, "ap-2")
        publish(pub, "refund:plain:v1", approval="ap-1")
        harness.arm("after_sink_commit_before_receipt", "refund:resumed:v1")
        publish(pub, "refund:resumed:v1", approval="ap-2")
        harness.start_all()
        harness.wait_quiescent(90)
        harness.restart()
        harness.wait_quiescent(90)

        before_ms = int(time.time() * 1000)
        clean = run_audit(settings)
        assert clean.violations == [], clean.violations
        assert clean.operations == 2 and clean.checked["state"] == 2
        assert clean.checked["recovery-receipt"] == 2 and clean.checked["consume-once"] == 2
        # What it covered: when, which offsets, with or without sink readback.
        assert clean.started_at_ms is not None and clean.started_at_ms >= before_ms
        assert set(clean.offsets["journal"]) == {0, 1, 2}
        assert sum(clean.offsets["journal"].values()) >= clean.journal_entries
        assert clean.sink_readback and clean.sink_facts == 2
        assert clean.verdict == "CLEAN (ledger and sink readback)"
        ledger_only = run_audit(settings, read_sinks=False)
        assert not ledger_only.sink_readback and ledger_only.sink_facts == 0
        assert ledger_only.facts == clean.facts - clean.sink_facts
        assert ledger_only.verdict == "CLEAN (ledger only, sink readback off)"
        assert clean.open_items == []

        force_compaction(settings)
        after = run_audit(settings)
        assert after.violations == [] and after.operations == 2

        # 1. A second receipt for an operation, with another effect ID.
        _raw(
            settings,
            "receipts",
            "refund:plain:v1",
            EffectReceipt(
                operation_id="refund:plain:v1",
                dispatch_id="refund:plain:v1#1.1",
                status="COMMITTED",
                sink="payments",
                attempt_id="forged",
                fencing_token=1,
                effect_id="payments-999",
                observed_at_ms=0,
                first_attempt_at_ms=0,
                detail="forged second receipt",
                observer="intruder",
            ).to_bytes(),
        )
        harness.wait_quiescent(90)
        harness.stop()

        # 2. A dispatch in the outbox that no admission produced.
        _raw(
            settings,
            "dispatches",
            "refund:forged:v1",
            Dispatch(
                dispatch_id="refund:forged:v1#1.1",
                operation_id="refund:forged:v1",
                kind="EXECUTE",
                sink="payments",
                action="refund",
                params_json="{}",
                parameter_digest="0" * 64,
                fencing_token=1,
                state_version=1,
            ).to_bytes(),
        )
        # 3. The recovery receipt of the resumed operation goes missing.
        _raw(settings, "recovery-receipts", "refund:resumed:v1", None)

        corrupted = run_audit(settings, read_sinks=False)
        found = {(v.invariant, v.operation_id) for v in corrupted.violations}
        assert ("single-effect", "refund:plain:v1") in found
        assert ("admission", "refund:forged:v1") in found
        assert ("recovery-receipt", "refund:resumed:v1") in found
        assert all(v.evidence for v in corrupted.violations)
        assert corrupted.unauthenticated_records == []

        # 4. An outsider (no key) writes the same kind of dispatch: the audit lists
        #    it as unauthenticated, and no invariant rests on it.
        outsider = Dispatch(
            dispatch_id="refund:outsider:v1#1.1",
            operation_id="refund:outsider:v1",
            kind="EXECUTE",
            sink="payments",
            action="refund",
            params_json="{}",
            parameter_digest="0" * 64,
            fencing_token=1,
            state_version=1,
        )
        _raw(settings, "dispatches", "refund:outsider:v1", outsider.to_bytes(), sealed=False)
        again = run_audit(settings, read_sinks=False)
        listed = [(r["topic"], r["reason"]) for r in again.unauthenticated_records]
        assert listed == [("dispatches", "no ledger-auth header")]
        assert not [v for v in again.violations if v.operation_id == "refund:outsider:v1"]

        # 5. A journal record that does not decode, and an entry whose recorded
        #    input does not: both are reported with their position, and the
        #    report is still made (the rest of the ledger is audited).
        _raw(settings, "journal", "refund:plain:v1", b"\x00garbage")
        entry = JournalEntry(
            operation_id="refund:odd:v1",
            seq=1,
            kind="Intent",
            outcome="APPLIED",
            reason="applied",
            input_topic="intents",
            input_partition=0,
            input_offset=999,
            input_event=b"\xc3\x01not avro",
        )
        _raw(settings, "journal", "refund:odd:v1", entry.to_bytes())
        survived = run_audit(settings, read_sinks=False)
        unreadable = [v.evidence for v in survived.violations if v.invariant == "readable"]
        assert len(unreadable) == 2, unreadable
        assert any("record at journal:" in e and "does not decode" in e for e in unreadable)
        assert any("intents:0:999" in e for e in unreadable)
        assert survived.checked["state"] > 0  # the sound operations were still audited
    finally:
        pub.close()
        harness.stop()


def test_audit_lists_open_items_with_their_history(
    ledger_settings: LedgerSettings, tmp_path: Path
) -> None:
    """An operation published without an approval waits for reauthorisation: the audit
    (text and JSON) names it, its age and the command that shows its history."""
    settings = ledger_settings
    harness = Harness(settings, create=False)
    pub = LedgerPublisher(settings)
    op = "refund:unapproved:v1"
    try:
        pub.publish(
            operation_id=op,
            sink="payments",
            action="refund",
            params={"account": "acct-1", "amount_minor": 100, "currency": "GBP"},
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id=None,
        )
        harness.start("processor")
        harness.wait_quiescent(90)
    finally:
        pub.close()
        harness.stop()
    env = {
        "LEDGER_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "LEDGER_TOPIC_PREFIX": settings.topic_prefix,
        "LEDGER_RUN_DIR": str(settings.run_dir),
        "LEDGER_PARTITIONS": str(settings.partitions),
    }
    runner = CliRunner()
    text = runner.invoke(main, ["audit", "--no-sinks"], env=env)
    assert text.exit_code == 0, text.output
    assert text.output.startswith("CLEAN (ledger only, sink readback off): 0 violation(s) in ")
    assert "none against sink readback (--no-sinks" in text.output
    assert "1 open item(s)" in text.output
    [line] = [ln for ln in text.output.splitlines() if ln.startswith(f"  {op}\t")]
    assert "NEEDS_REAUTHORISATION" in line and f"(ledger history {op})" in line
    assert "  journal: 0:" in text.output
    data = json.loads(runner.invoke(main, ["audit", "--json", "--no-sinks"], env=env).output)
    [item] = data["open_items"]
    assert item["operation_id"] == op and item["state"] == "NEEDS_REAUTHORISATION"
    assert item["age_s"] >= 0 and item["history"] == f"ledger history {op}"
    assert data["coverage"]["sink_readback"] is False and data["coverage"]["sink_facts"] is None
    assert data["ran_at"] and set(data["offsets"]["state"]) == {"0", "1", "2"}
    page = tmp_path / "audit.html"
    wrote = runner.invoke(
        main, ["audit", "--no-sinks", "--html", str(page), "--histories"], env=env
    )
    assert wrote.exit_code == 0, wrote.output
    [history] = list((tmp_path / "history").glob("*.html"))
    assert f'<a href="history/{history.name}"><code>ledger history {op}</code></a>' in (
        page.read_text()
    )
    assert f"<h1>History of <code>{op}</code></h1>" in history.read_text()
