"""Making, replacing and closing the Kafka clients of the ledger.

The one place where a stage's ``confluent_kafka.Consumer`` or ``Producer``
is constructed; every other consumer of the product (the reader,
:mod:`consumers.runtime.reader`, the tables' followers, probes of partition
ends, the status tools, the publisher's waiter) comes from
:func:`ledger.kafka.make_consumer`, a plain ``read_committed`` (or
``read_uncommitted``) client of a group that never joins it:

* :class:`Clients` – the clients of one stage instance: its transactional
  producer (``init_transactions`` ridden out through the stage's retry), its
  group member (static membership, ``range`` assignment), and a plain client
  of its group. A test injects a misbehaving client by giving a
  :class:`Clients` its own ``new_consumer``/``new_producer`` constructors
  (``Stage(settings, clients=Clients(...))``);
* :func:`bounded_call` – a close (or any call) that may hang on an
  unreachable broker, waited for at most a bounded time
  (confluent-kafka-python issue #1667, "consumer hangs on consumer.close()").
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

from consumers.retry import KafkaRetry
from consumers.twins import client_id, fenced_out, fenced_out_text
from ledger.kafka import ConsumerMaker, classify, make_consumer, producer_config
from ledger.settings import LedgerSettings

log = logging.getLogger(__name__)

#: Builds a consumer from its librdkafka settings (``confluent_kafka.Consumer``).
#: Builds a producer from its librdkafka settings (``confluent_kafka.Producer``).
ProducerMaker = Callable[[dict[str, Any]], Producer]


def bounded_call(call: Callable[[], object], timeout_s: float, what: str) -> bool:
    """Run ``call`` in a daemon thread and wait at most ``timeout_s`` seconds for it.

    For client closes that can block without end on an unreachable broker
    (confluent-kafka-python issue #1667). A call still running after the
    time is left behind in its daemon thread (it cannot keep the process
    alive) and logged; an exception it raises is logged, never raised.

    Args:
        call: what to run (no arguments).
        timeout_s: seconds to wait for it.
        what: what it is, for the log lines.

    Returns:
        True when it returned (or raised) in time.
    """
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - a close that fails is only logged
            log.warning("%s failed: %s", what, exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"bounded {what}", daemon=True).start()
    if done.wait(timeout_s):
        return True
    log.error("%s did not return within %.0f s; leaving it behind", what, timeout_s)
    return False


class ClientReports:
    """librdkafka's error callbacks of a stage's clients, and the suspicion they raise.

    Client errors can arrive late (queued while Kafka was away) or be
    passing (one dropped connection); a retriable one only sets
    :attr:`suspect`, and the loop then checks that Kafka answers (only a call
    that fails starts an outage, so the log has one WARNING per outage).

    Args:
        name: ``{component}-{instance}``, for log lines.
        bounced: called on ``_ALL_BROKERS_DOWN``: the next batch gets a new
            producer (librdkafka's idempotent producer can wait for ever
            draining requests lost with the connection once the broker is back).
    """

    def __init__(self, name: str, bounced: Callable[[], None]) -> None:
        self.name = name
        self.component = name.rsplit("-", 1)[0]
        self._bounced = bounced
        #: a client reported a retriable error since the loop last checked Kafka.
        self.suspect = False

    def producer_error(self, err: KafkaError) -> None:
        """The producer's ``error_cb``."""
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._bounced()
        if classify(err) == "retriable":
            self.suspect_kafka("producer", err)
        else:
            log.warning("%s: Kafka client error: %s", self.component, err)

    def consumer_error(self, err: KafkaError) -> None:
        """The member's ``error_cb``."""
        if fenced_out(err):  # another live process has this name (consumers.twins)
            log.error("%s", fenced_out_text(self.name, err))
        elif classify(err) == "retriable":
            self.suspect_kafka("consumer", err)
        else:
            log.warning("%s: Kafka consumer error: %s", self.component, err)

    def suspect_kafka(self, client: str, err: KafkaError) -> None:
        """A client reported a retriable error: the loop checks that Kafka answers."""
        log.debug("%s: %s reported %s; checking that Kafka answers", self.component, client, err)
        self.suspect = True


class Clients:
    """The Kafka clients of one stage instance, made afresh whenever one is replaced.

    Args:
        settings: ledger settings.
        component: the stage (``processor``, ``authority``, ``relay`` ...).
        instance: its instance name.
        new_consumer: consumer constructor (default ``confluent_kafka.Consumer``;
            a test passes a misbehaving double).
        new_producer: producer constructor (default ``confluent_kafka.Producer``).
    """

    def __init__(
        self,
        settings: LedgerSettings,
        component: str,
        instance: str,
        *,
        new_consumer: ConsumerMaker = Consumer,
        new_producer: ProducerMaker = Producer,
    ) -> None:
        self.settings = settings
        self.component = component
        self.instance = instance
        self.group_id = f"{settings.topic_prefix}.{component}"
        #: stable across restarts, so a restarted instance fences its zombie.
        self.transactional_id = f"{settings.topic_prefix}.{component}.{instance}"
        self._new_consumer = new_consumer
        self._new_producer = new_producer

    @property
    def name(self) -> str:
        """``{component}-{instance}``, for log lines."""
        return f"{self.component}-{self.instance}"

    def producer(self, retry: KafkaRetry, on_error: Callable[[KafkaError], None]) -> Producer:
        """A new transactional producer, its ``init_transactions`` done.

        ``init_transactions`` fences the previous producer of the
        transactional ID and completes or aborts its open transaction. A
        broker that is down or restarting is waited for (``retry``).

        Raises:
            KafkaException: a fatal error (not authorised, fenced).
        """
        producer = self._new_producer(
            producer_config(
                self.settings,
                **{
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": self.settings.transaction_timeout_ms,
                    "error_cb": on_error,
                },
            )
        )
        retry.call(lambda: producer.init_transactions(30), "init_transactions")
        return producer

    def member(self, on_error: Callable[[KafkaError], None], extra: Mapping[str, Any]) -> Consumer:
        """The stage's member of its group (subscribe it to join).

        Args:
            on_error: librdkafka's error callback.
            extra: more librdkafka settings (the metrics' statistics).
        """
        return make_consumer(
            self.settings,
            self.group_id,
            new_consumer=self._new_consumer,
            extra={
                # Names the process too, so that `ledger status` can tell two
                # processes given one instance name apart (consumers.twins).
                "client.id": client_id(self.component, self.instance, os.getpid()),
                # Static membership (KIP-345): a restarted instance takes its
                # predecessor's place at once instead of waiting for its
                # session to time out.
                "group.instance.id": f"{self.component}-{self.instance}",
                # Co-partitioned inputs: partition i of every topic together.
                "partition.assignment.strategy": "range",
                "fetch.wait.max.ms": 50,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 1000,
                "max.poll.interval.ms": 300000,
                "error_cb": on_error,
                **extra,
            },
        )

    def group_client(self) -> Consumer:
        """A plain ``read_committed`` client of the stage's group (it never joins it).

        ``OffsetFetch`` needs no membership: it asks the committed offsets
        afresh when the member's own asks are stuck; it also asks partition
        ends and reads one partition for the fetch check.
        """
        return make_consumer(self.settings, self.group_id, new_consumer=self._new_consumer)

    def close(self, client: Any, what: str) -> bool:
        """Close ``client`` within ``stop_timeout_s`` (:func:`bounded_call`).

        Returns:
            True when the close returned in time.
        """
        return bounded_call(client.close, self.settings.stop_timeout_s, f"{self.name}: {what}")
