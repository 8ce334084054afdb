"""One classification of Kafka errors and one retry policy for every stage (consumers.retry)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.processor import Processor
from consumers.retry import KafkaRetry, RetryPolicy, is_retriable, policy_for
from ledger.errors import BrokerError, BrokerUnavailableError, LedgerError
from ledger.kafka import FENCING_CODES, NEVER_RETRIED, RETRIABLE_CODES, classify
from ledger.settings import LedgerSettings
from tests.helpers import keyed

#: What a broker outage or a failover throws at a stage (the issue's cases first).
OUTAGE_CODES = [
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError.NOT_COORDINATOR,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
]

#: Fenced, not authorised, unknown topic: never ridden out.
FATAL_CODES = [
    KafkaError.PRODUCER_FENCED,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
]


def _exc(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, f"error {code}", **flags))


@pytest.mark.parametrize("code", OUTAGE_CODES)
def test_outage_and_failover_errors_are_retriable(code: int) -> None:
    assert classify(KafkaError(code)) == "retriable"
    assert is_retriable(_exc(code))


@pytest.mark.parametrize("code", FATAL_CODES)
def test_fenced_unauthorised_and_unknown_topic_errors_are_fatal(code: int) -> None:
    # even when librdkafka flags them retriable (UNKNOWN_TOPIC_OR_PART is, in the protocol)
    assert classify(KafkaError(code, retriable=True)) == "fatal"
    assert not is_retriable(_exc(code, retriable=True))


def test_librdkafka_flags_decide_in_its_order_fatal_abortable_retriable() -> None:
    assert classify(KafkaError(KafkaError.NOT_COORDINATOR, fatal=True)) == "fatal"
    assert classify(KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True)) == "abortable"
    # a zombie's send_offsets is abortable (the stage aborts and rewinds), not fatal
    assert classify(KafkaError(KafkaError.ILLEGAL_GENERATION, txn_requires_abort=True)) == (
        "abortable"
    )
    assert classify(KafkaError(KafkaError.INVALID_CONFIG, retriable=True)) == "retriable"
    assert classify(KafkaError(KafkaError.INVALID_CONFIG)) == "fatal"


def test_the_code_sets_do_not_overlap_and_fencing_is_never_retried() -> None:
    assert not RETRIABLE_CODES & NEVER_RETRIED
    assert FENCING_CODES <= NEVER_RETRIED


def test_broker_errors_are_retriable_only_when_kafka_did_not_answer() -> None:
    assert is_retriable(BrokerUnavailableError("no answer"))
    assert is_retriable(TimeoutError())  # an admin future of the start-up check, unanswered
    caused = BrokerError("could not read the configs")
    caused.__cause__ = _exc(KafkaError._TRANSPORT)
    assert is_retriable(caused)
    refused = BrokerError("could not read the configs")
    refused.__cause__ = _exc(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert not is_retriable(refused)
    assert not is_retriable(BrokerError("java is missing"))
    assert not is_retriable(LedgerError("anything else"))
    assert not is_retriable(ValueError("not Kafka"))


def test_a_stage_waits_indefinitely_and_a_command_for_at_least_the_takeover_wait() -> None:
    settings = keyed(LedgerSettings(takeover_wait_s=180))
    assert policy_for(settings, indefinitely=True).give_up_after_s is None
    assert policy_for(settings, indefinitely=False).give_up_after_s == 180


class _Flaky:
    """Fails with the given errors, then returns ``result``."""

    def __init__(self, errors: list[BaseException], result: object = "ok") -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def _retry(**kwargs: Any) -> tuple[KafkaRetry, list[float]]:
    sleeps: list[float] = []
    policy = kwargs.pop("policy", RetryPolicy(first_wait_s=0.5, max_wait_s=4.0))
    return KafkaRetry("relay-0", policy, sleep=sleeps.append, **kwargs), sleeps


def test_an_outage_is_ridden_out_with_one_warning_and_one_recovery_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    changes: list[dict[str, Any] | None] = []
    retry, sleeps = _retry(on_change=changes.append)
    call = _Flaky([_exc(KafkaError._ALL_BROKERS_DOWN)] * 30)
    with caplog.at_level(logging.DEBUG, logger="consumers.retry"):
        assert retry.call(call, "end of ledger.approvals[0]") == "ok"
    assert call.calls == 31 and len(sleeps) == 30
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "_ALL_BROKERS_DOWN" in warnings[0].getMessage()
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "answers again" in infos[0]
    # the status was told once when the outage began and once when it ended
    assert len(changes) == 2 and changes[1] is None
    assert changes[0] is not None and changes[0]["for"] == "end of ledger.approvals[0]"
    assert not retry.down and retry.outages == 1


def test_backoff_is_exponential_with_jitter_and_bounded() -> None:
    retry, sleeps = _retry()
    retry.call(_Flaky([_exc(KafkaError.NOT_COORDINATOR)] * 40), "committed offsets")
    assert all(0.0 <= s <= 4.0 for s in sleeps)
    assert len(set(sleeps)) > 30  # jittered, not a fixed interval
    early, late = sleeps[:3], sleeps[-20:]
    assert max(early) <= 0.5 * 2**2  # the first waits are short
    assert sum(late) / len(late) > 1.0  # later ones approach the bound (mean 2 s)


def test_a_non_retriable_error_passes_through_at_once() -> None:
    retry, sleeps = _retry()
    call = _Flaky([_exc(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)])
    with pytest.raises(KafkaException) as caught:
        retry.call(call, "init_transactions")
    assert caught.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert call.calls == 1 and sleeps == [] and not retry.down


def test_a_bounded_policy_gives_up_with_the_last_error() -> None:
    retry, _ = _retry(policy=RetryPolicy(give_up_after_s=0.0))
    call = _Flaky([_exc(KafkaError._TRANSPORT), _exc(KafkaError._TIMED_OUT)])
    with pytest.raises(KafkaException) as caught:
        retry.call(call, "metadata")
    assert caught.value.args[0].code() == KafkaError._TRANSPORT
    assert "did not answer" in retry.no_answer("ledger.state", caught.value).message


def test_a_stop_request_ends_the_wait_with_the_last_error() -> None:
    stop = {"now": False}
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        stop["now"] = len(sleeps) >= 3

    retry = KafkaRetry("authority-0", RetryPolicy(), should_stop=lambda: stop["now"], sleep=sleep)
    with pytest.raises(KafkaException):
        retry.call(_Flaky([_exc(KafkaError._TRANSPORT)] * 100), "catch-up")
    assert len(sleeps) == 3


def test_time_spent_in_an_outage_is_counted_for_deadlines() -> None:
    retry, _ = _retry()
    retry.call(_Flaky([]), "no failure")
    assert retry.waited_s == 0.0
    retry.call(_Flaky([_exc(KafkaError._TRANSPORT)] * 2), "two failures")
    assert retry.waited_s > 0.0


def test_between_hook_runs_before_each_wait() -> None:
    retry, _ = _retry()
    seen: list[int] = []
    retry.call(_Flaky([_exc(KafkaError._TRANSPORT)] * 3), "x", between=seen.append)
    assert seen == [1, 2, 3]


# ---------------------------------------------------------------------- the stage uses it


class _CoordinatorMoving:
    """A consumer whose group coordinator moves twice before it answers (issue 12)."""

    def __init__(self) -> None:
        self.committed_calls = 0
        self.seeks: list[TopicPartition] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("t.dispatches", 0), TopicPartition("t.dispatches", 1)]

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.committed_calls += 1
        if self.committed_calls <= 2:
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR, "Not coordinator"))
        return [TopicPartition(tp.topic, tp.partition, 7 + tp.partition) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append(tp)


def test_a_rewind_rides_out_not_coordinator_instead_of_dying_or_rejoining(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
    monkeypatch.setattr(stage.retry, "_sleep", lambda s: None)
    consumer = _CoordinatorMoving()
    stage.consumer = consumer  # type: ignore[assignment]
    rejoined: list[bool] = []
    monkeypatch.setattr(stage.assignment, "rejoin", lambda: rejoined.append(True))
    stage.assignment.rewind()
    assert consumer.committed_calls == 3 and rejoined == []
    assert [(tp.partition, tp.offset) for tp in consumer.seeks] == [(0, 7), (1, 8)]


def test_the_status_file_shows_a_stage_waiting_for_kafka(tmp_path: Path) -> None:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
    stage.retry.failed("committed offsets", KafkaError(KafkaError._ALL_BROKERS_DOWN))
    status = json.loads(stage.status.path.read_text())
    assert status["waiting"]["for"] == "committed offsets"
    assert "_ALL_BROKERS_DOWN" in status["waiting"]["error"]
    assert status["ready"] is False
    stage.retry.recovered()
    assert json.loads(stage.status.path.read_text())["waiting"] is None


def test_an_outage_that_ends_in_a_refusal_is_over() -> None:
    """Kafka that answers, even with a refusal, ends the outage and the status's wait."""
    changes: list[dict[str, Any] | None] = []
    retry, sleeps = _retry(on_change=changes.append)
    call = _Flaky([_exc(KafkaError._TRANSPORT)] * 3 + [_exc(KafkaError.FENCED_INSTANCE_ID)])
    with pytest.raises(KafkaException):
        retry.call(call, "Kafka to answer")
    assert len(sleeps) == 3 and retry.outages == 1
    assert not retry.down and retry.waiting is None and changes[-1] is None


def test_an_outage_cut_short_by_a_stop_request_stays_open() -> None:
    """A wait the caller gave up on proves nothing about Kafka: the outage stays open."""
    sleeps: list[float] = []
    retry = KafkaRetry(
        "relay-0", RetryPolicy(), should_stop=lambda: len(sleeps) >= 2, sleep=sleeps.append
    )
    with pytest.raises(KafkaException):
        retry.call(_Flaky([_exc(KafkaError._TRANSPORT)] * 5), "metadata")
    assert len(sleeps) == 2 and retry.down and retry.waiting is not None
