"""How the publisher puts one record on the wire: seal, trace, produce, acknowledge.

:class:`RecordSender` owns the idempotent producer of a
:class:`~producers.publisher.LedgerPublisher` and everything between a typed
record and the broker's acknowledgement: the size bound, the seal (from the
publisher's :class:`~ledger.credentials.Credentials`), the ``publish <kind>``
producer span whose W3C ``traceparent`` rides in the headers
(:mod:`ledger.tracing`), the wait for one acknowledgement, and the count of
records queued without waiting that :meth:`RecordSender.flush` settles. The
publisher decides *what* to publish; this decides nothing about the ledger.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from confluent_kafka import KafkaError, Message, Producer
from opentelemetry.trace import Span, SpanKind, Tracer

from ledger.authn import seal_headers
from ledger.credentials import Credentials
from ledger.errors import DeliveryUnknownError, InputBoundsError, PublishError
from ledger.events import Event
from ledger.identity import MAX_INPUT_BYTES
from ledger.settings import LedgerSettings
from ledger.tracing import with_trace


class RecordSender:
    """Produces sealed, traced records and waits for (or counts) their acknowledgements.

    Args:
        settings: ledger settings (the topic prefix).
        credentials: the keys records are sealed with.
        producer: the idempotent producer records go through.
        tracer: where the ``publish <kind>`` spans go.
        send_timeout_s: how long one waited-for record waits for the
            broker's acknowledgement, and the default patience of
            :meth:`flush` (seconds).

    Attributes:
        last_position: ``(short topic, partition, offset)`` of the last
            record acknowledged, or ``None``.
        pending: records queued with :meth:`send_later` not yet acknowledged.
    """

    def __init__(
        self,
        settings: LedgerSettings,
        credentials: Credentials,
        producer: Producer,
        tracer: Tracer,
        send_timeout_s: float,
    ) -> None:
        self.settings = settings
        self.credentials = credentials
        self.producer = producer
        self.tracer = tracer
        self.send_timeout_s = send_timeout_s
        self.last_position: tuple[str, int, int] | None = None
        self.pending = 0
        #: the broker's refusals among the queued records, until :meth:`flush` reports them.
        self._failed: list[str] = []

    def _span(self, topic: str, key: str, event: Event) -> AbstractContextManager[Span]:
        """The ``publish <kind>`` producer span of one record."""
        attributes: dict[str, str] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "publish",
            "messaging.destination.name": topic,
            "messaging.kafka.message.key": key,
        }
        operation_id = getattr(event, "operation_id", None)
        if operation_id:
            attributes["ledger.operation_id"] = operation_id
        return self.tracer.start_as_current_span(
            f"publish {event.KIND}", kind=SpanKind.PRODUCER, attributes=attributes
        )

    def send(self, topic: str, key: str, event: Event, timeout_s: float | None = None) -> Message:
        """Produce one record in its span and wait for the broker's acknowledgement.

        Args:
            topic: the short topic name (:class:`ledger.topology.Topic`).
            key: the record's key.
            event: the record.
            timeout_s: how long to wait (seconds); default ``send_timeout_s``.

        Returns:
            The acknowledged message.

        Raises:
            InputBoundsError: the encoded record is over the input bound.
            PublishError: the broker refused it.
            DeliveryUnknownError: not acknowledged within ``timeout_s``: it
                may still be delivered.
            SchemaValidationError: the record does not fit its schema.
        """
        with self._span(topic, key, event) as span:
            msg = self._send_traced(topic, key, event, timeout_s)
            span.set_attribute("messaging.destination.partition.id", str(msg.partition() or 0))
            span.set_attribute("messaging.kafka.offset", msg.offset() or 0)
            return msg

    def send_later(self, topic: str, key: str, event: Event) -> None:
        """Produce one record without waiting; :meth:`flush` reports its delivery.

        Raises:
            InputBoundsError: the encoded record is over the input bound.
            SchemaValidationError: the record does not fit its schema.
        """
        with self._span(topic, key, event):
            self._produce(topic, key, event, self._note_delivery)
        self.pending += 1
        self.producer.poll(0)  # serve the callbacks of records already delivered

    def _note_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None:
            self._failed.append(f"{msg.topic()}: {err}")
            return
        topic = (msg.topic() or "").removeprefix(self.settings.topic_prefix + ".")
        self.last_position = (topic, msg.partition() or 0, msg.offset() or 0)

    def _produce(
        self,
        topic: str,
        key: str,
        event: Event,
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        """Produce one record (its seal and the current span's traceparent in its headers)."""
        value = event.to_bytes()  # validates against the schema first
        if len(value) > MAX_INPUT_BYTES:
            raise InputBoundsError(
                f"the {event.KIND} is {len(value)} bytes encoded; the ledger accepts at most "
                f"{MAX_INPUT_BYTES} (keep large documents elsewhere and pass a reference)",
                expected=f"at most {MAX_INPUT_BYTES} bytes",
                observed=len(value),
            )
        raw_key = key.encode("utf-8")
        sealer = self.credentials.sealer_for(topic, event)
        headers = with_trace(seal_headers(sealer, topic, raw_key, value))
        while True:
            try:
                self.producer.produce(
                    self.settings.topic(topic),
                    key=raw_key,
                    value=value,
                    headers=headers,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:  # the local queue is full: deliver some first
                self.producer.poll(0.1)

    def _send_traced(
        self, topic: str, key: str, event: Event, timeout_s: float | None = None
    ) -> Message:
        """Produce one record and wait for the broker's acknowledgement."""
        delivered: list[tuple[KafkaError | None, Message]] = []
        self._produce(topic, key, event, lambda err, msg: delivered.append((err, msg)))
        timeout_s = self.send_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not delivered:
            if time.monotonic() > deadline:
                raise DeliveryUnknownError(
                    f"{event.KIND} {key!r} was not acknowledged by {self.settings.topic(topic)} "
                    f"within {timeout_s:g} s: it may still be delivered (this client keeps "
                    "trying), so it has not failed; publish the same operation again to find "
                    "out, which is always safe. Is the broker running (ledger broker status)?",
                    observed=key,
                )
            self.producer.poll(0.1)
        err, msg = delivered[0]
        if err is not None:
            raise PublishError(f"publishing to {self.settings.topic(topic)} failed: {err}")
        self.last_position = (topic, msg.partition() or 0, msg.offset() or 0)
        return msg

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every record queued with :meth:`send_later` is acknowledged.

        Args:
            timeout_s: how long to wait in all (seconds); default
                ``send_timeout_s``.

        Raises:
            PublishError: some were refused by the broker (the first reasons
                named; the failures are then forgotten).
            DeliveryUnknownError: some were not acknowledged within
                ``timeout_s``: they stay pending and may still be delivered.
        """
        timeout_s = self.send_timeout_s if timeout_s is None else timeout_s
        self.producer.flush(timeout_s)
        failed, self._failed = self._failed, []
        if failed:
            raise PublishError(
                f"{len(failed)} record(s) were not accepted by the broker: "
                + "; ".join(failed[:3]),
                observed=len(failed),
            )
        if self.pending:
            raise DeliveryUnknownError(
                f"{self.pending} record(s) not acknowledged after {timeout_s:g} s: they may "
                "still be delivered (this client keeps trying), so they have not failed; "
                "publish the same operations again to find out, which is always safe. Is the "
                "broker running (ledger broker status)?",
                observed=self.pending,
            )
