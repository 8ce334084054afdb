"""A stalled read that meets "unknown partition" asks again instead of dying.

Just after a broker restart a fresh client can answer ``_UNKNOWN_PARTITION``
for a while. ``read_partition`` asked again at the start of a read, but the
check it makes when a read stops moving let the error out: a processor
restoring its state then died of it in the fresh-clone CI run of ea91369
(mission: ``stage process(es) died of an error: {'processor-1': 1}``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

import consumers.runtime.reader as reader_module
import ledger.kafka as kafka_module
from consumers.runtime.reader import read_partition
from ledger.settings import LedgerSettings


class FakeMessage:
    def __init__(self, partition: int, offset: int) -> None:
        self._partition, self._offset = partition, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"op-1"

    def value(self) -> bytes:
        return b"x"

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (2, 0)  # the broker's append time (LogAppendTime), as sealed topics keep it


class World:
    """What the fake clients share: how many asked, and when the partition is known."""

    def __init__(self) -> None:
        self.clients: list[FakeConsumer] = []
        self.end_asks = 0
        #: the n-th "end" question (counting from 1) answers unknown partition
        self.unknown_on = {2, 3}


class FakeConsumer:
    """The first client stalls after assignment; the later ones deliver three records."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.number = len(world.clients)
        world.clients.append(self)
        self.assigned: list[TopicPartition] = []
        self.delivered = False

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        self.world.end_asks += 1
        if self.world.end_asks in self.world.unknown_on:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))
        return 0, 3

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = partitions

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        if self.number == 0 or not self.assigned or self.delivered:
            return []  # the first client never delivers: the read stalls
        self.delivered = True
        return [FakeMessage(0, offset) for offset in range(3)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        at = 3 if self.delivered else -1001
        return [TopicPartition(tp.topic, tp.partition, at) for tp in partitions]

    def close(self) -> None:
        pass


def test_a_stalled_read_rides_out_unknown_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World()
    monkeypatch.setattr(kafka_module, "Consumer", lambda *_a, **_k: FakeConsumer(world))
    monkeypatch.setattr(reader_module, "STALL_S", 0.0)
    settings = LedgerSettings(run_dir=tmp_path, topic_prefix="t")
    seen: list[int] = []

    count = read_partition(
        settings, "state", {0}, lambda _rec, msg: seen.append(msg.offset()), decode=False
    )

    assert count == 3 and seen == [0, 1, 2]
    # the end asked at the stall failed twice, and was asked again each time
    assert world.end_asks == 4
