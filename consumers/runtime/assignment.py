"""A stage's partitions: joining the group, restoring on assignment, rewinding, rejoining.

:class:`Assignment` owns the stage's group member and what it holds:

* **restore as a loop phase** – an assignment (the rebalance callback) waits
  for the previous owner's transaction (stable committed offsets, KIP-447)
  before the stage restores its state (:meth:`Assignment.restore`);
* **committed offsets with the stuck-consumer check** – a member left
  asking a coordinator that is no longer one (librdkafka#2630, #5586) is
  found out by a new client of the group and marked for replacement
  (:meth:`Assignment.committed`);
* **rewind** to the committed offsets after an aborted transaction;
* **rejoin** – the member replaced (bounded close, confluent-kafka-python#1667),
  its partitions dropped, a new member subscribed.

It calls the stage back through :class:`StageHooks` (the stage's own
``on_assign``/``on_revoke``/``rebuild``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from consumers.retry import KafkaRetry
from consumers.runtime.clients import Clients
from consumers.runtime.watches import StuckWatch
from ledger.errors import ConsumerStuckError, LedgerError
from ledger.settings import LedgerSettings

log = logging.getLogger(__name__)

#: Longest a single ask for committed offsets may block (seconds). A restore
#: waits longer than this in all (for a previous owner's transaction, for an
#: outage), but in tries of this length, so that a consumer stuck on a stale
#: coordinator is noticed between them (:class:`~consumers.runtime.watches.StuckWatch`):
#: one try as long as the whole takeover wait (180 s) held an authority
#: kernel, its loop unpolled, for minutes after a broker outage.
COMMITTED_TRY_S = 10.0


class StageHooks(Protocol):
    """What an assignment calls back on its stage."""

    def on_assign(self, partitions: set[int]) -> None:
        """Partitions of every input were assigned: restore state."""

    def on_revoke(self, partitions: set[int]) -> None:
        """Partitions were revoked or lost: drop their state."""

    def rebuild(self) -> None:
        """Discard uncommitted in-memory changes."""


class RestoreObserver(Protocol):
    """Told when a restore starts and ends (the stage's metrics)."""

    def restoring(self) -> None:
        """A restore starts."""

    def restored(self) -> None:
        """A restore ended."""


class Assignment:
    """The stage's group member and the partitions it holds.

    Args:
        settings: ledger settings (topic names, ``takeover_wait_s``).
        clients: makes the member and plain clients of the group.
        inputs: the stage's input topics (short names).
        hooks: the stage, called back on assignment, revocation, rebuild.
        retry: the stage's current retry policy (asked at each call).
        stuck: the stuck-consumer watch asked between tries of ``committed``.
        on_consumer_error: the member's librdkafka error callback.
        consumer_extra: more librdkafka settings of the member (statistics).
        bounced: called when the next batch should get a new producer.
        metrics: told when a restore starts and ends.
        on_new: called when a new assignment arrives (start-up work may follow).
    """

    def __init__(
        self,
        settings: LedgerSettings,
        clients: Clients,
        inputs: tuple[str, ...],
        hooks: StageHooks,
        retry: Callable[[], KafkaRetry],
        stuck: StuckWatch,
        on_consumer_error: Callable[..., None],
        consumer_extra: Callable[[], dict[str, object]],
        bounced: Callable[[], None],
        metrics: RestoreObserver,
        on_new: Callable[[], None],
    ) -> None:
        self.metrics = metrics
        self._on_new = on_new
        self.settings = settings
        self.clients = clients
        self.inputs = inputs
        self.hooks = hooks
        self._retry = retry
        self.stuck = stuck
        self._on_consumer_error = on_consumer_error
        self._consumer_extra = consumer_extra
        self._bounced = bounced
        self.consumer: Consumer | None = None
        #: (short topic, partition) pairs held now.
        self.assigned: set[tuple[str, int]] = set()
        #: an assignment has arrived since start (readiness).
        self.seen = False
        #: partitions revoked or lost so far (see ``StageLoop.next_batch``).
        self.revokes = 0
        #: Set when the member's own OffsetFetch kept failing while Kafka
        #: answered (see :meth:`committed`): the loop replaces it at a safe point.
        self.consumer_stuck = False
        #: partition -> committed offset it was assigned (or rewound) at.
        self.assigned_at: dict[tuple[str, int], int] = {}
        self._last_skip_check = 0.0
        #: positions known committed (see :meth:`skipped`).
        self._committed_positions: dict[tuple[str, int], int] = {}
        #: told where each partition starts (the fetch check forgets its samples).
        self.on_positions: Callable[[], None] = lambda: None

    @property
    def name(self) -> str:
        """``{component}-{instance}``, for log lines."""
        return self.clients.name

    def short(self, topic: str) -> str:
        """A full topic name without the ledger prefix."""
        prefix = self.settings.topic_prefix + "."
        return topic[len(prefix) :] if topic.startswith(prefix) else topic

    def join(self) -> Consumer:
        """Make the member and subscribe it to the inputs (it joins at its first poll)."""
        self.consumer = self.new_member()
        self.subscribe()
        return self.consumer

    def new_member(self) -> Consumer:
        """A new member of the group, not subscribed yet."""
        return self.clients.member(self._on_consumer_error, self._consumer_extra())

    def subscribe(self) -> None:
        """Subscribe the member to the inputs, with the rebalance callbacks."""
        assert self.consumer is not None
        self.consumer.subscribe(
            [self.settings.topic(t) for t in self.inputs],
            on_assign=self._assigned,
            on_revoke=self._revoked,
            on_lost=self._revoked,
        )

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.seen = True
        self._on_new()
        self.assigned = {(self.short(tp.topic), tp.partition) for tp in partitions}
        parts = {tp.partition for tp in partitions}
        log.info("%s assigned partitions %s", self.name, sorted(parts))
        self.restore(partitions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = {tp.partition for tp in partitions}
        self.revokes += 1
        log.info("%s revoked partitions %s", self.name, sorted(parts))
        self.assigned -= {(self.short(tp.topic), tp.partition) for tp in partitions}
        self.hooks.on_revoke(parts)

    def restore(self, partitions: list[TopicPartition]) -> None:
        """Wait out the previous owner's transaction, then let the stage restore its state.

        A partition can change hands while its previous owner's last
        transaction is still open: the owner was killed after asking to
        commit, or it is a paused zombie that has already sent its offsets.
        Restoring from the state topic at that moment would miss that
        transaction's outputs while the consumer, once the transaction
        commits, starts after its inputs: two owners would then decide from
        different states (split brain). So ``on_assign`` runs only once
        the group's committed offsets for these partitions are stable
        (``OffsetFetch`` with ``require_stable``, KIP-447: librdkafka retries
        ``UNSTABLE_OFFSET_COMMIT`` until the transaction ends, at most the
        transaction timeout), and a stage reading a table waits for it to
        settle as well (:func:`consumers.runtime.reader.await_settled`). A
        consumer found stuck meanwhile (see :meth:`committed`) restores
        nothing: the loop replaces it before handling any record, and the
        new member restores.

        Raises:
            LedgerError: if the offsets stay unreadable with a non-retriable
                error for ``takeover_wait_s`` seconds (retriable errors,
                unstable offsets included, are waited out).
        """
        if self.consumer_stuck:
            return  # the loop replaces the consumer first; the new member restores
        self.metrics.restoring()
        parts = {tp.partition for tp in partitions}
        if partitions:
            budget_s = self.settings.takeover_wait_s
            started = time.monotonic()
            deadline = started + budget_s
            asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
            while True:
                try:
                    # Retriable errors (the coordinator moving, the broker
                    # down) are ridden out; others are retried until the deadline.
                    answer = self.committed(
                        asked,
                        "stable committed offsets of the assigned partitions",
                        COMMITTED_TRY_S,
                    )
                    break
                except KafkaException as exc:
                    if time.monotonic() > deadline:
                        raise LedgerError(
                            f"{self.clients.component}: committed offsets of partitions "
                            f"{sorted(parts)} did not become stable in {budget_s:.0f} s",
                            observed=str(exc.args[0]),
                        ) from exc
                    log.warning("%s: waiting for stable offsets: %s", self.clients.component, exc)
                    time.sleep(0.5)
            waited = time.monotonic() - started
            if waited > 1.0:
                log.info(
                    "%s: waited %.1f s for the previous owner's transaction", self.name, waited
                )
            if answer is None:
                # Its partitions are left unrestored: the loop replaces the
                # consumer before handling anything, and the new member
                # restores them (takeover bookkeeping included).
                return
            self.note_assigned_at(answer)
        self.hooks.on_assign(parts)
        self.metrics.restored()

    def committed(
        self, partitions: list[TopicPartition], what: str, timeout_s: float
    ) -> list[TopicPartition] | None:
        """The group's committed offsets of ``partitions`` (``read_committed``: stable ones).

        Asked by the member, riding out retriable errors. A consumer can be
        left asking a coordinator that is no longer one: its ``OffsetFetch``
        then fails with ``NOT_COORDINATOR`` for as long as it lives
        (librdkafka#2630, #5586; seen for minutes after a broker restart in
        the three-broker chaos mission) while Kafka answers every other
        client. After the stuck watch's ``after_s`` of failures, when the
        producer gets an answer, a new client of the group (not subscribed:
        ``OffsetFetch`` needs no membership) asks once. Answered, the
        consumer is stuck: :attr:`consumer_stuck` tells the loop to replace
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
        if self.consumer_stuck:
            return None
        consumer = self.consumer
        while True:
            try:
                answer: list[TopicPartition] = self._retry().call(
                    lambda: consumer.committed(partitions, timeout=timeout_s),
                    what,
                    between=self.stuck.check,
                )
                return answer
            except ConsumerStuckError:
                if self._group_answers(partitions):
                    log.warning(
                        "%s: %s: the consumer keeps failing while a new client of the "
                        "group is answered; replacing the consumer",
                        self.name,
                        what,
                    )
                    self.consumer_stuck = True
                    self._bounced()  # and the next batch gets a new producer
                    return None

    def _group_answers(self, partitions: list[TopicPartition]) -> bool:
        """Whether a new client of this stage's group gets the committed offsets (one try)."""
        try:
            client = self.clients.group_client()
        except (KafkaException, LedgerError) as exc:
            log.warning("%s: cannot make a client to ask Kafka: %s", self.clients.component, exc)
            return False
        try:
            client.committed(partitions, timeout=10)
            return True
        except KafkaException as exc:
            log.info(
                "%s: a new client of the group is not answered either: %s",
                self.clients.component,
                exc,
            )
            return False
        finally:
            self.clients.close(client, "closing a client of the group")

    def next_batch(self, batch_size: int, interval_s: float) -> list[Message]:
        """The next batch: whatever has arrived, as soon as something has.

        Waits at most ``interval_s`` (the commit interval) for the first
        message (a poll that returns nothing leads to the stage's ``idle``),
        then takes what the consumer already holds, up to ``batch_size``,
        without waiting more. A batch is thus processed and committed as soon
        as the input is drained, instead of after a full interval spent
        waiting for more: at low load every hop costs one transaction, not
        one interval. Under load the consumer's prefetched queue fills the
        batch; the interval stays the longest wait. Errors and
        end-of-partition events come back in the list like messages (the
        loop sorts them).

        Returns:
            Up to ``batch_size`` messages (empty when nothing came in one
            interval, or when a revocation was served while it was read).
        """
        assert self.consumer is not None
        first = self.consumer.consume(1, interval_s)
        if not first or batch_size <= 1:
            return first
        revokes = self.revokes
        rest = self.consumer.consume(batch_size - 1, 0)
        if self.revokes != revokes:
            # The revocation was served inside the second call: the records
            # taken before it are no longer this member's to handle (their
            # new owner reads them from the committed offsets, and so does
            # this member if it is given them again), and handling them would
            # commit outputs with no offsets for the group to check.
            log.info(
                "%s: partitions were revoked while a batch was read; its %d records "
                "are left to their next owner",
                self.name,
                len(first) + len(rest),
            )
            return []
        return first + rest

    def skipped(self, now: float) -> list[TopicPartition] | None:
        """Positions that moved without delivering records and are not committed yet.

        A consumer skips aborted transactions' records and control markers
        without returning them; committing the new position then keeps the
        group's committed offsets at the partition's end (so a harness sees
        the stage caught up) and spares a restart the rescan. Asked at most
        once a second (``now``: monotonic seconds).

        Returns:
            The positions to commit (in a transaction of their own), or
            ``None`` when nothing moved, it is not time yet, or the member
            is stuck (the loop replaces it before anything else).

        Raises:
            KafkaException: a non-retriable error asking the committed offsets.
        """
        if now - self._last_skip_check < 1.0 or not self.assigned or self.consumer is None:
            return None
        self._last_skip_check = now
        consumer = self.consumer
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        current = {(tp.topic, tp.partition): tp.offset for tp in positions}
        if not positions or current == self._committed_positions:
            return None
        committed = self.committed(positions, "committed offsets", 10.0)
        if committed is None:
            return None
        if all(tp.offset >= current[(tp.topic, tp.partition)] for tp in committed):
            self._committed_positions = current
            return None
        return positions

    def skipped_committed(self, positions: list[TopicPartition]) -> None:
        """The positions :meth:`skipped` named are committed."""
        self._committed_positions = {(tp.topic, tp.partition): tp.offset for tp in positions}

    def note_assigned_at(self, committed: list[TopicPartition]) -> None:
        """Remember where each partition starts: a position until one is delivered."""
        self.on_positions()
        for tp in committed:
            self.assigned_at[(tp.topic, tp.partition)] = tp.offset

    def rewind(self) -> None:
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
            committed = self.committed(assignment, "committed offsets (rewind)", 30.0)
            if committed is None:
                return  # the loop replaces the consumer: the new one starts from them
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
            self.note_assigned_at(committed)
        except KafkaException as exc:
            log.warning(
                "%s: cannot rewind to the committed offsets (%s); rejoining the group",
                self.name,
                exc,
            )
            self.rejoin()

    def restore_all(self) -> None:
        """Drop the held partitions' state and restore it from what was committed."""
        if self.assigned and self.consumer is not None:
            self.hooks.on_revoke({p for _, p in self.assigned})
            self.restore(self.consumer.assignment())

    def rejoin(self) -> None:
        """Replace a member that hit a fatal error (or got stuck): drop state, join again."""
        assert self.consumer is not None
        # A consumer being replaced is the kind whose close can hang
        # (confluent-kafka-python#1667): it is left behind after stop_timeout_s.
        self.clients.close(self.consumer, "closing the replaced consumer")
        self.hooks.on_revoke({p for _, p in self.assigned})
        self.assigned = set()
        self.hooks.rebuild()
        self.join()

    def leave(self) -> None:
        """Clean stop: close the member within ``stop_timeout_s``."""
        if self.consumer is not None:
            consumer, self.consumer = self.consumer, None
            self.clients.close(consumer, "consumer close")
