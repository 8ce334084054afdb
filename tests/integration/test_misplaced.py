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

A copy must not stand for the operation on the restore either: when a
forged record has displaced a settled state on its own partition (see
``test_forged_state.py``), copies of it on the other partitions are refused
as misplaced and leave the displacing record, and the journal partition the
state is rebuilt from, where they are.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Message, Producer

from consumers.auditor import run_audit
from consumers.reader import current_states
from consumers.stage import Record, read_partition
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import AdmissionRequest, Dispatch, Intent, OperatingEvent
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.topology import COMPACTION_KEY, partition_for
from producers.publisher import LedgerPublisher
from testbed.compaction import force_compaction
from testbed.harness import Harness
from tests.integration.test_stages import approve, of_operation, publish

pytestmark = pytest.mark.integration

OP = "refund:misplaced:v1"


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
        dispatches = of_operation(settings, OP, "dispatches", Dispatch)
        requests = of_operation(settings, OP, "admission-requests", AdmissionRequest)

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
            for e in of_operation(settings, OP, "operating-events", OperatingEvent)
            if e.kind == "UNAUTHENTICATED" and e.source_topic == "intents"
        }
        assert set(refused) == set(landed), refused
        assert all(
            f"misplaced: its key belongs on partition {home}" in why for why in refused.values()
        )

        # Nothing about the refund moved: no state written over it, no new
        # admission request, no dispatch, no effect.
        assert current_states(settings)[OP] == verified
        assert of_operation(settings, OP, "dispatches", Dispatch) == dispatches
        assert of_operation(settings, OP, "admission-requests", AdmissionRequest) == requests
        assert harness.effects("payments", OP) == 1
        assert not harness.crashed() and not harness.failed()

        # The audit is clean: the refused copies were handled.
        report = run_audit(settings, read_sinks=True)
        assert report.violations == [], report.violations
    finally:
        pub.close()
        harness.stop()


def _write_state(settings: LedgerSettings, key: bytes, value: bytes, partition: int) -> int:
    """Write to ``ledger.state`` as an outsider (no seal); returns the offset."""
    producer = Producer(client_config(settings))
    landed: list[int] = []
    producer.produce(
        settings.topic("state"),
        key=key,
        value=value,
        partition=partition,
        on_delivery=lambda err, msg: landed.append(msg.offset() or 0),
    )
    assert producer.flush(10) == 0 and landed
    return landed[0]


def test_copies_of_a_displacing_state_do_not_hide_it_from_the_rebuild(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    op = "refund:misplaced-displaced:v1"
    home = partition_for(op, settings.partitions)
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-1")
        publish(pub, op, approval="ap-1")
        harness.start_all()
        harness.wait_quiescent(90)
        verified = current_states(settings)[op]
        assert verified.state == S.OUTCOME_VERIFIED
        requests = of_operation(settings, op, "admission-requests", AdmissionRequest)

        # An unsealed in-flight state displaces the verified one on its own
        # partition (compaction removes the authentic records) ...
        harness.kill("processor")
        forged = verified.model_copy(
            update={"state": S.NOT_ADMITTED, "version": verified.version + 1, "reason": "x"}
        ).to_bytes()
        displacing = _write_state(settings, op.encode(), forged, home)
        force_compaction(settings, names=["state"])
        # ... and copies of it go to every other partition, read after the
        # home partition (behind records of the reserved key, which restores
        # pass over), so that the last refused record of the key is a copy.
        copies = []
        for other in range(settings.partitions):
            if other != home:
                for _ in range(4):
                    _write_state(settings, COMPACTION_KEY, b"x" * 800_000, other)
                copies.append((other, _write_state(settings, op.encode(), forged, other)))

        harness.restart("processor")
        harness.wait_quiescent(90)

        # The state is rebuilt from the journal of its own partition, and the
        # event names the record that displaced it, not a copy.
        events = of_operation(settings, op, "operating-events", OperatingEvent)
        [rebuilt] = [e for e in events if e.kind == "STATE_REBUILT"]
        assert (rebuilt.source_topic, rebuilt.source_partition, rebuilt.source_offset) == (
            "state",
            home,
            displacing,
        )
        refused = {
            (e.source_partition, e.source_offset)
            for e in events
            if e.kind == "UNAUTHENTICATED" and e.source_topic == "state"
        }
        assert refused == {(home, displacing), *copies}

        # The intent published again is a duplicate: nothing is readmitted,
        # and the rebuilt state is written back with it.
        publish(pub, op, approval="ap-1")
        harness.wait_quiescent(90)
        assert of_operation(settings, op, "admission-requests", AdmissionRequest) == requests
        assert harness.effects("payments", op) == 1
        assert current_states(settings)[op] == verified
        assert run_audit(settings, read_sinks=True).violations == []
    finally:
        pub.close()
        harness.stop()
