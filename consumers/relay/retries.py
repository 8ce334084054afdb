"""Retry rounds: parked dispatches tried again once their backoff has passed.

Before anything is sent, the relay proves that it still belongs to its
group (a zombie's offsets-only transaction is refused); outcomes are then
committed in a transaction of their own. The round only decides what to try
and what to commit; the transactions are the stage's
(:meth:`consumers.relay.stage.Relay._transaction`).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

from confluent_kafka import TopicPartition

from consumers.relay.attempts import AttemptBook
from consumers.relay.parking import Parked, Parking
from consumers.relay.records import Output
from consumers.relay.sinks import SinkDesk
from consumers.sinkpool import run_per_sink
from consumers.stage import Writer
from ledger.logs import bound_each
from ledger.tracing import RecordSpans


class Transaction(Protocol):
    """Opens, writes and commits one transaction (``Relay._transaction``)."""

    def __call__(
        self,
        write: Callable[[Writer], None] | None = None,
        *,
        prove: bool = False,
        offsets: list[TopicPartition] | None = None,
    ) -> None:
        """Open a transaction, let ``write`` fill it, commit (``offsets`` with it)."""
        ...


class RetryRound:
    """Tries parked dispatches again, proving membership first.

    Args:
        parking: the parked dispatches.
        sinks: the sinks' adapters (a new pass asks stalled sinks again).
        book: the relay's attempts (a committed outcome completes its dispatch).
        transaction: opens, writes and commits one transaction.
        commit_outputs: commits one dispatch's outputs at once.
        settle: applies the receipts filed for an operation.
        positions: the consumer's positions (``None``: no consumer).
        batch_started: whether the current batch has start offsets.
        spans: the stage's record spans (read at each call).
        active: whether the stage has a producer.
    """

    def __init__(
        self,
        parking: Parking,
        sinks: SinkDesk,
        book: AttemptBook,
        *,
        transaction: Transaction,
        commit_outputs: Callable[[list[Output]], None],
        settle: Callable[[str], object],
        positions: Callable[[], list[TopicPartition] | None],
        batch_started: Callable[[], bool],
        spans: Callable[[], RecordSpans],
        active: Callable[[], bool],
    ) -> None:
        self.parking = parking
        self.sinks = sinks
        self.book = book
        self.transaction = transaction
        self.commit_outputs = commit_outputs
        self.settle = settle
        self.positions = positions
        self.batch_started = batch_started
        self.spans = spans
        self.active = active

    def run(self, *, commit_offsets: bool) -> None:
        """Try again every parked dispatch whose backoff has passed.

        Outcomes (an answer from the sink, or a spent budget) are committed in
        their own transaction; a dispatch that again did not reach its sink
        stays parked with a longer backoff. Called before every batch (then
        the batch's own commit moves the offsets) and when the relay is idle
        (``commit_offsets``: every consumed record is then handled, so the
        positions, held back at the dispatches still parked, are committed
        with the outcomes). Each call starts a new pass: a sink that could not
        be reached in it is not asked again until the next pass.

        Raises:
            KafkaException: from the transaction (the stage loop recovers; a
                dispatch whose outcome was lost is met again and read back).
        """
        self.parking.new_pass()
        self.sinks.new_pass()
        due = self.parking.due(time.monotonic())
        if not due or not self.active():
            return
        if not self.still_a_member(between_batches=commit_offsets):
            return
        finished: list[tuple[Parked, list[Output]]] = []
        done: list[Parked] = []
        jobs: list[tuple[str, Callable[[], object]]] = []
        for p in bound_each(due, lambda p: p.dispatch.operation_id):
            self.settle(p.dispatch.operation_id)  # refiled by a reassignment meanwhile
            ctx = contextvars.copy_context()
            jobs.append((p.dispatch.sink, partial(ctx.run, self._job, p, finished, done)))
        run_per_sink(jobs)
        spans = self.spans()
        if not done or not (finished or commit_offsets):
            spans.end()
            return

        def write(out: Writer) -> None:
            for p, outputs in finished:
                with spans.of_operation(p.dispatch.operation_id):
                    for topic, key, event in outputs:
                        out.write(topic, key, event)

        self.transaction(write, offsets=self.positions() if commit_offsets else None)
        spans.end()
        for p, _ in finished:
            self.book.done(p.dispatch)

    def _job(
        self, p: Parked, finished: list[tuple[Parked, list[Output]]], done: list[Parked]
    ) -> None:
        """Try parked ``p`` again (a sink lane's job of :meth:`run`)."""
        d = p.dispatch
        spans = self.spans()
        with spans.continued(d.operation_id, p.trace, "relay retry Dispatch"):
            outputs = self.parking.attempt(
                d, p.partition, p.offset, fresh=p.fresh, readback_on_resume=p.readback_on_resume
            )
        if d.dispatch_id in self.parking.parked:
            return
        done.append(p)
        if self.sinks.marks_alone(d.sink):
            # As for a first send: its receipt committed just after it.
            with spans.of_operation(d.operation_id):
                self.commit_outputs(outputs)
            self.book.done(p.dispatch)
        else:
            finished.append((p, outputs))

    def still_a_member(self, *, between_batches: bool) -> bool:
        """Prove this relay still belongs to its group before parked dispatches are tried again.

        A relay paused past its session (a zombie) may hold parked
        dispatches its successor has since read back and sent again under
        the same fencing token: only an idempotency key would then keep a
        second effect out. An offsets-only transaction
        (:meth:`~consumers.stage.Stage._prove_membership`) is refused by the
        group coordinator from such a member, and then nothing is sent. The
        offsets are where the current batch starts, or between batches the
        consumer's positions (both held back at parked dispatches).

        Returns:
            ``False`` when there is nothing to prove it with (no position:
            nothing assigned), and no retry should be made.

        Raises:
            KafkaException: the transaction failed (a zombie: abortable); the
                stage loop recovers and nothing was sent.
        """
        offsets: list[TopicPartition] | None = None
        if between_batches:
            offsets = self.positions()
            if not offsets:
                return False
        elif not self.batch_started():
            return False
        self.transaction(prove=True, offsets=offsets)
        return True
