"""Watches over a stage's clients, each returning a verdict the loop acts on.

* :class:`StuckWatch` – during an outage, is it the consumer that is stuck
  while Kafka answers (its producer is answered)? Raises
  :class:`~ledger.errors.ConsumerStuckError` between retries.
* :func:`await_kafka` – a client reported Kafka unreachable: wait until it
  answers; the verdict (:class:`KafkaVerdict`) says whether the next batch
  needs a new producer or a new consumer.
* :class:`FetchCheck` – a consumer that silently stopped fetching a partition
  with records waiting (librdkafka#2363, #2830): the verdict
  (:class:`FetchStall`) names the partition; the loop replaces the consumer.
* :class:`StopWatchdog` – a stop that takes longer than it may ends the
  process (confluent-kafka-python#1667).
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from consumers.fetchwatch import FetchWatch
from consumers.retry import KafkaRetry
from consumers.runtime.clients import Clients
from ledger.errors import ConsumerStuckError, LedgerError

log = logging.getLogger(__name__)

#: Seconds of an outage after which a stage asks, with its producer's own
#: connections, whether Kafka answers (then its consumer is the one stuck).
CONSUMER_STUCK_AFTER_S = 30.0

#: Seconds an assigned partition may stay behind its last stable offset, its
#: position unmoved, before a fresh reader checks whether the stage's consumer
#: stopped fetching it (see :class:`FetchCheck`).
FETCH_STALL_S = 30.0

#: Seconds between two samples of the assigned partitions' positions and ends
#: (taken while the stage is idle).
FETCH_CHECK_EVERY_S = 5.0

#: Seconds one sample may spend asking the assigned partitions' ends.
FETCH_CHECK_BUDGET_S = 10.0


class StuckWatch:
    """Between tries of a Kafka call that keeps failing: is the consumer stuck, not Kafka?

    After ``after_s`` of an outage, and then every fifth try, the producer
    (its own connections) asks for the first input's metadata. An answer
    means Kafka is back while the consumer still times out (seen for more
    than six minutes after a 90 s broker outage, ``Failed to get committed
    offsets: Local: Timed out``): a new consumer asks afresh.

    Args:
        component: the stage, for the error.
        topic: the full name of the topic whose metadata the producer asks.
        retry: the stage's current retry policy (its ``waiting`` says since when).
        producer: the stage's current producer (``None`` before it has one).
        after_s: seconds of an outage before the producer is asked.
    """

    def __init__(
        self,
        component: str,
        topic: str,
        retry: Callable[[], KafkaRetry],
        producer: Callable[[], Producer | None],
        after_s: float = CONSUMER_STUCK_AFTER_S,
    ) -> None:
        self.component = component
        self.topic = topic
        self._retry = retry
        self._producer = producer
        self.after_s = after_s

    def check(self, failures: int) -> None:
        """Called between tries (``failures`` so far).

        Raises:
            ConsumerStuckError: Kafka answered the producer.
        """
        waiting = self._retry().waiting
        producer = self._producer()
        if producer is None or waiting is None or failures % 5:
            return
        if time.time() - float(waiting["since"]) < self.after_s:
            return
        try:
            producer.list_topics(self.topic, timeout=5)
        except KafkaException:
            return  # Kafka does not answer the producer either: an outage
        raise ConsumerStuckError(f"{self.component}: Kafka answers, its consumer does not")


class KafkaVerdict(enum.Enum):
    """What :func:`await_kafka` found."""

    #: Kafka answered at once: nothing to replace.
    ANSWERED = "answered"
    #: Kafka was away: the next batch gets a new producer.
    BOUNCED = "bounced"
    #: Kafka answers the producer, the consumer times out: replace both.
    CONSUMER_STUCK = "consumer stuck"


def await_kafka(
    consumer: Consumer, retry: KafkaRetry, topic: str, stuck: StuckWatch
) -> KafkaVerdict:
    """A client reported Kafka unreachable: check, and wait until it answers.

    Asks for the committed offsets of the assignment (or for ``topic``'s
    metadata when nothing is assigned), riding out the outage; the answer
    ends it, with one log line, and clears ``waiting`` from the status file.
    When Kafka did not answer at first (an outage, a broker restart), the
    verdict is :attr:`KafkaVerdict.BOUNCED`, as after ``_ALL_BROKERS_DOWN``:
    a producer that never reported that error can still be left with
    requests lost with the old connections, and then timed out adding
    offsets to its transaction for 15 s at a time (seen for 45 s after a
    broker restart, game day g13).

    Args:
        consumer: the stage's member.
        retry: the stage's retry policy.
        topic: full name of the first input.
        stuck: asked between tries.

    Raises:
        KafkaException: Kafka did not answer for as long as ``retry`` waits.
    """
    assignment = consumer.assignment()
    outage = retry.down
    outages_before = retry.outages
    ask: Callable[[], object] = (
        (lambda: consumer.committed(assignment, timeout=10))
        if assignment
        else (lambda: consumer.list_topics(topic, timeout=10))
    )
    try:
        retry.call(ask, "Kafka to answer", between=stuck.check)
    except ConsumerStuckError:
        # The outage stays open (status: waiting); the next pass asks the
        # new consumer, which then joins the group and restores.
        return KafkaVerdict.CONSUMER_STUCK
    if outage or retry.outages > outages_before:
        return KafkaVerdict.BOUNCED
    return KafkaVerdict.ANSWERED


@dataclass(frozen=True)
class FetchStall:
    """A partition the consumer stopped fetching while a record waits there.

    Attributes:
        topic: full topic name.
        partition: partition.
        position: where the consumer is (offset).
        end: the partition's last stable offset.
        stall_s: seconds it stayed there (the watch's threshold).
    """

    topic: str
    partition: int
    position: int
    end: int
    stall_s: float

    def __str__(self) -> str:
        return (
            f"the consumer fetched nothing from {self.topic}[{self.partition}] (at "
            f"{self.position}, end {self.end}) for {self.stall_s:.0f} s while records wait there"
        )


class FetchCheck:
    """Finds a consumer that stopped fetching a partition with records waiting.

    Sampled when a poll returned nothing (the loop is idle, no transaction
    open), at most every ``every_s`` seconds: the assigned partitions'
    positions are compared with their last stable offsets, asked by a client
    of their own. A partition behind, its position unmoved over ``stall_s``
    seconds of idle samples (time spent handling records does not count, see
    :class:`~consumers.fetchwatch.FetchWatch`), is read by a fresh reader
    from that position: a record there means the consumer stopped fetching
    (see :mod:`consumers.fetchwatch`); nothing there (a transaction marker
    before the end) starts the wait afresh. Skipped during an outage (the
    retry paths handle it) and when Kafka does not answer the check; the
    ends are asked within ``budget_s`` seconds in all, and the probing stops
    at the first record found.

    Args:
        clients: makes the ends client and the partition readers.
        watch: the pure part (default: :data:`FETCH_STALL_S`).
        every_s: seconds between samples.
        budget_s: seconds one sample may spend asking ends.
        probe_s: seconds a partition check reader waits for a record.
    """

    def __init__(
        self,
        clients: Clients,
        watch: FetchWatch | None = None,
        every_s: float = FETCH_CHECK_EVERY_S,
        budget_s: float = FETCH_CHECK_BUDGET_S,
        probe_s: float = 5.0,
    ) -> None:
        self.probe_s = probe_s
        self.clients = clients
        self.watch = watch or FetchWatch(FETCH_STALL_S, max_gap_s=2 * FETCH_CHECK_EVERY_S)
        self.every_s = every_s
        self.budget_s = budget_s
        self.next_check = 0.0
        #: asks the assigned partitions' ends; never fetches nor joins the group.
        self.ends_client: Consumer | None = None
        #: consumers found stalled (since start).
        self.stalls = 0

    def check(
        self,
        consumer: Consumer,
        retry: KafkaRetry,
        assigned_at: dict[tuple[str, int], int],
        stopping: Callable[[], bool],
    ) -> FetchStall | None:
        """One sample (when due): the partition found stalled, or ``None``.

        Args:
            consumer: the stage's member.
            retry: the stage's retry policy (no sample during an outage).
            assigned_at: partition -> the committed offset it started at.
            stopping: whether the stage is stopping (then nothing is probed).
        """
        now = time.monotonic()
        if now < self.next_check or stopping():
            return None
        self.next_check = now + self.every_s
        if retry.down or retry.waiting is not None:
            return None
        assignment = consumer.assignment()
        if not assignment:
            self.watch.reset()
            return None
        budget_ends = now + self.budget_s
        try:
            if self.ends_client is None:
                self.ends_client = self.clients.group_client()
            self.ends_client.poll(0)  # serves its log and error events (never records)
            positions: dict[tuple[str, int], int] = {}
            ends: dict[tuple[str, int], int] = {}
            for tp in consumer.position(assignment):
                if time.monotonic() > budget_ends:
                    log.debug(
                        "%s: fetch check skipped: the ends came too slowly", self.clients.name
                    )
                    return None
                key = (tp.topic, tp.partition)
                low, high = self.ends_client.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=2, cached=False
                )
                ends[key] = int(high)
                # Nothing delivered since the assignment: it starts at the
                # committed offset, or (none yet) at the partition's start.
                at = tp.offset if tp.offset >= 0 else assigned_at.get(key, -1)
                positions[key] = at if at >= 0 else int(low)
        except KafkaException as exc:
            log.debug("%s: fetch check skipped: %s", self.clients.name, exc)
            self.drop_ends_client()
            return None
        for key in self.watch.observe(positions, ends, now):
            if stopping():
                return None
            if self.record_at(key, positions[key]):
                self.stalls += 1
                self.watch.reset()
                return FetchStall(key[0], key[1], positions[key], ends[key], self.watch.stall_s)
            self.watch.forgive(key, now)
        return None

    def record_at(self, key: tuple[str, int], offset: int) -> bool:
        """Whether a fresh ``read_committed`` reader gets a record from ``offset`` on (one try)."""
        topic, partition = key
        try:
            reader = self.clients.group_client()
        except (KafkaException, LedgerError) as exc:
            log.debug("%s: cannot make a reader to check a partition: %s", self.clients.name, exc)
            return False
        try:
            reader.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + self.probe_s
            while time.monotonic() < deadline:
                for msg in reader.consume(10, 0.5):
                    if msg.error() is None:
                        return True
            return False
        except KafkaException as exc:
            log.debug("%s: checking %s[%d]: %s", self.clients.name, topic, partition, exc)
            return False
        finally:
            self.clients.close(reader, "closing a partition check reader")

    def drop_ends_client(self) -> None:
        """Close the ends client (a new one is made at the next sample)."""
        client, self.ends_client = self.ends_client, None
        if client is not None:
            self.clients.close(client, "closing the ends client")


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
