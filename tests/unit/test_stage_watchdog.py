"""A stage does not hang in ``send_offsets_to_transaction`` (librdkafka#5456).

librdkafka can block in that call past its timeout when the group
coordinator goes away during it; the stage gives such a producer up as
fatally failed instead of hanging with its partitions.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.processor import Processor
from consumers.retry import KafkaRetry, RetryPolicy
from consumers.runtime.assignment import COMMITTED_TRY_S
from ledger.settings import LedgerSettings
from tests.helpers import keyed
from tests.unit.kafka_doubles import FakeMember, FakeProducer, Kafka, clients


class _BlockedProducer:
    def __init__(self, release: threading.Event, fail: bool = False) -> None:
        self.release = release
        self.fail = fail

    def send_offsets_to_transaction(self, *args: Any) -> None:
        self.release.wait(10)
        if self.fail:
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "stale"))


class _Consumer:
    def consumer_group_metadata(self) -> object:
        return object()

    def assignment(self) -> list[TopicPartition]:
        return []  # nothing to rewind

    def close(self) -> None:
        pass


class _Recording(Processor):
    """A processor that records what it is told to restore and drop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.restored: list[set[int]] = []
        self.revoked: list[set[int]] = []

    def on_assign(self, partitions: set[int]) -> None:
        self.restored.append(partitions)

    def on_revoke(self, partitions: set[int]) -> None:
        self.revoked.append(partitions)


def _stage(
    tmp_path: Path, producer: object, kafka: Kafka | None = None, stuck_after_s: float = 30.0
) -> _Recording:
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    stage = _Recording(
        settings, clients=clients(settings, kafka or Kafka()), stuck_after_s=stuck_after_s
    )
    stage.producer = producer  # type: ignore[assignment]
    stage.consumer = _Consumer()  # type: ignore[assignment]
    return stage


def test_a_hung_send_offsets_is_a_fatal_error_and_the_producer_is_kept(tmp_path: Path) -> None:
    release = threading.Event()
    blocked = _BlockedProducer(release)
    stage = _stage(tmp_path, blocked)
    try:
        with pytest.raises(KafkaException) as caught:
            stage._send_offsets([], timeout_s=0.05, grace_s=0.05)
        err = caught.value.args[0]
        assert err.fatal() and err.code() == KafkaError._TIMED_OUT
        assert stage.txn.abandoned == [blocked]  # not freed under the blocked call
    finally:
        release.set()


def test_the_calls_own_error_reaches_the_stage(tmp_path: Path) -> None:
    release = threading.Event()
    release.set()
    stage = _stage(tmp_path, _BlockedProducer(release, fail=True))
    with pytest.raises(KafkaException) as caught:
        stage._send_offsets([], timeout_s=1.0)
    assert caught.value.args[0].code() == KafkaError.ILLEGAL_GENERATION
    assert stage.txn.abandoned == []


class _AbortingProducer:
    def __init__(self) -> None:
        self.aborted = 0

    def abort_transaction(self, timeout: float) -> None:
        self.aborted += 1


def _aborting_stage(tmp_path: Path) -> tuple[Processor, _AbortingProducer, Kafka]:
    stuck = _AbortingProducer()
    kafka = Kafka()  # makes the stage's new producers
    return _stage(tmp_path, stuck, kafka), stuck, kafka


def test_a_failed_delivery_replaces_the_producer_at_once(tmp_path: Path) -> None:
    """A producer that fails every delivery (left stuck by a broker restart) is not kept."""
    stage, stuck, kafka = _aborting_stage(tmp_path)
    failed = KafkaError(
        KafkaError._INCONSISTENT, "1 message(s) failed delivery", txn_requires_abort=True
    )
    stage.loop.recover(KafkaException(failed))
    assert stuck.aborted == 1 and [stage.producer] == kafka.producers


def test_a_second_abort_in_a_row_replaces_the_producer(tmp_path: Path) -> None:
    stage, stuck, kafka = _aborting_stage(tmp_path)
    abortable = KafkaException(
        KafkaError(KafkaError._STATE, "an abortable error", txn_requires_abort=True)
    )
    stage.loop.recover(abortable)
    assert stage.producer is stuck and stuck.aborted == 1  # one abort: retry with it
    stage.loop.recover(abortable)
    assert stuck.aborted == 2 and [stage.producer] == kafka.producers


class _RefusingProducer:
    """Its abort is refused: the coordinator may have completed the transaction."""

    def abort_transaction(self, timeout: float) -> None:
        raise KafkaException(
            KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True)
        )


