"""The auditor on a real ledger: sound before and after compaction, and a
deliberately corrupted ledger is caught (forged dispatch, second receipt,
missing recovery receipt)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from consumers.auditor import run_audit
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Dispatch, EffectReceipt, JournalEntry
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.topics import force_compaction
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.helpers import stage_seal
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration


def _raw(
    settings: LedgerSettings, topic: str, key: str, value: bytes | None, *, sealed: bool = True
) -> None:
    """Write a hand-made record: sealed with the stages' deployment key (an insider who
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

        clean = run_audit(settings)
        assert clean.violations == [], clean.violations
        assert clean.operations == 2 and clean.checked["state"] == 2
        assert clean.checked["recovery-receipt"] == 2 and clean.checked["consume-once"] == 2

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
