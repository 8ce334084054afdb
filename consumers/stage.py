"""The consume-transform-produce loop every ledger stage runs on.

One transactional producer per process (KIP-447 style, stable
``transactional.id`` per instance so a restart fences its zombie), a
``read_committed`` consumer in a ``range``-assigned group (co-partitioned
inputs land on one member), and for every batch (what has arrived, taken as
soon as something has: a stage commits when its input is drained, and waits
at most the commit interval, :meth:`Stage._next_batch`):

1. ``begin_transaction()``;
2. decode each record (bad bytes become a dead-letter operating event);
3. let the stage decide and produce its outputs;
4. ``send_offsets_to_transaction()`` with the consumer's positions and group
   metadata, so progress commits with the outputs or not at all;
5. ``commit_transaction()``.

Errors follow librdkafka's classification (``examples/transactions.c``), made
once in :mod:`consumers.retry`: retriable -> retry the call with bounded,
jittered backoff (a broker outage is waited out, however long, with one
WARNING, a recovery line and ``waiting`` in the stage's status file);
``txn_requires_abort`` -> abort, rewind the consumer to its committed offsets
and rebuild the stage's in-memory state; anything else (fatal), and a commit
still failing after its retry budget -> new producer (``init_transactions``
fences the old epoch), rewind, rebuild.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from consumers.fetchwatch import FetchWatch
from consumers.hooks import NO_FAULTS, FaultHooks
from consumers.metrics import StageMetrics
from consumers.retry import STALL_S, KafkaRetry, is_retriable, policy_for
from consumers.twins import (
    Presence,
    announce,
    client_id,
    fenced_out,
    fenced_out_text,
    withdraw,
)
from ledger.authn import AUTH_HEADER, Keyring, Sealer, unverifiable
from ledger.clock import check_stage_clock
from ledger.credentials import load_keyring, stage_sealer
from ledger.errors import BrokerError, ConsumerStuckError, LedgerError
from ledger.events import Event, OperatingEvent, RecordHeader, decode_event
from ledger.identity import MAX_INPUT_BYTES, MAX_KEY_BYTES
from ledger.kafka import (
    FENCING_CODES,
    REFUSAL_CODES,
    classify,
    consumer_config,
    producer_config,
)
from ledger.logs import bind_here
from ledger.settings import LedgerSettings
from ledger.topics import check_topics
from ledger.topology import is_reserved_key, misplaced
from ledger.tracing import RecordSpans, with_trace

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Record:
    """One decoded input record.

    Attributes:
        topic: short topic name (without the prefix).
        partition: partition.
        offset: offset.
        key: record key (text).
        raw: the value bytes as read.
        event: the decoded event.
        headers: the record's headers as read (the seal, the W3C trace
            context: see :mod:`ledger.tracing`); empty when not kept.
        timestamp_ms: its Kafka timestamp (Unix ms: the producer's or the
            broker's clock), ``None`` when it has none; a witness of the time
            for the stage's clock (:class:`consumers.localfiles.LastGoodClock`).
    """

    topic: str
    partition: int
    offset: int
    key: str
    raw: bytes
    event: Event
    headers: tuple[tuple[str, str | bytes | None], ...] = ()
    timestamp_ms: int | None = None


def kafka_timestamp_ms(msg: Message) -> int | None:
    """A message's Kafka timestamp in ms, ``None`` when it has none (or a test double lacks it)."""
    timestamp = getattr(msg, "timestamp", None)
    if timestamp is None:
        return None
    kind, stamp = timestamp()
    return int(stamp) if kind != TIMESTAMP_NOT_AVAILABLE and stamp > 0 else None


#: Seconds a transaction's commit (or offsets send) may keep failing with
#: retriable errors before the producer is replaced (see :meth:`Stage._commit`).
COMMIT_BUDGET_S = 60.0

#: Consecutive aborted transactions after which a stage replaces its producer.
ABORTS_BEFORE_NEW_PRODUCER = 2

#: Seconds of an outage after which a stage asks, with its producer's own
#: connections, whether Kafka answers (then its consumer is the one stuck).
CONSUMER_STUCK_AFTER_S = 30.0

#: Longest a single ask for committed offsets may block (seconds). A restore
#: waits longer than this in all (for a previous owner's transaction, for an
#: outage), but in tries of this length, so that a consumer stuck on a stale
#: coordinator is noticed between them (:meth:`Stage._check_consumer_stuck`):
#: one try as long as the whole takeover wait (180 s) held an authority
#: kernel, its loop unpolled, for minutes after a broker outage.
COMMITTED_TRY_S = 10.0

#: Seconds an assigned partition may stay behind its last stable offset, its
#: position unmoved, before a fresh reader checks whether the stage's consumer
#: stopped fetching it (see :meth:`Stage._check_fetching`).
FETCH_STALL_S = 30.0

#: Seconds between two samples of the assigned partitions' positions and ends
#: (taken while the stage is idle).
FETCH_CHECK_EVERY_S = 5.0

#: Seconds one sample may spend asking the assigned partitions' ends.
FETCH_CHECK_BUDGET_S = 10.0

#: Log marker of a transaction Kafka refused as a zombie's (counted by missions).
FENCED_MARKER = "zombie transaction fenced by Kafka"


def seal_refusal_kind(problem: str) -> str:
    """``UNVERIFIABLE`` for a seal by a key not held here, else ``UNAUTHENTICATED``."""
    return "UNVERIFIABLE" if unverifiable(problem) else "UNAUTHENTICATED"


def refusal_verdict(problem: str) -> str:
    """How a refused input is described: it cannot be verified here, or it is not authentic."""
    return "cannot be verified here" if unverifiable(problem) else "not authentic"


def record_event(
    component: str,
    rec: Record,
    kind: str,
    reason: str,
    *,
    operation_id: str | None = None,
    id_suffix: str | None = None,
    keep_bytes: bool = True,
) -> OperatingEvent:
    """An operating event about one input record (a dead letter when it keeps the bytes).

    The event ID, ``{component}:{topic}:{partition}:{offset}:{id_suffix or kind}``,
    is derived from the input's position, so reprocessing writes the same ID.
    """
    return OperatingEvent(
        event_id=f"{component}:{rec.topic}:{rec.partition}:{rec.offset}:{id_suffix or kind}",
        operation_id=operation_id,
        component=component,
        kind=kind,
        reason=reason,
        source_topic=rec.topic,
        source_partition=rec.partition,
        source_offset=rec.offset,
        original_bytes=rec.raw if keep_bytes else None,
    )


def key_text(msg: Message) -> str:
    """A message's key as text (``""`` when it has none)."""
    key = msg.key()
    return key.decode("utf-8", "replace") if key is not None else ""


def decode_record(topic: str, msg: Message) -> Record | None:
    """Decode a message read from a ledger topic.

    Returns:
        The record, or ``None`` for tombstones, :func:`force_compaction`'s
        reserved records and values that do not decode.
    """
    key = key_text(msg)
    value = msg.value()
    if value is None or is_reserved_key(key):
        return None
    try:
        event = decode_event(value)
    except Exception:
        return None
    return Record(
        topic,
        msg.partition() or 0,
        msg.offset() or 0,
        key,
        value,
        event,
        timestamp_ms=kafka_timestamp_ms(msg),
    )


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


def oversized(msg: Message) -> str | None:
    """Why a record is too large to copy into a dead letter, or ``None`` when it is within bounds.

    A value over :data:`ledger.identity.MAX_INPUT_BYTES` or a key over
    :data:`ledger.identity.MAX_KEY_BYTES` is refused before it is decoded: a
    copy could exceed the producer's limit and make the stage fail the same
    batch for ever (DESIGN.md "Trust boundary": inputs are bounded).
    """
    raw, raw_key = msg.value() or b"", msg.key() or b""
    if len(raw_key) > MAX_KEY_BYTES:
        return f"a key of {len(raw_key)} bytes (over {MAX_KEY_BYTES})"
    if len(raw) > MAX_INPUT_BYTES:
        return f"a value of {len(raw)} bytes (over {MAX_INPUT_BYTES})"
    return None


def dead_letter(
    component: str,
    topic: str,
    msg: Message,
    reason: str,
    *,
    keyed_by_operation: bool = True,
    kind: str = "BAD_INPUT",
) -> tuple[str, OperatingEvent]:
    """The operating event of a record a stage refuses (a dead letter), and its key.

    The record's value, key bytes and headers are kept while they are within
    the input bounds; a larger value or key is named by SHA-256, size and
    position instead (and headers over 16 KiB are dropped, with a note), so
    the dead letter always fits under the producer's limit.

    Args:
        component: the stage writing it.
        topic: the record's short topic name.
        msg: the record as consumed.
        reason: why it is refused.
        keyed_by_operation: the record's key is an operation ID (else the
            event names no operation).
        kind: ``BAD_INPUT`` (does not decode, over the bounds) or
            ``UNAUTHENTICATED`` (its seal is missing or wrong).

    Returns:
        ``(key, OperatingEvent)``: the record's key, or ``sha256:<hex>`` of a
        key over the bound.
    """
    raw, raw_key = msg.value() or b"", msg.key() or b""
    if len(raw_key) > MAX_KEY_BYTES:
        key = f"sha256:{hashlib.sha256(raw_key).hexdigest()}"
        reason = f"{reason}; key {key}"
        operation_id = None
    else:
        key = key_text(msg)
        operation_id = (key or None) if keyed_by_operation else None
    copied = len(raw) <= MAX_INPUT_BYTES
    headers = [
        RecordHeader(name=str(h[0]), value=h[1].encode() if isinstance(h[1], str) else h[1])
        for h in msg.headers() or []
    ]
    if sum(len(h.name) + len(h.value or b"") for h in headers) > MAX_KEY_BYTES * 16:
        reason = f"{reason}; {len(headers)} headers not copied (over {MAX_KEY_BYTES * 16} bytes)"
        headers = []
    if not copied:
        digest = hashlib.sha256(raw).hexdigest()
        reason = f"{reason}; value sha256 {digest}, {len(raw)} bytes, not copied"
    position = f"{topic}:{msg.partition()}:{msg.offset()}"
    return key, OperatingEvent(
        event_id=f"{component}:{position}:{kind}",
        operation_id=operation_id,
        component=component,
        kind=kind,
        reason=reason,
        source_topic=topic,
        source_partition=msg.partition(),
        source_offset=msg.offset(),
        original_bytes=msg.value() if copied else None,
        original_key=msg.key() if len(raw_key) <= MAX_KEY_BYTES else None,
        original_headers=headers or None,
    )


class Stage:
    """Base class of the processor, the authority kernel and the relay.

    Subclasses set :attr:`component` and :attr:`inputs` and implement
    :meth:`handle`; they may override :meth:`on_assign`, :meth:`rebuild`,
    :meth:`before_transaction` and :meth:`after_commit`.

    Args:
        settings: ledger settings.
        instance: instance name; the transactional ID is
            ``{prefix}.{component}.{instance}``, stable across restarts so a
            restarted instance fences its zombie.
    """

    component = "stage"
    inputs: tuple[str, ...] = ()
    batch_size = 500
    #: this process's file in the run folder, touched as the loop goes round
    _presence: Presence | None = None

    def __init__(
        self, settings: LedgerSettings, instance: str = "0", hooks: FaultHooks = NO_FAULTS
    ) -> None:
        self.settings = settings
        self.instance = instance
        #: fault hooks called at each named seam (do nothing unless a testbed passes its own).
        self.hooks = hooks
        self.run_dir = settings.run_dir
        self.group_id = f"{settings.topic_prefix}.{self.component}"
        self.transactional_id = f"{settings.topic_prefix}.{self.component}.{instance}"
        self.stopping = False
        #: Armed by the first stop signal (see :meth:`_stop`); disarmed when the run ends.
        self._watchdog: StopWatchdog | None = None
        self.assigned: set[tuple[str, int]] = set()
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.processed = 0
        self.dead_letters = 0
        #: records refused because their seal was missing or wrong.
        self.forgeries_refused = 0
        #: keys that check the seals of input records (re-read on unknown keys).
        self.keyring: Keyring = load_keyring(settings)
        #: topic -> key that seals this stage's records on it.
        self.sealer = stage_sealer(settings, self.component)
        self.broker_bounced = False
        #: transactions aborted since the last commit (see :meth:`_recover`).
        self.aborts_in_a_row = 0
        #: Producers given up while blocked in a call (kept alive, see _send_offsets).
        self._abandoned: list[Producer] = []
        self._last_skip_check = 0.0
        self._ready_reported = False
        self._assignment_seen = False
        self._committed_positions: dict[tuple[str, int], int] = {}
        #: Where the batch being processed starts in each of its partitions
        #: (everything before is handled): offsets a transaction opened
        #: before the batch's own may commit to prove this member still
        #: belongs to its group (see :meth:`_prove_membership`).
        self.batch_starts: list[TopicPartition] = []
        #: partitions revoked or lost so far (see :meth:`_next_batch`).
        self._revokes = 0
        #: a client reported a retriable error since the loop last checked Kafka.
        self._kafka_suspect = False
        # Set when the consumer's own OffsetFetch kept failing while Kafka
        # answered (see _committed): the loop replaces it at a safe point.
        self._consumer_stuck = False
        #: partitions stalled with records waiting (see _check_fetching).
        self._fetch_watch = FetchWatch(FETCH_STALL_S, max_gap_s=2 * FETCH_CHECK_EVERY_S)
        self._next_fetch_check = 0.0
        #: partition -> committed offset it was assigned (or rewound) at.
        self._assigned_at: dict[tuple[str, int], int] = {}
        #: asks the assigned partitions' ends; never fetches nor joins the group.
        self._ends_client: Consumer | None = None
        #: consumers replaced because they stopped fetching (since start).
        self.fetch_stalls = 0
        #: one span per input record, current while it is handled (ledger.tracing):
        #: ``for rec in self.spans.each(records)`` in the stages' loops.
        self.spans = RecordSpans(self.component)
        #: rides out retriable errors and broker outages (indefinitely, until told to stop).
        self.retry = KafkaRetry(
            f"{self.component}-{instance}",
            policy_for(settings, indefinitely=True),
            should_stop=lambda: self.stopping,
            on_change=lambda _: self._write_status(),
        )
        #: Prometheus metrics and health of this stage (served when LEDGER_METRICS_PORT is set).
        self.metrics = StageMetrics(
            self.component,
            instance,
            stall_s=settings.health_stall_s,
            ready=lambda: self._ready_reported and self.consumer is not None,
            waiting=lambda: self.retry.waiting,
            held=self.unverifiable_held,
        )
        #: how many keys :meth:`unverifiable_held` named at the last status write.
        self._held_written = 0
        self.metrics.describe_stage(self.group_id, self.transactional_id)

    # ------------------------------------------------------------------ hooks

    def handle(self, records: list[Record], out: Writer) -> None:
        """Decide on a batch of decoded records and write the outputs."""
        raise NotImplementedError

    def on_start(self) -> None:
        """Called once the topics are checked, before the loop starts."""

    def on_assign(self, partitions: set[int]) -> None:
        """Partitions ``partitions`` of every input were assigned: restore state."""

    def on_revoke(self, partitions: set[int]) -> None:
        """Partitions were revoked or lost: drop their state."""

    def rebuild(self) -> None:
        """Discard uncommitted in-memory changes after an aborted transaction."""

    def before_transaction(self, records: list[Record]) -> None:
        """Work that must happen outside the main transaction (the relay's sends)."""

    def after_commit(self) -> None:
        """The batch's transaction committed: make pending changes permanent."""

    def before_commit(self, records: list[Record]) -> None:
        """Called inside the transaction just before it commits (fault seams)."""

    # ------------------------------------------------------------------ plumbing

    def _on_client_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            # After the broker comes back, librdkafka's idempotent producer can
            # wait forever draining requests lost with the connection; a new
            # producer (init_transactions fences the old epoch) is the remedy.
            self.broker_bounced = True
        if classify(err) == "retriable":
            self._suspect_kafka("producer", err)
        else:
            log.warning("%s: Kafka client error: %s", self.component, err)

    def _on_consumer_error(self, err: KafkaError) -> None:
        if fenced_out(err):  # another live process has this name (consumers.twins)
            log.error("%s", fenced_out_text(f"{self.component}-{self.instance}", err))
        elif classify(err) == "retriable":
            self._suspect_kafka("consumer", err)
        else:
            log.warning("%s: Kafka consumer error: %s", self.component, err)

    def _suspect_kafka(self, client: str, err: KafkaError) -> None:
        """A client reported a retriable error: the loop checks that Kafka answers.

        Client errors can arrive late (queued while Kafka was away) or be
        passing (one dropped connection); only a call that fails starts an
        outage (:meth:`_await_kafka`), so the log has one WARNING per outage.
        """
        log.debug("%s: %s reported %s; checking that Kafka answers", self.component, client, err)
        self._kafka_suspect = True

    def _new_producer(self) -> Producer:
        self.broker_bounced = False
        producer = Producer(
            producer_config(
                self.settings,
                **{
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": self.settings.transaction_timeout_ms,
                    "error_cb": self._on_client_error,
                },
            )
        )
        # A broker that is down or restarting is waited for; a fatal error
        # (not authorised, fenced) is raised.
        self.retry.call(lambda: producer.init_transactions(30), "init_transactions")
        return producer

    def _new_consumer(self) -> Consumer:
        return Consumer(
            consumer_config(
                self.settings,
                self.group_id,
                extra={
                    # Names the process too, so that `ledger status` can tell two
                    # processes given one instance name apart (consumers.twins).
                    "client.id": client_id(self.component, self.instance, os.getpid()),
                    # Static membership (KIP-345): a restarted instance takes its
                    # predecessor's place at once instead of waiting for its
                    # session to time out.
                    "group.instance.id": f"{self.component}-{self.instance}",
                    # Co-partitioned inputs: partition i of every topic together.
                    "partition.assignment.strategy": "range",
                    "fetch.wait.max.ms": 50,
                    "session.timeout.ms": 10000,
                    "heartbeat.interval.ms": 1000,
                    "max.poll.interval.ms": 300000,
                    "error_cb": self._on_consumer_error,
                    **self.metrics.consumer_settings(),
                },
            )
        )

    def _short(self, topic: str) -> str:
        prefix = self.settings.topic_prefix + "."
        return topic[len(prefix) :] if topic.startswith(prefix) else topic

    def _assign_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._assignment_seen = True
        self._ready_reported = False  # start-up work may follow a new assignment
        self.assigned = {(self._short(tp.topic), tp.partition) for tp in partitions}
        parts = {tp.partition for tp in partitions}
        log.info("%s-%s assigned partitions %s", self.component, self.instance, sorted(parts))
        self._restore(partitions)

    def _restore(self, partitions: list[TopicPartition]) -> None:
        """Wait out the previous owner's transaction, then let the stage restore its state.

        A partition can change hands while its previous owner's last
        transaction is still open: the owner was killed after asking to
        commit, or it is a paused zombie that has already sent its offsets.
        Restoring from the state topic at that moment would miss that
        transaction's outputs while the consumer, once the transaction
        commits, starts after its inputs: two owners would then decide from
        different states (split brain). So :meth:`on_assign` runs only once
        the group's committed offsets for these partitions are stable
        (``OffsetFetch`` with ``require_stable``, KIP-447: librdkafka retries
        ``UNSTABLE_OFFSET_COMMIT`` until the transaction ends, at most the
        transaction timeout), and a stage reading a table waits for it to
        settle as well (:func:`await_settled`). A consumer found stuck
        meanwhile (see :meth:`_committed`) restores nothing: the loop replaces
        it before handling any record, and the new member restores.

        Raises:
            LedgerError: if the offsets stay unreadable with a non-retriable
                error for ``takeover_wait_s`` seconds (retriable errors,
                unstable offsets included, are waited out).
        """
        assert self.consumer is not None
        if self._consumer_stuck:
            return  # the loop replaces the consumer first; the new member restores
        self.metrics.restoring()
        parts = {tp.partition for tp in partitions}
        if partitions:
            budget_s = self.settings.takeover_wait_s
            deadline = time.monotonic() + budget_s
            started = time.monotonic()
            asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
            while True:
                try:
                    # Retriable errors (the coordinator moving, the broker
                    # down) are ridden out; others are retried until the deadline.
                    answer = self._committed(
                        asked,
                        "stable committed offsets of the assigned partitions",
                        COMMITTED_TRY_S,
                    )
                    break
                except KafkaException as exc:
                    if time.monotonic() > deadline:
                        raise LedgerError(
                            f"{self.component}: committed offsets of partitions "
                            f"{sorted(parts)} did not become stable in {budget_s:.0f} s",
                            observed=str(exc.args[0]),
                        ) from exc
                    log.warning("%s: waiting for stable offsets: %s", self.component, exc)
                    time.sleep(0.5)
            waited = time.monotonic() - started
            if waited > 1.0:
                log.info(
                    "%s-%s: waited %.1f s for the previous owner's transaction",
                    self.component,
                    self.instance,
                    waited,
                )
            if answer is None:
                # Its partitions are left unrestored: the loop replaces the
                # consumer before handling anything, and the new member
                # restores them (takeover bookkeeping included).
                return
            self._note_assigned_at(answer)
        self.on_assign(parts)
        self.metrics.restored()

    def _revoke_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = {tp.partition for tp in partitions}
        self._revokes += 1
        log.info("%s-%s revoked partitions %s", self.component, self.instance, sorted(parts))
        self.assigned -= {(self._short(tp.topic), tp.partition) for tp in partitions}
        self.on_revoke(parts)

    def _rejoin(self) -> None:
        """Replace a consumer that hit a fatal error: drop state, join again."""
        assert self.consumer is not None
        consumer = self.consumer

        def close() -> None:
            try:
                consumer.close()
            except Exception as exc:  # the old consumer is unusable anyway
                log.warning("%s: closing the failed consumer: %s", self.component, exc)

        # A consumer being replaced is the kind whose close can hang
        # (confluent-kafka-python#1667): it is left behind after stop_timeout_s.
        bounded_call(
            close,
            self.settings.stop_timeout_s,
            f"{self.component}-{self.instance}: closing the replaced consumer",
        )
        self.on_revoke({p for _, p in self.assigned})
        self.assigned = set()
        self.rebuild()
        self.consumer = self._new_consumer()
        self._subscribe()

    def _subscribe(self) -> None:
        assert self.consumer is not None
        self.consumer.subscribe(
            [self.settings.topic(t) for t in self.inputs],
            on_assign=self._assign_cb,
            on_revoke=self._revoke_cb,
            on_lost=self._revoke_cb,
        )

    def _committed(
        self, partitions: list[TopicPartition], what: str, timeout_s: float
    ) -> list[TopicPartition] | None:
        """The group's committed offsets of ``partitions`` (``read_committed``: stable ones).

        Asked by the stage's consumer, riding out retriable errors. A
        consumer can be left asking a coordinator that is no longer one:
        its ``OffsetFetch`` then fails with ``NOT_COORDINATOR`` for as long
        as it lives (librdkafka#2630, #5586; seen for minutes after a broker
        restart in the three-broker chaos mission) while Kafka answers every
        other client. After :data:`CONSUMER_STUCK_AFTER_S` of failures, when
        the producer gets an answer, a new client of the group (not
        subscribed: ``OffsetFetch`` needs no membership) asks once. Answered,
        the consumer is stuck: ``_consumer_stuck`` tells the loop to replace
        it before it handles anything (it cannot be closed inside a
        rebalance callback) and ``None`` is returned. Not answered, the
        group's coordinator is away and the wait goes on.

        Args:
            partitions: ``TopicPartition`` (topic, partition) pairs.
            what: what is asked, for the log and the status.
            timeout_s: seconds each try may take.

        Returns:
            One ``TopicPartition`` per partition with its committed offset
            (negative when the group has none), or ``None`` when the
            consumer is stuck (its replacement reads them afresh).

        Raises:
            KafkaException: a non-retriable error (e.g. the member was fenced).
        """
        assert self.consumer is not None
        if self._consumer_stuck:
            return None
        consumer = self.consumer
        while True:
            try:
                answer: list[TopicPartition] = self.retry.call(
                    lambda: consumer.committed(partitions, timeout=timeout_s),
                    what,
                    between=self._check_consumer_stuck,
                )
                return answer
            except ConsumerStuckError:
                if self._group_answers(partitions):
                    log.warning(
                        "%s-%s: %s: the consumer keeps failing while a new client of the "
                        "group is answered; replacing the consumer",
                        self.component,
                        self.instance,
                        what,
                    )
                    self._consumer_stuck = True
                    self.broker_bounced = True  # and the next batch gets a new producer
                    return None

    def _group_answers(self, partitions: list[TopicPartition]) -> bool:
        """Whether a new client of this stage's group gets the committed offsets (one try)."""
        try:
            client = Consumer(consumer_config(self.settings, self.group_id))
        except (KafkaException, LedgerError) as exc:
            log.warning("%s: cannot make a client to ask Kafka: %s", self.component, exc)
            return False
        try:
            client.committed(partitions, timeout=10)
            return True
        except KafkaException as exc:
            log.info(
                "%s: a new client of the group is not answered either: %s", self.component, exc
            )
            return False
        finally:
            bounded_call(
                client.close,
                self.settings.stop_timeout_s,
                f"{self.component}-{self.instance}: closing a client of the group",
            )

    def _rewind(self) -> None:
        """Seek every assigned partition back to its committed offset.

        Retriable errors while reading the committed offsets (the group
        coordinator moving, the broker down: ``NOT_COORDINATOR`` ...) are
        ridden out. A consumer that cannot (its membership was fenced
        meanwhile, e.g. by a second live process with this instance's
        identity: the seek fails with ``_STATE``) is replaced as after a fatal
        consumer error: the new member starts from the committed offsets, so
        nothing is skipped.
        """
        assert self.consumer is not None
        consumer = self.consumer
        try:
            assignment = consumer.assignment()
            if not assignment:
                return
            committed = self._committed(assignment, "committed offsets (rewind)", 30.0)
            if committed is None:
                return  # the loop replaces the consumer: the new one starts from them
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            self._note_assigned_at(committed)
        except KafkaException as exc:
            log.warning(
                "%s-%s: cannot rewind to the committed offsets (%s); rejoining the group",
                self.component,
                self.instance,
                exc,
            )
            self._rejoin()

    def _decode(self, msg: Message) -> Record | tuple[str, OperatingEvent] | None:
        """Decode one message: a record, a dead letter ``(key, event)``, or ``None`` to skip."""
        raw = msg.value()
        key = key_text(msg)
        topic = self._short(msg.topic() or "")
        if is_reserved_key(key):
            return None
        try:
            too_large = oversized(msg)
            if too_large is not None:
                raise LedgerError(
                    f"record at {topic}:{msg.partition()}:{msg.offset()} has {too_large}"
                )
            if not key:
                raise LedgerError("record has no key; ledger records are keyed by ID")
            # Refused whatever the authentication setting: a stage that does
            # not own a key's partition must never decide about it.
            where = misplaced(topic, msg.key() or b"", msg.partition(), self.settings.partitions)
            if where is not None:
                self.forgeries_refused += 1
                log.error(
                    "%s: MISPLACED record at %s:%s:%s refused: %s",
                    self.component,
                    topic,
                    msg.partition(),
                    msg.offset(),
                    where,
                )
                return dead_letter(
                    self.component, topic, msg, f"not authentic: {where}", kind="UNAUTHENTICATED"
                )
            if raw is None:
                # A tombstone is never a stage's input; one that no trusted
                # writer sealed is a forgery first (docs/trust-model.md).
                problem = self.keyring.check(
                    topic, msg.key() or b"", None, msg.headers(), timestamp=msg.timestamp()
                )
                if problem is not None and self.unauthenticated(msg, topic, problem):
                    return dead_letter(
                        self.component,
                        topic,
                        msg,
                        f"{refusal_verdict(problem)} (tombstone): {problem}",
                        kind=seal_refusal_kind(problem),
                    )
            event = decode_event(raw)
            problem = self.keyring.check(
                topic, msg.key() or b"", raw, msg.headers(), event, timestamp=msg.timestamp()
            )
            if problem is not None and self.unauthenticated(msg, topic, problem):
                return dead_letter(
                    self.component,
                    topic,
                    msg,
                    f"{refusal_verdict(problem)}: {problem}",
                    kind=seal_refusal_kind(problem),
                )
        except Exception as exc:
            self.dead_letters += 1
            reason = f"{type(exc).__name__}: {exc}"
            log.error(
                "%s: dead letter at %s:%s:%s: %s",
                self.component,
                topic,
                msg.partition(),
                msg.offset(),
                reason,
            )
            return dead_letter(self.component, topic, msg, reason)
        headers = tuple((str(h[0]), h[1]) for h in msg.headers() or ())
        return Record(
            topic,
            msg.partition() or 0,
            msg.offset() or 0,
            key,
            raw or b"",
            event,
            headers,
            timestamp_ms=kafka_timestamp_ms(msg),
        )

    def unauthenticated(self, msg: Message, topic: str, problem: str) -> bool:
        """Count and log a record whose seal is missing or wrong.

        Returns:
            True when it is refused (``require_authenticated_records``, the
            default); False when the setting is off and it is only reported.
        """
        refused = self.settings.require_authenticated_records
        log.error(
            "%s: UNAUTHENTICATED record at %s:%s:%s %s: %s",
            self.component,
            topic,
            msg.partition(),
            msg.offset(),
            "refused" if refused else "accepted (LEDGER_REQUIRE_AUTHENTICATED_RECORDS=false)",
            problem,
        )
        if not refused:
            return False
        if unverifiable(problem):
            self.unverifiable_input(topic, key_text(msg), msg, problem)
        else:
            self.forgeries_refused += 1
        return True

    def unverifiable_input(self, topic: str, key: str, msg: Message, problem: str) -> None:
        """An input sealed by a key this stage does not hold was refused (``UNVERIFIABLE``).

        It may be authentic evidence about its key: a stage that decides per
        key holds that key here (the processor does). Nothing by default.

        Args:
            topic: the input's short topic name.
            key: its key (an operation ID on operation-keyed topics).
            msg: the record as consumed.
            problem: why it cannot be verified.
        """

    def table_refusal(
        self, msg: Message, reason: str, kind: str, *, keyed_by_operation: bool
    ) -> tuple[str, OperatingEvent]:
        """The operating event of a record one of this stage's tables refused, and its key.

        For a :class:`consumers.tables.TableFollower`'s ``on_bad``: the
        record does not decode (``BAD_INPUT``) or is not authentic
        (``UNAUTHENTICATED``, tombstones included, counted in
        :attr:`forgeries_refused`); the table treats it as absent. The event
        keeps the record's bytes while they are within the input bounds
        (:func:`dead_letter`).

        Args:
            msg: the refused record as consumed.
            reason: why the table refused it.
            kind: ``BAD_INPUT``, ``UNAUTHENTICATED`` or ``UNVERIFIABLE`` (sealed
                by a key this stage does not hold: counted in
                :attr:`unverifiable_refused`, not as a forgery).
            keyed_by_operation: the table's keys are operation IDs.

        Returns:
            ``(key, OperatingEvent)`` to write to ``operating-events``.
        """
        topic = (msg.topic() or "").removeprefix(self.settings.topic_prefix + ".")
        if kind in ("UNAUTHENTICATED", "UNVERIFIABLE"):
            self.forgeries_refused += kind == "UNAUTHENTICATED"
            what = f"{topic} record {key_text(msg)[:200]!r} refused, {reason}"
        else:
            what = f"{topic} record {key_text(msg)[:200]!r} does not decode: {reason}"
        key, event = dead_letter(
            self.component, topic, msg, what, keyed_by_operation=keyed_by_operation, kind=kind
        )
        return key or "(no key)", event

    def writer(self) -> Writer:
        """A writer into the open transaction that seals with this stage's keys."""
        assert self.producer is not None
        return Writer(self.producer, self.settings, self.sealer, observe=self.metrics.written)

    def _process(self, msgs: list[Message]) -> None:
        assert self.producer is not None and self.consumer is not None
        mine = [m for m in msgs if (self._short(m.topic() or ""), m.partition()) in self.assigned]
        if len(mine) < len(msgs):
            # Records of partitions no longer assigned: their new owner handles them.
            log.info(
                "%s-%s: %d records of partitions no longer assigned left to their owner",
                self.component,
                self.instance,
                len(msgs) - len(mine),
            )
            msgs = mine
            if not msgs:
                return
        self.producer.poll(0)  # serve error callbacks before deciding on the producer
        if self.broker_bounced:
            log.warning("%s: the broker was unreachable; replacing the producer", self.component)
            self.producer = self._new_producer()
        self.spans.end("the batch's transaction did not commit")  # left by a failed batch
        starts: dict[tuple[str, int], int] = {}
        for msg in msgs:
            where = (msg.topic() or "", msg.partition() or 0)
            starts[where] = min(starts.get(where, msg.offset() or 0), msg.offset() or 0)
        self.batch_starts = [TopicPartition(t, p, o) for (t, p), o in sorted(starts.items())]
        records: list[Record] = []
        dead: list[tuple[str, OperatingEvent]] = []
        for msg in msgs:
            item = self._decode(msg)
            if isinstance(item, Record):
                records.append(item)
            elif item is not None:
                dead.append(item)
        self.before_transaction(records)
        self.producer.begin_transaction()
        out = self.writer()
        for key, event in dead:
            out.write("operating-events", key, event)
        self.handle(records, out)
        positions = self.consumer.position(self.consumer.assignment())
        offsets = [tp for tp in positions if tp.offset >= 0]
        self._send_offsets(offsets)
        self.before_commit(records)
        self._commit()
        self.retry.recovered()
        self.aborts_in_a_row = 0
        self.processed += len(msgs)
        self.metrics.consumed(len(msgs))
        self.after_commit()
        self.spans.end()

    def _commit_skipped(self) -> None:
        """Commit positions that moved without delivering records.

        A consumer skips aborted transactions' records and control markers
        without returning them; committing the new position then keeps the
        group's committed offsets at the partition's end (so the harness sees
        the stage caught up) and spares a restart the rescan. At most once a
        second.
        """
        assert self.consumer is not None and self.producer is not None
        now = time.monotonic()
        if now - self._last_skip_check < 1.0 or not self.assigned:
            return
        self._last_skip_check = now
        positions = [
            tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0
        ]
        current = {(tp.topic, tp.partition): tp.offset for tp in positions}
        if not positions or current == self._committed_positions:
            return
        committed = self._committed(positions, "committed offsets", 10.0)
        if committed is None:
            return  # the loop replaces the consumer before anything else
        if all(tp.offset >= current[(tp.topic, tp.partition)] for tp in committed):
            self._committed_positions = current
            return
        self.producer.begin_transaction()
        self._send_offsets(positions)
        self._commit()
        self._committed_positions = current

    def _prove_membership(self, offsets: list[TopicPartition] | None = None) -> None:
        """Put the batch's start offsets into the open transaction: a zombie's commit fails.

        A transaction that carries consumer offsets is checked by the group
        coordinator against the member's generation (KIP-447): a member
        that lost its partitions while paused or cut off (a zombie) gets
        ``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID`` or ``FENCED_INSTANCE_ID``
        and its transaction must abort. A transaction with no offsets is
        checked by nobody: another instance of the stage has its own
        transactional ID, so it does not fence this one's producer. A stage
        that commits something before its batch's own transaction (the
        relay's ``ATTEMPTED`` markers, after which a request may leave) calls
        this inside that transaction; the offsets are where the batch starts
        (see :attr:`batch_starts`), so a commit moves no position past a
        record not yet handled.

        Args:
            offsets: the offsets to commit instead (a stage proving its
                membership between batches passes its positions).

        Raises:
            KafkaException: as :meth:`_send_offsets` (abortable when this
                member is a zombie).
        """
        chosen = self.batch_starts if offsets is None else offsets
        if chosen:
            self._send_offsets(chosen)

    def _send_offsets(
        self, offsets: list[TopicPartition], timeout_s: float = 30.0, grace_s: float = 5.0
    ) -> None:
        """``send_offsets_to_transaction``, retriable errors retried for :data:`COMMIT_BUDGET_S`.

        Each try is :meth:`_send_offsets_once`; an abortable or fatal error
        (a hung call included) is raised at once for :meth:`_recover`.

        Raises:
            KafkaException: as :meth:`_send_offsets_once`; a retriable error
                that lasted longer than the budget.
        """
        self.retry.call(
            lambda: self._send_offsets_once(offsets, timeout_s, grace_s),
            "send_offsets_to_transaction",
            give_up_after_s=COMMIT_BUDGET_S,
        )

    def _send_offsets_once(
        self, offsets: list[TopicPartition], timeout_s: float = 30.0, grace_s: float = 5.0
    ) -> None:
        """``send_offsets_to_transaction`` with a deadline that holds.

        librdkafka can block in it past its timeout when the group coordinator
        goes away during the call (confluentinc/librdkafka#5456, seen here
        when the broker restarts mid-transaction). The call runs in a helper
        thread; if it has not returned ``timeout_s + grace_s`` seconds later, the
        stage gives the producer up as fatally failed: :meth:`_recover`
        replaces it, and the new producer's ``init_transactions`` fences the
        old one and aborts its transaction. The blocked producer is kept
        referenced so that it is not freed under the call.

        Raises:
            KafkaException: the call's own error, or a fatal ``_TIMED_OUT``.
        """
        assert self.producer is not None and self.consumer is not None
        producer, metadata = self.producer, self.consumer.consumer_group_metadata()
        outcome: list[BaseException | None] = []

        def call() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, metadata, timeout_s)
                outcome.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome.append(exc)

        worker = threading.Thread(target=call, name="send-offsets", daemon=True)
        worker.start()
        worker.join(timeout_s + grace_s)
        if not outcome:
            log.error(
                "%s: send_offsets_to_transaction still blocked after %.1f s "
                "(librdkafka#5456); replacing the producer",
                self.component,
                timeout_s + grace_s,
            )
            self._abandoned.append(producer)
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "send_offsets_to_transaction hung", fatal=True)
            )
        if outcome[0] is not None:
            raise outcome[0]

    def _commit(self, budget_s: float = COMMIT_BUDGET_S) -> None:
        """Commit the open transaction, retrying retriable errors for ``budget_s`` seconds.

        A commit that still fails is treated as fatal (librdkafka does not
        implement KIP-890 yet; recreating the producer is the stop-gap its
        maintainers suggest): the new producer's ``init_transactions`` (which
        waits for a broker that is down) aborts the transaction or completes
        it, and fences this one; :meth:`_recover` then restores the state
        from what was committed.

        Raises:
            KafkaException: an abortable or fatal error, or a retriable one
                that lasted ``budget_s``.
        """
        assert self.producer is not None
        producer = self.producer
        started = time.monotonic()
        self.retry.call(
            lambda: producer.commit_transaction(10), "commit_transaction", give_up_after_s=budget_s
        )
        self.metrics.committed(time.monotonic() - started)

    def _recover(self, exc: KafkaException) -> None:
        """Recover from a failed transaction or Kafka call (see the module docstring).

        An abortable error aborts the transaction (the batch is redone from
        the committed offsets); a fatal one, or a retriable one that outlasted
        its retry budget, replaces the producer and restores the state from
        what was committed. Every Kafka call on the way rides out retriable
        errors, so a broker outage is waited out here too.
        """
        err: KafkaError = exc.args[0]
        assert self.producer is not None
        self.metrics.failed(classify(err), fenced=err.code() in FENCING_CODES)
        self.spans.end(f"transaction failed: {err}")
        if err.code() in FENCING_CODES:
            log.warning("%s-%s: %s: %s", self.component, self.instance, FENCED_MARKER, err)
        kind = classify(err)
        if kind == "abortable":
            log.warning("%s: transaction aborted: %s", self.component, err)
            self.aborts_in_a_row += 1
            producer = self.producer
            try:
                # An abort that times out (the brokers restarting) is resumed
                # by calling it again, for the commit's budget: once it
                # returns, the transaction is aborted for certain.
                self.retry.call(
                    lambda: producer.abort_transaction(30),
                    "abort_transaction",
                    give_up_after_s=COMMIT_BUDGET_S,
                )
            except KafkaException as abort_exc:
                # The transaction's fate is unknown: the coordinator may have
                # completed it (an abort refused with INVALID_TXN_STATE, seen
                # under broker chaos), and the new producer's init_transactions
                # completes or aborts whatever is left. The committed offsets
                # may then have moved past the batch, so what is in memory is
                # restored from what was committed, as after a fatal error.
                log.error(
                    "%s: abort failed (%s); new producer, state restored",
                    self.component,
                    abort_exc,
                )
                self._replace_producer_and_restore()
            else:
                # A producer left behind by a broker restart can fail every
                # delivery for good without ever reporting the brokers down
                # (seen in game day g12): retrying with it aborts forever. A
                # failed delivery (librdkafka's _INCONSISTENT at commit) or a
                # second abort in a row therefore gets a new producer.
                failed_delivery = err.code() == KafkaError._INCONSISTENT
                if failed_delivery or self.aborts_in_a_row >= ABORTS_BEFORE_NEW_PRODUCER:
                    log.warning(
                        "%s: %s; replacing the producer",
                        self.component,
                        "a delivery failed"
                        if failed_delivery
                        else f"{self.aborts_in_a_row} transactions in a row aborted",
                    )
                    self.producer = self._new_producer()
                self.rebuild()
        else:
            if kind == "retriable":
                log.warning(
                    "%s: %s still failing after its retry budget; new producer",
                    self.component,
                    err,
                )
            else:
                log.error("%s: fatal producer error (%s); new producer", self.component, err)
            self._replace_producer_and_restore()
        self._rewind()

    def _replace_producer_and_restore(self) -> None:
        """A new producer, and the state restored from what was committed.

        The old producer's last transaction may have committed after all (a
        commit that timed out had reached the coordinator; the new producer's
        ``init_transactions`` then completes it): what is in memory cannot
        tell, so the state is restored afresh.
        """
        self.producer = self._new_producer()
        self.rebuild()
        if self.assigned and self.consumer is not None:
            parts = {p for _, p in self.assigned}
            self.on_revoke(parts)
            self._restore(self.consumer.assignment())

    def run(self, stop_after_s: float | None = None) -> None:
        """Run the loop until SIGTERM/SIGINT (or ``stop_after_s`` seconds).

        A broker that does not answer, at start-up or later, is waited for
        (see :mod:`consumers.retry`); a stop asked for meanwhile ends the run
        cleanly.

        Raises:
            SettingsError: the settings name the manual clock outside a
                testbed (see :func:`ledger.clock.check_stage_clock`).
            BrokerError: the topics cannot be checked for a reason other than
                the broker not answering.
            TopicConfigError: a ledger topic is missing or unsafe.
        """
        check_stage_clock(self.settings.clock, testbed=self.settings.testbed)
        bind_here(stage=self.component, instance=self.instance)
        presence = announce(self.run_dir, self.component, self.instance)  # consumers.twins
        self._presence = Presence(presence)  # touched as the loop goes round (ledger status)
        if self.settings.metrics_port is not None:
            self.metrics.serve(self.settings.metrics_host, self.settings.metrics_port)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._stop)
            signal.signal(signal.SIGINT, self._stop)
        try:
            self.retry.call(lambda: check_topics(self.settings), "start-up topic check")
            self.on_start()
            self.producer = self._new_producer()
            self.consumer = self._new_consumer()
            self._subscribe()
        except (KafkaException, LedgerError) as exc:
            self.close()
            withdraw(presence)
            if not self.stopping:
                raise
            log.info("%s-%s: stopped while starting (%s)", self.component, self.instance, exc)
            return
        log.info(
            "%s-%s running (pid %s, group %s, transactional.id %s)",
            self.component,
            self.instance,
            os.getpid(),
            self.group_id,
            self.transactional_id,
        )
        try:
            self._loop(stop_after_s)
        except (KafkaException, LedgerError) as exc:
            if not self.stopping:
                raise
            # Told to stop while it waited for Kafka: the last error ends the wait.
            log.info("%s-%s: stopped while waiting (%s)", self.component, self.instance, exc)
        finally:
            self.close()
            withdraw(presence)
            if self._watchdog is not None:
                self._watchdog.cancel()

    def _loop(self, stop_after_s: float | None) -> None:
        """The consume-transform-produce loop (see :meth:`run`)."""
        assert self.consumer is not None and self.producer is not None
        started = time.monotonic()
        while not self.stopping:
            self.metrics.beat()
            if self._presence is not None:
                self._presence.beat()
            if stop_after_s is not None and time.monotonic() - started > stop_after_s:
                break
            if self._consumer_stuck:
                self._consumer_stuck = False
                log.warning(
                    "%s: replacing the consumer that could not read offsets", self.component
                )
                self._rejoin()
            msgs = self._next_batch()
            if self._consumer_stuck:
                continue  # read by a member about to be replaced: its successor reads them
            real = []
            for msg in msgs:
                err = msg.error()
                if err is None:
                    real.append(msg)
                elif err.code() == KafkaError._FATAL or err.fatal():
                    # e.g. a static member fenced after a coordinator restart
                    log.error("%s: fatal consumer error (%s); rejoining", self.component, err)
                    self._rejoin()
                    real = []  # the new member reads them again from the committed offsets
                    break
                elif err.code() == KafkaError._PARTITION_EOF:
                    continue
                elif classify(err) == "retriable":
                    self._suspect_kafka("consume", err)
                else:
                    log.warning("%s: consumer error: %s", self.component, err)
            if self._kafka_suspect or self.retry.down:
                self._kafka_suspect = False
                self._await_kafka()
            if not real:
                try:
                    self.producer.poll(0)
                    self._commit_skipped()
                    self.idle()
                    self._report_ready()
                except KafkaException as exc:
                    self._recover(exc)
                self._check_fetching()
                continue
            try:
                self._process(real)
            except KafkaException as exc:
                self._recover(exc)

    def _next_batch(self) -> list[Message]:
        """The next batch: whatever has arrived, as soon as something has.

        Waits at most the commit interval for the first message (a poll that
        returns nothing leads to :meth:`idle`), then takes what the consumer
        already holds, up to :attr:`batch_size`, without waiting more. A
        batch is thus processed and committed as soon as the input is
        drained, instead of after a full interval spent waiting for more: at
        low load every hop costs one transaction, not one interval. Under
        load the consumer's prefetched queue fills the batch; the interval
        stays the longest wait. Errors and end-of-partition events come back
        in the list like messages (the loop sorts them).

        Returns:
            Up to :attr:`batch_size` messages (empty when nothing came in one
            commit interval).
        """
        assert self.consumer is not None
        first = self.consumer.consume(1, self.settings.commit_interval_ms / 1000)
        if not first or self.batch_size <= 1:
            return first
        revokes = self._revokes
        rest = self.consumer.consume(self.batch_size - 1, 0)
        if self._revokes != revokes:
            # The revocation was served inside the second call: the records
            # taken before it are no longer this member's to handle (their
            # new owner reads them from the committed offsets, and so does
            # this member if it is given them again), and handling them would
            # commit outputs with no offsets for the group to check.
            log.info(
                "%s-%s: partitions were revoked while a batch was read; its %d records "
                "are left to their next owner",
                self.component,
                self.instance,
                len(first) + len(rest),
            )
            return []
        return first + rest

    def _await_kafka(self) -> None:
        """A client reported Kafka unreachable: check, and wait until it answers.

        Asks for the committed offsets of the assignment (or for the first
        input's metadata when nothing is assigned), riding out the outage;
        the answer ends it, with one log line, and clears ``waiting`` from the
        status file. When Kafka did not answer at first (an outage, a broker
        restart), the next batch starts with a new producer, as after
        ``_ALL_BROKERS_DOWN``: a producer that never reported that error can
        still be left with requests lost with the old connections, and then
        timed out adding offsets to its transaction for 15 s at a time (seen
        for 45 s after a broker restart, game day g13).
        """
        assert self.consumer is not None
        consumer = self.consumer
        assignment = consumer.assignment()
        outage = self.retry.down
        outages_before = self.retry.outages
        topic = self.settings.topic(self.inputs[0])
        ask: Callable[[], object] = (
            (lambda: consumer.committed(assignment, timeout=10))
            if assignment
            else (lambda: consumer.list_topics(topic, timeout=10))
        )
        try:
            self.retry.call(ask, "Kafka to answer", between=self._check_consumer_stuck)
        except ConsumerStuckError:
            # The outage stays open (status: waiting); the next pass asks the
            # new consumer, which then joins the group and restores.
            log.warning(
                "%s: Kafka answers, but the consumer's calls keep timing out; "
                "replacing the consumer and the producer",
                self.component,
            )
            self.broker_bounced = True
            self._rejoin()
            return
        if outage or self.retry.outages > outages_before:
            self.broker_bounced = True

    def _note_assigned_at(self, committed: list[TopicPartition]) -> None:
        """Remember where each partition starts: a position until one is delivered."""
        self._fetch_watch.reset()
        for tp in committed:
            self._assigned_at[(tp.topic, tp.partition)] = tp.offset

    def _check_fetching(self) -> None:
        """Replace a consumer that stopped fetching a partition with records waiting.

        Called when a poll returned nothing (the loop is idle, no
        transaction open), at most every :data:`FETCH_CHECK_EVERY_S` seconds:
        the assigned partitions' positions are compared with their last
        stable offsets, asked by a client of their own. A partition behind,
        its position unmoved over :data:`FETCH_STALL_S` seconds of idle
        samples (time spent handling records does not count, see
        :class:`~consumers.fetchwatch.FetchWatch`), is read by a fresh reader
        from that position: a record there means the consumer stopped
        fetching (see :mod:`consumers.fetchwatch`) and it is replaced as
        after a fatal error (the new member restores and starts from the
        committed offsets, so nothing is skipped); nothing there (a
        transaction marker before the end) starts the wait afresh. Skipped
        during an outage (the retry paths handle it) and when Kafka does not
        answer the check; the ends are asked within
        :data:`FETCH_CHECK_BUDGET_S` seconds in all, and the probing stops
        at the first record found.
        """
        now = time.monotonic()
        if now < self._next_fetch_check or self.consumer is None or self.stopping:
            return
        self._next_fetch_check = now + FETCH_CHECK_EVERY_S
        if self.retry.down or self.retry.waiting is not None:
            return
        assignment = self.consumer.assignment()
        if not assignment:
            self._fetch_watch.reset()
            return
        budget_ends = now + FETCH_CHECK_BUDGET_S
        try:
            if self._ends_client is None:
                self._ends_client = Consumer(consumer_config(self.settings, self.group_id))
            self._ends_client.poll(0)  # serves its log and error events (never records)
            positions: dict[tuple[str, int], int] = {}
            ends: dict[tuple[str, int], int] = {}
            for tp in self.consumer.position(assignment):
                if time.monotonic() > budget_ends:
                    log.debug("%s: fetch check skipped: the ends came too slowly", self.component)
                    return
                key = (tp.topic, tp.partition)
                low, high = self._ends_client.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=2, cached=False
                )
                ends[key] = int(high)
                # Nothing delivered since the assignment: it starts at the
                # committed offset, or (none yet) at the partition's start.
                at = tp.offset if tp.offset >= 0 else self._assigned_at.get(key, -1)
                positions[key] = at if at >= 0 else int(low)
        except KafkaException as exc:
            log.debug("%s: fetch check skipped: %s", self.component, exc)
            self._drop_ends_client()
            return
        stalled = self._fetch_watch.observe(positions, ends, now)
        found = None
        for key in stalled:
            if self.stopping:
                return
            if self._record_at(key, positions[key]):
                found = key
                break
            self._fetch_watch.forgive(key, now)
        if found is None:
            return
        self.fetch_stalls += 1
        topic, partition = found
        log.warning(
            "%s-%s: the consumer fetched nothing from %s[%d] (at %d, end %d) for %.0f s while "
            "records wait there; replacing the consumer",
            self.component,
            self.instance,
            self._short(topic),
            partition,
            positions[found],
            ends[found],
            self._fetch_watch.stall_s,
        )
        self._fetch_watch.reset()
        self.broker_bounced = True  # and the next batch gets a new producer
        self._rejoin()

    def _record_at(self, key: tuple[str, int], offset: int) -> bool:
        """Whether a fresh ``read_committed`` reader gets a record from ``offset`` on (one try)."""
        topic, partition = key
        try:
            reader = Consumer(consumer_config(self.settings, self.group_id))
        except (KafkaException, LedgerError) as exc:
            log.debug("%s: cannot make a reader to check a partition: %s", self.component, exc)
            return False
        try:
            reader.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                for msg in reader.consume(10, 0.5):
                    if msg.error() is None:
                        return True
            return False
        except KafkaException as exc:
            log.debug("%s: checking %s[%d]: %s", self.component, topic, partition, exc)
            return False
        finally:
            bounded_call(
                reader.close,
                self.settings.stop_timeout_s,
                f"{self.component}-{self.instance}: closing a partition check reader",
            )

    def _drop_ends_client(self) -> None:
        client, self._ends_client = self._ends_client, None
        if client is not None:
            bounded_call(
                client.close,
                self.settings.stop_timeout_s,
                f"{self.component}-{self.instance}: closing the ends client",
            )

    def _check_consumer_stuck(self, failures: int) -> None:
        """Between tries of :meth:`_await_kafka`: is it the consumer, not Kafka, that is stuck?

        After :data:`CONSUMER_STUCK_AFTER_S` of an outage, and then every
        fifth try, the producer (its own connections) asks for the first
        input's metadata. An answer means Kafka is back while the consumer
        still times out (seen for more than six minutes after a 90 s broker
        outage, ``Failed to get committed offsets: Local: Timed out``): a new
        consumer asks afresh.

        Raises:
            ConsumerStuckError: Kafka answered the producer.
        """
        waiting = self.retry.waiting
        if self.producer is None or waiting is None or failures % 5:
            return
        if time.time() - float(waiting["since"]) < CONSUMER_STUCK_AFTER_S:
            return
        try:
            self.producer.list_topics(self.settings.topic(self.inputs[0]), timeout=5)
        except KafkaException:
            return  # Kafka does not answer the producer either: an outage
        raise ConsumerStuckError(f"{self.component}: Kafka answers, its consumer does not")

    def settled(self) -> bool:
        """True once start-up work after an assignment is done (override to add some)."""
        return True

    def status_path(self) -> Path:
        """Where this instance says it is ready: ``run_dir/status/{component}-{instance}``."""
        return self.run_dir / "status" / f"{self.component}-{self.instance}.json"

    def unverifiable_held(self) -> dict[str, str]:
        """What this stage holds because evidence about it cannot be verified here.

        A record sealed by a key the stage does not hold may be authentic
        evidence (made with a key this host lost or never had): the stage
        stops deciding for what it covers instead of reading it as absent,
        and says so in its status file, ``/healthz``, ``/readyz`` (503) and
        the ``ledger_unverifiable_held`` gauge. Stages override this.

        Returns:
            key (an operation or approval ID) -> the record (``topic:partition:offset``)
            and why it cannot be verified; empty when nothing is held.
        """
        return {}

    def _report_ready(self) -> None:
        """Tell harnesses this process has its partitions and nothing left from start-up."""
        held = len(self.unverifiable_held())
        if held != self._held_written:
            self._held_written = held
            self._write_status()
        if self._ready_reported or not self._assignment_seen or not self.settled():
            return
        self._ready_reported = True
        self._write_status()

    def _write_status(self) -> None:
        """Write :meth:`status_path`: ``{"pid", "ready", "waiting", "metrics_port", ...}``.

        The rest: ``unverifiable_held`` (up to 50 keys held for evidence the
        stage cannot verify, key -> record and reason) and its full count
        ``unverifiable_held_count`` (:meth:`unverifiable_held`).

        ``ready`` says the process has its partitions and nothing left from
        start-up; ``waiting`` is ``None``, or what it waits for while Kafka
        does not answer (``{"for", "error", "since"}``, since in Unix seconds,
        see :attr:`consumers.retry.KafkaRetry.waiting`).
        """
        path = self.status_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        held = self.unverifiable_held()
        status = {
            "pid": os.getpid(),
            "ready": self._ready_reported,
            "waiting": self.retry.waiting,
            # where this process serves /metrics, /healthz, /readyz (None: not
            # serving); `ledger console` probes it on this host
            "metrics_port": self.metrics.port,
            # keys held for evidence this stage cannot verify (key -> record, reason)
            "unverifiable_held": dict(sorted(held.items())[:50]),
            "unverifiable_held_count": len(held),
        }
        tmp.write_text(json.dumps(status))
        os.replace(tmp, path)

    def idle(self) -> None:
        """Called when a poll returned nothing (periodic work may go here)."""

    def _stop(self, signum: int, frame: object) -> None:
        """SIGTERM/SIGINT: stop at the next step, and exit anyway after ``stop_timeout_s``.

        The first signal arms a watchdog (:class:`StopWatchdog`): a Kafka
        call that waits on an unreachable broker cannot keep the process
        alive past it. Leaving that way is as safe as a crash: the open
        transaction is aborted by the broker (or fenced by the next instance
        with the transactional ID), and the next owner resumes.
        """
        if not self.stopping:
            self._watchdog = StopWatchdog(
                self.settings.stop_timeout_s, f"{self.component}-{self.instance}"
            )
            self._watchdog.start()
        self.stopping = True

    def close(self) -> None:
        """Leave the group and release the producer (clean shutdown only).

        Each client's close is bounded by ``stop_timeout_s``
        (:func:`bounded_call`): a close that does not return in time is left
        behind, logged, and the process goes on exiting.
        """
        self.metrics.close()
        self.spans.end("the stage stopped before the batch committed")
        limit = self.settings.stop_timeout_s
        name = f"{self.component}-{self.instance}"
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            bounded_call(consumer.close, limit, f"{name}: consumer close")
        self._drop_ends_client()
        if self.producer is not None:
            producer, self.producer = self.producer, None
            bounded_call(lambda: producer.flush(min(10.0, limit)), limit, f"{name}: producer flush")