def test_a_refused_abort_restores_the_state_from_what_was_committed(tmp_path: Path) -> None:
    """Seen under broker chaos: messages timed out, the abort was refused with
    INVALID_TXN_STATE. The transaction may have committed (the committed
    offsets then moved past the batch), so the stage must not go on from
    what it held in memory before the batch: it restores, as after a fatal
    error. Before the fix it only dropped the batch's pending decisions,
    and a later decision of an operation of that batch started from a
    version the journal had left behind."""
    kafka = Kafka()
    stage = _stage(tmp_path, _RefusingProducer(), kafka)
    stage.assigned = {("intents", 0)}
    consumer = _AssignedConsumer()
    stage.consumer = consumer  # type: ignore[assignment]
    timed_out = KafkaError(
        KafkaError._TIMED_OUT, "27 message(s) timed out", txn_requires_abort=True
    )
    stage.loop.recover(KafkaException(timed_out))
    assert kafka.producers and stage.producer is kafka.producers[-1]
    # dropped and restored from the committed offsets, then rewound to them
    assert stage.revoked == [{0}] and stage.restored == [{0}]
    assert consumer.seeks == [TopicPartition("t.intents", 0, 12)]


class _SlowAbortProducer:
    """Its first abort times out (the brokers restarting); the next one completes."""

    def __init__(self) -> None:
        self.calls = 0

    def abort_transaction(self, timeout: float) -> None:
        self.calls += 1
        if self.calls == 1:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    "Timed out waiting for operation to finish, retry call to resume",
                    retriable=True,
                )
            )


def test_an_abort_that_timed_out_is_resumed_not_given_up(tmp_path: Path) -> None:
    """librdkafka says "retry call to resume": the abort is called again until it
    completes (the transaction is then aborted for certain), and the stage keeps
    its producer and its committed memory instead of restoring (which waited on
    a half-aborted transaction's offsets for minutes under broker chaos)."""
    slow = _SlowAbortProducer()
    kafka = Kafka()
    stage = _stage(tmp_path, slow, kafka)
    stage.retry = KafkaRetry(
        "relay-0", RetryPolicy(first_wait_s=0.001, max_wait_s=0.001), sleep=lambda _s: None
    )
    stage.assigned = {("intents", 0)}
    stage.consumer = _AssignedConsumer()  # type: ignore[assignment]
    abortable = KafkaError(KafkaError._STATE, "an abortable error", txn_requires_abort=True)
    stage.loop.recover(KafkaException(abortable))
    assert slow.calls == 2 and stage.producer is slow
    assert kafka.producers == [] and stage.restored == [] and stage.revoked == []


class _AssignedConsumer(_Consumer):
    def __init__(self) -> None:
        self.seeks: list[TopicPartition] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t.intents", 0)]

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 12) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append(tp)


class _FencedConsumer:
    """A consumer whose membership was fenced: seeking its old assignment fails."""

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t.intents", 0)]

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 12) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, "Failed to seek to offset 12"))

    def close(self) -> None:
        self.closed = True


def test_a_rewind_the_consumer_cannot_do_replaces_the_consumer(tmp_path: Path) -> None:
    """Seen with two live processes of one identity: the stage rejoins, it does not die."""
    kafka = Kafka()
    stage = _stage(tmp_path, object(), kafka)
    fenced = _FencedConsumer()
    stage.consumer = fenced  # type: ignore[assignment]
    stage.assignment.rewind()
    assert fenced.closed and len(kafka.members) == 1 and stage.consumer is kafka.members[0]
    assert kafka.members[0].subscribed == [stage.settings.topic(t) for t in stage.inputs]


