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

The machinery lives in :mod:`consumers.runtime`, in objects the loop owns:
the clients (:class:`~consumers.runtime.clients.Clients`), the transaction
(:class:`~consumers.runtime.txn.Transactions`: begin, offsets, commit, abort,
recover), the assignment (:class:`~consumers.runtime.assignment.Assignment`:
restore, committed offsets, rewind, rejoin), the watches
(:mod:`consumers.runtime.watches`, each returning a verdict the loop acts
on) and the one reader (:mod:`consumers.runtime.reader`). Errors follow
librdkafka's classification, made once in :mod:`consumers.retry`: retriable
-> retried with bounded, jittered backoff (a broker outage is waited out,
however long, with one WARNING, a recovery line and ``waiting`` in the
stage's status file); ``txn_requires_abort`` -> abort, rewind, rebuild;
anything else (fatal), and a commit still failing after its retry budget ->
new producer, rewind, restore.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from consumers.hooks import NO_FAULTS, FaultHooks
from consumers.metrics import StageMetrics
from consumers.retry import KafkaRetry, policy_for
from consumers.runtime.assignment import COMMITTED_TRY_S, Assignment
from consumers.runtime.clients import ClientReports, Clients, bounded_call
from consumers.runtime.inputs import (
    Refusal,
    dead_letter,
    decode_input,
    oversized,
    record_event,
    refusal_verdict,
    seal_refusal_kind,
    seal_refused,
    table_refusal_event,
)
from consumers.runtime.reader import await_settled, read_partition
from consumers.runtime.records import Record, decode_record, kafka_timestamp_ms, key_text
from consumers.runtime.status import write_status
from consumers.runtime.txn import (
    ABORTS_BEFORE_NEW_PRODUCER,
    COMMIT_BUDGET_S,
    FENCED_MARKER,
    Offsets,
    Recovery,
    Transactions,
)
from consumers.runtime.watches import (
    CONSUMER_STUCK_AFTER_S,
    FETCH_CHECK_BUDGET_S,
    FETCH_CHECK_EVERY_S,
    FETCH_STALL_S,
    FetchCheck,
    KafkaVerdict,
    StopWatchdog,
    StuckWatch,
    await_kafka,
)
from consumers.runtime.writer import Writer
from consumers.twins import Presence, announce, withdraw
from ledger.authn import Keyring, unverifiable
from ledger.clock import check_stage_clock
from ledger.credentials import load_keyring, stage_sealer
from ledger.errors import LedgerError
from ledger.events import OperatingEvent
from ledger.kafka import classify
from ledger.logs import bind_here
from ledger.settings import LedgerSettings
from ledger.topics import check_topics
from ledger.tracing import RecordSpans

log = logging.getLogger(__name__)

#: Names other modules import from here (they moved to :mod:`consumers.runtime`).
__all__ = [
    "ABORTS_BEFORE_NEW_PRODUCER",
    "COMMITTED_TRY_S",
    "COMMIT_BUDGET_S",
    "CONSUMER_STUCK_AFTER_S",
    "FENCED_MARKER",
    "FETCH_CHECK_BUDGET_S",
    "FETCH_CHECK_EVERY_S",
    "FETCH_STALL_S",
    "Record",
    "Stage",
    "StopWatchdog",
    "Writer",
    "await_settled",
    "bounded_call",
    "dead_letter",
    "decode_record",
    "kafka_timestamp_ms",
    "key_text",
    "oversized",
    "read_partition",
    "record_event",
    "refusal_verdict",
    "seal_refusal_kind",
]


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
        hooks: fault hooks called at each named seam (a testbed passes its own).
        clients: makes the Kafka clients (default: the real ones; a test
            passes a :class:`~consumers.runtime.clients.Clients` whose
            constructors make misbehaving doubles).
        fetch: the fetch-stall watch (default: :data:`FETCH_STALL_S`).
        stuck_after_s: seconds of an outage before the stuck-consumer watch
            asks whether Kafka answers the producer.
    """

    component = "stage"
    inputs: tuple[str, ...] = ()
    batch_size = 500
    #: this process's file in the run folder, touched as the loop goes round
    _presence: Presence | None = None

    def __init__(
        self,
        settings: LedgerSettings,
        instance: str = "0",
        hooks: FaultHooks = NO_FAULTS,
        *,
        clients: Clients | None = None,
        fetch: FetchCheck | None = None,
        stuck_after_s: float = CONSUMER_STUCK_AFTER_S,
    ) -> None:
        self.settings = settings
        self.instance = instance
        #: fault hooks called at each named seam (do nothing unless a testbed passes its own).
        self.hooks = hooks
        self.run_dir = settings.run_dir
        #: makes and replaces this instance's Kafka clients.
        self.kafka = clients or Clients(settings, self.component, instance)
        self.group_id = self.kafka.group_id
        self.stopping = False
        #: Armed by the first stop signal (see :meth:`_stop`); disarmed when the run ends.
        self._watchdog: StopWatchdog | None = None
        self.processed = 0
        self.dead_letters = 0
        #: records refused because their seal was missing or wrong.
        self.forgeries_refused = 0
        #: keys that check the seals of input records (re-read on unknown keys).
        self.keyring: Keyring = load_keyring(settings)
        #: topic -> key that seals this stage's records on it.
        self.sealer = stage_sealer(settings, self.component)
        self._ready_reported = False
        #: Where the batch being processed starts in each of its partitions
        #: (everything before is handled): offsets a transaction opened
        #: before the batch's own may commit to prove this member still
        #: belongs to its group (see :meth:`_prove_membership`).
        self.batch_starts: list[TopicPartition] = []
        #: the clients' error callbacks (a retriable error makes the loop check Kafka).
        self.reports = ClientReports(f"{self.component}-{instance}", self._bounced)
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
        #: the transactional producer and its transactions.
        self.txn = Transactions(
            self.kafka,
            lambda: self.retry,
            lambda: self._member().consumer_group_metadata(),
            self.metrics,
            self.reports.producer_error,
        )
        topic = settings.topic(self.inputs[0]) if self.inputs else ""
        #: is it the consumer, not Kafka, that is stuck? (asked between retries)
        self.stuck = StuckWatch(
            self.component, topic, lambda: self.retry, lambda: self.txn.producer, stuck_after_s
        )
        #: the group member and its partitions: restore, rewind, rejoin.
        self.assignment = Assignment(
            settings,
            self.kafka,
            self.inputs,
            self,
            lambda: self.retry,
            self.stuck,
            self.reports.consumer_error,
            self.metrics.consumer_settings,
            self._bounced,
            self.metrics,
            self._new_assignment,
        )
        #: partitions stalled with records waiting (see :meth:`_check_fetching`).
        self.fetch = fetch or FetchCheck(self.kafka)
        self.assignment.on_positions = self.fetch.watch.reset
        #: how many keys :meth:`unverifiable_held` named at the last status write.
        self._held_written = 0
        self.metrics.describe_stage(self.group_id, self.transactional_id)

    # ------------------------------------------------------------------ the runtime's parts

    @property
    def producer(self) -> Producer | None:
        """The transactional producer (``self.txn``'s)."""
        return self.txn.producer

    @producer.setter
    def producer(self, producer: Producer | None) -> None:
        self.txn.producer = producer

    @property
    def consumer(self) -> Consumer | None:
        """The group member (``self.assignment``'s)."""
        return self.assignment.consumer

    @consumer.setter
    def consumer(self, consumer: Consumer | None) -> None:
        self.assignment.consumer = consumer

    @property
    def assigned(self) -> set[tuple[str, int]]:
        """The ``(short topic, partition)`` pairs held now."""
        return self.assignment.assigned

    @assigned.setter
    def assigned(self, assigned: set[tuple[str, int]]) -> None:
        self.assignment.assigned = assigned

    @property
    def broker_bounced(self) -> bool:
        """The next batch gets a new producer (the broker was away)."""
        return self.txn.broker_bounced

    @property
    def transactional_id(self) -> str:
        """``{prefix}.{component}.{instance}`` (the clients')."""
        return self.kafka.transactional_id

    @transactional_id.setter
    def transactional_id(self, transactional_id: str) -> None:
        self.kafka.transactional_id = transactional_id

    @property
    def fetch_stalls(self) -> int:
        """Consumers replaced because they stopped fetching (since start)."""
        return self.fetch.stalls

    def _member(self) -> Consumer:
        assert self.consumer is not None
        return self.consumer

    def _bounced(self) -> None:
        self.txn.broker_bounced = True

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

    def _new_assignment(self) -> None:
        self._ready_reported = False  # start-up work may follow a new assignment

    # ------------------------------------------------------------------ inputs

    def _short(self, topic: str) -> str:
        return self.assignment.short(topic)

    def _decode(self, msg: Message) -> Record | tuple[str, OperatingEvent] | None:
        """Decode one message: a record, a dead letter ``(key, event)``, or ``None`` to skip."""
        item = decode_input(
            msg,
            self._short(msg.topic() or ""),
            component=self.component,
            settings=self.settings,
            keyring=self.keyring,
            unauthenticated=self.unauthenticated,
        )
        if not isinstance(item, Refusal):
            return item
        self.forgeries_refused += item.forgery
        self.dead_letters += item.bad
        return item.key, item.event

    def unauthenticated(self, msg: Message, topic: str, problem: str) -> bool:
        """Count and log a record whose seal is missing or wrong (:func:`seal_refused`).

        Returns:
            True when it is refused (``require_authenticated_records``, the
            default); False when the setting is off and it is only reported.
        """
        if not seal_refused(self.settings, self.component, msg, topic, problem):
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
        """A record one of this stage's tables refused: ``(key, OperatingEvent)`` to write.

        See :func:`~consumers.runtime.inputs.table_refusal_event`; an
        ``UNAUTHENTICATED`` one is counted in :attr:`forgeries_refused` (an
        ``UNVERIFIABLE`` one is not: it may be authentic).
        """
        self.forgeries_refused += kind == "UNAUTHENTICATED"
        return table_refusal_event(
            self.settings, self.component, msg, reason, kind, keyed_by_operation=keyed_by_operation
        )

    def writer(self) -> Writer:
        """A writer into the open transaction that seals with this stage's keys."""
        assert self.producer is not None
        return Writer(self.producer, self.settings, self.sealer, observe=self.metrics.written)

    # ------------------------------------------------------------------ transactions

    def transaction(
        self, offsets: Offsets = None, before_commit: Callable[[], None] | None = None
    ) -> contextlib.AbstractContextManager[Writer]:
        """``with self.transaction(offsets) as out:`` begin, write, send offsets, commit.

        See :mod:`consumers.runtime.txn`: the block's writer seals with this
        stage's keys; leaving the block sends ``offsets`` (a list, a callable
        asked then, or ``None``) and commits within :data:`COMMIT_BUDGET_S`;
        an exception leaves the transaction for the loop's recovery.
        """
        return self.txn.transaction(self.writer, offsets, before_commit, self._send_offsets)

    def _send_offsets(
        self, offsets: list[TopicPartition], timeout_s: float = 30.0, grace_s: float = 5.0
    ) -> None:
        """Send ``offsets`` into the open transaction (:meth:`Transactions.send_offsets`)."""
        self.txn.send_offsets(offsets, timeout_s, grace_s)

    def _commit(self, budget_s: float = COMMIT_BUDGET_S) -> None:
        """Commit the open transaction (:meth:`Transactions.commit`)."""
        self.txn.commit(budget_s)

    def _prove_membership(self, offsets: list[TopicPartition] | None = None) -> None:
        """Put the batch's start offsets (or ``offsets``) into the open transaction.

        A zombie's commit then fails (see :meth:`Transactions.prove_membership`);
        the starts are :attr:`batch_starts`, so a commit moves no position
        past a record not yet handled.
        """
        chosen = self.batch_starts if offsets is None else offsets
        if chosen:
            self._send_offsets(chosen)  # the relay holds them back at parked dispatches

    def _new_producer(self) -> Producer:
        """A new producer (``init_transactions`` fences the previous one)."""
        return self.txn.new_producer()

    def _new_consumer(self) -> Consumer:
        """A new member of the group, not subscribed yet (:meth:`_subscribe` joins it)."""
        return self.assignment.new_member()

    def _subscribe(self) -> None:
        """Subscribe the consumer to the inputs (:meth:`Assignment.subscribe`)."""
        self.assignment.subscribe()

    def _process(self, msgs: list[Message]) -> None:
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
        self.txn.renew_if_bounced()  # serves error callbacks before deciding on the producer
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
        consumer = self._member()

        def positions() -> list[TopicPartition]:
            return [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]

        with self.transaction(positions, lambda: self.before_commit(records)) as out:
            for key, event in dead:
                out.write("operating-events", key, event)
            self.handle(records, out)
        self.retry.recovered()
        self.txn.committed()
        self.processed += len(msgs)
        self.metrics.consumed(len(msgs))
        self.after_commit()
        self.spans.end()

    def _commit_skipped(self) -> None:
        """Commit positions that moved without delivering records (:meth:`Assignment.skipped`)."""
        positions = self.assignment.skipped(time.monotonic())
        if positions:
            with self.transaction(positions):
                pass
            self.assignment.skipped_committed(positions)

    def _recover(self, exc: KafkaException) -> None:
        """Recover from a failed transaction or Kafka call (see the module docstring).

        The transaction ends (:meth:`Transactions.recover`: aborted, or a new
        producer); the stage then drops what was pending (after a certain
        abort) or restores its state from what was committed (a new
        producer: the old one's last transaction may have committed after
        all), and rewinds its consumer to the committed offsets.
        """
        self.spans.end(f"transaction failed: {exc.args[0]}")
        if self.txn.recover(exc.args[0]) is Recovery.RESTORE:
            self.rebuild()
            self.assignment.restore_all()
        else:
            self.rebuild()
        self._rewind()

    def _rewind(self) -> None:
        """Seek the assigned partitions back to their committed offsets (Assignment.rewind)."""
        self.assignment.rewind()

    def _rejoin(self) -> None:
        """Replace the consumer: drop state, join again (:meth:`Assignment.rejoin`)."""
        self.assignment.rejoin()

    # ------------------------------------------------------------------ the loop

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
            self.txn.new_producer()
            self.assignment.join()
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
            if self.assignment.consumer_stuck:
                self.assignment.consumer_stuck = False
                log.warning(
                    "%s: replacing the consumer that could not read offsets", self.component
                )
                self._rejoin()
            msgs = self._next_batch()
            if self.assignment.consumer_stuck:
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
                    self.reports.suspect_kafka("consume", err)
                else:
                    log.warning("%s: consumer error: %s", self.component, err)
            if self.reports.suspect or self.retry.down:
                self.reports.suspect = False
                self._await_kafka()
            if not real:
                try:
                    assert self.producer is not None
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
        """The next batch, up to :attr:`batch_size` (:meth:`Assignment.next_batch`)."""
        return self.assignment.next_batch(self.batch_size, self.settings.commit_interval_ms / 1000)

    def _await_kafka(self) -> None:
        """A client reported Kafka unreachable: wait until it answers, act on the verdict.

        See :func:`consumers.runtime.watches.await_kafka`: Kafka away at
        first -> the next batch gets a new producer; Kafka answering the
        producer while the consumer's calls keep timing out -> both replaced.
        """
        verdict = await_kafka(
            self._member(), self.retry, self.settings.topic(self.inputs[0]), self.stuck
        )
        if verdict is KafkaVerdict.CONSUMER_STUCK:
            log.warning(
                "%s: Kafka answers, but the consumer's calls keep timing out; "
                "replacing the consumer and the producer",
                self.component,
            )
            self._bounced()
            self._rejoin()
        elif verdict is KafkaVerdict.BOUNCED:
            self._bounced()

    def _check_fetching(self) -> None:
        """Replace a consumer that stopped fetching a partition with records waiting.

        When idle, at most every :data:`FETCH_CHECK_EVERY_S` seconds (see
        :class:`~consumers.runtime.watches.FetchCheck`); the new member
        restores and starts from the committed offsets, so nothing is skipped.
        """
        if self.consumer is None:
            return
        stall = self.fetch.check(
            self.consumer, self.retry, self.assignment.assigned_at, lambda: self.stopping
        )
        if stall is None:
            return
        log.warning("%s-%s: %s; replacing the consumer", self.component, self.instance, stall)
        self._bounced()  # and the next batch gets a new producer
        self._rejoin()

    # ------------------------------------------------------------------ status and stop

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
        if self._ready_reported or not self.assignment.seen or not self.settled():
            return
        self._ready_reported = True
        self._write_status()

    def _write_status(self) -> None:
        """Write :meth:`status_path` (:func:`~consumers.runtime.status.write_status`)."""
        write_status(
            self.status_path(),
            ready=self._ready_reported,
            waiting=self.retry.waiting,
            metrics_port=self.metrics.port,
            held=self.unverifiable_held(),
        )

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
        self.assignment.leave()
        self.fetch.drop_ends_client()
        self.txn.flush_and_forget()
