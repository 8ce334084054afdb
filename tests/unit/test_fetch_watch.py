"""A stage replaces a consumer that silently stopped fetching a partition.

``FetchWatch`` names partitions behind their end with an unmoved position;
``Stage._check_fetching`` confirms with a fresh reader and replaces the
consumer. The integration test (``test_fetch_stall``) pauses a real
consumer's partitions; these pin the rules with fakes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from consumers import stage as stage_module
from consumers.fetchwatch import FetchWatch
from consumers.processor import Processor
from ledger.settings import LedgerSettings
from tests.helpers import keyed

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


class _Ends:
    def __init__(self, ends: dict[int, tuple[int, int]]) -> None:
        self.ends = ends
        self.asked = 0

    def poll(self, timeout: float) -> None:
        return None

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        self.asked += 1
        return self.ends[tp.partition]


def _stage(
    tmp_path: Path, offsets: dict[int, int], ends: dict[int, tuple[int, int]], found: bool
) -> tuple[Processor, list[str], list[tuple[tuple[str, int], int]], _Ends]:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
    stage.consumer = _Consumer(offsets)  # type: ignore[assignment]
    client = _Ends(ends)
    stage._ends_client = client  # type: ignore[assignment]
    stage._fetch_watch = FetchWatch(0.0)  # stalled from the first sample
    rejoined: list[str] = []
    probed: list[tuple[tuple[str, int], int]] = []

    def record_at(key: tuple[str, int], offset: int) -> bool:
        probed.append((key, offset))
        return found

    stage._record_at = record_at  # type: ignore[method-assign]
    stage._rejoin = lambda: rejoined.append("rejoined")  # type: ignore[method-assign]
    return stage, rejoined, probed, client


def test_a_stalled_partition_with_a_record_waiting_replaces_the_consumer(
    tmp_path: Path,
) -> None:
    stage, rejoined, probed, _ = _stage(tmp_path, {0: 4, 1: 8}, {0: (0, 6), 1: (0, 8)}, True)
    stage._check_fetching()
    assert probed == [(("ledger.intents", 0), 4)]  # partition 1 is at its end
    assert rejoined == ["rejoined"]
    assert stage.fetch_stalls == 1
    assert stage.broker_bounced


def test_nothing_to_deliver_there_keeps_the_consumer(tmp_path: Path) -> None:
    # A transaction marker between the position and the end delivers nothing.
    stage, rejoined, probed, _ = _stage(tmp_path, {0: 5}, {0: (0, 6)}, False)
    stage._check_fetching()
    assert probed == [(("ledger.intents", 0), 5)]
    assert rejoined == [] and stage.fetch_stalls == 0


def test_nothing_delivered_yet_counts_from_the_committed_offset_or_the_start(
    tmp_path: Path,
) -> None:
    stage, _, probed, _ = _stage(tmp_path, {0: -1001, 1: -1001}, {0: (0, 9), 1: (3, 9)}, False)
    stage._note_assigned_at([TopicPartition("ledger.intents", 0, 7)])
    stage._check_fetching()
    assert probed == [(("ledger.intents", 0), 7), (("ledger.intents", 1), 3)]


def test_no_check_during_an_outage_nor_before_it_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage, rejoined, probed, client = _stage(tmp_path, {0: 4}, {0: (0, 6)}, True)
    monkeypatch.setattr(type(stage.retry), "waiting", property(lambda self: {"since": 0}))
    stage._check_fetching()
    assert client.asked == 0 and probed == [] and rejoined == []
    monkeypatch.undo()
    stage._check_fetching()  # not due yet: the outage's pass counted
    assert client.asked == 0
    stage._next_fetch_check = 0.0
    stage._check_fetching()
    assert rejoined == ["rejoined"]


def test_probing_stops_at_the_first_record_found(tmp_path: Path) -> None:
    stage, rejoined, probed, _ = _stage(
        tmp_path, {0: 1, 1: 1, 2: 1}, {p: (0, 4) for p in range(3)}, True
    )
    stage._check_fetching()
    assert probed == [(("ledger.intents", 0), 1)]
    assert rejoined == ["rejoined"]


def test_the_stage_samples_only_when_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch handled means a loop that is busy, not stalled: no check on that pass."""
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
    checks: list[int] = []
    batches = iter([["record"], [], ["record"]])

    def next_batch() -> list[Any]:
        try:
            return next(batches)
        except StopIteration:
            stage.stopping = True
            return []

    class _Msg:
        def error(self) -> None:
            return None

    stage.consumer = object()  # type: ignore[assignment]
    stage.producer = type("P", (), {"poll": lambda self, t: 0})()
    monkeypatch.setattr(stage, "_next_batch", lambda: [_Msg() for _ in next_batch()])
    monkeypatch.setattr(stage, "_process", lambda msgs: None)
    monkeypatch.setattr(stage, "_commit_skipped", lambda: None)
    monkeypatch.setattr(stage, "idle", lambda: None)
    monkeypatch.setattr(stage, "_report_ready", lambda: None)
    monkeypatch.setattr(stage, "_check_fetching", lambda: checks.append(1))
    stage._loop(None)
    assert len(checks) == 2  # the empty pass and the last one, not the two batches
    assert stage_module.FETCH_CHECK_EVERY_S < stage_module.FETCH_STALL_S
