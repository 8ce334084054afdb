"""Kafka transactions with raw confluent-kafka on the real broker.

These pin down the broker/client behaviour the ledger relies on:
consume-transform-produce with ``send_offsets_to_transaction`` is atomic, an
aborted transaction's outputs are invisible to read_committed readers and its
offsets are not committed, so rewinding to the committed offsets reprocesses
the inputs, which then appear exactly once.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from ledger.settings import LedgerSettings
from testbed.harness import watermarks

pytestmark = pytest.mark.integration

N = 30
PARTITIONS = 3
TIMEOUT_S = 30.0


def unique(kind: str) -> str:
    return f"test-{kind}-{uuid.uuid4().hex[:12]}"


def _create_topics(settings: LedgerSettings, *short: str) -> list[str]:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    names = [settings.topic(s) for s in short]
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names]
    )
    for future in futures.values():
        future.result(timeout=TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while not all(n in admin.list_topics(timeout=10).topics for n in names):
        assert time.monotonic() < deadline, f"{names} not visible"
        time.sleep(0.05)
    return names


def _produce_inputs(settings: LedgerSettings, topic: str) -> set[bytes]:
    producer = Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    keys = set()
    for i in range(N):
        key = f"op-{i:03d}"
        producer.produce(topic, key=key, value=f"input {i}")
        keys.add(key.encode())
    assert producer.flush(TIMEOUT_S) == 0
    return keys


def _txn_producer(settings: LedgerSettings) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "transactional.id": unique("txn"),
            "transaction.timeout.ms": 15000,
            "retry.backoff.ms": 10,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(TIMEOUT_S)
    return producer


def _txn_consumer(settings: LedgerSettings, topic: str, group: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    # No offset given: start at the group's committed offset, else earliest.
    consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
    return consumer


def _consume(consumer: Consumer, n: int) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < n:
        assert time.monotonic() < deadline, f"consumed only {len(got)} of {n}"
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
    return got


def _transform_in_txn(
    producer: Producer, consumer: Consumer, inputs: list[Message], out: str, tag: str
) -> None:
    """Produce one output per input and add the consumer's positions to the transaction."""
    producer.begin_transaction()
    for msg in inputs:
        producer.produce(
            out,
            key=msg.key(),
            value=f"{tag}|{msg.partition()}:{msg.offset()}|{msg.value().decode()}".encode(),
        )
    positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), TIMEOUT_S)


def _end_offsets(settings: LedgerSettings, topic: str) -> dict[int, int]:
    """High watermark per partition (includes transaction markers)."""
    probe = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": unique("probe"),
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        return {
            # A fresh topic's leadership may still be settling: ask again on
            # retriable answers (NOT_LEADER_FOR_PARTITION), within a bound.
            p: watermarks(probe, TopicPartition(topic, p), 10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        probe.close()


def _drain(settings: LedgerSettings, topic: str, isolation: str) -> list[tuple[bytes, bytes]]:
    """Everything a reader with ``isolation`` sees, once it has passed every record written.

    The reader must reach end-of-partition at or beyond the high watermark
    taken now, so a read_committed reader cannot stop early at a last stable
    offset still held by transaction markers that are being written.
    """
    target = _end_offsets(settings, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": unique("drain"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    records: list[tuple[bytes, bytes]] = []
    done = {p for p, end in target.items() if end == 0}
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(done) < PARTITIONS:
            assert time.monotonic() < deadline, f"{isolation} reader stuck below {target}"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                if msg.offset() >= target[msg.partition()]:
                    done.add(msg.partition())
                continue
            records.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return records


def _committed(consumer: Consumer, topic: str) -> dict[int, int]:
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    return {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=TIMEOUT_S)}


def _await_committed(consumer: Consumer, topic: str, want: dict[int, int]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while (got := _committed(consumer, topic)) != want:
        assert time.monotonic() < deadline, f"committed offsets {got}, expected {want}"
        time.sleep(0.05)


def test_committed_transaction_is_visible_and_commits_its_offsets(
    ledger_settings: LedgerSettings,
) -> None:
    s = ledger_settings
    src, out = _create_topics(s, "tx-in", "tx-out")
    keys = _produce_inputs(s, src)
    group = unique("group")
    consumer = _txn_consumer(s, src, group)
    producer = _txn_producer(s)
    try:
        inputs = _consume(consumer, N)
        _transform_in_txn(producer, consumer, inputs, out, "t1")
        producer.commit_transaction(TIMEOUT_S)

        outputs = _drain(s, out, "read_committed")
        assert sorted(k for k, _ in outputs) == sorted(keys)
        assert all(v.startswith(b"t1|") for _, v in outputs)
        _await_committed(consumer, src, _end_offsets(s, src))
    finally:
        consumer.close()

    # A new member of the group starts after the committed offsets: nothing to redo.
    fresh = _txn_consumer(s, src, group)
    try:
        assert _committed(fresh, src) == _end_offsets(s, src)
    finally:
        fresh.close()


def test_aborted_transaction_is_invisible_and_its_inputs_are_reprocessed_once(
    ledger_settings: LedgerSettings,
) -> None:
    s = ledger_settings
    src, out = _create_topics(s, "tx-in", "tx-out")
    keys = _produce_inputs(s, src)
    consumer = _txn_consumer(s, src, unique("group"))
    producer = _txn_producer(s)
    try:
        first = _consume(consumer, N)
        _transform_in_txn(producer, consumer, first, out, "aborted")
        # Deliver the outputs first (abort would purge undelivered ones), then abort.
        assert producer.flush(TIMEOUT_S) == 0
        producer.abort_transaction(TIMEOUT_S)

        assert _drain(s, out, "read_committed") == []
        # The aborted records are in the log; only read_uncommitted sees them.
        uncommitted = _drain(s, out, "read_uncommitted")
        assert len(uncommitted) == N and all(v.startswith(b"aborted|") for _, v in uncommitted)
        assert all(off < 0 for off in _committed(consumer, src).values())

        # Rewind to the committed offsets (none: the beginning) and redo the work.
        for tp in consumer.committed(consumer.assignment(), timeout=TIMEOUT_S):
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        second = _consume(consumer, N)
        assert sorted((m.partition(), m.offset()) for m in second) == sorted(
            (m.partition(), m.offset()) for m in first
        )
        _transform_in_txn(producer, consumer, second, out, "retried")
        producer.commit_transaction(TIMEOUT_S)

        committed = _drain(s, out, "read_committed")
        assert sorted(k for k, _ in committed) == sorted(keys)  # each input exactly once
        assert all(v.startswith(b"retried|") for _, v in committed)
        _await_committed(consumer, src, _end_offsets(s, src))
        assert consumer.poll(0.5) is None  # nothing left to reprocess
    finally:
        consumer.close()
