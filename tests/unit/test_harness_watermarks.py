"""The harness asks a partition's watermarks again while Kafka's answer is retriable.

A fresh topic's leader can still be moving under load: one
``NOT_LEADER_FOR_PARTITION`` from a watermark query failed a whole suite once.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from testbed.harness import watermarks


class Flaky:
    """A consumer whose first answers are errors, then the watermarks."""

    def __init__(self, *errors: int) -> None:
        self.errors = list(errors)
        self.asked = 0

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return (0, 7)


def test_a_leader_moving_is_asked_again() -> None:
    flaky = Flaky(KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)
    assert watermarks(flaky, TopicPartition("t", 0), 1) == (0, 7)  # type: ignore[arg-type]
    assert flaky.asked == 3


def test_an_answer_that_is_not_retriable_is_raised_at_once() -> None:
    flaky = Flaky(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException):
        watermarks(flaky, TopicPartition("t", 0), 1)  # type: ignore[arg-type]
    assert flaky.asked == 1


def test_a_caller_that_retries_itself_hears_at_once() -> None:
    flaky = Flaky(KafkaError.NOT_LEADER_FOR_PARTITION)
    with pytest.raises(KafkaException):
        watermarks(flaky, TopicPartition("t", 0), 1, retry_s=0)  # type: ignore[arg-type]
    assert flaky.asked == 1