class StopWatchdog:
    """Ends the process when a requested stop takes longer than it may.

    A daemon timer: after ``timeout_s`` seconds it logs and calls ``exit``
    (default :func:`os._exit` with status 1, which runs no cleanup that could
    block again). :meth:`cancel` disarms it (a stop that finished in time).
    The workaround confluent-kafka-python issue #1667 ("consumer hangs on
    consumer.close()") describes, applied to the whole stop.

    Args:
        timeout_s: seconds the stop may take.
        name: the stage process, for the log line.
        exit: called with the exit status when the time is up.
    """

    def __init__(
        self, timeout_s: float, name: str, exit: Callable[[int], object] = os._exit
    ) -> None:
        self.name = name
        self._exit = exit
        self._timer = threading.Timer(timeout_s, self._expire, args=(timeout_s,))
        self._timer.daemon = True

    def start(self) -> None:
        """Arm it."""
        self._timer.start()

    def cancel(self) -> None:
        """Disarm it."""
        self._timer.cancel()

    def _expire(self, timeout_s: float) -> None:
        log.error(
            "%s: still stopping after %.0f s (a Kafka call waits on the broker); exiting now, "
            "as after a crash (LEDGER_STOP_TIMEOUT_S)",
            self.name,
            timeout_s,
        )
        logging.shutdown()
        self._exit(1)


