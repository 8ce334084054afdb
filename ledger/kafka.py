"""Kafka client settings, defined once for every ledger client.

Every producer, consumer and admin client of the ledger starts from these
librdkafka dictionaries, so the settings correctness rests on live in one
place:

* producers are idempotent (``enable.idempotence``, ``acks=all``) and use the
  ``murmur2_random`` partitioner, which is the Java client's default, so that
  Java and Python producers put a key on the same partition (DESIGN.md
  "Kafka layout": co-partitioned topics);
* consumers read ``read_committed`` (KIP-98) unless a caller asks to see
  open transactions, never auto-commit, and start from the earliest offset;
* every client logs through :data:`CLIENT_LOGGER`, silent unless a handler is
  attached, with librdkafka ``debug`` contexts from ``LEDGER_KAFKA_DEBUG``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from ledger.settings import LedgerSettings

#: Logger for librdkafka's own log lines: "connection refused" while a broker
#: boots and the like go here instead of stderr. Silent unless you attach a
#: handler to it (``ledger processor`` does when ``LEDGER_KAFKA_DEBUG`` is set).
CLIENT_LOGGER = logging.getLogger("ledger.kafka.client")
CLIENT_LOGGER.addHandler(logging.NullHandler())
CLIENT_LOGGER.propagate = False

#: The partitioner of every ledger producer (the Java client's default).
PARTITIONER = "murmur2_random"

Isolation = Literal["read_committed", "read_uncommitted"]


def client_config(settings: LedgerSettings, **extra: Any) -> dict[str, Any]:
    """librdkafka settings every client of this ledger starts from.

    Args:
        settings: the process's settings (bootstrap list, debug contexts).
        **extra: librdkafka properties added on top (dotted names).

    Returns:
        ``bootstrap.servers``, ``logger`` (:data:`CLIENT_LOGGER`), ``debug``
        when ``kafka_debug`` is set, then ``extra``.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "logger": CLIENT_LOGGER,
    }
    if settings.kafka_debug:
        config["debug"] = settings.kafka_debug
    config.update(extra)
    return config


def producer_config(settings: LedgerSettings, **extra: Any) -> dict[str, Any]:
    """Settings of every ledger producer: idempotent, ``acks=all``, ``murmur2_random``.

    Args:
        settings: the process's settings.
        **extra: properties on top, e.g. ``{"transactional.id": ...}`` for a
            stage or ``{"linger.ms": 1}`` for a publisher.

    Returns:
        A librdkafka producer configuration.
    """
    config: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": PARTITIONER,
        "linger.ms": 5,
        "retry.backoff.ms": 10,
    }
    config.update(extra)
    return client_config(settings, **config)


def consumer_config(
    settings: LedgerSettings,
    group_id: str,
    *,
    isolation: Isolation = "read_committed",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Settings of every ledger consumer: no auto-commit, earliest, ``read_committed``.

    Args:
        settings: the process's settings.
        group_id: the consumer group (``group.id``); readers that never
            commit still need one for librdkafka.
        isolation: ``read_committed`` (the default: only committed
            transactions) or ``read_uncommitted`` (to see how far open
            transactions reach, e.g. while waiting for a previous owner).
        extra: librdkafka properties on top (dotted names), e.g.
            ``{"partition.assignment.strategy": "range"}``.

    Returns:
        A librdkafka consumer configuration.
    """
    config: dict[str, Any] = {
        "group.id": group_id,
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    config.update(extra or {})
    return client_config(settings, **config)
