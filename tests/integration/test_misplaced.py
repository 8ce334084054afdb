"""An authentic record copied to another partition reaches no stage, on the real broker.

A record's seal covers its topic, key and value, not its partition: the key
names the partition (``murmur2_random``), and that partition's owner is the
only stage that may decide about the key. An attacker who can write to
``ledger.intents`` copies a settled refund's intent, bytes and headers as
read, to every other partition. Before the placement check the processor
that held those partitions decided from no state: it wrote a sealed
``NOT_ADMITTED`` version 1 over the verified refund and asked the authority
kernel again. Now each copy is refused where it arrives, with an operating
event naming it; the refund's state, dispatches and effects do not move,
and the audit stays clean.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Message, Producer

from consumers.auditor import run_audit
from consumers.reader import current_states, read_topic
from consumers.stage import Record, read_partition
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import AdmissionRequest, Dispatch, Intent, OperatingEvent
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.topology import partition_for
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration

OP = "refund:misplaced:v1"


def _of_op(settings: LedgerSettings, topic: str, kind: type) -> list:
    return [
        r.event
        for r in read_topic(settings, topic)
        if isinstance(r.event, kind) and getattr(r.event, "operation_id", None) == OP
    ]


def test_an_intent_copied_to_another_partition_is_refused_there(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    assert settings.partitions > 1
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-1")
        publish(pub, OP, approval="ap-1")
        harness.start_all()
        harness.wait_quiescent(90)
        verified = current_states(settings)[OP]
        assert verified.state == S.OUTCOME_VERIFIED
        assert harness.effects("payments", OP) == 1
        dispatches = _of_op(settings, "dispatches", Dispatch)
        requests = _of_op(settings, "admission-requests", AdmissionRequest)

        # The attacker: the authentic intent, bytes and headers as read, on
        # every partition but its own.
        found: list[tuple[bytes | None, bytes | None, list | None, int]] = []

        def keep(rec: Record | None, msg: Message) -> None:
            if rec is not None and isinstance(rec.event, Intent) and rec.event.operation_id == OP:
                found.append((msg.key(), msg.value(), msg.headers(), msg.partition() or 0))

        read_partition(settings, "intents", None, keep)
        [(key, value, headers, home)] = found
        assert home == partition_for(OP, settings.partitions)
        producer = Producer(client_config(settings))
        landed: list[tuple[int, int]] = []
        for other in range(settings.partitions):
            if other != home:
                producer.produce(
                    settings.topic("intents"),
                    key=key,
                    value=value,
                    headers=headers,
                    partition=other,
                    on_delivery=lambda err, msg: landed.append((msg.partition(), msg.offset())),
                )
        assert producer.flush(10) == 0
        assert len(landed) == settings.partitions - 1
        harness.wait_quiescent(90)

        # Each copy was refused where it arrived, and named.
        refused = {
            (e.source_partition, e.source_offset): e.reason
            for e in _of_op(settings, "operating-events", OperatingEvent)
            if e.kind == "UNAUTHENTICATED" and e.source_topic == "intents"
        }
        assert set(refused) == set(landed), refused
        assert all(
            f"misplaced: its key belongs on partition {home}" in why for why in refused.values()
        )

        # Nothing about the refund moved: no state written over it, no new
        # admission request, no dispatch, no effect.
        assert current_states(settings)[OP] == verified
        assert _of_op(settings, "dispatches", Dispatch) == dispatches
        assert _of_op(settings, "admission-requests", AdmissionRequest) == requests
        assert harness.effects("payments", OP) == 1
        assert not harness.crashed() and not harness.failed()

        # The audit is clean: the refused copies were handled.
        report = run_audit(settings, read_sinks=True)
        assert report.violations == [], report.violations
    finally:
        pub.close()
        harness.stop()