class _AnsweringConsumer:
    """Answers ``committed`` after refusing it ``refusals`` times (broker restarting)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t", 0)]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.refusals:
            self.refusals -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker restarting"))
        return partitions

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("refusals", "replaced"), [(0, False), (2, True)])
def test_after_kafka_was_away_the_next_batch_gets_a_new_producer(
    tmp_path: Path, refusals: int, replaced: bool
) -> None:
    """A producer that never reported all brokers down can still hold requests lost with the
    old connections (game day g13: adding offsets timed out for 45 s after a broker restart)."""
    stage = _stage(tmp_path, object())
    stage.consumer = _AnsweringConsumer(refusals)  # type: ignore[assignment]
    stage.retry = KafkaRetry(
        "authority-0", RetryPolicy(first_wait_s=0.001, max_wait_s=0.001), sleep=lambda _s: None
    )
    stage.loop.await_kafka()
    assert stage.broker_bounced is replaced
    assert not stage.retry.down


class _TimingOutConsumer(_AnsweringConsumer):
    """A consumer whose ``committed`` never answers (stuck after a broker restart)."""

    def __init__(self) -> None:
        super().__init__(refusals=0)

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets"))


class _MetadataProducer:
    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.asked = 0

    def list_topics(self, topic: str, timeout: float) -> object:
        self.asked += 1
        if not self.answers:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return object()


@pytest.mark.parametrize("kafka_answers", [True, False])
def test_a_consumer_stuck_while_kafka_answers_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kafka_answers: bool
) -> None:
    """Seen in CI: the relay's ``committed`` timed out for six minutes after a 90 s outage
    while the other stages' clients were answered. When the producer is answered, the
    consumer (and the producer) are replaced; in a real outage the wait goes on."""
    producer = _MetadataProducer(kafka_answers)
    kafka = Kafka()
    stage = _stage(tmp_path, producer, kafka, stuck_after_s=0.0)
    stage.consumer = _TimingOutConsumer()  # type: ignore[assignment]
    rejoined = kafka.members  # a new member joins in the stuck one's place
    stage.retry = KafkaRetry(
        "relay-0",
        RetryPolicy(first_wait_s=0.001, max_wait_s=0.001, give_up_after_s=0.5),
        sleep=lambda _s: None,
    )
    if kafka_answers:
        stage.loop.await_kafka()
        assert len(rejoined) == 1 and stage.consumer is rejoined[0] and stage.broker_bounced
        assert stage.retry.down  # the outage ends when the new consumer is answered
    else:
        with pytest.raises(KafkaException):
            stage.loop.await_kafka()
        assert rejoined == [] and producer.asked > 0


class _NotCoordinatorConsumer(_AnsweringConsumer):
    """Asks a coordinator that is no longer one, for as long as it lives (librdkafka#5586)."""

    def __init__(self) -> None:
        super().__init__(refusals=0)
        self.seeks: list[TopicPartition] = []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(
            KafkaError(KafkaError.NOT_COORDINATOR, "Failed to get committed offsets")
        )

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append(tp)


class _NewClient:
    """A new client of the group: answers (or not) the committed offsets once, is closed."""

    made: list[_NewClient] = []
    #: how many new clients are refused before one is answered
    refusals = 0

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.closed = False
        _NewClient.made.append(self)

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if len(_NewClient.made) <= _NewClient.refusals:
            raise KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "away"))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in partitions]

    def close(self) -> None:
        self.closed = True


def _stuck_stage(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kafka_answers: bool = True,
    new_client_refusals: int = 0,
) -> tuple[_Recording, _NotCoordinatorConsumer, _MetadataProducer]:
    monkeypatch.setattr(_NewClient, "made", [])
    monkeypatch.setattr(_NewClient, "refusals", new_client_refusals)
    producer = _MetadataProducer(kafka_answers)
    stage = _stage(tmp_path, producer, Kafka(client=_NewClient), stuck_after_s=0.0)
    consumer = _NotCoordinatorConsumer()
    stage.consumer = consumer  # type: ignore[assignment]
    stage.retry = KafkaRetry(
        "relay-0",
        RetryPolicy(first_wait_s=0.001, max_wait_s=0.001, give_up_after_s=0.5),
        sleep=lambda _s: None,
    )
    return stage, consumer, producer


def test_a_consumer_stuck_on_a_stale_coordinator_is_marked_for_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in the three-broker chaos mission (CI): the relay's rewind asked for its committed
    offsets against NOT_COORDINATOR for minutes while every other client was answered, and
    the mission never finished. A new client of the group (same group ID, read_committed so
    that its answer waits for open transactions) asks once; answered, the consumer is marked
    for replacement and the caller gets no offsets."""
    stage, consumer, _ = _stuck_stage(tmp_path, monkeypatch)
    assert (
        stage.assignment.committed([TopicPartition("t", 0)], "committed offsets (rewind)", 30.0)
        is None
    )
    (client,) = _NewClient.made
    assert client.closed
    assert client.config["group.id"] == stage.group_id
    assert client.config["isolation.level"] == "read_committed"
    assert stage.assignment.consumer_stuck and stage.broker_bounced


def test_while_new_clients_are_not_answered_either_the_wait_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's coordinator is away, not only for the consumer: the consumer keeps asking
    (and a new client is tried again later) until a new client is answered."""
    stage, _, _ = _stuck_stage(tmp_path, monkeypatch, new_client_refusals=2)
    assert stage.assignment.committed([TopicPartition("t", 0)], "committed offsets", 10.0) is None
    assert len(_NewClient.made) == 3 and all(c.closed for c in _NewClient.made)
    assert stage.assignment.consumer_stuck


