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

import consumers.stage as stage_module
from consumers.processor import Processor
from consumers.retry import KafkaRetry, RetryPolicy
from ledger.settings import LedgerSettings
from tests.helpers import keyed


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


def _stage(tmp_path: Path, producer: object) -> Processor:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
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
        assert stage._abandoned == [blocked]  # not freed under the blocked call
    finally:
        release.set()


def test_the_calls_own_error_reaches_the_stage(tmp_path: Path) -> None:
    release = threading.Event()
    release.set()
    stage = _stage(tmp_path, _BlockedProducer(release, fail=True))
    with pytest.raises(KafkaException) as caught:
        stage._send_offsets([], timeout_s=1.0)
    assert caught.value.args[0].code() == KafkaError.ILLEGAL_GENERATION
    assert stage._abandoned == []


class _AbortingProducer:
    def __init__(self) -> None:
        self.aborted = 0

    def abort_transaction(self, timeout: float) -> None:
        self.aborted += 1


def _aborting_stage(tmp_path: Path) -> tuple[Processor, _AbortingProducer, object]:
    stuck = _AbortingProducer()
    stage = _stage(tmp_path, stuck)
    fresh = object()
    stage._new_producer = lambda: fresh  # type: ignore[method-assign]
    stage._rewind = lambda: None  # type: ignore[method-assign]
    return stage, stuck, fresh


def test_a_failed_delivery_replaces_the_producer_at_once(tmp_path: Path) -> None:
    """A producer that fails every delivery (left stuck by a broker restart) is not kept."""
    stage, stuck, fresh = _aborting_stage(tmp_path)
    failed = KafkaError(
        KafkaError._INCONSISTENT, "1 message(s) failed delivery", txn_requires_abort=True
    )
    stage._recover(KafkaException(failed))
    assert stuck.aborted == 1 and stage.producer is fresh


def test_a_second_abort_in_a_row_replaces_the_producer(tmp_path: Path) -> None:
    stage, stuck, fresh = _aborting_stage(tmp_path)
    abortable = KafkaException(
        KafkaError(KafkaError._STATE, "an abortable error", txn_requires_abort=True)
    )
    stage._recover(abortable)
    assert stage.producer is stuck and stuck.aborted == 1  # one abort: retry with it
    stage._recover(abortable)
    assert stuck.aborted == 2 and stage.producer is fresh


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
    stage = _stage(tmp_path, _RefusingProducer())
    fresh = object()
    stage._new_producer = lambda: fresh  # type: ignore[method-assign]
    stage._rewind = lambda: None  # type: ignore[method-assign]
    stage.assigned = {("intents", 0)}
    restored: list[object] = []
    revoked: list[set[int]] = []
    stage._restore = restored.append  # type: ignore[method-assign,assignment]
    stage.on_revoke = revoked.append  # type: ignore[method-assign,assignment]
    stage.consumer = _AssignedConsumer()  # type: ignore[assignment]
    timed_out = KafkaError(
        KafkaError._TIMED_OUT, "27 message(s) timed out", txn_requires_abort=True
    )
    stage._recover(KafkaException(timed_out))
    assert stage.producer is fresh
    assert revoked == [{0}] and restored == [[TopicPartition("t.intents", 0)]]


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
    stage = _stage(tmp_path, slow)
    stage.retry = KafkaRetry(
        "relay-0", RetryPolicy(first_wait_s=0.001, max_wait_s=0.001), sleep=lambda _s: None
    )
    stage._new_producer = lambda: pytest.fail("the producer was replaced")  # type: ignore[method-assign]
    stage._restore = lambda _p: pytest.fail("the state was restored")  # type: ignore[method-assign]
    stage._rewind = lambda: None  # type: ignore[method-assign]
    abortable = KafkaError(KafkaError._STATE, "an abortable error", txn_requires_abort=True)
    stage._recover(KafkaException(abortable))
    assert slow.calls == 2 and stage.producer is slow


class _AssignedConsumer(_Consumer):
    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t.intents", 0)]


class _FencedConsumer:
    """A consumer whose membership was fenced: seeking its old assignment fails."""

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t.intents", 0)]

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 12) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, "Failed to seek to offset 12"))


