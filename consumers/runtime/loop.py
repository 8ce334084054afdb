"""The consume-transform-produce loop a stage runs (see :mod:`consumers.stage`).

:class:`StageLoop` drives one stage: start-up (topics checked, producer and
group member made), then batch after batch, each decoded and handled in one
transaction whose offsets commit with its outputs, with recovery from a
failed transaction, the watches' verdicts acted on, and the stop signals.
It calls the stage back at its hooks (``on_start``, ``before_transaction``,
``handle``, ``before_commit``, ``after_commit``, ``idle``, ``rebuild``) and
opens every transaction through the stage's ``transaction()`` (the relay
holds offsets back there).
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
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from consumers.metrics import StageMetrics
from consumers.retry import KafkaRetry
from consumers.runtime.assignment import Assignment
from consumers.runtime.clients import ClientReports
from consumers.runtime.records import Record
from consumers.runtime.status import StatusFile
from consumers.runtime.txn import Offsets, Recovery, Transactions
from consumers.runtime.watches import (
    FetchCheck,
    KafkaVerdict,
    StopWatchdog,
    StuckWatch,
    await_kafka,
)
from consumers.runtime.writer import Writer
from consumers.twins import Presence, announce, withdraw
from ledger.clock import check_stage_clock
from ledger.errors import LedgerError
from ledger.events import OperatingEvent
from ledger.kafka import classify
from ledger.logs import bind_here
from ledger.settings import LedgerSettings
from ledger.topics import check_topics
from ledger.topology import Topic
from ledger.tracing import RecordSpans

#: The loop logs under the stage module's name, as it did before it moved here
#: (log filters and searches name ``consumers.stage``).
log = logging.getLogger("consumers.stage")


class LoopedStage(Protocol):
    """What the loop reads and calls back on its stage (:class:`consumers.stage.Stage`)."""

    settings: LedgerSettings
    component: str
    instance: str
    run_dir: Path
    batch_size: int
    group_id: str
    stopping: bool
    processed: int
    batch_starts: list[TopicPartition]
    metrics: StageMetrics
    retry: KafkaRetry
    reports: ClientReports
    spans: RecordSpans
    txn: Transactions
    assignment: Assignment
    fetch: FetchCheck
    stuck: StuckWatch
    status: StatusFile

    @property
    def transactional_id(self) -> str:
        """The producer's transactional ID."""

    def _decode(self, msg: Message) -> Record | tuple[str, OperatingEvent] | None:
        """A record, a dead letter ``(key, event)``, or ``None`` to skip."""

    def transaction(
        self, offsets: Offsets = None, before_commit: Callable[[], None] | None = None
    ) -> contextlib.AbstractContextManager[Writer]:
        """Begin, write, send offsets, commit (the stage's seam)."""

    def handle(self, records: list[Record], out: Writer) -> None:
        """Decide on a batch and write the outputs."""

    def on_start(self) -> None:
        """Topics checked, the loop about to start."""

    def before_transaction(self, records: list[Record]) -> None:
        """Work outside the batch's transaction."""

    def before_commit(self, records: list[Record]) -> None:
        """Inside the transaction, just before it commits."""

    def after_commit(self) -> None:
        """The batch's transaction committed."""

    def rebuild(self) -> None:
        """Discard uncommitted in-memory changes."""

    def idle(self) -> None:
        """A poll returned nothing."""

    def settled(self) -> bool:
        """Start-up work after an assignment is done."""

    def close(self) -> None:
        """Leave the group, release the producer."""


