"""Tables kept in memory by following a compacted topic.

A :class:`TableFollower` reads some partitions of a compacted topic from the
beginning (``read_committed``, no consumer group) and, on each
:meth:`TableFollower.catch_up`, up to the topic's current last stable offset.
The authority kernel uses it for approvals and the policy version; the relay
for its record of attempts. A broker outage is waited out (with the stage's
:class:`~consumers.retry.KafkaRetry`, indefinitely), and the time it takes
does not count against a catch-up's deadline.

A table whose records are expensive to check (Ed25519 signatures on every
approval and approval use) can be followed *lazily*: a catch-up only files
each record under its key, and :meth:`TableFollower.settle` decodes, checks
and applies a key's records, in offset order, when the stage is about to
consult that key. A key's row then comes out exactly as an eager follow
would have made it (every rule a table applies is per key and in order),
but a restart reads a long history at the cost of filing it: the keys
nobody asks about are checked later, a slice at a time while the stage is
idle (:meth:`TableFollower.settle_some`), off the path of the work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from consumers.retry import STALL_S, KafkaRetry, is_retriable, policy_for
from consumers.runtime.inputs import oversized, refusal_verdict, seal_refusal_kind
from consumers.runtime.reader import await_settled
from consumers.runtime.records import Record, decode_record, key_text
from ledger.authn import Keyring, unverifiable
from ledger.errors import LedgerError
from ledger.events import decode_event
from ledger.kafka import make_consumer
from ledger.settings import LedgerSettings
from ledger.topology import is_reserved_key

log = logging.getLogger(__name__)

#: Seconds a stage spends settling filed records per idle turn
#: (:meth:`TableFollower.settle_some`): short, so a request that arrives
#: meanwhile waits little.
IDLE_SETTLE_S = 0.02


class TableFollower:
    """Follow partitions of one topic and feed every record to ``apply``.

    Args:
        settings: ledger settings.
        topic: short topic name.
        apply: called with each decodable record (tombstones and undecodable
            values are passed as ``None`` with the key).
        on_bad: called once per follow with each record that is refused (the
            message, the reason and the kind: ``BAD_INPUT`` for a value that
            does not decode, ``UNAUTHENTICATED`` for a record, tombstones
            included, whose seal is missing or wrong), so the stage can
            record an operating event; such a record is otherwise treated as
            absent (never applied).
        keyring: checks each record's seal (:mod:`ledger.authn`); ``None``
            applies records unchecked (tools that read for display).
        retry: how retriable errors and outages are ridden out (a stage
            passes its own, which waits indefinitely; default: for
            ``takeover_wait_s`` at a time).
        lazy: file records by key on catch-up and decode, check and apply
            a key's records only on :meth:`settle` (the stage must settle a
            key before it reads its row); ``on_bad`` then hears of a refused
            record when its key is settled.
        on_unverifiable: called with the key, the record and the reason each
            time a record is refused because its seal names a key this
            reader does not hold (:func:`ledger.authn.unverifiable`), every
            follow (not once like ``on_bad``, whose kind is then
            ``UNVERIFIABLE``): such a record may be authentic evidence, so a
            stage must hold what it covers instead of reading it as absent.
    """

    def __init__(
        self,
        settings: LedgerSettings,
        topic: str,
        apply: Callable[[str, Record | None], None],
        on_bad: Callable[[Message, str, str], None] | None = None,
        keyring: Keyring | None = None,
        retry: KafkaRetry | None = None,
        lazy: bool = False,
        on_unverifiable: Callable[[str, Message, str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.lazy = lazy
        self.on_unverifiable = on_unverifiable
        #: key -> its records not yet settled, in offset order (lazy only).
        self._held: dict[str, list[Message]] = {}
        self.topic = topic
        self.full = settings.topic(topic)
        self.apply = apply
        self.on_bad = on_bad
        self.keyring = keyring
        #: records refused because their seal was missing or wrong (since start).
        self.unauthenticated = 0
        #: (partition, offset) of undecodable values already reported since follow().
        self._reported: set[tuple[int, int]] = set()
        self.partitions: set[int] = set()
        self._uncommitted: Consumer | None = None
        #: partition -> offset a replacement reader was told to start at.
        self._resume_at: dict[int, int] = {}
        self.retry = retry or KafkaRetry(
            f"{self.full} follower", policy_for(settings, indefinitely=False)
        )
        self.consumer = self._new_consumer()
        #: asks for the partitions' ends and never fetches: on the reader's
        #: own connection each ListOffsets queued behind its long-poll fetch
        #: (``fetch.wait.max.ms``), about 20 ms per partition, every catch-up.
        self._ends = self._new_ends_client()

    def _new_ends_client(self) -> Consumer:
        # The group of the high-watermark probe: neither client joins it (ledger.acl).
        return make_consumer(self.settings, f"{self.settings.topic_prefix}.table.{self.topic}.hw")

    def _new_consumer(self) -> Consumer:
        return make_consumer(
            self.settings,
            f"{self.settings.topic_prefix}.table.{self.topic}",
            extra={"fetch.wait.max.ms": 20},
        )

    def _reconnect(self, positions: dict[int, int], why: str = "") -> None:
        """Replace the consumer, resuming at ``positions`` (partition -> offset).

        After a broker restart a consumer's fetch or metadata can stay stuck
        for longer than a catch-up may wait; a fresh consumer asks again.
        ``why`` (during an outage, logged already) keeps the log quiet.
        """
        if why:
            log.debug("%s: %s; reconnecting its reader", self.full, why)
        else:
            log.warning("%s: catch-up made no progress; reconnecting its reader", self.full)
        self.consumer.close()
        self.consumer = self._new_consumer()
        self._ends.close()
        self._ends = self._new_ends_client()
        # A fresh consumer reports no position for a partition until it has
        # delivered from it: where it was told to start counts until then.
        self._resume_at = {
            p: positions[p] if positions.get(p, -1) >= 0 else self._resume_at.get(p, -1)
            for p in self.partitions
        }
        self.consumer.assign(
            [
                TopicPartition(
                    self.full,
                    p,
                    self._resume_at[p] if self._resume_at[p] >= 0 else OFFSET_BEGINNING,
                )
                for p in sorted(self.partitions)
            ]
        )

    def follow(self, partitions: set[int]) -> int:
        """(Re)start following exactly ``partitions`` from the beginning.

        Returns the number of records read (applied, or filed when lazy).

        Waits first until no open transaction holds the partitions back
        (:func:`consumers.stage.await_settled`), so that a stage taking over
        from one that died inside a transaction reads what that transaction
        wrote once it is decided.
        """
        await_settled(self.settings, self.topic, set(partitions), retry=self.retry)
        self.partitions = set(partitions)
        self._reported.clear()
        self._held.clear()
        self._resume_at = {}
        self.consumer.assign(
            [TopicPartition(self.full, p, OFFSET_BEGINNING) for p in sorted(self.partitions)]
        )
        return self.catch_up()

    def catch_up(self, timeout_s: float | None = None) -> int:
        """Read until every followed partition reaches its current last stable offset.

        A broker that does not answer is waited for (:attr:`retry`); that
        time does not count against the timeout, so an outage of any length
        does not stop a stage.

        Args:
            timeout_s: longest wait in seconds while Kafka answers; default
                ``LEDGER_TAKEOVER_WAIT_S`` (180 s).

        Returns:
            Number of records applied.

        Raises:
            LedgerError: if the end is not reached within the timeout, or
                Kafka does not answer for as long as :attr:`retry` waits.
        """
        if not self.partitions:
            return 0
        wait_s = self.settings.takeover_wait_s if timeout_s is None else timeout_s
        started, waited_before = time.monotonic(), self.retry.waited_s

        def overdue() -> bool:
            return time.monotonic() > started + wait_s + (self.retry.waited_s - waited_before)

        ends = {p: self._end(p, overdue) for p in self.partitions}
        count = 0
        last: dict[int, int] = {}
        moved_at = time.monotonic()
        while True:
            positions = self.consumer.position(
                [TopicPartition(self.full, p) for p in self.partitions]
            )
            current = {
                tp.partition: tp.offset if tp.offset >= 0 else self._resume_at.get(tp.partition, -1)
                for tp in positions
            }
            behind = [p for p, at in current.items() if ends[p] > 0 and at < ends[p]]
            if not behind:
                return count
            now = time.monotonic()
            if overdue():
                raise LedgerError(f"following {self.full} did not catch up in {wait_s:g} s")
            if current != last:
                last, moved_at = current, now
            elif now - moved_at > STALL_S:
                # Ask afresh for the ends too: one read just after a broker
                # restart can be one the partition cannot reach.
                log.info("%s: positions %s, ends %s", self.full, current, ends)
                self._reconnect(current)
                ends = {p: self._end(p, overdue) for p in self.partitions}
                moved_at = time.monotonic()
            for msg in self._take():
                if msg.error() is not None:
                    continue
                key = key_text(msg)
                if is_reserved_key(key):
                    continue
                if self.lazy and not oversized(msg):
                    self._held.setdefault(key, []).append(msg)
                elif not self._take_one(key, msg):
                    continue
                count += 1

    def _take_one(self, key: str, msg: Message) -> bool:
        """Decode, check and apply one record; False when it was refused (not applied)."""
        # A record over the input bounds is never decoded (nor copied).
        rec = None if oversized(msg) else decode_record(self.topic, msg)
        if rec is None and msg.value() is not None:
            self._bad(msg)
        elif self.keyring is not None and not self._authentic(msg, rec):
            return False
        self.apply(key, rec)
        return True

    def settle(self, key: str) -> None:
        """Decode, check and apply the records of ``key`` filed since its last settle.

        A no-op for an eager follower, or a key with nothing held. Refused
        records are reported (``on_bad``) and skipped, as on an eager
        catch-up; the records are applied in offset order.
        """
        for msg in self._held.pop(key, ()):
            self._take_one(key, msg)

    def settle_some(self, budget_s: float) -> int:
        """Settle held keys, oldest filed first, for about ``budget_s`` seconds.

        A stage calls it when idle, so that every filed record is checked
        (and a refused one reported) soon after a restart, without holding
        up the work that asked for none of them.

        Returns:
            How many keys are still held.
        """
        until = time.monotonic() + budget_s
        while self._held and time.monotonic() < until:
            self.settle(next(iter(self._held)))
        return len(self._held)

    @property
    def held(self) -> int:
        """How many keys have records waiting for :meth:`settle` (0 when eager)."""
        return len(self._held)

    def _take(self) -> list[Message]:
        """What the consumer holds (up to 1,000), or else the first record within 5 ms.

        ``consume(n, timeout)`` returns early only with ``n`` records, so a
        catch-up that asked for 1,000 with a 20 ms timeout paid the 20 ms on
        every call, three tables per batch. Taking what has arrived without
        waiting, and waiting only for the first record (the loop checks the
        positions again between calls: control records move them without
        delivering anything), makes a catch-up as long as its reads.
        """
        return self.consumer.consume(1000, 0) or self.consumer.consume(1, 0.005)

    def _authentic(self, msg: Message, rec: Record | None) -> bool:
        """Check a record's seal; report (once per follow) and refuse one that fails."""
        assert self.keyring is not None
        problem = self.keyring.check(
            self.topic,
            msg.key() or b"",
            msg.value(),
            msg.headers(),
            rec.event if rec else None,
            msg.partition(),
            msg.timestamp(),
        )
        if problem is None or not self.keyring.refuses(
            problem, self.settings.require_authenticated_records
        ):
            return True
        doubt = unverifiable(problem)
        if doubt and self.on_unverifiable is not None:
            self.on_unverifiable(key_text(msg), msg, problem)
        where = (msg.partition() or 0, msg.offset() or 0)
        if where in self._reported:
            return False
        self._reported.add(where)
        self.unauthenticated += 1
        what = "tombstone" if msg.value() is None else "record"
        kind = seal_refusal_kind(problem)
        log.error("%s[%d]@%d: %s %s refused: %s", self.full, *where, kind, what, problem)
        if self.on_bad is not None:
            self.on_bad(msg, f"{refusal_verdict(problem)} ({what}): {problem}", kind)
        return False

    def _bad(self, msg: Message) -> None:
        """Report a value that does not decode (once per follow)."""
        where = (msg.partition() or 0, msg.offset() or 0)
        if where in self._reported:
            return
        self._reported.add(where)
        too_large = oversized(msg)
        if too_large is not None:
            reason = f"the record has {too_large}"
        else:
            try:
                decode_event(msg.value())
                reason = "reserved or unreadable record"
            except Exception as exc:  # the reason is what is wanted here
                reason = f"{type(exc).__name__}: {exc}"
        log.warning("%s[%d]@%d: value does not decode: %s", self.full, *where, reason)
        if self.on_bad is not None:
            self.on_bad(msg, reason, "BAD_INPUT")

    def _positions(self) -> dict[int, int]:
        """The consumer's position in each followed partition (negative: none yet)."""
        return {
            tp.partition: tp.offset
            for tp in self.consumer.position(
                [TopicPartition(self.full, p) for p in self.partitions]
            )
        }

    def _end(self, partition: int, overdue: Callable[[], bool]) -> int:
        """Last stable offset of a partition, retried while the broker settles.

        Retriable errors (the broker down or restarting) are ridden out with
        :attr:`retry`, replacing the consumer now and then; others (just after
        a broker restart metadata can be missing for a moment: "unknown
        partition") are retried with a fresh consumer until ``overdue()``.

        Raises:
            LedgerError: still failing when ``overdue()``, or Kafka did not
                answer for as long as :attr:`retry` waits.
        """
        tp = TopicPartition(self.full, partition)

        def fresh(failures: int) -> None:
            if failures % 5 == 0:
                self._reconnect(self._positions(), why="Kafka does not answer")

        failures = 0
        while True:
            try:
                low, high = self.retry.call(
                    lambda: self._ends.get_watermark_offsets(tp, timeout=10, cached=False),
                    f"end of {self.full}[{partition}]",
                    between=fresh,
                )
                # A partition emptied to its end (DeleteRecords) has nothing to read:
                # its end counts as 0, or the catch-up would wait for a record that
                # never comes (the audit names the deletion).
                return 0 if int(low) >= int(high) else int(high)
            except KafkaException as exc:
                if is_retriable(exc):  # the retry policy gave up: Kafka is not answering
                    raise self.retry.no_answer(self.full, exc) from exc
                if overdue():
                    raise LedgerError(
                        f"cannot read the end of {self.full}[{partition}]: {exc.args[0]}"
                    ) from exc
                failures += 1
                if failures % 25 == 0:  # about five seconds of refusals: ask afresh
                    self._reconnect(self._positions())
                time.sleep(0.2)

    def unsettled(self, partition: int) -> bool:
        """True while a transaction holds ``partition``'s last stable offset back.

        A producer that died (or stalled) inside a transaction leaves the
        partition's last stable offset below its high watermark until the
        broker aborts the transaction or the producer's successor fences it:
        records written after it, by anyone, are not visible yet. A table
        reader that misses a key must then not conclude that it does not
        exist.
        """
        if self._uncommitted is None:
            self._uncommitted = make_consumer(
                self.settings,
                f"{self.settings.topic_prefix}.table.{self.topic}.hw",
                isolation="read_uncommitted",
            )
        tp = TopicPartition(self.full, partition)
        try:
            _, stable = self._ends.get_watermark_offsets(tp, timeout=10, cached=False)
            _, high = self._uncommitted.get_watermark_offsets(tp, timeout=10, cached=False)
        except KafkaException:
            return True  # cannot tell: treat as unsettled (the caller's wait is bounded)
        return int(stable) < int(high)

    def close(self) -> None:
        """Close the underlying consumers."""
        self.consumer.close()
        self._ends.close()
        if self._uncommitted is not None:
            self._uncommitted.close()
            self._uncommitted = None
