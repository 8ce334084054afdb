"""A stage commits as soon as its input is drained (consumers.runtime.loop.StageLoop.next_batch).

The consumer is a fake that records how long each call was allowed to wait:
the commit interval bounds only the wait for a batch's first record; what
is already there is taken without waiting for more.
"""

from __future__ import annotations

from pathlib import Path

from consumers.processor import Processor
from ledger.settings import LedgerSettings
from tests.helpers import keyed
from tests.unit.kafka_doubles import FakeProducer


class _Queue:
    """A consumer holding ``n`` records; each call takes up to ``num`` of them."""

    def __init__(self, n: int) -> None:
        self.left = list(range(n))
        #: (num, timeout) of every call
        self.calls: list[tuple[int, float]] = []

    def consume(self, num: int, timeout: float) -> list[int]:
        self.calls.append((num, timeout))
        taken, self.left = self.left[:num], self.left[num:]
        return taken


def _stage(tmp_path: Path, queue: _Queue) -> Processor:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path, commit_interval_ms=100)))
    stage.consumer = queue  # type: ignore[assignment]
    return stage


def test_a_short_batch_is_taken_without_waiting_out_the_interval(tmp_path: Path) -> None:
    queue = _Queue(3)
    stage = _stage(tmp_path, queue)
    assert stage.loop.next_batch() == [0, 1, 2]
    # Only the first record may be waited for; the rest is taken as it is.
    assert queue.calls == [(1, 0.1), (stage.batch_size - 1, 0)]


def test_a_full_queue_gives_one_batch_of_batch_size(tmp_path: Path) -> None:
    queue = _Queue(700)
    stage = _stage(tmp_path, queue)
    assert len(stage.loop.next_batch()) == stage.batch_size
    assert len(stage.loop.next_batch()) == 700 - stage.batch_size
    assert stage.loop.next_batch() == []


def test_nothing_pending_waits_one_interval_and_returns_nothing(tmp_path: Path) -> None:
    queue = _Queue(0)
    stage = _stage(tmp_path, queue)
    assert stage.loop.next_batch() == []
    assert queue.calls == [(1, 0.1)]


class _RevokedMidBatch(_Queue):
    """The second call serves a revocation (as ``consume`` does with a rebalance queued)."""

    def __init__(self, n: int, stage_box: list[Processor]) -> None:
        super().__init__(n)
        self.stage_box = stage_box

    def consume(self, num: int, timeout: float) -> list[int]:
        taken = super().consume(num, timeout)
        if len(self.calls) == 2:
            self.stage_box[0].assignment.revokes += 1  # what the revoke callback counts
        return taken


def test_a_batch_read_across_a_revocation_is_left_to_the_next_owner(tmp_path: Path) -> None:
    box: list[Processor] = []
    queue = _RevokedMidBatch(5, box)
    stage = _stage(tmp_path, queue)
    box.append(stage)
    assert stage.loop.next_batch() == []  # records taken before the revocation are not handled
    assert stage.loop.next_batch() == []  # (the fake has nothing left: they were taken)
    assert len(queue.calls) == 3


def test_a_revocation_before_the_first_record_keeps_the_batch(tmp_path: Path) -> None:
    stage = _stage(tmp_path, _Queue(3))
    stage.assignment.revokes += 1  # served before this batch was read
    assert stage.loop.next_batch() == [0, 1, 2]


class _Msg:
    def __init__(self, topic: str, partition: int) -> None:
        self._topic, self._partition = topic, partition

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition


def test_records_of_partitions_no_longer_assigned_are_not_processed(tmp_path: Path) -> None:
    stage = _stage(tmp_path, _Queue(0))
    producer = FakeProducer()
    stage.producer = producer  # type: ignore[assignment]
    stage.assigned = {("intents", 1)}
    topic = stage.settings.topic("intents")
    stage.loop.process([_Msg(topic, 0), _Msg(topic, 2)])  # type: ignore[list-item]
    # nothing decoded (the doubles have no key to decode), no transaction opened
    assert producer.calls == [] and stage.processed == 0
