"""The one reader of ledger topics: whole partitions, settled ends, with client renewal.

* :func:`read_partition` reads partitions of a topic from their start (or
  their last ``tail`` offsets) to their last stable offset as of the call,
  riding out outages and renewing its client when a read stops moving (a
  client that went through a broker restart can keep answering "unknown
  partition" or stop fetching);
* :func:`await_settled` waits until the transactions open on partitions have
  ended (a restore before then would miss records about to become visible).

Stages restore from them, the table followers (:mod:`consumers.tables`)
wait on them, and the read-side tools (history, audit, reconcile) read
through them. Their clients are made by :func:`consumers.runtime.clients.make_consumer`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from consumers.retry import STALL_S, KafkaRetry, is_retriable, policy_for
from consumers.runtime.records import Record, decode_record
from ledger.authn import Keyring
from ledger.errors import BrokerError, LedgerError
from ledger.kafka import REFUSAL_CODES, make_consumer
from ledger.settings import LedgerSettings
from ledger.topology import is_reserved_key

log = logging.getLogger(__name__)

T = TypeVar("T")


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
            make_consumer(settings, group),
            make_consumer(settings, group, isolation="read_uncommitted"),
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
        return make_consumer(
            settings,
            f"{settings.topic_prefix}.reader",
            extra={"enable.partition.eof": False, "fetch.wait.max.ms": 50},
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
        """:func:`end_of` (log start, end), asked again with a fresh client.

        Asked again while it is not overdue.
        """
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