def test_a_rewind_the_consumer_cannot_do_replaces_the_consumer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen with two live processes of one identity: the stage rejoins, it does not die."""
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
    stage.consumer = _FencedConsumer()  # type: ignore[assignment]
    rejoined: list[bool] = []
    monkeypatch.setattr(stage, "_rejoin", lambda: rejoined.append(True))
    stage._rewind()
    assert rejoined == [True]


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
    stage._await_kafka()
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
    monkeypatch.setattr("consumers.stage.CONSUMER_STUCK_AFTER_S", 0.0)
    producer = _MetadataProducer(kafka_answers)
    stage = _stage(tmp_path, producer)
    stage.consumer = _TimingOutConsumer()  # type: ignore[assignment]
    rejoined: list[bool] = []
    stage._rejoin = lambda: rejoined.append(True)  # type: ignore[method-assign]
    stage.retry = KafkaRetry(
        "relay-0",
        RetryPolicy(first_wait_s=0.001, max_wait_s=0.001, give_up_after_s=0.5),
        sleep=lambda _s: None,
    )
    if kafka_answers:
        stage._await_kafka()
        assert rejoined == [True] and stage.broker_bounced
        assert stage.retry.down  # the outage ends when the new consumer is answered
    else:
        with pytest.raises(KafkaException):
            stage._await_kafka()
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
) -> tuple[Processor, _NotCoordinatorConsumer, _MetadataProducer]:
    monkeypatch.setattr("consumers.stage.CONSUMER_STUCK_AFTER_S", 0.0)
    monkeypatch.setattr("consumers.stage.Consumer", _NewClient)
    monkeypatch.setattr(_NewClient, "made", [])
    monkeypatch.setattr(_NewClient, "refusals", new_client_refusals)
    producer = _MetadataProducer(kafka_answers)
    stage = _stage(tmp_path, producer)
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
    assert stage._committed([TopicPartition("t", 0)], "committed offsets (rewind)", 30.0) is None
    (client,) = _NewClient.made
    assert client.closed
    assert client.config["group.id"] == stage.group_id
    assert client.config["isolation.level"] == "read_committed"
    assert stage._consumer_stuck and stage.broker_bounced


def test_while_new_clients_are_not_answered_either_the_wait_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group's coordinator is away, not only for the consumer: the consumer keeps asking
    (and a new client is tried again later) until a new client is answered."""
    stage, _, _ = _stuck_stage(tmp_path, monkeypatch, new_client_refusals=2)
    assert stage._committed([TopicPartition("t", 0)], "committed offsets", 10.0) is None
    assert len(_NewClient.made) == 3 and all(c.closed for c in _NewClient.made)
    assert stage._consumer_stuck


def test_a_rewind_by_a_stuck_consumer_leaves_it_to_the_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage, consumer, _ = _stuck_stage(tmp_path, monkeypatch)
    stage._rewind()
    assert consumer.seeks == []  # the new consumer starts from the committed offsets
    assert stage._consumer_stuck


def test_a_stuck_consumer_restores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its partitions are restored by the member that replaces it, takeover bookkeeping
    included (the relay's handover, the processor's resumes)."""
    stage, _, _ = _stuck_stage(tmp_path, monkeypatch)
    restored: list[set[int]] = []
    monkeypatch.setattr(stage, "on_assign", restored.append)
    stage._restore([TopicPartition("t", 0), TopicPartition("t", 1)])
    assert restored == [] and stage._consumer_stuck


def test_in_a_real_outage_no_new_client_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage, _, producer = _stuck_stage(tmp_path, monkeypatch, kafka_answers=False)
    with pytest.raises(KafkaException):
        stage._committed([TopicPartition("t", 0)], "committed offsets", 10.0)
    assert producer.asked > 0 and _NewClient.made == [] and not stage._consumer_stuck


class _Record:
    def error(self) -> None:
        return None


class _StuckDuringConsume:
    """A consume whose rebalance callback found the consumer stuck, and returns a record."""

    def __init__(self, stage: Processor) -> None:
        self.stage = stage
        self.calls = 0

    def consume(self, num: int, timeout: float) -> list[_Record]:
        self.calls += 1
        if self.calls == 1:
            self.stage._consumer_stuck = True  # as _restore does inside the assign callback
        return [_Record()] if num == 1 else []

    def assignment(self) -> list[TopicPartition]:
        return []  # nothing for the fetch check to judge


def test_the_loop_replaces_a_stuck_consumer_before_handling_what_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = _stage(tmp_path, object())
    stage.consumer = _StuckDuringConsume(stage)  # type: ignore[assignment]
    events: list[str] = []

    def rejoin() -> None:
        events.append("rejoin")
        stage.stopping = True

    monkeypatch.setattr(stage, "_rejoin", rejoin)
    monkeypatch.setattr(stage, "_process", lambda msgs: events.append("process"))
    monkeypatch.setattr(stage, "idle", lambda: events.append("idle"))
    stage._loop(None)
    # What the stuck member read is left to its replacement; the next batch is handled.
    assert events == ["rejoin", "process"]
    assert not stage._consumer_stuck


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
    restored: list[set[int]] = []
    monkeypatch.setattr(stage, "on_assign", restored.append)
    stage._restore([TopicPartition("t", 0)])
    assert consumer.timeouts and max(consumer.timeouts) <= stage_module.COMMITTED_TRY_S <= 10.0
    assert restored == [] and stage._consumer_stuck
