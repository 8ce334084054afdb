"""The consume-transform-produce loop every ledger stage runs on.

One transactional producer per process (KIP-447 style, stable
``transactional.id`` per instance so a restart fences its zombie), a
``read_committed`` consumer in a ``range``-assigned group (co-partitioned
inputs land on one member), and for every batch (what has arrived, taken as
soon as something has: a stage commits when its input is drained, and waits
at most the commit interval,
:meth:`~consumers.runtime.loop.StageLoop.next_batch`):

1. ``begin_transaction()``;
2. decode each record (bad bytes become a dead-letter operating event);
3. let the stage decide and produce its outputs;
4. ``send_offsets_to_transaction()`` with the consumer's positions and group
   metadata, so progress commits with the outputs or not at all;
5. ``commit_transaction()``.

The loop is :class:`~consumers.runtime.loop.StageLoop`; its machinery lives
in :mod:`consumers.runtime`, in objects the stage owns:
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
from collections.abc import Callable

from confluent_kafka import (
    Consumer,
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
from consumers.runtime.loop import StageLoop
from consumers.runtime.reader import await_settled, read_partition
from consumers.runtime.records import Record, decode_record, kafka_timestamp_ms, key_text
from consumers.runtime.status import StatusFile, status_path
from consumers.runtime.txn import (
    ABORTS_BEFORE_NEW_PRODUCER,
    COMMIT_BUDGET_S,
    FENCED_MARKER,
    Offsets,
    Transactions,
)
from consumers.runtime.watches import (
    CONSUMER_STUCK_AFTER_S,
    FETCH_CHECK_BUDGET_S,
    FETCH_CHECK_EVERY_S,
    FETCH_STALL_S,
    FetchCheck,
    StopWatchdog,
    StuckWatch,
)
from consumers.runtime.writer import Writer
from ledger.authn import Keyring, unverifiable
from ledger.credentials import load_keyring, stage_sealer
from ledger.events import OperatingEvent
from ledger.settings import LedgerSettings
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
        self.processed = 0
        self.dead_letters = 0
        #: records refused because their seal was missing or wrong.
        self.forgeries_refused = 0
        #: keys that check the seals of input records (re-read on unknown keys).
        self.keyring: Keyring = load_keyring(settings)
        #: topic -> key that seals this stage's records on it.
        self.sealer = stage_sealer(settings, self.component)
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
            on_change=lambda _: self.status.write(),
        )
        #: Prometheus metrics and health of this stage (served when LEDGER_METRICS_PORT is set).
        self.metrics = StageMetrics(
            self.component,
            instance,
            stall_s=settings.health_stall_s,
            ready=lambda: self.status.ready and self.consumer is not None,
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
        #: partitions stalled with records waiting (see
        #: :meth:`~consumers.runtime.loop.StageLoop.check_fetching`).
        self.fetch = fetch or FetchCheck(self.kafka)
        self.assignment.on_positions = self.fetch.watch.reset
        #: ``run_dir/status/{component}-{instance}.json``: ready, waiting, held.
        self.status = StatusFile(
            status_path(self.run_dir, self.component, instance),
            lambda: self.retry.waiting,
            lambda: self.metrics.port,
            self.unverifiable_held,
        )
        #: runs the consume-transform-produce loop and handles the stop signals.
        self.loop = StageLoop(self)
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
        self.status.ready = False  # start-up work may follow a new assignment

    # ------------------------------------------------------------------ inputs

    def _decode(self, msg: Message) -> Record | tuple[str, OperatingEvent] | None:
        """Decode one message: a record, a dead letter ``(key, event)``, or ``None`` to skip."""
        item = decode_input(
            msg,
            self.assignment.short(msg.topic() or ""),
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

    def _prove_membership(self, offsets: list[TopicPartition] | None = None) -> None:
        """Put the batch's start offsets (or ``offsets``) into the open transaction.

        A zombie's commit then fails (see :meth:`Transactions.prove_membership`);
        the starts are :attr:`batch_starts`, so a commit moves no position
        past a record not yet handled.
        """
        chosen = self.batch_starts if offsets is None else offsets
        if chosen:
            self._send_offsets(chosen)  # the relay holds them back at parked dispatches

    # ------------------------------------------------------------------ the loop, status and stop

    def run(self, stop_after_s: float | None = None) -> None:
        """Run the loop until SIGTERM/SIGINT or ``stop_after_s`` seconds (:meth:`StageLoop.run`)."""
        self.loop.run(stop_after_s)

    def settled(self) -> bool:
        """True once start-up work after an assignment is done (override to add some)."""
        return True

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

    def idle(self) -> None:
        """Called when a poll returned nothing (periodic work may go here)."""

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