def bounded_call(call: Callable[[], object], timeout_s: float, what: str) -> bool:
    """Run ``call`` in a daemon thread and wait at most ``timeout_s`` seconds for it.

    For client closes that can block without end on an unreachable broker
    (confluent-kafka-python issue #1667). A call still running after the
    time is left behind in its daemon thread (it cannot keep the process
    alive) and logged; an exception it raises is logged, never raised.

    Args:
        call: what to run (no arguments).
        timeout_s: seconds to wait for it.
        what: what it is, for the log lines.

    Returns:
        True when it returned (or raised) in time.
    """
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - a close that fails is only logged
            log.warning("%s failed: %s", what, exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"bounded {what}", daemon=True).start()
    if done.wait(timeout_s):
        return True
    log.error("%s did not return within %.0f s; leaving it behind", what, timeout_s)
    return False


def await_settled(
    settings: LedgerSettings,
    topic: str,
    partitions: set[int],
    timeout_s: float | None = None,
    retry: KafkaRetry | None = None,
) -> float:
    """Wait until every transaction open on partitions of a ledger topic has ended.

    The partition's high watermark is read first; the wait ends once its last
    stable offset (what a ``read_committed`` reader can reach) has reached
    that mark, i.e. every record written before the call is committed or
    aborted. A transaction left open by a producer that died or stalled
    keeps the last stable offset below until the broker aborts it (after
    the transaction timeout) or its commit markers are written; a reader
    restoring state before then would miss records about to become visible.
    Transactions begun after the call (by a live writer) do not hold it.

    Args:
        settings: ledger settings.
        topic: short topic name.
        partitions: which partitions.
        timeout_s: give up after this many seconds (default: the setting
            ``takeover_wait_s``); time spent waiting out retriable errors (a
            broker outage) does not count.
        retry: how retriable errors are ridden out (a stage passes its own;
            default: for ``takeover_wait_s`` at a time).

    Returns:
        Seconds waited.

    Raises:
        LedgerError: if a partition is still unsettled at the deadline.
    """
    if not partitions:
        return 0.0
    if timeout_s is None:
        timeout_s = settings.takeover_wait_s
    full = settings.topic(topic)
    group = f"{settings.topic_prefix}.settle"
    if retry is None:
        retry = KafkaRetry(f"{full} settle", policy_for(settings, indefinitely=False))

    def readers() -> list[Consumer]:
        return [
            Consumer(consumer_config(settings, group)),
            Consumer(consumer_config(settings, group, isolation="read_uncommitted")),
        ]

    #: [stable reader, high-watermark reader], replaced when they may be stuck.
    now_reading = readers()

    def fresh(failures: int) -> None:
        # A client that went through a broker restart may keep failing: ask afresh.
        if failures % 5 == 0:
            for reader in now_reading:
                reader.close()
            now_reading[:] = readers()

    def watermark(which: int, tp: TopicPartition) -> int:
        _, high = retry.call(
            lambda: now_reading[which].get_watermark_offsets(tp, timeout=10, cached=False),
            f"offsets of {tp.topic}[{tp.partition}]",
            between=fresh,
        )
        return int(high)

    started = time.monotonic()
    waited_before = retry.waited_s
    marks: dict[int, int] = {}
    next_note = started + 15
    fresh_at = started
    try:
        while True:
            behind: dict[int, tuple[int, int]] = {}
            unreadable: dict[int, str] = {}
            for p in sorted(partitions):
                tp = TopicPartition(full, p)
                try:
                    if p not in marks:
                        marks[p] = watermark(1, tp)
                    stable = watermark(0, tp)
                except KafkaException as exc:
                    if is_retriable(exc):  # the retry policy gave up: Kafka is not answering
                        raise retry.no_answer(full, exc) from exc
                    unreadable[p] = str(exc.args[0])
                    continue
                if stable < marks[p]:
                    behind[p] = (int(stable), marks[p])
            if not behind and not unreadable:
                return time.monotonic() - started
            now = time.monotonic()
            if now > started + timeout_s + (retry.waited_s - waited_before):
                if unreadable:
                    raise LedgerError(
                        f"{full}: cannot read the offsets of partitions {sorted(unreadable)} "
                        f"after {timeout_s:.0f} s (is the broker up?)",
                        observed=unreadable,
                    )
                raise LedgerError(
                    f"{full}: partitions {sorted(behind)} still held back by an open "
                    f"transaction after {timeout_s:.0f} s (last stable offset, mark)",
                    observed=behind,
                )
            if unreadable and now - fresh_at > 2.0:
                # A client whose first metadata came before the partitions
                # were known (or before a broker restart) can keep answering
                # "unknown partition"; fresh readers ask again.
                fresh(0)
                fresh_at = now
            if now > next_note:
                log.warning(
                    "%s: still waiting after %.0f s: held back %s, unreadable %s",
                    full,
                    now - started,
                    behind,
                    unreadable,
                )
                next_note = now + 15
            time.sleep(0.1)
    finally:
        for reader in now_reading:
            reader.close()


