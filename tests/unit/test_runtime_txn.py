"""The transaction as a block: begin, write, send offsets, commit (consumers.runtime.txn).

Other stages open their own transactions through ``Stage.transaction``; these
pin its order of calls and what it leaves for the loop's recovery.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.processor import Processor
from consumers.runtime.txn import Recovery, commit_alone
from ledger.settings import LedgerSettings
from tests.helpers import keyed
from tests.unit.kafka_doubles import FakeMember, FakeProducer, Kafka, clients


def _stage(tmp_path: Path) -> tuple[Processor, FakeProducer]:
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    stage = Processor(settings, clients=clients(settings, Kafka()))
    producer = FakeProducer()
    stage.producer = producer  # type: ignore[assignment]
    stage.consumer = FakeMember()  # type: ignore[assignment]
    return stage, producer


def test_a_block_begins_writes_sends_its_offsets_and_commits_in_that_order(
    tmp_path: Path,
) -> None:
    stage, producer = _stage(tmp_path)
    asked: list[str] = []

    def offsets() -> list[TopicPartition]:
        asked.append("positions")  # asked when the block ends, not before
        return [TopicPartition(stage.settings.topic("intents"), 0, 5)]

    with stage.transaction(offsets, before_commit=lambda: producer.calls.append("seam")) as out:
        assert producer.calls == ["begin"] and asked == []
        out.write("operating-events", "k", None)
    assert asked == ["positions"]
    assert producer.calls == ["begin", "offsets", "seam", "commit"]
    assert [topic for topic, _ in producer.produced] == [stage.settings.topic("operating-events")]


def test_a_block_without_offsets_commits_only_its_writes(tmp_path: Path) -> None:
    stage, producer = _stage(tmp_path)
    with stage.transaction():
        pass
    assert producer.calls == ["begin", "commit"]


class _Boom(Exception):
    pass


def test_a_failure_inside_the_block_leaves_the_transaction_to_the_recovery(
    tmp_path: Path,
) -> None:
    stage, producer = _stage(tmp_path)
    with pytest.raises(_Boom), stage.transaction([TopicPartition("t", 0, 1)]):
        raise _Boom
    assert producer.calls == ["begin"]  # neither offsets nor commit
    abortable = KafkaError(KafkaError._STATE, "an abortable error", txn_requires_abort=True)
    assert stage.txn.recover(abortable) is Recovery.REBUILD
    assert producer.calls == ["begin", "abort"]


def test_a_fatal_error_gets_a_new_producer_and_a_restore(tmp_path: Path) -> None:
    stage, producer = _stage(tmp_path)
    fatal = KafkaError(KafkaError._FENCED, "fenced", fatal=True)
    assert stage.txn.recover(fatal) is Recovery.RESTORE
    assert stage.producer is not producer and stage.producer is not None


def test_a_transaction_of_its_own_commits_what_its_body_wrote() -> None:
    producer = FakeProducer()
    commit_alone(producer, lambda: producer.calls.append("body"), 5.0)  # type: ignore[arg-type]
    assert producer.calls == ["begin", "body", "commit"]


def test_a_failed_commit_is_raised_to_the_caller() -> None:
    class _Refusing(FakeProducer):
        def commit_transaction(self, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer"))

    producer = _Refusing()
    with pytest.raises(KafkaException):
        commit_alone(producer, lambda: None, 5.0)  # type: ignore[arg-type]


class _HoldingBack(Processor):
    """Overrides the offsets seam, as the relay does to hold offsets back at parked dispatches."""

    sent: list[list[TopicPartition]]

    def _send_offsets(self, offsets: list[TopicPartition], *args: Any, **kwargs: Any) -> None:
        held = [TopicPartition(tp.topic, tp.partition, min(tp.offset, 3)) for tp in offsets]
        self.sent.append(held)
        super()._send_offsets(held, *args, **kwargs)


def test_a_stage_that_holds_offsets_back_is_asked_for_every_transactions_offsets(
    tmp_path: Path,
) -> None:
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    stage = _HoldingBack(settings, clients=clients(settings, Kafka()))
    stage.sent = []
    stage.producer = FakeProducer()  # type: ignore[assignment]
    stage.consumer = FakeMember()  # type: ignore[assignment]
    with stage.transaction([TopicPartition("t", 0, 9)]):
        pass
    stage._prove_membership([TopicPartition("t", 1, 8)])
    assert stage.sent == [[TopicPartition("t", 0, 3)], [TopicPartition("t", 1, 3)]]
