"""A stage taking over partitions waits for the previous owner's last transaction.

The split brain these tests pin down: the previous owner of a partition
(killed after asking to commit, or a paused zombie that already sent its
offsets) has a transaction open that holds both ``ledger.state`` records and
the group's offsets. A new owner that restored state at once would read up
to the last stable offset, missing those records, and then, once the
transaction commits, consume from after the inputs that produced them: it
would decide from a stale state.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from consumers.processor import Processor
from consumers.stage import await_settled, read_partition
from ledger.errors import LedgerError
from ledger.events import OperationState
from ledger.kafka import client_config, producer_config
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState
from tests import helpers
from tests.helpers import stage_seal

pytestmark = pytest.mark.integration

#: The partition the stand-in previous owner writes to (explicitly).
PARTITION = 0


def _state(
    op: str, version: int, state: RecoveryState = RecoveryState.EFFECT_PENDING
) -> OperationState:
    return helpers.state(op, state, version=version)


def _open_transaction(
    settings: LedgerSettings,
    op: str,
    version: int,
    state: RecoveryState = RecoveryState.EFFECT_PENDING,
) -> Producer:
    """A producer whose open transaction holds a state record of ``op`` (partition 0)."""
    producer = Producer(producer_config(settings, **{"transactional.id": f"old-owner-{op}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    value = _state(op, version, state).to_bytes()
    producer.produce(
        settings.topic("state"),
        key=op.encode(),
        value=value,
        partition=PARTITION,
        headers=stage_seal(settings, "state", op, value),
    )
    assert producer.flush(30) == 0
    return producer


def _versions(settings: LedgerSettings, partition: int) -> dict[str, int]:
    seen: dict[str, int] = {}

    def keep(rec: object, msg: object) -> None:
        event = getattr(rec, "event", None)
        if isinstance(event, OperationState):
            seen[event.operation_id] = event.version

    read_partition(settings, "state", {partition}, keep)
    return seen


def test_await_settled_waits_for_an_open_transaction(ledger_settings: LedgerSettings) -> None:
    settings = ledger_settings
    op = "refund:settle:v1"
    partition = PARTITION
    old_owner = _open_transaction(settings, op, 3)
    # The hazard: a read_committed restore now does not see the record.
    assert op not in _versions(settings, partition)
    with pytest.raises(LedgerError, match="held back by an open transaction"):
        await_settled(settings, "state", {partition}, timeout_s=2)
    old_owner.commit_transaction(30)
    await_settled(settings, "state", {partition}, timeout_s=30)
    assert _versions(settings, partition)[op] == 3


def test_processor_restores_only_after_the_previous_owners_transaction(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    op = "refund:takeover:v1"
    partition = PARTITION
    group = f"{settings.topic_prefix}.processor"
    inputs = [settings.topic(t) for t in Processor.inputs]
    # The previous owner: a member of the processor's group that holds the
    # partition, with a transaction carrying a state record and its offsets.
    member = Consumer(
        client_config(
            settings,
            **{
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "partition.assignment.strategy": "range",
            },
        )
    )
    member.subscribe(inputs)
    deadline = time.monotonic() + 60
    while not member.assignment():
        assert time.monotonic() < deadline, "the stand-in owner got no assignment"
        member.poll(0.1)
    # A settled state: the processor restores it and has nothing to resume, so the version
    # it holds is the committed one (an in-flight state would be claimed at once, and the
    # claim decided before this test looks, moving the version on).
    old_owner = _open_transaction(settings, op, 5, RecoveryState.OUTCOME_VERIFIED)
    old_owner.send_offsets_to_transaction(
        [TopicPartition(t, partition, 0) for t in inputs], member.consumer_group_metadata(), 30
    )
    member.close()  # the partitions move on; the transaction stays open

    processor = Processor(settings, instance="new")
    thread = threading.Thread(target=processor.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not processor.assigned:
            assert time.monotonic() < deadline, "the processor got no assignment"
            time.sleep(0.05)  # polling for a condition
        # Assigned, but it must not restore while the transaction is open.
        assert processor.current(op) is None
        old_owner.commit_transaction(30)
        deadline = time.monotonic() + 60
        while processor.current(op) is None:
            assert time.monotonic() < deadline, "the committed state was never restored"
            time.sleep(0.05)  # polling for a condition
        restored = processor.current(op)
        assert restored is not None and restored.version == 5
    finally:
        processor.stopping = True
        thread.join(60)