def _refused(topic: str, err: KafkaError) -> BrokerError:
    """The error of a read the broker refuses to this client's principal."""
    return BrokerError(
        f"reading {topic}: the broker refuses this client's principal ({err.name()}); "
        "run as a principal that may read it (LEDGER_KAFKA_CONFIG_FILE: the auditor's for "
        "`ledger audit`, an operator's for `ledger state`; see `ledger acl plan`)",
        expected="READ on " + topic,
        observed=err.name(),
    )


def read_partition(
    settings: LedgerSettings,
    topic: str,
    partitions: set[int] | None,
    handle: Callable[[Record | None, Message], None],
    timeout_s: float = 60.0,
    *,
    decode: bool = True,
    keyring: Keyring | None = None,
    on_refused: Callable[[Message, str], None] | None = None,
    retry: KafkaRetry | None = None,
    ends_out: dict[int, int] | None = None,
    tail: int | None = None,
) -> int:
    """Read partitions of a ledger topic from the beginning to their end.

    Reads ``read_committed`` up to the last stable offset as of the call, so
    an open transaction of a dead producer does not hold it forever (its
    records are not stable and are not needed). A broker outage is waited
    out (``retry``), and the time it takes does not count against
    ``timeout_s``; a read that makes no progress for
    :data:`~consumers.retry.STALL_S` seconds checks that Kafka answers and
    goes on with a fresh client where it was.

    Args:
        settings: ledger settings.
        topic: short topic name.
        partitions: which partitions (``None``: all).
        handle: called with each decoded record (``None`` when the value does
            not decode, e.g. a tombstone) and the raw message.
        timeout_s: give up when the read makes no progress for this many
            seconds (outages not counted); a long read that keeps moving,
            e.g. a restore of millions of records, is not cut off.
        decode: ``False`` passes ``None`` for every record, leaving the
            decoding (of only the values it keeps) to ``handle``.
        keyring: when given, a record whose seal is missing or wrong is not
            passed to ``handle`` (unless ``require_authenticated_records`` is
            off) but to ``on_refused`` with the reason.
        on_refused: see ``keyring``.
        retry: how retriable errors are ridden out (a stage passes its own,
            which waits indefinitely; default: for ``takeover_wait_s`` at a
            time).
        ends_out: when given, filled with partition -> the end offset read
            to (0 for an empty partition), e.g. for a report of what was read.
            A partition whose log start equals its end (records deleted up
            to its end) is read through at once, with its end offset here.
        tail: read only the last ``tail`` offsets of each partition (from
            ``end - tail``, or its log start if that is later) instead of
            from the beginning (``None``: from the beginning).

    Returns:
        The number of records read.

    Raises:
        LedgerError: if the read stops moving for ``timeout_s``, or Kafka
            does not answer for as long as ``retry`` waits.
        BrokerError: the broker refuses this client's principal the read
            (``TOPIC_AUTHORIZATION_FAILED`` ...), at once.
    """
    full = settings.topic(topic)
    if retry is None:
        retry = KafkaRetry(f"{full} reader", policy_for(settings, indefinitely=False))
    waits = retry

    def reader() -> Consumer:
        return Consumer(
            consumer_config(
                settings,
                f"{settings.topic_prefix}.reader",
                extra={"enable.partition.eof": False, "fetch.wait.max.ms": 50},
            )
        )

    #: the one client, replaced when it may be stuck
    client = [reader()]

    def renew(failures: int = 0) -> None:
        if failures % 5 == 0:
            client[0].close()
            client[0] = reader()

    def ask(call: Callable[[Consumer], T], what: str) -> T:
        try:
            return waits.call(lambda: call(client[0]), what, between=renew)
        except KafkaException as exc:
            if is_retriable(exc):  # the retry policy gave up: Kafka is not answering
                raise waits.no_answer(full, exc) from exc
            raise

    #: when the read last made progress, and the outage time waited by then
    progress = [time.monotonic(), retry.waited_s]

    def overdue() -> bool:
        since, waited_then = progress
        return time.monotonic() > since + timeout_s + (waits.waited_s - waited_then)

    def end_of(tp: TopicPartition) -> tuple[int, int]:
        low, high = ask(
            lambda c: c.get_watermark_offsets(tp, timeout=10, cached=False),
            f"end of {tp.topic}[{tp.partition}]",
        )
        return int(low), int(high)

    def settled_end_of(p: int) -> tuple[int, int]:
        """:func:`end_of` (log start, end), asked again with a fresh client while it is
        not overdue."""
        while True:
            try:
                return end_of(TopicPartition(full, p))
            except KafkaException as exc:
                if exc.args and exc.args[0].code() in REFUSAL_CODES:
                    raise _refused(full, exc.args[0]) from exc
                # A client that asked before the partition was known (or just
                # after a broker restart) may keep answering "unknown
                # partition": a fresh one asks again.
                if overdue():
                    raise LedgerError(f"cannot read the end of {full}[{p}]: {exc.args[0]}") from exc
                time.sleep(0.2)
                renew()

    try:
        if partitions is None:
            meta = ask(lambda c: c.list_topics(full, timeout=30), f"metadata of {full}")
            partitions = set(meta.topics[full].partitions)
        ends: dict[int, int] = {}
        for p in partitions:
            low, high = settled_end_of(p)
            if ends_out is not None:
                ends_out[p] = high
            # A partition whose log start is its end holds nothing to read (it is
            # empty, or DeleteRecords emptied it): read through, whatever its end.
            if high > max(low, 0):
                ends[p] = high
        if not ends:
            return 0
        client[0].assign(
            [
                TopicPartition(full, p, OFFSET_BEGINNING if tail is None else max(0, e - tail))
                for p, e in ends.items()
            ]
        )
        done: set[int] = set()
        count = 0
        #: partition -> next offset to read (known once the client delivered from it).
        at: dict[int, int] = {}
        last: dict[int, int] = {}
        moved_at = time.monotonic()
        while len(done) < len(ends):
            if overdue():
                raise LedgerError(
                    f"reading {full} made no progress for {timeout_s} s"
                    f" (at {dict(sorted(at.items()))}, ends {dict(sorted(ends.items()))})",
                    expected=ends,
                )
            for msg in client[0].consume(1000, 0.02):
                err = msg.error()
                if err is not None:
                    if err.code() in REFUSAL_CODES:
                        raise _refused(full, err)
                    continue
                p = msg.partition() or 0
                if p in done:
                    continue
                if keyring is not None and is_reserved_key(msg.key()):
                    # Never sealed and never meaningful (ledger.topics.COMPACTION_KEY):
                    # skipped before the seal check, as TableFollower does.
                    continue
                rec = decode_record(topic, msg) if decode else None
                if keyring is not None:
                    problem = keyring.check(
                        topic,
                        msg.key() or b"",
                        msg.value(),
                        msg.headers(),
                        rec.event if rec else None,
                        msg.partition(),
                        msg.timestamp(),
                    )
                    if problem is not None and keyring.refuses(
                        problem, settings.require_authenticated_records
                    ):
                        if on_refused is not None:
                            on_refused(msg, problem)
                        continue
                handle(rec, msg)
                count += 1
            pending = [TopicPartition(full, p) for p in ends if p not in done]
            at.update(
                (tp.partition, tp.offset) for tp in client[0].position(pending) if tp.offset >= 0
            )
            done |= {p for p, offset in at.items() if offset >= ends[p]}
            now = time.monotonic()
            if at != last:
                last, moved_at = dict(at), now
                progress[:] = [now, waits.waited_s]
            elif now - moved_at > STALL_S and len(done) < len(ends):
                # No progress: wait for Kafka if it is away (not counted), then
                # read on from where this client was with a fresh one.
                rest = sorted(p for p in ends if p not in done)
                # (just after a broker restart the answer can be "unknown
                # partition" for a while: asked again, as at the start)
                settled_end_of(rest[0])
                client[0].close()
                client[0] = reader()
                client[0].assign(
                    [TopicPartition(full, p, at.get(p, OFFSET_BEGINNING)) for p in rest]
                )
                moved_at = time.monotonic()
        return count
    finally:
        client[0].close()
