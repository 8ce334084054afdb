"""The writer of a stage's outputs into its open transaction, every record sealed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from ledger.authn import AUTH_HEADER, Sealer
from ledger.events import Event
from ledger.settings import LedgerSettings
from ledger.tracing import with_trace


class Writer:
    """Produces a stage's outputs into the open transaction, each record sealed.

    Args:
        producer: the transactional producer.
        settings: for topic names.
        sealer: ``topic -> key`` that seals each record (the ``ledger-auth``
            header, :mod:`ledger.authn`); required, so that no stage writes
            an unsealed record by omission (``None`` writes unsealed records,
            which every reader refuses: tools that forge on purpose only).
            Stages get theirs from :meth:`Stage.writer`.
    """

    def __init__(
        self,
        producer: Producer,
        settings: LedgerSettings,
        sealer: Callable[[str], Sealer] | None,
        observe: Callable[[str, Event | None], None] | None = None,
    ) -> None:
        self.producer = producer
        self.settings = settings
        self.sealer = sealer
        #: told of every event written (the stage's metrics count them on commit).
        self.observe = observe
        self.count = 0

    def write(self, topic: str, key: str, event: Event | None) -> None:
        """Produce ``event`` (or a tombstone when ``None``) to a ledger topic.

        Args:
            topic: short topic name, e.g. ``dispatches``.
            key: record key.
            event: the event to encode, or ``None`` for a tombstone.
        """
        value = event.to_bytes() if event is not None else None
        self.write_raw(topic, key, value)
        if self.observe is not None:
            self.observe(topic, event)

    def write_raw(
        self,
        topic: str,
        key: str,
        value: bytes | None,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
        partition: int | None = None,
    ) -> None:
        """Produce already-encoded bytes (dead letters keep the original bytes), sealed.

        ``on_delivery``, when given, is called with the broker's answer (the
        record's offset), as librdkafka's delivery report; ``partition``,
        when given, is the partition to write to (else the key's, by the
        ``murmur2_random`` partitioner).
        """
        raw_key = key.encode("utf-8")
        headers: list[tuple[str, str | bytes | None]] | None = (
            [(AUTH_HEADER, self.sealer(topic).seal(topic, raw_key, value))]
            if self.sealer is not None
            else None
        )
        # The current span's traceparent (advisory, outside the seal: ledger.tracing).
        headers = with_trace(headers)
        extra: dict[str, Any] = {}
        if on_delivery is not None:
            extra["on_delivery"] = on_delivery
        if partition is not None:
            extra["partition"] = partition
        while True:
            try:
                self.producer.produce(
                    self.settings.topic(topic), key=raw_key, value=value, headers=headers, **extra
                )
                break
            except BufferError:
                self.producer.poll(0.05)
        self.count += 1
        self.producer.poll(0)
