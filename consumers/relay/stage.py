"""The relay stage: dispatches in, receipts and readbacks out, in transactions.

The stage wires the relay's rooms (see :mod:`consumers.relay`) to the
exactly-once loop of :class:`~consumers.stage.Stage`: it marks executions
attempted, hands each sink's dispatches to a lane of their own
(:func:`~consumers.sinkpool.run_per_sink`), retries parked dispatches, and
opens every transaction of its own in one place (:meth:`Relay._transaction`).
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import Message, TopicPartition

from consumers.hooks import NO_FAULTS, FaultHooks
from consumers.localfiles import LastGoodClock
from consumers.relay.admission import AdmissionTables
from consumers.relay.attempts import AttemptBook
from consumers.relay.dispatch import Dispatcher, RelayMode
from consumers.relay.handover import Handover
from consumers.relay.notes import Notes
from consumers.relay.parking import Parking
from consumers.relay.postcondition import Postconditions
from consumers.relay.records import Output, Recorder
from consumers.relay.retries import RetryRound
from consumers.relay.sinks import SinkDesk, SinkOpener
from consumers.relay.upgrade import UpgradeGate
from consumers.sinkpool import run_per_sink
from consumers.stage import Record, Stage, Writer, record_event
from consumers.tables import IDLE_SETTLE_S, TableFollower
from ledger.clock import clock_for
from ledger.contracts import RetryBudget
from ledger.events import Dispatch
from ledger.logs import bound_each
from ledger.settings import LedgerSettings
from ledger.topology import Topic

log = logging.getLogger("consumers.relay")


class Relay(Stage):
    """Consume-transform-produce stage delivering dispatches to sinks.

    Args:
        settings: ledger settings.
        instance: instance name (see :class:`~consumers.stage.Stage`).
        hooks: fault hooks called at each named seam.
        open_client: opens a sink's adapter (default: the one its registry
            entry names); tests pass a misbehaving one.
        withdrawn: ``dispatch -> why its admission no longer stands``
            (default: the approvals and policy tables, :class:`AdmissionTables`).

    Attributes:
        mode: ``ledger`` or ``checkpoint-only``.
        book: what the receipts say was attempted and completed.
        sinks: the sink registry and the sinks' adapters.
        dispatcher: performs one dispatch.
        parking: dispatches waiting for an unreached sink.
        admission: the approvals and policy tables.
        notes: operating events waiting to be written.

    Raises:
        ValueError: an unknown ``relay_mode``.
    """

    component = "relay"
    inputs = (Topic.DISPATCHES,)
    batch_size = 50

    def __init__(
        self,
        settings: LedgerSettings,
        instance: str = "0",
        hooks: FaultHooks = NO_FAULTS,
        *,
        open_client: SinkOpener | None = None,
        withdrawn: Callable[[Dispatch], str | None] | None = None,
    ) -> None:
        super().__init__(settings, instance, hooks)
        if settings.relay_mode not in ("ledger", "checkpoint-only"):
            raise ValueError(
                f"unknown relay mode {settings.relay_mode!r}: use ledger or checkpoint-only"
            )
        self.mode: RelayMode = settings.relay_mode
        #: Held for what the sink lanes share (:func:`~consumers.sinkpool.run_per_sink`):
        #: the producer's transactions, the tables, the registry, the clock.
        self._shared = threading.RLock()
        self.notes = Notes(instance, settings.clock)
        self.clock = LastGoodClock(
            self.hooks.clock(clock_for(settings.clock, settings.run_dir)),
            component="relay",
            on_problem=self.notes.local_file_problem,
            kind=settings.clock,
            max_skew_s=settings.clock_max_skew_s,
            on_refused=self.notes.clock_refused,
            on_each_refusal=lambda: self.metrics.clock_refused(settings.clock),
        )
        self.sinks = SinkDesk(settings, self._shared, self.notes.local_file_problem, open_client)
        self.book = AttemptBook()
        self.observer = f"relay-{instance}"
        recorder = Recorder(self.observer, self.sinks.version_of)
        self.recorder = recorder
        self.admission = AdmissionTables(settings, self.keyring, self.retry, self._shared)
        self.dispatcher = Dispatcher(
            self.mode,
            self.sinks,
            self.book,
            recorder,
            UpgradeGate(settings.release_manifest_file, self._shared, self.book, recorder),
            Postconditions(
                recorder, self.hooks.seam, self._now_ms, inline=settings.relay_inline_verify
            ),
            withdrawn if withdrawn is not None else self.admission.withdrawn,
            self.hooks.seam,
            self._now_ms,
        )
        budget = RetryBudget(
            attempts=settings.sink_retry_attempts,
            first_backoff_ms=int(settings.sink_retry_backoff_s * 1000),
            max_backoff_ms=int(settings.sink_retry_max_backoff_s * 1000),
        )
        self.parking = Parking(
            budget,
            self.dispatcher.perform_safely,
            self.book,
            recorder,
            self.metrics,
            self.sinks.registry.path,
            self._now_ms,
        )
        self.retries = RetryRound(
            self.parking,
            self.sinks,
            self.book,
            transaction=self._transaction,
            commit_outputs=self._commit_outputs,
            settle=lambda operation_id: self.receipts_table.settle(operation_id),
            positions=self._positions,
            batch_started=lambda: bool(self.batch_starts),
            spans=lambda: self.spans,
            active=lambda: self.producer is not None,
        )
        self.results: dict[tuple[int, int], list[Output]] = {}
        self.handover = Handover(settings.topic(Topic.DISPATCHES))
        # Lazy: an assignment files the partitions' receipts by operation,
        # and an operation's are checked and applied when one of its
        # dispatches is met (or while idle), so a restart over a long history
        # costs the filing, not a decode and a seal check per receipt.
        self.receipts_table = TableFollower(
            settings,
            Topic.RECEIPTS,
            self.book.apply,
            on_bad=self._bad_table_value,
            keyring=self.keyring,
            retry=self.retry,
            lazy=True,
        )

    # ------------------------------------------------------------------ the loop's hooks

    def on_assign(self, partitions: set[int]) -> None:
        """Learn which dispatches of these partitions were already attempted."""
        self.book.clear()
        filed = self.receipts_table.follow(partitions)
        log.info("relay: %d receipts filed (applied when their operation is met)", filed)
        self.handover.assigned(partitions, self.consumer)

    def on_revoke(self, partitions: set[int]) -> None:
        """Forget parked dispatches of revoked partitions (their new owner meets them)."""
        self.parking.forget(partitions)
        self.handover.revoked(partitions)

    def rebuild(self) -> None:
        """Drop results of the aborted transaction (they will be recomputed).

        Parked dispatches stay parked: met again after the rewind, they keep
        waiting for their next try.
        """
        self.results.clear()

    def after_commit(self) -> None:
        """Results are durable."""
        self.results.clear()

    def on_start(self) -> None:
        """Read the sink registry and the clock, waiting while one is corrupted."""
        for wait in (self.sinks.last_good.wait, self.clock.file.wait):
            wait(lambda: self.stopping)
            if self.stopping:
                return

    def _now_ms(self) -> int:
        """The relay's clock (ms), read by one sink lane at a time."""
        with self._shared:
            return self.clock.now_ms()

    def _bad_table_value(self, msg: Message, reason: str, kind: str) -> None:
        """A receipt the relay's table refuses becomes an operating event.

        The table treats it as absent: a forged receipt completes nothing,
        a forged tombstone forgets no attempt (see
        :meth:`consumers.stage.Stage.table_refusal`).
        """
        self.notes.add(*self.table_refusal(msg, reason, kind, keyed_by_operation=True))

    # ------------------------------------------------------------------ work

    def before_transaction(self, records: list[Record]) -> None:
        """Commit ATTEMPTED markers, then perform every dispatch of the batch."""
        assert self.producer is not None
        self.retries.run(commit_offsets=False)  # starts a new pass (down_now)
        for rec in records:
            self.clock.observe(rec.timestamp_ms)
        now = self.clock.now_ms()
        # What the receipts say about these operations, before anything is decided.
        for rec in records:
            if isinstance(rec.event, Dispatch):
                self.receipts_table.settle(rec.event.operation_id)
        fresh: list[Dispatch] = []
        for rec in self.spans.each(records):
            d = rec.event
            if (
                isinstance(d, Dispatch)
                and d.kind == "EXECUTE"
                and self.mode == "ledger"
                and d.dispatch_id not in self.book.attempts
                and d.dispatch_id not in self.parking.parked
            ):
                fresh.append(d)
        # Dispatches to a sink that can be read back are marked together; one
        # that cannot is marked just before its own send and its receipt
        # committed just after, so that a crash leaves ambiguous only the one
        # request that may have left without its receipt.
        one_by_one = {d.dispatch_id for d in fresh if self.sinks.marks_alone(d.sink)}
        self._mark_attempted([d for d in fresh if d.dispatch_id not in one_by_one], now)
        fresh_ids = {d.dispatch_id for d in fresh}
        # Each sink's dispatches in order, the sinks' at once (consumers.sinkpool);
        # a job runs in its record's context (its span and log fields).
        jobs: list[tuple[str, Callable[[], object]]] = []
        for rec in bound_each(self.spans.each(records), lambda r: r.key):
            d = rec.event
            if not isinstance(d, Dispatch):
                continue
            d = self.handover.resumed(d, rec.partition, rec.offset)
            at = (rec.partition, rec.offset)
            parked = self.parking.parked.get(d.dispatch_id)
            if parked is not None:
                # Met again after a rewind: it keeps waiting for its next try.
                parked.partition, parked.offset = rec.partition, rec.offset
                self.results[at] = []
            elif (
                self.mode == "ledger"
                and d.kind == "EXECUTE"
                and d.dispatch_id in self.book.completed
            ):
                self.results[at] = []  # its receipt is in the ledger already
            else:
                job = self._alone_job if d.dispatch_id in one_by_one else self._batch_job
                ctx = contextvars.copy_context()
                fresh_send = d.dispatch_id in fresh_ids
                jobs.append((d.sink, partial(ctx.run, job, d, at, now, fresh_send)))
        run_per_sink(jobs)

    def _batch_job(self, d: Dispatch, at: tuple[int, int], now: int, fresh: bool) -> None:
        """Perform ``d``; its outputs are written with the batch (see :meth:`handle`)."""
        self.results[at] = self.parking.attempt(d, at[0], at[1], fresh=fresh)

    def _alone_job(self, d: Dispatch, at: tuple[int, int], now: int, fresh: bool) -> None:
        """Mark ``d`` attempted, perform it and commit its receipt at once.

        For a sink without readback: a crash leaves ambiguous only the one request
        of its lane in flight.
        """
        self._mark_attempted([d], now)
        outputs = self.parking.attempt(d, at[0], at[1], fresh=True)
        if d.dispatch_id not in self.parking.parked:
            self._commit_outputs(outputs)
            self.book.completed.add(d.dispatch_id)
        self.results[at] = []

    def idle(self) -> None:
        """Try parked dispatches whose backoff has passed (:meth:`RetryRound.run`).

        Then apply some filed receipts and approvals (:data:`IDLE_SETTLE_S`),
        so that what a restart filed is soon held as compactly as before.
        """
        self.retries.run(commit_offsets=True)
        for table in (self.receipts_table, self.admission.approvals_table):
            if table.held:
                table.settle_some(IDLE_SETTLE_S)
        if self.notes.pending and self.producer is not None:
            # Operating events only: no offsets, no authority in them.
            self._transaction(self.notes.write)

    def handle(self, records: list[Record], out: Writer) -> None:
        """Write the receipts and readbacks gathered by :meth:`before_transaction`."""
        self.notes.write(out)
        for rec in self.spans.each(records):
            if not isinstance(rec.event, Dispatch):
                out.write(
                    Topic.OPERATING_EVENTS,
                    rec.key,
                    record_event(
                        "relay",
                        rec,
                        "BAD_INPUT",
                        f"{rec.event.KIND} is not a dispatch",
                        operation_id=rec.key,
                    ),
                )
                continue
            for topic, key, event in self.results.get((rec.partition, rec.offset), []):
                out.write(topic, key, event)

    def before_commit(self, records: list[Record]) -> None:
        """Seam: the receipt is written but its transaction not committed."""
        for rec in records:
            if isinstance(rec.event, Dispatch) and rec.event.kind == "EXECUTE":
                self.hooks.seam("after_receipt_before_commit", rec.event.operation_id)

    def _positions(self) -> list[TopicPartition] | None:
        """The consumer's positions (``None``: no consumer; only assigned partitions)."""
        if self.consumer is None:
            return None
        positions = self.consumer.position(self.consumer.assignment())
        return [tp for tp in positions if tp.offset >= 0]

    # ------------------------------------------------------------------ transactions

    def _transaction(
        self,
        write: Callable[[Writer], None] | None = None,
        *,
        prove: bool = False,
        offsets: list[TopicPartition] | None = None,
    ) -> None:
        """Every transaction the relay opens besides its batch's own: begin, write, commit.

        Args:
            write: writes the transaction's records (``None``: none).
            prove: carry offsets that prove this member still belongs to its
                group (:meth:`~consumers.stage.Stage._prove_membership`:
                ``offsets``, or where the batch starts when ``None``).
            offsets: consumer offsets to commit with it (held back at parked
                dispatches, see :meth:`_send_offsets`).

        Raises:
            KafkaException: from the transaction (the stage loop recovers).
        """
        prove_now = (lambda: self._prove_membership(offsets)) if prove else None
        with self.transaction(None if prove else offsets, before_commit=prove_now) as out:
            if write is not None:
                write(out)

    def _send_offsets(self, offsets: list[TopicPartition], *args: Any, **kwargs: Any) -> None:
        """The stage's offset commit, held back at parked dispatches."""
        held = self.parking.held_back(offsets, self.settings.topic(Topic.DISPATCHES))
        super()._send_offsets(held, *args, **kwargs)

    def _commit_outputs(self, outputs: list[Output]) -> None:
        """Commit one dispatch's receipt at once (its offset follows with the batch)."""

        def write(out: Writer) -> None:
            for topic, key, event in outputs:
                out.write(topic, key, event)

        with self._shared:
            self._transaction(write)

    def _mark_attempted(self, dispatches: list[Dispatch], now: int) -> None:
        """Commit ATTEMPTED receipts: from here on these dispatches may have left.

        The markers' transaction carries the batch's start offsets
        (:meth:`~consumers.stage.Stage._prove_membership`), so a relay that
        lost its partitions while paused (a zombie, whose successor read the
        receipts without these markers and may have sent the same dispatches)
        cannot commit them, and so sends nothing.

        Raises:
            KafkaException: the transaction failed (a zombie: abortable); the
                stage loop recovers and nothing was sent.
        """
        if not dispatches:
            return

        def write(out: Writer) -> None:
            for d in dispatches:
                with self.spans.of_operation(d.operation_id):  # the marker continues its trace
                    out.write(Topic.RECEIPTS, d.operation_id, self.recorder.attempt_marker(d, now))

        with self._shared:
            self._transaction(write, prove=True)
            for d in dispatches:
                self.book.marked(d, now, self.sinks.version_of(d.sink))

    def close(self) -> None:
        """Close sink clients and the table followers too."""
        super().close()
        self.sinks.close()
        self.receipts_table.close()
        self.admission.close()
