"""``ledger history`` on the real broker: a crashed and resumed operation, told in order."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from consumers.history import read_history
from consumers.reader import current_states
from ledger.cli import main
from ledger.cli.common import EXIT_UNKNOWN_OPERATION
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Dispatch, EffectReceipt, JournalEntry, OperationState, Readback
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration


def _env(settings: LedgerSettings) -> dict[str, str]:
    return {
        "LEDGER_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "LEDGER_TOPIC_PREFIX": settings.topic_prefix,
        "LEDGER_RUN_DIR": str(settings.run_dir),
        "LEDGER_CLOCK": "manual",
        "LEDGER_TESTBED": "true",
        "LEDGER_PARTITIONS": str(settings.partitions),
    }


def test_history_of_a_resumed_operation(ledger_settings: LedgerSettings) -> None:
    op = "refund:history:v1"
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    try:
        approve(pub)
        harness.arm("after_dispatch_before_send", op)
        publish(pub, op)
        harness.start_all()
        harness.wait_quiescent(90)
        assert not harness.alive("relay")  # died before sending
        harness.kill("processor")
        harness.restart("processor")  # claims what it restored
        harness.wait_quiescent(90)
        harness.restart("relay")
        harness.wait_quiescent(90)
    finally:
        pub.close()
        harness.stop()
    final = current_states(ledger_settings)[op]
    assert final.state == S.OUTCOME_VERIFIED
    # An outsider's receipt (no seal) and bytes that do not decode: listed, not believed.
    forged = EffectReceipt(
        operation_id=op,
        dispatch_id=f"{op}#9.9",
        status="COMMITTED",
        sink="payments",
        attempt_id="forged",
        fencing_token=9,
        effect_id="payments-forged",
        observed_at_ms=0,
        first_attempt_at_ms=0,
        detail="forged",
        observer="outsider",
    )
    raw = Producer(client_config(ledger_settings, partitioner="murmur2_random"))
    raw.produce(ledger_settings.topic("receipts"), key=op.encode(), value=forged.to_bytes())
    raw.produce(ledger_settings.topic("claims"), key=op.encode(), value=b"\x00garbage")
    assert raw.flush(10) == 0

    history = read_history(ledger_settings, op)
    unbelieved = [e for e in history.entries if not e.record.believed]
    assert sorted((e.record.topic, e.kind) for e in unbelieved) == [
        ("claims", "UNREADABLE"),
        ("receipts", "EffectReceipt"),
    ]
    assert all(e.summary.startswith("NOT BELIEVED (") for e in unbelieved)
    assert "payments-forged" not in history.answer("target").answer
    entries = tuple(e for e in history.entries if e.record.believed)
    assert all(e.record.key in (op, "ap-1") for e in entries)
    topics = {e.record.topic for e in entries}
    assert {
        "intents",
        "approvals",
        "approval-uses",
        "admission-requests",
        "admissions",
        "dispatches",
        "receipts",
        "readbacks",
        "claims",
        "journal",
        "state",
        "recovery-receipts",
    } <= topics
    positions = [e.record.position for e in entries]

    # Causal order: every journaled input before its entry; each dispatch after the
    # entry that wrote it and before what the sink said about it; state versions rise.
    seen_dispatch: set[str] = set()
    versions: list[int] = []
    journal_at: dict[int, int] = {}
    for n, e in enumerate(entries):
        ev = e.record.event
        if isinstance(ev, JournalEntry):
            where = (ev.input_topic, ev.input_partition, ev.input_offset)
            assert where in positions[:n], f"input {where} of journal seq {ev.seq} not before it"
            if ev.outcome == "APPLIED":
                journal_at[ev.seq] = n
        elif isinstance(ev, Dispatch):
            assert journal_at.get(ev.state_version, n) < n
            seen_dispatch.add(ev.dispatch_id)
        elif isinstance(ev, EffectReceipt | Readback):
            assert ev.dispatch_id in seen_dispatch, f"{e.summary} before its dispatch"
        elif isinstance(ev, OperationState) and e.record.topic == "state":
            versions.append(ev.version)
    assert versions == sorted(versions) and versions[-1] == final.version
    kinds = [e.kind for e in entries]
    assert kinds.index("Intent") < kinds.index("AdmissionDecision") < kinds.index("Claim")
    assert kinds.index("Claim") < kinds.index("RecoveryReceipt")

    # The five answers, each resting on recorded evidence.
    assert all(a.recorded for a in history.answers), [a.answer for a in history.answers]
    assert history.answer("initiated").answer.startswith("svc for subject customer-1")
    admitted = history.answer("admitted").answer
    assert final.parameter_digest in admitted and "approval ap-1" in admitted
    assert "receipt COMMITTED" in history.answer("target").answer
    assert "by processor-0" in history.answer("resume").answer
    assert history.answer("outcome").answer.startswith("OUTCOME_VERIFIED")

    # The command: --json in the documented shape; an unknown operation exits 5.
    runner = CliRunner()
    result = runner.invoke(main, ["history", op, "--json"], env=_env(ledger_settings))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["operation_id"] == op
    assert [a["key"] for a in data["answers"]] == [
        "initiated",
        "admitted",
        "target",
        "resume",
        "outcome",
    ]
    assert [(r["topic"], r["partition"], r["offset"]) for r in data["records"]] == [
        e.record.position for e in history.entries
    ]
    assert data["counts"]["unbelieved"] == 2
    assert data["final_state"]["state"] == "OUTCOME_VERIFIED"
    text = runner.invoke(main, ["history", op], env=_env(ledger_settings))
    assert text.exit_code == 0 and "Who initiated the case?" in text.output
    missing = runner.invoke(main, ["history", "refund:nobody:v1"], env=_env(ledger_settings))
    assert missing.exit_code == EXIT_UNKNOWN_OPERATION
    assert "no operation 'refund:nobody:v1' in the ledger" in missing.output
