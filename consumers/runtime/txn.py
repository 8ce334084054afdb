"""The transaction: begin, write, send offsets, commit within a budget; abort and recover.

A stage owns one :class:`Transactions` (``stage.txn``): its transactional
producer and every call that opens, fills, proves and ends a transaction.
It is the only place in the product that calls ``begin_transaction()``.

Use (a stage's own transaction, positions committed with the outputs)::

    with stage.transaction(offsets) as out:     # begin_transaction()
        out.write("journal", key, entry)        # sealed, into the transaction
    # on leaving the block: send_offsets_to_transaction(offsets), then
    # commit_transaction(), retriable errors retried for COMMIT_BUDGET_S

``offsets`` is a list of ``TopicPartition`` (or a callable returning one,
asked when the block ends; ``None``: no offsets, e.g. the relay's
``ATTEMPTED`` markers, which prove membership with :meth:`Transactions.send_offsets`
of the batch's starts inside the block). An exception inside the block
leaves the transaction open and propagates: the stage's loop hands a
``KafkaException`` to :meth:`Transactions.recover`, which aborts (or replaces
the producer) and tells the loop what to restore (:class:`Recovery`).

Errors follow librdkafka's classification (``examples/transactions.c``),
made once in :mod:`consumers.retry`: retriable -> retried with bounded,
jittered backoff; ``txn_requires_abort`` -> abort, rewind, rebuild;
anything else (fatal), and a commit still failing after its budget -> new
producer (``init_transactions`` fences the old epoch), rewind, restore.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from consumers.retry import KafkaRetry
from consumers.runtime.clients import Clients, bounded_call
from consumers.runtime.writer import Writer
from ledger.kafka import FENCING_CODES, classify

log = logging.getLogger(__name__)

#: Seconds a transaction's commit (or offsets send) may keep failing with
#: retriable errors before the producer is replaced (see :meth:`Transactions.commit`).
COMMIT_BUDGET_S = 60.0

#: Consecutive aborted transactions after which a stage replaces its producer.
ABORTS_BEFORE_NEW_PRODUCER = 2

#: Log marker of a transaction Kafka refused as a zombie's (counted by missions).
FENCED_MARKER = "zombie transaction fenced by Kafka"

#: The offsets a transaction commits: a list, one made when the block ends, or none.
Offsets = list[TopicPartition] | Callable[[], list[TopicPartition]] | None


class Recovery(enum.Enum):
    """What a stage restores after :meth:`Transactions.recover` (then it rewinds)."""

    #: the transaction was aborted for certain: drop what was pending (``rebuild``).
    REBUILD = "rebuild"
    #: its fate is unknown (new producer): restore the state from what was committed.
    RESTORE = "restore"


class TxnObserver(Protocol):
    """What a transaction reports to (the stage's metrics and spans)."""

    def committed(self, seconds: float) -> None:
        """A commit took ``seconds``."""

    def failed(self, kind: str, *, fenced: bool) -> None:
        """A transaction failed (``kind``: librdkafka's error class)."""


class Transactions:
    """A stage's transactional producer and its transactions.

    Args:
        clients: makes (and replaces) the producer.
        retry: the stage's current retry policy (asked at each call: a stage
            may be given another).
        group_metadata: the stage's consumer's group metadata (KIP-447), for
            the offsets sent with a transaction.
        metrics: told of commits and failures.
        on_client_error: the producer's librdkafka error callback.
    """

    def __init__(
        self,
        clients: Clients,
        retry: Callable[[], KafkaRetry],
        group_metadata: Callable[[], object],
        metrics: TxnObserver,
        on_client_error: Callable[[KafkaError], None],
    ) -> None:
        self.clients = clients
        self._retry = retry
        self._group_metadata = group_metadata
        self.metrics = metrics
        self._on_client_error = on_client_error
        self.producer: Producer | None = None
        #: the producer must be replaced before the next transaction (a broker
        #: bounce: librdkafka's idempotent producer can wait for ever draining
        #: requests lost with the connection).
        self.broker_bounced = False
        #: transactions aborted since the last commit (see :meth:`recover`).
        self.aborts_in_a_row = 0
        #: Producers given up while blocked in a call (kept alive, see send_offsets_once).
        self.abandoned: list[Producer] = []

    @property
    def name(self) -> str:
        """``{component}-{instance}``, for log lines."""
        return self.clients.name

    def new_producer(self) -> Producer:
        """Make (or replace) the producer: ``init_transactions`` fences the previous one."""
        self.broker_bounced = False
        self.producer = self.clients.producer(self._retry(), self._on_client_error)
        return self.producer

    def renew_if_bounced(self) -> None:
        """Before a batch: serve the error callbacks; replace a producer a bounce left behind."""
        assert self.producer is not None
        self.producer.poll(0)
        if self.broker_bounced:
            log.warning("%s: the broker was unreachable; replacing the producer", self.name)
            self.new_producer()

    def begin(self) -> None:
        """``begin_transaction()`` on the current producer (prefer :meth:`transaction`)."""
        assert self.producer is not None
        self.producer.begin_transaction()

    @contextlib.contextmanager
    def transaction(
        self,
        writer: Callable[[], Writer],
        offsets: Offsets = None,
        before_commit: Callable[[], None] | None = None,
        send: Callable[[list[TopicPartition]], None] | None = None,
    ) -> Iterator[Writer]:
        """Begin a transaction, yield a writer into it, then send ``offsets`` and commit.

        Args:
            writer: makes the sealed writer into the open transaction.
            offsets: the consumer offsets committed with the outputs (see the
                module docstring).
            before_commit: called after the offsets are sent, just before the
                commit (fault seams).
            send: sends the offsets (default :meth:`send_offsets`; a stage
                passes its own ``_send_offsets``, which the relay overrides to
                hold offsets back at parked dispatches).

        Raises:
            KafkaException: as :meth:`send_offsets` and :meth:`commit`; the
                transaction is left open for :meth:`recover`.
        """
        self.begin()
        yield writer()
        chosen = offsets() if callable(offsets) else offsets
        if chosen:
            (send or self.send_offsets)(chosen)
        if before_commit is not None:
            before_commit()
        self.commit()

    def send_offsets(
        self, offsets: list[TopicPartition], timeout_s: float = 30.0, grace_s: float = 5.0
    ) -> None:
        """``send_offsets_to_transaction``, retriable errors retried for :data:`COMMIT_BUDGET_S`.

        Each try is :meth:`send_offsets_once`; an abortable or fatal error
        (a hung call included) is raised at once for :meth:`recover`.

        Raises:
            KafkaException: as :meth:`send_offsets_once`; a retriable error
                that lasted longer than the budget.
        """
        self._retry().call(
            lambda: self.send_offsets_once(offsets, timeout_s, grace_s),
            "send_offsets_to_transaction",
            give_up_after_s=COMMIT_BUDGET_S,
        )

    def send_offsets_once(
        self, offsets: list[TopicPartition], timeout_s: float = 30.0, grace_s: float = 5.0
    ) -> None:
        """``send_offsets_to_transaction`` with a deadline that holds.

        librdkafka can block in it past its timeout when the group coordinator
        goes away during the call (confluentinc/librdkafka#5456, seen here
        when the broker restarts mid-transaction). The call runs in a helper
        thread; if it has not returned ``timeout_s + grace_s`` seconds later, the
        producer is given up as fatally failed: :meth:`recover` replaces it,
        and the new producer's ``init_transactions`` fences the old one and
        aborts its transaction. The blocked producer is kept referenced
        (:attr:`abandoned`) so that it is not freed under the call.

        Raises:
            KafkaException: the call's own error, or a fatal ``_TIMED_OUT``.
        """
        assert self.producer is not None
        producer, metadata = self.producer, self._group_metadata()
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
                self.clients.component,
                timeout_s + grace_s,
            )
            self.abandoned.append(producer)
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "send_offsets_to_transaction hung", fatal=True)
            )
        if outcome[0] is not None:
            raise outcome[0]

    def prove_membership(self, offsets: list[TopicPartition]) -> None:
        """Put consumer offsets into the open transaction: a zombie's commit fails.

        A transaction that carries consumer offsets is checked by the group
        coordinator against the member's generation (KIP-447): a member
        that lost its partitions while paused or cut off (a zombie) gets
        ``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID`` or ``FENCED_INSTANCE_ID``
        and its transaction must abort. A transaction with no offsets is
        checked by nobody: another instance of the stage has its own
        transactional ID, so it does not fence this one's producer. A stage
        that commits something before its batch's own transaction (the
        relay's ``ATTEMPTED`` markers, after which a request may leave) calls
        this inside that transaction with where the batch starts; a stage
        proving its membership between batches passes its positions.

        Args:
            offsets: the offsets to commit (nothing is sent when empty).

        Raises:
            KafkaException: as :meth:`send_offsets` (abortable when this
                member is a zombie).
        """
        if offsets:
            self.send_offsets(offsets)

    def commit(self, budget_s: float = COMMIT_BUDGET_S) -> None:
        """Commit the open transaction, retrying retriable errors for ``budget_s`` seconds.

        A commit that still fails is treated as fatal (librdkafka does not
        implement KIP-890 yet; recreating the producer is the stop-gap its
        maintainers suggest): the new producer's ``init_transactions`` (which
        waits for a broker that is down) aborts the transaction or completes
        it, and fences this one; :meth:`recover` then has the state restored
        from what was committed.

        Raises:
            KafkaException: an abortable or fatal error, or a retriable one
                that lasted ``budget_s``.
        """
        assert self.producer is not None
        producer = self.producer
        started = time.monotonic()
        self._retry().call(
            lambda: producer.commit_transaction(10), "commit_transaction", give_up_after_s=budget_s
        )
        self.metrics.committed(time.monotonic() - started)

    def committed(self) -> None:
        """A batch's transaction committed: the run of aborts is over."""
        self.aborts_in_a_row = 0

    def recover(self, err: KafkaError) -> Recovery:
        """End a failed transaction: abort it, or replace the producer.

        An abortable error aborts the transaction (an abort that times out is
        resumed, for the commit's budget: once it returns, the transaction is
        aborted for certain); a refused abort, a fatal error, or a retriable
        one that outlasted its retry budget replaces the producer, and the
        transaction's fate is then unknown. Every Kafka call on the way rides
        out retriable errors, so a broker outage is waited out here too.

        Args:
            err: the error the transaction (or a Kafka call in it) failed with.

        Returns:
            :attr:`Recovery.REBUILD` after a certain abort,
            :attr:`Recovery.RESTORE` after a new producer.

        Raises:
            KafkaException: the new producer's ``init_transactions`` failed fatally.
        """
        assert self.producer is not None
        kind = classify(err)
        self.metrics.failed(kind, fenced=err.code() in FENCING_CODES)
        if err.code() in FENCING_CODES:
            log.warning("%s: %s: %s", self.name, FENCED_MARKER, err)
        if kind != "abortable":
            if kind == "retriable":
                log.warning(
                    "%s: %s still failing after its retry budget; new producer",
                    self.clients.component,
                    err,
                )
            else:
                log.error(
                    "%s: fatal producer error (%s); new producer", self.clients.component, err
                )
            self.new_producer()
            return Recovery.RESTORE
        log.warning("%s: transaction aborted: %s", self.clients.component, err)
        self.aborts_in_a_row += 1
        producer = self.producer
        try:
            self._retry().call(
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
                self.clients.component,
                abort_exc,
            )
            self.new_producer()
            return Recovery.RESTORE
        # A producer left behind by a broker restart can fail every
        # delivery for good without ever reporting the brokers down
        # (seen in game day g12): retrying with it aborts forever. A
        # failed delivery (librdkafka's _INCONSISTENT at commit) or a
        # second abort in a row therefore gets a new producer.
        failed_delivery = err.code() == KafkaError._INCONSISTENT
        if failed_delivery or self.aborts_in_a_row >= ABORTS_BEFORE_NEW_PRODUCER:
            log.warning(
                "%s: %s; replacing the producer",
                self.clients.component,
                "a delivery failed"
                if failed_delivery
                else f"{self.aborts_in_a_row} transactions in a row aborted",
            )
            self.new_producer()
        return Recovery.REBUILD

    def flush_and_forget(self) -> None:
        """Clean stop: flush the producer within ``stop_timeout_s`` and let it go."""
        if self.producer is None:
            return
        producer, self.producer = self.producer, None
        limit = self.clients.settings.stop_timeout_s
        bounded_call(
            lambda: producer.flush(min(10.0, limit)), limit, f"{self.name}: producer flush"
        )


def commit_alone(producer: Producer, body: Callable[[], None], timeout_s: float) -> None:
    """One transaction of its own on ``producer`` (no offsets): begin, ``body``, commit.

    For work outside a stage's loop (the journal heads published on a clean
    stop, :meth:`consumers.heads.HeadPublisher.publish_last`); the caller
    bounds it in time and handles its failure.

    Args:
        producer: a transactional producer with no transaction open.
        body: writes into the open transaction.
        timeout_s: how long the commit may take (seconds).

    Raises:
        KafkaException: the transaction failed (it is left to the broker or
            the next owner to abort).
    """
    producer.begin_transaction()
    body()
    producer.commit_transaction(timeout_s)
