"""Waiting for an operation's outcome on ``outcomes``, at a cost that does not grow with history.

The processor answers every intent it decides with a signed
:class:`~ledger.events.Outcome` on the operation's partition of
``outcomes`` (its ID names the intent's position, ``processor:intents:P:O``),
and publishes another whenever the operation moves to another state (see
:mod:`ledger.outcomes`). A waiter that knows where its own intent landed
therefore reads one partition (:func:`ledger.topology.partition_for`),
``read_committed``, from where that partition ended just before it
published (:meth:`OutcomeReader.watch`; a waiter that did not watch first
starts at the publish time less a margin for clock skew,
``offsets_for_times``), and takes nothing before the answer to its own
intent: what it reads is bounded by the traffic of one partition since the
publish, not by the ledger's history.

It needs no secret and joins no group: records are checked with the outcome
key's public half (:func:`ledger.credentials.outcome_keyring`), and one that
is unsigned or mis-signed is treated as absent (logged). librdkafka wants a
``group.id`` even for a consumer that only assigns; the waiter names
``{prefix}.outcomes`` and never joins it or commits (the ACL plan grants
the service DESCRIBE on it, :mod:`ledger.acl`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from ledger.authn import Keyring
from ledger.credentials import outcome_keyring
from ledger.errors import BrokerUnavailableError
from ledger.events import Outcome, decode_event
from ledger.kafka import consumer_config
from ledger.outcomes import FINAL_KINDS
from ledger.settings import LedgerSettings
from ledger.topology import Topic, partition_for

log = logging.getLogger(__name__)

#: How far before the publish time a waiter starts reading (ms): covers a
#: processor whose clock is behind the service's by up to this much.
SKEW_MARGIN_MS = 60_000

#: Errors a waiter that never joins or commits can ignore: the coordinator
#: lookup of the group it names (refused to a principal without DESCRIBE on
#: it), the end of the partition, a connection librdkafka re-establishes.
_GROUP_ERRORS = frozenset(
    {KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError._PARTITION_EOF, KafkaError._TRANSPORT}
)


@dataclass(frozen=True)
class Waited:
    """What one wait found.

    Attributes:
        outcome: the first final outcome after the answer to the caller's
            intent; on the deadline the last outcome seen (``PENDING``), or
            ``None`` when none was seen.
        final: whether ``outcome`` is final (not ``PENDING``).
        records_read: records read from ``outcomes`` (of every operation on
            the partition): the wait's cost.
        refused: records of the operation refused as not authentic.
    """

    outcome: Outcome | None
    final: bool
    records_read: int
    refused: int


class OutcomeWatch:
    """One operation's partition of ``outcomes``, assigned from a start offset.

    Made by :meth:`OutcomeReader.watch` (before the caller publishes) or
    :meth:`OutcomeReader.since`; :meth:`wait` reads it, :meth:`close` ends it.
    """

    def __init__(
        self, reader: OutcomeReader, consumer: Consumer, operation_id: str, partition: int
    ) -> None:
        self.reader = reader
        self.consumer = consumer
        self.operation_id = operation_id
        self.partition = partition

    def wait(
        self,
        timeout_s: float,
        *,
        answer_to: tuple[int, int] | None = None,
        parameter_digest: str | None = None,
        answer_only: bool = False,
        min_state_version: int = 0,
    ) -> Waited:
        """Read until a final outcome of the operation, or the deadline.

        Args:
            timeout_s: how long to wait at most (seconds).
            answer_to: ``(partition, offset)`` of the caller's intent on
                ``intents``: outcomes before the processor's answer to it
                are skipped (an older settlement is not this publish's
                answer). ``None``: every outcome read counts.
            parameter_digest: the intent's digest: outcomes for another
                request of the operation (a drifted intent's refusal) are
                skipped.
            answer_only: return the answer to the caller's intent itself,
                final or not (what the processor decided on it).
            min_state_version: skip outcomes of a lower state version (the
                floor for a wait with no answer to anchor on, such as
                :meth:`OutcomeReader.since`: the last version the caller
                saw). A genuine outcome replayed from an earlier episode
                carries its old version, and versions never go back.

        Returns:
            :class:`Waited`: the first final outcome, else on the deadline
            the last one seen; never a guess.
        """
        deadline = time.monotonic() + timeout_s
        op = self.operation_id
        answer_id = f"processor:intents:{answer_to[0]}:{answer_to[1]}" if answer_to else None
        answered = answer_id is None
        last: Outcome | None = None
        read = refused = 0
        while time.monotonic() < deadline:
            msg = self.consumer.poll(min(0.2, max(deadline - time.monotonic(), 0.0)))
            if msg is None:
                continue
            if msg.error() is not None:
                _log_error(msg)
                continue
            read += 1
            if msg.key() != op.encode():
                continue
            outcome = self.reader.authentic(msg, op)
            if outcome is None:
                refused += 1
                continue
            if not answered:
                answered = outcome.outcome_id == answer_id
                if not answered:
                    continue
            if parameter_digest is not None and outcome.parameter_digest != parameter_digest:
                continue
            if outcome.state_version < min_state_version:
                continue
            if last is not None and (
                outcome.state_version < last.state_version
                or (outcome.kind == "REFUSED" and outcome.outcome_id != answer_id)
            ):
                # A genuine record replayed from an earlier episode (the seal
                # binds key and value, not position): an operation's state
                # version never goes back. A refusal after the answer answers
                # another intent and changes nothing of this operation.
                continue
            last = outcome
            if outcome.kind in FINAL_KINDS or answer_only:
                return Waited(outcome, outcome.kind in FINAL_KINDS, read, refused)
        return Waited(last, False, read, refused)

    def close(self) -> None:
        """Close the consumer (joins nothing, commits nothing)."""
        self.consumer.close()

    def __enter__(self) -> OutcomeWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class OutcomeReader:
    """Reads outcomes of single operations with the outcome public key only.

    Args:
        settings: bootstrap servers, topic prefix, the outcome public key file.
        keyring: checks each record (default: the outcome public key,
            :func:`ledger.credentials.outcome_keyring`).
        consumer_factory: builds the consumer from its configuration (tests
            inject a double).

    Raises:
        MissingKeyError: no outcome public key; the message names
            ``ledger keys export --outcome-public``.
        LocalFileError: it is unreadable.
    """

    def __init__(
        self,
        settings: LedgerSettings,
        *,
        keyring: Keyring | None = None,
        consumer_factory: Callable[[dict[str, Any]], Consumer] = Consumer,
    ) -> None:
        self.settings = settings
        self.keyring = keyring if keyring is not None else outcome_keyring(settings)
        self._factory = consumer_factory

    def watch(self, operation_id: str, timeout_s: float = 10.0) -> OutcomeWatch:
        """Start watching an operation before publishing its intent.

        Reading starts where the operation's partition ends now (its high
        watermark): the answer to an intent published after this call can
        only come after it.

        Args:
            operation_id: the operation.
            timeout_s: how long to try to learn the partition and its end (seconds).

        Returns:
            The watch (close it, or use it as a context manager).

        Raises:
            BrokerUnavailableError: the topic cannot be described in time.
        """
        deadline = time.monotonic() + timeout_s
        consumer, partition = self._open(operation_id, deadline)
        try:
            tp = TopicPartition(self.settings.topic(Topic.OUTCOMES), partition)
            _, high = consumer.get_watermark_offsets(
                tp, timeout=max(deadline - time.monotonic(), 1.0), cached=False
            )
            consumer.assign([TopicPartition(tp.topic, partition, high)])
        except Exception as exc:
            consumer.close()
            raise BrokerUnavailableError(
                f"cannot learn where {tp.topic} partition {partition} ends ({exc}): is the "
                "broker running?",
                observed=str(exc),
            ) from exc
        return OutcomeWatch(self, consumer, operation_id, partition)

    def since(self, operation_id: str, since_ms: int, timeout_s: float = 10.0) -> OutcomeWatch:
        """Watch an operation from a time (its intent is already published).

        Args:
            operation_id: the operation.
            since_ms: when its intent was published (Unix ms); reading starts
                :data:`SKEW_MARGIN_MS` before it (``offsets_for_times``), so
                an earlier outcome of the operation inside that margin can
                be read: pass the last state version seen as
                ``min_state_version`` to :meth:`OutcomeWatch.wait`.
            timeout_s: how long to try to learn where to start (seconds).

        Raises:
            BrokerUnavailableError: the topic cannot be described in time.
        """
        deadline = time.monotonic() + timeout_s
        consumer, partition = self._open(operation_id, deadline)
        full = self.settings.topic(Topic.OUTCOMES)
        start: int = OFFSET_BEGINNING
        try:
            (found,) = consumer.offsets_for_times(
                [TopicPartition(full, partition, max(since_ms - SKEW_MARGIN_MS, 0))],
                timeout=max(deadline - time.monotonic(), 1.0),
            )
            if found.offset >= 0:
                start = found.offset
            else:  # nothing since then: from the end (an answer comes after it)
                start = consumer.get_watermark_offsets(
                    TopicPartition(full, partition), timeout=5.0, cached=False
                )[1]
        except Exception as exc:  # noqa: BLE001 -- KafkaException: the partition from the start
            log.warning("outcomes: no offset for %d ms (%s); reading the partition", since_ms, exc)
        consumer.assign([TopicPartition(full, partition, start)])
        return OutcomeWatch(self, consumer, operation_id, partition)

    def _open(self, operation_id: str, deadline: float) -> tuple[Consumer, int]:
        consumer = self._factory(
            consumer_config(
                self.settings,
                f"{self.settings.topic_prefix}.outcomes",
                extra={"fetch.wait.max.ms": 50},
            )
        )
        try:
            count = _partitions(consumer, self.settings.topic(Topic.OUTCOMES), deadline)
        except BaseException:
            consumer.close()
            raise
        return consumer, partition_for(operation_id, count)

    def authentic(self, msg: Message, operation_id: str) -> Outcome | None:
        """The authentic outcome in ``msg`` (keyed ``operation_id``), else ``None`` (logged)."""
        key, value = msg.key() or b"", msg.value()
        if value is None:
            return None
        try:
            event = decode_event(value)
        except Exception as exc:  # noqa: BLE001 -- a value that does not decode is absent
            log.warning("outcomes:%s:%s does not decode: %s", msg.partition(), msg.offset(), exc)
            return None
        problem = self.keyring.check(
            Topic.OUTCOMES,
            key,
            value,
            msg.headers(),
            event,
            partition=msg.partition(),
            timestamp=msg.timestamp(),
        )
        if problem is None and not isinstance(event, Outcome):
            problem = f"a {event.KIND} is not an outcome"
        if problem is not None:
            log.error(
                "outcomes:%s:%s for %s refused (treated as absent): %s",
                msg.partition(),
                msg.offset(),
                operation_id,
                problem,
            )
            return None
        assert isinstance(event, Outcome)
        return event


def _log_error(msg: Message) -> None:
    err = msg.error()
    if err is not None and err.code() not in _GROUP_ERRORS:
        log.warning("outcomes: %s", err)


def _partitions(consumer: Consumer, topic: str, deadline: float) -> int:
    """The topic's partition count, asked until the deadline (a broker may be starting).

    Raises:
        BrokerUnavailableError: no answer before the deadline.
    """
    problem = "no answer"
    while True:
        try:
            meta = consumer.list_topics(topic, timeout=max(min(deadline - time.monotonic(), 5), 1))
            found = meta.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                return len(found.partitions)
            problem = str(found.error) if found is not None else "no such topic"
        except Exception as exc:  # noqa: BLE001 -- KafkaException: asked again until the deadline
            problem = str(exc)
        if time.monotonic() >= deadline:
            raise BrokerUnavailableError(
                f"cannot learn the partitions of {topic} ({problem}): is the broker running, "
                "do the ledger's topics exist (`ledger topics create`), and may this principal "
                "DESCRIBE it (`ledger acl plan`)?",
                observed=problem,
            )
        time.sleep(0.2)
