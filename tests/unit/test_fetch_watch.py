"""A stage replaces a consumer that silently stopped fetching a partition.

``FetchWatch`` names partitions behind their end with an unmoved position;
``consumers.runtime.watches.FetchCheck`` confirms with a fresh reader and
the stage replaces the consumer. The integration test (``test_fetch_stall``) pauses a real
consumer's partitions; these pin the rules with fakes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from consumers.fetchwatch import FetchWatch
from consumers.processor import Processor
from consumers.runtime import watches
from consumers.runtime.watches import FetchCheck, FetchStall
from consumers.stage import Stage
from ledger.settings import LedgerSettings
from tests.helpers import keyed
from tests.unit.kafka_doubles import FakeMember, FakeProducer, Kafka, clients

A = ("t", 0)
B = ("t", 1)


def test_a_partition_behind_and_unmoved_is_named_after_the_stall() -> None:
    watch = FetchWatch(30.0)
    assert watch.observe({A: 5}, {A: 9}, now=100.0) == []
    assert watch.observe({A: 5}, {A: 9}, now=129.0) == []
    assert watch.observe({A: 5}, {A: 12}, now=130.0) == [A]


def test_a_moving_caught_up_or_unknown_partition_is_not_named() -> None:
    watch = FetchWatch(30.0)
    watch.observe({A: 5, B: 7}, {A: 9, B: 7}, now=0.0)
    # A moved (the wait starts afresh), B is at its end.
    assert watch.observe({A: 6, B: 7}, {A: 9, B: 7}, now=40.0) == []
    assert watch.observe({A: 6, B: 7}, {A: 9, B: 7}, now=69.0) == []
    assert watch.observe({A: 6, B: 7}, {A: 9, B: 7}, now=70.0) == [A]
    assert watch.observe({A: -1001}, {A: 9}, now=200.0) == []


def test_time_spent_busy_between_samples_does_not_count_as_a_stall() -> None:
    watch = FetchWatch(30.0, max_gap_s=10.0)
    watch.observe({A: 5}, {A: 9}, now=0.0)
    # The loop handled another partition's batch for 45 s: A's wait starts again.
    assert watch.observe({A: 5}, {A: 9}, now=45.0) == []
    for now in (50.0, 55.0, 60.0, 65.0, 70.0):
        assert watch.observe({A: 5}, {A: 9}, now=now) == []
    assert watch.observe({A: 5}, {A: 9}, now=75.0) == [A]


def test_forgiven_and_reset_partitions_wait_afresh() -> None:
    watch = FetchWatch(10.0)
    watch.observe({A: 1, B: 1}, {A: 2, B: 2}, now=0.0)
    watch.forgive(A, now=10.0)
    assert watch.observe({A: 1, B: 1}, {A: 2, B: 2}, now=10.0) == [B]
    assert watch.observe({A: 1, B: 1}, {A: 2, B: 2}, now=20.0) == [A, B]
    watch.reset()
    assert watch.observe({A: 1, B: 1}, {A: 2, B: 2}, now=25.0) == []


class _Consumer:
    def __init__(self, offsets: dict[int, int]) -> None:
        self.offsets = offsets

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("ledger.intents", p) for p in self.offsets]

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.offsets[tp.partition]) for tp in tps]

    def close(self) -> None:
        pass


class _Found:
    """A record a partition check reader gets."""

    def error(self) -> None:
        return None


class _GroupClient:
    """A plain client of the group: the ends client, or a partition check reader.

    Records where each check reader was told to start, and gives it a record
    there when ``found``.
    """

    def __init__(
        self, ends: dict[int, tuple[int, int]], found: bool, probed: list[Any], asked: list[int]
    ) -> None:
        self.ends, self.found, self.probed, self.asked = ends, found, probed, asked

    def poll(self, timeout: float) -> None:
        return None

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        self.asked.append(tp.partition)
        return self.ends[tp.partition]

    def assign(self, tps: list[TopicPartition]) -> None:
        self.probed.extend(((tp.topic, tp.partition), tp.offset) for tp in tps)

    def consume(self, num: int, timeout: float) -> list[_Found]:
        return [_Found()] if self.found else []

    def close(self) -> None:
        pass


def _stage(
    tmp_path: Path, offsets: dict[int, int], ends: dict[int, tuple[int, int]], found: bool
) -> tuple[Processor, list[FakeMember], list[tuple[tuple[str, int], int]], list[int]]:
    probed: list[tuple[tuple[str, int], int]] = []
    asked: list[int] = []
    kafka = Kafka(client=lambda _config: _GroupClient(ends, found, probed, asked))
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    made = clients(settings, kafka)
    # stalled from the first sample; a reader finding nothing gives up at once
    fetch = FetchCheck(made, FetchWatch(0.0), probe_s=0.05)
    stage = Processor(settings, clients=made, fetch=fetch)
    stage.consumer = _Consumer(offsets)  # type: ignore[assignment]
    return stage, kafka.members, probed, asked


def test_a_stalled_partition_with_a_record_waiting_replaces_the_consumer(
    tmp_path: Path,
) -> None:
    stage, rejoined, probed, _ = _stage(tmp_path, {0: 4, 1: 8}, {0: (0, 6), 1: (0, 8)}, True)
    stage.loop.check_fetching()
    assert probed == [(("ledger.intents", 0), 4)]  # partition 1 is at its end
    assert len(rejoined) == 1 and stage.consumer is rejoined[0]
    assert stage.fetch_stalls == 1
    assert stage.broker_bounced


def test_nothing_to_deliver_there_keeps_the_consumer(tmp_path: Path) -> None:
    # A transaction marker between the position and the end delivers nothing.
    stage, rejoined, probed, _ = _stage(tmp_path, {0: 5}, {0: (0, 6)}, False)
    stage.loop.check_fetching()
    assert probed == [(("ledger.intents", 0), 5)]
    assert rejoined == [] and stage.fetch_stalls == 0


def test_nothing_delivered_yet_counts_from_the_committed_offset_or_the_start(
    tmp_path: Path,
) -> None:
    stage, _, probed, _ = _stage(tmp_path, {0: -1001, 1: -1001}, {0: (0, 9), 1: (3, 9)}, False)
    stage.assignment.note_assigned_at([TopicPartition("ledger.intents", 0, 7)])
    stage.loop.check_fetching()
    assert probed == [(("ledger.intents", 0), 7), (("ledger.intents", 1), 3)]


def test_no_check_during_an_outage_nor_before_it_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage, rejoined, probed, asked = _stage(tmp_path, {0: 4}, {0: (0, 6)}, True)
    monkeypatch.setattr(type(stage.retry), "waiting", property(lambda self: {"since": 0}))
    stage.loop.check_fetching()
    assert asked == [] and probed == [] and rejoined == []
    monkeypatch.undo()
    stage.loop.check_fetching()  # not due yet: the outage's pass counted
    assert asked == []
    stage.fetch.next_check = 0.0
    stage.loop.check_fetching()
    assert len(rejoined) == 1


def test_probing_stops_at_the_first_record_found(tmp_path: Path) -> None:
    stage, rejoined, probed, _ = _stage(
        tmp_path, {0: 1, 1: 1, 2: 1}, {p: (0, 4) for p in range(3)}, True
    )
    stage.loop.check_fetching()
    assert probed == [(("ledger.intents", 0), 1)]
    assert len(rejoined) == 1


class _CountingCheck(FetchCheck):
    """A fetch check that counts the samples it is asked for and finds nothing."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.samples = 0

    def check(self, *args: Any) -> FetchStall | None:
        self.samples += 1
        return None


class _Idle(Stage):
    component = "processor"
    inputs = ("intents",)

    def handle(self, records: list[Any], out: Any) -> None:
        pass


class _Msg:
    """A record of an unassigned partition (the batch is left to its owner)."""

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "ledger.intents"

    def partition(self) -> int:
        return 0


def test_the_stage_samples_only_when_idle(tmp_path: Path) -> None:
    """A batch handled means a loop that is busy, not stalled: no check on that pass."""
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    made = clients(settings, Kafka())
    check = _CountingCheck(made)
    stage = _Idle(settings, clients=made, fetch=check)

    def stop() -> None:
        stage.stopping = True

    stage.consumer = FakeMember([[_Msg()], [], [_Msg()]], on_empty=stop)  # type: ignore[assignment]
    stage.producer = FakeProducer()  # type: ignore[assignment]
    stage.loop.loop(None)
    assert check.samples == 2  # the empty pass and the last one, not the two batches
    assert watches.FETCH_CHECK_EVERY_S < watches.FETCH_STALL_S