def test_a_rewind_by_a_stuck_consumer_leaves_it_to_the_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage, consumer, _ = _stuck_stage(tmp_path, monkeypatch)
    stage.assignment.rewind()
    assert consumer.seeks == []  # the new consumer starts from the committed offsets
    assert stage.assignment.consumer_stuck


def test_a_stuck_consumer_restores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its partitions are restored by the member that replaces it, takeover bookkeeping
    included (the relay's handover, the processor's resumes)."""
    stage, _, _ = _stuck_stage(tmp_path, monkeypatch)
    stage.assignment.restore([TopicPartition("t", 0), TopicPartition("t", 1)])
    assert stage.restored == [] and stage.assignment.consumer_stuck


def test_in_a_real_outage_no_new_client_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage, _, producer = _stuck_stage(tmp_path, monkeypatch, kafka_answers=False)
    with pytest.raises(KafkaException):
        stage.assignment.committed([TopicPartition("t", 0)], "committed offsets", 10.0)
    assert producer.asked > 0 and _NewClient.made == [] and not stage.assignment.consumer_stuck


class _Record:
    """A record without a key (it becomes a dead letter), at ``offset`` of intents[0]."""

    def __init__(self, topic: str, offset: int) -> None:
        self._topic, self._offset = topic, offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


class _StuckDuringConsume:
    """A consume whose rebalance callback found the consumer stuck, and returns a record."""

    def __init__(self, stage: Processor) -> None:
        self.stage = stage
        self.closed = False

    def consume(self, num: int, timeout: float) -> list[_Record]:
        if num == 1:
            self.stage.assignment.consumer_stuck = True  # as restore does in the callback
            return [_Record(self.stage.settings.topic("intents"), 1)]
        return []

    def close(self) -> None:
        self.closed = True


class _Assigned(FakeMember):
    """A new member that is assigned intents[0] as it joins, and reads one record there."""

    def __init__(self, stage: Processor) -> None:
        super().__init__([[_Record(stage.settings.topic("intents"), 2)]], self._stop)
        self.stage = stage

    def _stop(self) -> None:
        self.stage.stopping = True

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        super().subscribe(topics)
        callbacks["on_assign"](self, [TopicPartition(topics[0], 0)])


def test_the_loop_replaces_a_stuck_consumer_before_handling_what_it_read(tmp_path: Path) -> None:
    holder: list[Processor] = []
    kafka = Kafka(member=lambda: _Assigned(holder[0]))
    stage = _stage(tmp_path, FakeProducer(), kafka)
    holder.append(stage)
    stuck = _StuckDuringConsume(stage)
    stage.consumer = stuck  # type: ignore[assignment]
    stage.loop.loop(None)
    # What the stuck member read (offset 1) is left to its replacement, which
    # restores and handles the next batch (offset 2) in a transaction.
    assert stuck.closed and stage.consumer is kafka.members[0]
    assert stage.restored == [{0}] and stage.processed == 1
    assert stage.producer is not None and stage.producer.calls == ["begin", "commit"]  # type: ignore[attr-defined]
    assert not stage.assignment.consumer_stuck


class _RecordingConsumer(_TimingOutConsumer):
    """Times out every ask, recording how long each was allowed to block."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float] = []

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.timeouts.append(timeout)
        return super().committed(partitions, timeout)


def test_a_restore_asks_in_short_tries_so_a_stuck_consumer_is_noticed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen in CI after a 90 s broker outage: an authority kernel restoring after a new
    producer asked for its committed offsets with the whole takeover wait (180 s) as one
    try; its consumer was stuck, the loop went unpolled, and the work behind it waited
    past the test's five minutes. Every try is short, and the stuck consumer is replaced."""
    stage, _, _ = _stuck_stage(tmp_path, monkeypatch)
    consumer = _RecordingConsumer()
    stage.consumer = consumer  # type: ignore[assignment]
    stage.assignment.restore([TopicPartition("t", 0)])
    assert consumer.timeouts and max(consumer.timeouts) <= COMMITTED_TRY_S <= 10.0
    assert stage.restored == [] and stage.assignment.consumer_stuck