class StageLoop:
    """Runs one stage's loop until it is told to stop.

    Args:
        stage: the stage it runs and calls back.
    """

    def __init__(self, stage: LoopedStage) -> None:
        self.stage = stage
        #: Armed by the first stop signal (see :meth:`stop`); disarmed when the run ends.
        self.watchdog: StopWatchdog | None = None
        #: this process's file in the run folder, touched as the loop goes round
        self.presence: Presence | None = None

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
        stage = self.stage
        check_stage_clock(stage.settings.clock, testbed=stage.settings.testbed)
        bind_here(stage=stage.component, instance=stage.instance)
        presence = announce(stage.run_dir, stage.component, stage.instance)  # consumers.twins
        self.presence = Presence(presence)  # touched as the loop goes round (ledger status)
        if stage.settings.metrics_port is not None:
            stage.metrics.serve(stage.settings.metrics_host, stage.settings.metrics_port)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        try:
            stage.retry.call(lambda: check_topics(stage.settings), "start-up topic check")
            stage.on_start()
            stage.txn.new_producer()
            stage.assignment.join()
        except (KafkaException, LedgerError) as exc:
            stage.close()
            withdraw(presence)
            if not stage.stopping:
                raise
            log.info("%s-%s: stopped while starting (%s)", stage.component, stage.instance, exc)
            return
        log.info(
            "%s-%s running (pid %s, group %s, transactional.id %s)",
            stage.component,
            stage.instance,
            os.getpid(),
            stage.group_id,
            stage.transactional_id,
        )
        try:
            self.loop(stop_after_s)
        except (KafkaException, LedgerError) as exc:
            if not stage.stopping:
                raise
            # Told to stop while it waited for Kafka: the last error ends the wait.
            log.info("%s-%s: stopped while waiting (%s)", stage.component, stage.instance, exc)
        finally:
            stage.close()
            withdraw(presence)
            if self.watchdog is not None:
                self.watchdog.cancel()

    def loop(self, stop_after_s: float | None) -> None:
        """The consume-transform-produce loop (see :meth:`run`)."""
        stage = self.stage
        assert stage.assignment.consumer is not None and stage.txn.producer is not None
        started = time.monotonic()
        while not stage.stopping:
            stage.metrics.beat()
            if self.presence is not None:
                self.presence.beat()
            if stop_after_s is not None and time.monotonic() - started > stop_after_s:
                break
            if stage.assignment.consumer_stuck:
                stage.assignment.consumer_stuck = False
                log.warning(
                    "%s: replacing the consumer that could not read offsets", stage.component
                )
                stage.assignment.rejoin()
            msgs = self.next_batch()
            if stage.assignment.consumer_stuck:
                continue  # read by a member about to be replaced: its successor reads them
            real = []
            for msg in msgs:
                err = msg.error()
                if err is None:
                    real.append(msg)
                elif err.code() == KafkaError._FATAL or err.fatal():
                    # e.g. a static member fenced after a coordinator restart
                    log.error("%s: fatal consumer error (%s); rejoining", stage.component, err)
                    stage.assignment.rejoin()
                    real = []  # the new member reads them again from the committed offsets
                    break
                elif err.code() == KafkaError._PARTITION_EOF:
                    continue
                elif classify(err) == "retriable":
                    stage.reports.suspect_kafka("consume", err)
                else:
                    log.warning("%s: consumer error: %s", stage.component, err)
            if stage.reports.suspect or stage.retry.down:
                stage.reports.suspect = False
                self.await_kafka()
            if not real:
                try:
                    assert stage.txn.producer is not None
                    stage.txn.producer.poll(0)
                    self.commit_skipped()
                    stage.idle()
                    stage.status.report_ready(stage.assignment.seen, stage.settled)
                except KafkaException as exc:
                    self.recover(exc)
                self.check_fetching()
                continue
            try:
                self.process(real)
            except KafkaException as exc:
                self.recover(exc)

    def next_batch(self) -> list[Message]:
        """The next batch, up to the stage's ``batch_size`` (:meth:`Assignment.next_batch`)."""
        stage = self.stage
        return stage.assignment.next_batch(
            stage.batch_size, stage.settings.commit_interval_ms / 1000
        )

    def process(self, msgs: list[Message]) -> None:
        """Decode and handle one batch in one transaction, its offsets committed with it.

        Records of partitions no longer assigned are left to their new
        owner; bad records become dead-letter operating events.

        Raises:
            KafkaException: the transaction failed (:meth:`recover` ends it).
        """
        stage = self.stage
        assigned = stage.assignment.assigned
        short = stage.assignment.short
        mine = [m for m in msgs if (short(m.topic() or ""), m.partition()) in assigned]
        if len(mine) < len(msgs):
            # Records of partitions no longer assigned: their new owner handles them.
            log.info(
                "%s-%s: %d records of partitions no longer assigned left to their owner",
                stage.component,
                stage.instance,
                len(msgs) - len(mine),
            )
            msgs = mine
            if not msgs:
                return
        stage.txn.renew_if_bounced()  # serves error callbacks before deciding on the producer
        stage.spans.end("the batch's transaction did not commit")  # left by a failed batch
        starts: dict[tuple[str, int], int] = {}
        for msg in msgs:
            where = (msg.topic() or "", msg.partition() or 0)
            starts[where] = min(starts.get(where, msg.offset() or 0), msg.offset() or 0)
        stage.batch_starts = [TopicPartition(t, p, o) for (t, p), o in sorted(starts.items())]
        records: list[Record] = []
        dead: list[tuple[str, OperatingEvent]] = []
        for msg in msgs:
            item = stage._decode(msg)
            if isinstance(item, Record):
                records.append(item)
            elif item is not None:
                dead.append(item)
        stage.before_transaction(records)
        consumer = stage.assignment.consumer
        assert consumer is not None

        def positions() -> list[TopicPartition]:
            return [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]

        with stage.transaction(positions, lambda: stage.before_commit(records)) as out:
            for key, event in dead:
                out.write(Topic.OPERATING_EVENTS, key, event)
            stage.handle(records, out)
        stage.retry.recovered()
        stage.txn.committed()
        stage.processed += len(msgs)
        stage.metrics.consumed(len(msgs))
        stage.after_commit()
        stage.spans.end()

    def commit_skipped(self) -> None:
        """Commit positions that moved without delivering records (:meth:`Assignment.skipped`)."""
        stage = self.stage
        positions = stage.assignment.skipped(time.monotonic())
        if positions:
            with stage.transaction(positions):
                pass
            stage.assignment.skipped_committed(positions)

    def recover(self, exc: KafkaException) -> None:
        """Recover from a failed transaction or Kafka call (see :mod:`consumers.stage`).

        The transaction ends (:meth:`Transactions.recover`: aborted, or a new
        producer); the stage then drops what was pending (after a certain
        abort) or restores its state from what was committed (a new
        producer: the old one's last transaction may have committed after
        all), and rewinds its consumer to the committed offsets.
        """
        stage = self.stage
        stage.spans.end(f"transaction failed: {exc.args[0]}")
        if stage.txn.recover(exc.args[0]) is Recovery.RESTORE:
            stage.rebuild()
            stage.assignment.restore_all()
        else:
            stage.rebuild()
        stage.assignment.rewind()

    def await_kafka(self) -> None:
        """A client reported Kafka unreachable: wait until it answers, act on the verdict.

        See :func:`consumers.runtime.watches.await_kafka`: Kafka away at
        first -> the next batch gets a new producer; Kafka answering the
        producer while the consumer's calls keep timing out -> both replaced.
        """
        stage = self.stage
        consumer = stage.assignment.consumer
        assert consumer is not None
        topic = stage.settings.topic(stage.assignment.inputs[0])
        verdict = await_kafka(consumer, stage.retry, topic, stage.stuck)
        if verdict is KafkaVerdict.CONSUMER_STUCK:
            log.warning(
                "%s: Kafka answers, but the consumer's calls keep timing out; "
                "replacing the consumer and the producer",
                stage.component,
            )
            stage.txn.broker_bounced = True
            stage.assignment.rejoin()
        elif verdict is KafkaVerdict.BOUNCED:
            stage.txn.broker_bounced = True

    def check_fetching(self) -> None:
        """Replace a consumer that stopped fetching a partition with records waiting.

        When idle, at most every
        :data:`~consumers.runtime.watches.FETCH_CHECK_EVERY_S` seconds (see
        :class:`~consumers.runtime.watches.FetchCheck`); the new member
        restores and starts from the committed offsets, so nothing is skipped.
        """
        stage = self.stage
        consumer = stage.assignment.consumer
        if consumer is None:
            return
        stall = stage.fetch.check(
            consumer, stage.retry, stage.assignment.assigned_at, lambda: stage.stopping
        )
        if stall is None:
            return
        log.warning("%s-%s: %s; replacing the consumer", stage.component, stage.instance, stall)
        stage.txn.broker_bounced = True  # and the next batch gets a new producer
        stage.assignment.rejoin()

    def stop(self, signum: int = signal.SIGTERM, frame: object = None) -> None:
        """SIGTERM/SIGINT: stop at the next step, and exit anyway after ``stop_timeout_s``.

        The first signal arms a watchdog (:class:`StopWatchdog`): a Kafka
        call that waits on an unreachable broker cannot keep the process
        alive past it. Leaving that way is as safe as a crash: the open
        transaction is aborted by the broker (or fenced by the next instance
        with the transactional ID), and the next owner resumes.
        """
        stage = self.stage
        if not stage.stopping:
            self.watchdog = StopWatchdog(
                stage.settings.stop_timeout_s, f"{stage.component}-{stage.instance}"
            )
            self.watchdog.start()
        stage.stopping = True
