"""Intents the processor has not consumed (the readers' side of ``intent_not_consumed``).

An operation has no recovery state until the processor consumes its intent:
while the processor is down, a published intent is on ``intents`` and
nowhere else. This module asks Kafka how far the processor's group has
committed on ``intents`` (its committed offsets) and where each partition
ends (the last stable offset), reads the records in between (their keys and
Kafka timestamps only: no seal is checked, nothing is decoded) and hands
them to the pure :func:`ledger.stranded.unconsumed`. The audit,
``ledger reconcile run``, the console (through
:func:`consumers.stranding.ledger_stranded`) and ``ledger state OP`` ask here.

Reading needs DESCRIBE on the processor's group and READ on ``intents``; a
principal refused either is logged with what it lacks and gets ``None``
(unknown), never an empty answer passed off as "all consumed".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import (
    OFFSET_BEGINNING,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not in its __all__
    AdminClient,
    OffsetSpec,
)

from consumers.runtime.records import kafka_timestamp_ms, key_text
from ledger.kafka import REFUSAL_CODES, admin_config, kafka_error, make_consumer
from ledger.settings import LedgerSettings
from ledger.stranded import PublishedIntent, Stranded, StrandedBounds, unconsumed
from ledger.topology import Topic

log = logging.getLogger(__name__)

#: Seconds one admin request, and the read of the unconsumed records, may take.
REQUEST_TIMEOUT_S = 15.0

#: Records read per partition at most (the oldest: they carry the oldest age).
MAX_PER_PARTITION = 10_000


def intent_offsets(
    settings: LedgerSettings,
) -> tuple[dict[int, int | None], dict[int, int]] | None:
    """The processor group's committed offset and the end of every ``intents`` partition.

    Returns:
        ``(committed, ends)``: partition -> committed offset (``None``: never
        committed) and partition -> last stable offset; ``None`` when Kafka
        did not answer or refused this principal (logged).
    """
    topic = settings.topic(Topic.INTENTS)
    parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
    group = f"{settings.topic_prefix}.processor"
    admin = AdminClient(admin_config(settings))
    try:
        answer = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, parts)], request_timeout=REQUEST_TIMEOUT_S
        )[group].result(timeout=REQUEST_TIMEOUT_S)
        committed: dict[int, int | None] = {
            tp.partition: tp.offset if tp.offset >= 0 else None
            for tp in answer.topic_partitions or []
        }
        ends = {
            tp.partition: int(future.result(timeout=REQUEST_TIMEOUT_S).offset)
            for tp, future in admin.list_offsets(
                {tp: OffsetSpec.latest() for tp in parts},  # type: ignore[no-untyped-call]  # untyped in confluent-kafka
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=REQUEST_TIMEOUT_S,
            ).items()
        }
    except (KafkaException, TimeoutError) as exc:
        err = kafka_error(exc)
        lacks = (
            f"this principal needs DESCRIBE on the group {group} and on {topic}"
            if err is not None and err.code() in REFUSAL_CODES
            else "Kafka did not answer in time"
        )
        log.warning(
            "stranded: intents the processor has not consumed are unknown: the processor "
            "group's offsets or the intents' ends were not read (%s: %r)",
            lacks,
            exc,
        )
        return None
    return committed, ends


def pending_intents(
    settings: LedgerSettings,
    committed: Mapping[int, int | None],
    ends: Mapping[int, int],
) -> list[PublishedIntent] | None:
    """Read the records on ``intents`` between each committed offset and its end.

    Args:
        settings: ledger settings.
        committed: partition -> committed offset (``None``: from the beginning).
        ends: partition -> last stable offset.

    Returns:
        Every record read (key, partition, offset, Kafka timestamp), at most
        :data:`MAX_PER_PARTITION` per partition; ``None`` when this principal
        may not read ``intents`` (logged).
    """
    topic = settings.topic(Topic.INTENTS)
    wanted = {p: end for p, end in ends.items() if end > (committed.get(p) or 0)}
    if not wanted:
        return []
    consumer = make_consumer(
        settings,
        f"{settings.topic_prefix}.reader",
        extra={"enable.partition.eof": True, "fetch.wait.max.ms": 50},
    )
    found: list[PublishedIntent] = []
    done: set[int] = set()
    try:
        starts = {p: committed.get(p) for p in wanted}
        consumer.assign(
            [
                TopicPartition(topic, p, OFFSET_BEGINNING if at is None else at)
                for p, at in starts.items()
            ]
        )
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        counts = dict.fromkeys(wanted, 0)
        while len(done) < len(wanted) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            part = msg.partition() or 0
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done.add(part)
                elif err.code() in REFUSAL_CODES:
                    log.warning(
                        "stranded: intents the processor has not consumed are unknown: this "
                        "principal may not read %s (%s)",
                        topic,
                        err.name(),
                    )
                    return None
                continue
            if part in done:
                continue
            offset = msg.offset() or 0
            if offset >= wanted[part]:
                done.add(part)
                continue
            found.append(PublishedIntent(key_text(msg), part, offset, kafka_timestamp_ms(msg)))
            counts[part] += 1
            if counts[part] >= MAX_PER_PARTITION:
                done.add(part)
    finally:
        consumer.close()
    return found


#: What an audit says when it could not look for intents the processor has not consumed.
UNCHECKED = (
    "intents the processor has not consumed were not looked for: Kafka refused this "
    "principal or did not answer (the ACL plan grants the auditor, reconciler and "
    "operator roles READ on intents and DESCRIBE on the processor's group; see the log)"
)


def not_consumed(
    settings: LedgerSettings,
    now_ms: int,
    bounds: StrandedBounds,
    unknown: list[str] | None = None,
) -> list[Stranded]:
    """The operations whose intent the processor has not consumed past the bound.

    Args:
        settings: ledger settings.
        now_ms: wall clock now (milliseconds; Kafka timestamps are on it).
        bounds: the stranded bounds (``intents_s``).
        unknown: when given, :data:`UNCHECKED` is added to it when Kafka could
            not tell (the audit's ``unverified``: its verdict is then NOT
            VERIFIED, never CLEAN by not looking).

    Returns:
        Oldest first (:func:`ledger.stranded.unconsumed`); empty when Kafka
        could not tell (logged, and said in ``unknown``).
    """
    offsets = intent_offsets(settings)
    intents = None if offsets is None else pending_intents(settings, *offsets)
    if offsets is None or intents is None:
        if unknown is not None:
            unknown.append(UNCHECKED)
        return []
    return unconsumed(intents, offsets[0], now_ms, bounds)


def awaiting_processor(settings: LedgerSettings, operation_id: str) -> bool:
    """Whether an intent of ``operation_id`` is on ``intents``, not yet consumed (any age).

    Returns:
        ``False`` also when Kafka could not tell (logged).
    """
    offsets = intent_offsets(settings)
    if offsets is None:
        return False
    committed, ends = offsets
    intents = pending_intents(settings, committed, ends) or []
    return any(i.operation_id == operation_id for i in intents)
