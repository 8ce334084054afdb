"""The stages on the real broker: the happy path, bad input, drift, and the
abort and fatal-error paths of the transactional loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from consumers.processor import Processor
from consumers.reader import current_states, read_topic
from consumers.stage import Record, Writer
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import (
    Approval,
    Dispatch,
    EffectReceipt,
    JournalEntry,
    OperatingEvent,
    Readback,
)
from ledger.serde import MARKER
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from testbed.people import can_sign
from tests import helpers

pytestmark = pytest.mark.integration

PARAMS = {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}


def of_operation(settings: LedgerSettings, op: str, topic: str, kind: type) -> list[Any]:
    """The events of ``kind`` on ``topic`` about operation ``op``, in the order read."""
    return [
        r.event
        for r in read_topic(settings, topic)
        if isinstance(r.event, kind) and getattr(r.event, "operation_id", None) == op
    ]


def publish(pub: LedgerPublisher, op: str, amount: int = 5000, approval: str = "ap-1") -> None:
    pub.publish(
        operation_id=op,
        sink="payments",
        action="refund",
        params={**PARAMS, "amount_minor": amount},
        actor="svc",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
        approval_id=approval,
    )


REVIEWER = ReviewerKey.generate("reviewer-test")


def approve(pub: LedgerPublisher, approval_id: str = "ap-1", max_amount: int = 9000) -> None:
    trust(pub.settings.trusted_keys_path(), REVIEWER)
    pub.credentials.add(REVIEWER)
    pub.publish_approval(
        REVIEWER.sign(
            Approval(
                approval_id=approval_id,
                reviewer="rev",
                policy_version=1,
                expires_at_ms=1_000_000,
                scope_subject="customer-1",
                scope_max_amount_minor=max_amount,
                granted_at_ms=0,
            ),
            ledger_id=pub.settings.ledger_identity,
        )
    )


@pytest.fixture
def ledger(ledger_settings: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher]]:
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    try:
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def test_intent_to_verified_outcome_with_one_effect(ledger) -> None:
    harness, pub = ledger
    approve(pub)
    publish(pub, "refund:happy:v1")
    harness.start_all()
    harness.wait_quiescent(90)
    state = current_states(harness.settings)["refund:happy:v1"]
    assert state.state == S.OUTCOME_VERIFIED
    assert harness.effects("payments", "refund:happy:v1") == 1
    kinds = [
        r.event.kind
        for r in read_topic(harness.settings, "journal")
        if isinstance(r.event, JournalEntry)
    ]
    # Verified by the postcondition the relay read right after the effect,
    # carried by its receipt: no VERIFY dispatch, no readback record.
    assert kinds[0] == "Intent" and "AdmissionDecision" in kinds and kinds.count("Readback") == 0


def _of(settings: LedgerSettings, topic: str, op: str) -> list[Any]:
    return [r.event for r in read_topic(settings, topic) if r.key == op and r.event is not None]


def test_the_relay_commits_the_effect_and_its_postcondition_in_one_receipt(ledger) -> None:
    harness, pub = ledger
    settings = harness.settings
    op = "refund:inline:v1"
    approve(pub)
    publish(pub, op)
    harness.start_all()
    harness.wait_quiescent(90)
    assert current_states(settings)[op].state == S.OUTCOME_VERIFIED
    assert harness.effects("payments", op) == 1
    receipts = [e for e in _of(settings, "receipts", op) if isinstance(e, EffectReceipt)]
    assert [r.status for r in receipts] == ["ATTEMPTED", "COMMITTED"]
    committed = receipts[1]
    assert committed.postcondition_status == "MATCH"
    assert committed.postcondition_source == "payments GET /accounts/acct-1"
    assert committed.postcondition_observed_at_ms is not None
    dispatches = [e for e in _of(settings, "dispatches", op) if isinstance(e, Dispatch)]
    assert [d.kind for d in dispatches] == ["EXECUTE"]  # no VERIFY
    assert _of(settings, "readbacks", op) == []
    journal = [e for e in _of(settings, "journal", op) if isinstance(e, JournalEntry)]
    (folded,) = [j for j in journal if j.kind == "EffectReceipt" and j.outcome == "APPLIED"]
    assert (folded.from_state, folded.to_state) == ("EFFECT_PENDING", "OUTCOME_VERIFIED")
    assert folded.hops == (
        "EFFECT_PENDING->EFFECT_COMMITTED",
        "EFFECT_COMMITTED->OUTCOME_VERIFIED",
    )


def test_without_inline_verification_the_processor_dispatches_a_verify(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings.model_copy(update={"relay_inline_verify": False})
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    op = "refund:two-hops:v1"
    try:
        approve(pub)
        publish(pub, op)
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(settings)[op].state == S.OUTCOME_VERIFIED
        receipts = [e for e in _of(settings, "receipts", op) if isinstance(e, EffectReceipt)]
        assert [(r.status, r.postcondition_status) for r in receipts] == [
            ("ATTEMPTED", None),
            ("COMMITTED", None),
        ]
        dispatches = [e for e in _of(settings, "dispatches", op) if isinstance(e, Dispatch)]
        assert [d.kind for d in dispatches] == ["EXECUTE", "VERIFY"]
        (readback,) = [e for e in _of(settings, "readbacks", op) if isinstance(e, Readback)]
        assert (readback.kind, readback.status) == ("POSTCONDITION", "MATCH")
    finally:
        pub.close()
        harness.stop()


def test_bad_input_is_dead_lettered_and_the_partition_keeps_moving(ledger) -> None:
    harness, pub = ledger
    settings = harness.settings
    raw = Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    op = "refund:bad:v1"
    garbage = [b"\x00\x01garbage", MARKER + b"\xde\xad\xbe\xef\x00\x00\x00\x00body", None]
    for value in garbage:
        raw.produce(settings.topic("intents"), key=op.encode(), value=value)
    raw.flush(10)
    # A keyless record never reaches a compacted topic: the broker refuses it.
    refused: list[KafkaError | None] = []
    raw.produce(
        settings.topic("intents"), key=None, value=b"x", on_delivery=lambda e, m: refused.append(e)
    )
    raw.flush(10)
    assert refused and refused[0] is not None
    approve(pub)
    publish(pub, op)
    harness.start_all()
    harness.wait_quiescent(90)
    assert current_states(settings)[op].state == S.OUTCOME_VERIFIED
    dead = [
        r.event
        for r in read_topic(settings, "operating-events")
        if isinstance(r.event, OperatingEvent) and r.event.kind == "BAD_INPUT"
    ]
    assert len(dead) == 3
    assert {d.original_bytes for d in dead} >= {garbage[0], garbage[1]}
    assert all(d.source_topic == "intents" and d.reason for d in dead)


def test_oversized_records_and_odd_ids_are_refused_and_every_stage_keeps_moving(ledger) -> None:
    """A value near Kafka's limit, a 10 KB key and an intent whose operation ID
    has a newline: each is refused with an operating event, nothing is copied
    whole, no stage stops, and a good operation afterwards completes."""
    harness, pub = ledger
    settings = harness.settings
    raw = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "partitioner": "murmur2_random",
            "message.max.bytes": 1_040_000,
        }
    )
    big = MARKER + bytes(999_000)
    raw.produce(settings.topic("claims"), key=b"refund:big:v1", value=big)
    raw.produce(settings.topic("approvals"), key=b"ap-big", value=big)
    raw.produce(settings.topic("intents"), key=b"k" * 10_000, value=b"\x00junk")
    odd_key = b"refund:\xff\xfe:v1"  # not UTF-8: the dead letter must keep the bytes
    raw.produce(
        settings.topic("intents"),
        key=odd_key,
        value=b"\x01junk",
        headers=[("traceparent", b"00-abc"), ("empty", None)],
    )
    odd = helpers.intent(op="refund:26\n:v1", approval="ap-1")
    raw.produce(settings.topic("intents"), key=odd.operation_id.encode(), value=odd.to_bytes())
    raw.flush(30)
    approve(pub)
    good = "refund:after-odd:v1"
    publish(pub, good)
    harness.start_all()
    harness.wait_quiescent(90)
    assert current_states(settings)[good].state == S.OUTCOME_VERIFIED
    assert odd.operation_id not in current_states(settings)
    assert all(harness.alive(stage) for stage in ("processor", "authority", "relay"))
    events = [
        r.event
        for r in read_topic(settings, "operating-events")
        if isinstance(r.event, OperatingEvent)
    ]
    too_big = [e for e in events if e.kind == "BAD_INPUT" and "bytes (over" in e.reason]
    assert {e.source_topic for e in too_big} == {"claims", "approvals", "intents"}
    big_values = [e for e in too_big if e.source_topic in ("claims", "approvals")]
    assert big_values and all(e.original_bytes is None for e in big_values)
    assert all("not copied" in e.reason for e in big_values)
    (long_key,) = [e for e in too_big if e.source_topic == "intents"]
    assert long_key.operation_id is None and "key sha256:" in long_key.reason
    (kept,) = [e for e in events if e.kind == "BAD_INPUT" and e.original_key == odd_key]
    assert kept.original_bytes == b"\x01junk"
    assert [(h.name, h.value) for h in kept.original_headers or []] == [
        ("traceparent", b"00-abc"),
        ("empty", None),
    ]
    refused = [e for e in events if e.kind == "BAD_INPUT" and "U+000A" in e.reason]
    assert [e.operation_id for e in refused] == [odd.operation_id]


def test_parameter_drift_is_refused_and_visible(ledger) -> None:
    harness, pub = ledger
    approve(pub)
    publish(pub, "refund:drift:v1", amount=5000)
    harness.start_all()
    harness.wait_quiescent(90)
    before = current_states(harness.settings)["refund:drift:v1"]
    publish(pub, "refund:drift:v1", amount=7000)
    harness.wait_quiescent(90)
    after = current_states(harness.settings)["refund:drift:v1"]
    assert after == before and after.state == S.OUTCOME_VERIFIED
    drift = [
        r.event
        for r in read_topic(harness.settings, "operating-events")
        if isinstance(r.event, OperatingEvent) and r.event.kind == "PARAMETER_DRIFT"
    ]
    assert len(drift) == 1 and drift[0].operation_id == "refund:drift:v1"
    assert harness.effects("payments", "refund:drift:v1") == 1


class FailingProcessor(Processor):
    """A processor whose first transaction fails after writing its outputs."""

    def __init__(self, settings: LedgerSettings, error: KafkaError) -> None:
        super().__init__(settings, "failing")
        self.error = error
        self.failures = 0

    def handle(self, records: list[Record], out: Writer) -> None:
        super().handle(records, out)
        if self.failures == 0 and records:
            self.failures += 1
            assert self.producer is not None
            self.producer.flush(10)  # the outputs reach the broker, uncommitted
            raise KafkaException(self.error)


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(KafkaError._STATE, "injected abortable error", txn_requires_abort=True),
        KafkaError(KafkaError._FENCED, "injected fatal error", fatal=True),
    ],
    ids=["abortable", "fatal"],
)
def test_failed_transaction_is_invisible_and_its_input_reprocessed(
    ledger_settings: LedgerSettings, error: KafkaError
) -> None:
    pub = LedgerPublisher(ledger_settings)
    ops = [f"refund:abort{n}:v1" for n in range(3)]
    for op in ops:
        publish(pub, op, approval=f"ap-{op}")
    pub.close()
    stage = FailingProcessor(ledger_settings, error)
    thread = threading.Thread(target=stage.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            journal = [r for r in read_topic(ledger_settings, "journal") if r.key in ops]
            if len(journal) >= len(ops):
                break
            time.sleep(0.2)
    finally:
        stage.stopping = True
        thread.join(30)
    assert stage.failures == 1
    # read_committed readers see each input's outputs exactly once: the aborted
    # transaction's journal, state and admission requests are invisible.
    journal = [r for r in read_topic(ledger_settings, "journal") if r.key in ops]
    assert sorted(r.key for r in journal) == sorted(ops)
    requests = read_topic(ledger_settings, "admission-requests")
    assert sorted(r.event.operation_id for r in requests) == sorted(ops)
    assert set(current_states(ledger_settings)) == set(ops)


def test_restarted_processor_resumes_in_flight_operations(ledger) -> None:
    harness, pub = ledger
    op = "refund:resume:v1"
    approve(pub)
    harness.arm("after_dispatch_before_send", op)
    publish(pub, op)
    harness.start_all()
    harness.wait_quiescent(90)
    assert not harness.alive("relay")  # died before sending
    before = current_states(harness.settings)[op]
    assert before.state == S.EFFECT_PENDING
    harness.kill("processor")
    harness.restart("processor")  # claims what it restored before it says it is ready
    harness.wait_quiescent(90)
    harness.restart("relay")
    harness.wait_quiescent(90)
    after = current_states(harness.settings)[op]
    assert after.state == S.OUTCOME_VERIFIED
    assert after.epoch > before.epoch  # the resume fenced the earlier owner
    assert after.recovery_receipts >= 1
    assert harness.effects("payments", op) == 1
    claims = [
        r.event
        for r in read_topic(harness.settings, "journal")
        if isinstance(r.event, JournalEntry) and r.event.kind == "Claim"
    ]
    assert [c.outcome for c in claims] == ["APPLIED"]
    receipts = read_topic(harness.settings, "recovery-receipts")
    assert receipts and receipts[-1].event.claimant == "processor-0"


def test_unknown_outcome_is_held_until_an_attributable_disposition(
    ledger_settings: LedgerSettings,
) -> None:
    from consumers.reconciler import open_items, reconcile_once
    from ledger.contracts import EffectContract
    from ledger.events import Disposition

    harness = Harness(ledger_settings, create=False)
    harness.start_sink("mailer", EffectContract(), hang_s=2 * ledger_settings.sink_timeout_s)
    pub = LedgerPublisher(ledger_settings)
    op = "notify:held:v1"
    try:
        approve(pub)
        with harness.sinks["mailer"].client() as client:
            client.arm_fault(op, "timeout_after_commit")
        pub.publish(
            operation_id=op,
            sink="mailer",
            action="send_email",
            params={"to": "customer-1", "amount_minor": 0},
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id="ap-1",
        )
        harness.start_all()
        harness.wait_quiescent(90)
        assert [st.operation_id for st in open_items(ledger_settings)] == [op]
        observed = reconcile_once(ledger_settings)
        assert [r["observed"] for r in observed] == ["UNSUPPORTED"]
        harness.advance(3600)
        harness.wait_quiescent(90)
        held = current_states(ledger_settings)[op]
        assert held.state == S.UNKNOWN_OUTCOME  # neither time nor a readback released it
        can_sign(pub, ledger_settings, "operator-3")
        pub.publish_disposition(
            Disposition(
                disposition_id="d-1",
                operation_id=op,
                decision="COMMITTED",
                by="operator-3",
                evidence="mail provider log shows delivery",
                disposed_at_ms=harness.clock.now_ms(),
                episode=held.entered_version,  # the unknown outcome it answers
            )
        )
        harness.wait_quiescent(90)
        released = current_states(ledger_settings)[op]
        assert released.state == S.EFFECT_COMMITTED
        assert "operator-3" in (released.observation_source or "")
        assert open_items(ledger_settings) == []
        assert harness.effects("mailer", op) == 1
    finally:
        pub.close()
        harness.stop()


def test_two_instances_of_each_stage_survive_kills_without_duplicates(
    ledger_settings: LedgerSettings,
) -> None:
    from collections import Counter

    from consumers.auditor import run_audit

    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    trust(settings.trusted_keys_path(), REVIEWER)
    ops = [f"refund:multi{n}:v1" for n in range(60)]
    try:
        for component in ("processor", "authority", "relay"):
            for instance in ("0", "1"):
                harness.start(component, instance)
        for n, op in enumerate(ops):
            pub.publish_approval(
                REVIEWER.sign(
                    Approval(
                        approval_id=f"ap-{op}",
                        reviewer="rev",
                        policy_version=1,
                        expires_at_ms=1_000_000,
                        scope_subject="customer-1",
                        scope_max_amount_minor=9000,
                        scope_operation_id=op,
                        granted_at_ms=0,
                    ),
                    ledger_id=pub.settings.ledger_identity,
                )
            )
            publish(pub, op, approval=f"ap-{op}")
            if n == 30:
                # Partitions move mid-flight: one processor and one relay die.
                harness.wait_quiescent(90)
                harness.kill("processor", "1")
                harness.kill("relay", "0")
        harness.restart()
        harness.wait_quiescent(120)
        states = current_states(settings)
        assert Counter(str(states[op].state) for op in ops) == {"OUTCOME_VERIFIED": len(ops)}
        with harness.sinks["payments"].client() as client:
            effects = client.effects()
        assert [effects.get(op, 0) for op in ops] == [1] * len(ops)
        report = run_audit(settings)
        assert report.violations == []
    finally:
        pub.close()
        harness.stop()
