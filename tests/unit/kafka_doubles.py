"""Kafka client doubles a stage is given through its constructor (``Stage(clients=...)``).

:func:`clients` builds a :class:`consumers.runtime.clients.Clients` whose
constructors hand out these doubles, so a test drives a stage's runtime
(transactions, assignment, watches, the loop) without a broker and without
replacing any of the stage's methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from consumers.runtime.clients import Clients
from ledger.settings import LedgerSettings


class FakeProducer:
    """A transactional producer that accepts every call and records it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.produced: list[tuple[str, bytes | None]] = []

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, topic: str, key: bytes, value: bytes | None, **_: Any) -> None:
        self.produced.append((topic, value))

    def poll(self, timeout: float) -> int:
        return 0

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], *_: Any) -> None:
        self.calls.append("offsets")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")

    def flush(self, timeout: float) -> int:
        return 0


class FakeMember:
    """A group member: joins when subscribed, hands out ``batches`` one per poll.

    Args:
        batches: what each ``consume(1, ...)`` returns, in turn (then nothing).
        on_empty: called once the batches are used up (e.g. to stop the stage).
    """

    def __init__(
        self, batches: list[list[Any]] | None = None, on_empty: Callable[[], None] | None = None
    ) -> None:
        self.batches = list(batches or [])
        self.on_empty = on_empty
        self.subscribed: list[str] = []
        self.closed = False
        self.seeks: list[TopicPartition] = []

    def subscribe(self, topics: list[str], **_callbacks: Any) -> None:
        self.subscribed = topics

    def consume(self, num: int, timeout: float) -> list[Any]:
        if num != 1:
            return []
        if self.batches:
            return self.batches.pop(0)
        if self.on_empty is not None:
            self.on_empty()
        return []

    def assignment(self) -> list[TopicPartition]:
        return []

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return tps

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 0) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append(tp)

    def consumer_group_metadata(self) -> object:
        return object()

    def close(self) -> None:
        self.closed = True


class Kafka:
    """Hands out doubles: members (configs with ``group.instance.id``) and plain clients.

    Args:
        member: makes each new member (default :class:`FakeMember`).
        client: makes each plain client of the group (default: refuses).
        producer: makes each producer (default :class:`FakeProducer`).
    """

    def __init__(
        self,
        member: Callable[[], Any] = FakeMember,
        client: Callable[[dict[str, Any]], Any] | None = None,
        producer: Callable[[], Any] = FakeProducer,
    ) -> None:
        self._member = member
        self._client = client
        self._producer = producer
        self.members: list[Any] = []
        self.producers: list[Any] = []
        self.client_configs: list[dict[str, Any]] = []

    def consumer(self, config: dict[str, Any]) -> Any:
        if "group.instance.id" in config:
            self.members.append(self._member())
            return self.members[-1]
        self.client_configs.append(config)
        if self._client is None:
            raise AssertionError("this test makes no plain client of the group")
        return self._client(config)

    def producer(self, config: dict[str, Any]) -> Any:
        self.producers.append(self._producer())
        return self.producers[-1]


def clients(settings: LedgerSettings, kafka: Kafka, component: str = "processor") -> Clients:
    """:class:`Clients` of ``component``-0 whose clients are ``kafka``'s doubles."""
    return Clients(
        settings, component, "0", new_consumer=kafka.consumer, new_producer=kafka.producer
    )
