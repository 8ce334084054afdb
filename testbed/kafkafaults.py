"""Faults a game day injects through Kafka itself (game-day format v3).

* :func:`reset_offsets`: a stage's consumer group loses its committed
  offsets while the stage is down, as offset retention (``offsets.retention.minutes``)
  or an operator with ``kafka-consumer-groups --reset-offsets`` would do it;
* :func:`alter_topic_config`: a topic's configuration changes under the
  ledger (e.g. a retention set on an audited topic).

Both are Kafka admin requests, the same an administrator sends; the stages
learn of them only as a real deployment would (their next start, their next
read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Literal

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

# Re-exported by confluent_kafka.admin without being marked public (as in ledger.topics).
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from consumers.stages import STAGES
from ledger.errors import LedgerError, TopicConfigError
from ledger.kafka import admin_config, consumer_config
from ledger.settings import LedgerSettings
from ledger.topics import check_topics
from testbed.harness import watermarks

log = logging.getLogger(__name__)

#: Seconds an admin request is given, and how long a reset waits for the
#: group to empty: a member killed by SIGKILL stays in the group until its
#: session times out (10 s for the stages).
ADMIN_TIMEOUT_S = 30.0

ResetTo = Literal["earliest", "latest", "deleted"]


def reset_offsets(
    settings: LedgerSettings, component: str, to: ResetTo, timeout_s: float = ADMIN_TIMEOUT_S
) -> dict[str, int]:
    """Reset or delete the committed offsets of ``component``'s consumer group.

    The group is ``{topic_prefix}.{component}``; its input partitions are the
    component's inputs (:data:`consumers.stages.STAGES`) on every partition.
    Kafka refuses both requests while the group has members, so the request
    is repeated (a dead member leaves at its session timeout) until
    ``timeout_s``.

    Args:
        settings: the ledger's settings (bootstrap, prefix, partitions).
        component: a stage, e.g. ``relay``; every instance of it must be down.
        to: ``earliest`` (each partition's low watermark: the first record
            retention left), ``latest`` (its last stable offset: whatever the
            group had not read is skipped) or ``deleted`` (the group is
            deleted with its offsets, as offset retention deletes an empty
            group's; the stage then starts where ``auto.offset.reset`` says).

    Returns:
        ``"topic[partition]" -> offset`` set (empty for ``deleted``).

    Raises:
        LedgerError: an unknown component, or Kafka still refused the request
            after ``timeout_s`` (the message has its last answer: a group that
            still has a live member must be stopped first).
    """
    if component not in STAGES:
        raise LedgerError(f"unknown component {component!r}; one of {sorted(STAGES)}")
    group = f"{settings.topic_prefix}.{component}"
    tps = [
        TopicPartition(settings.topic(t), p)
        for t in STAGES[component].inputs
        for p in range(settings.partitions)
    ]
    targets = {} if to == "deleted" else _targets(settings, tps, to)
    admin = AdminClient(admin_config(settings))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if to == "deleted":
                _delete_group(admin, group)
            else:
                request = ConsumerGroupTopicPartitions(
                    group,
                    [TopicPartition(t, p, off) for (t, p), off in sorted(targets.items())],
                )
                for future in admin.alter_consumer_group_offsets([request]).values():
                    _check_partitions(future.result(timeout=ADMIN_TIMEOUT_S))
            return {f"{t}[{p}]": off for (t, p), off in sorted(targets.items())}
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise LedgerError(
                    f"could not reset the offsets of group {group} to {to} in {timeout_s:g} s: "
                    f"{exc.args[0]}; every instance of {component} must be down (a live or "
                    "paused member keeps the group until its session times out)"
                ) from exc
            log.info("offsets of %s not reset yet (%s); asking again", group, exc.args[0])
            time.sleep(0.5)


def _check_partitions(result: ConsumerGroupTopicPartitions) -> None:
    """Raise the first partition's error: Kafka answers an alter per partition, not as a whole."""
    for tp in result.topic_partitions or []:
        if tp.error is not None:
            raise KafkaException(tp.error)


def _delete_group(admin: AdminClient, group: str) -> None:
    for future in admin.delete_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S).values():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            if "GROUP_ID_NOT_FOUND" in str(exc.args[0]):
                return  # never committed anything: nothing to lose
            raise


def _targets(
    settings: LedgerSettings, tps: list[TopicPartition], to: ResetTo
) -> dict[tuple[str, int], int]:
    """Offsets to reset to: each partition's low watermark, or its last stable offset."""
    from confluent_kafka import Consumer

    reader = Consumer(consumer_config(settings, f"{settings.topic_prefix}.gameday-offsets"))
    try:
        out = {}
        for tp in tps:
            low, high = watermarks(reader, tp, ADMIN_TIMEOUT_S)
            out[(tp.topic, tp.partition)] = low if to == "earliest" else high
        return out
    finally:
        reader.close()


def alter_topic_config(
    settings: LedgerSettings,
    topic: str,
    config: Mapping[str, str | int | bool],
    timeout_s: float = ADMIN_TIMEOUT_S,
) -> dict[str, str]:
    """Set topic configs on one ledger topic, and wait until the broker reports them.

    Args:
        settings: the ledger's settings.
        topic: the topic's short name (``journal``).
        config: Kafka topic config -> value (booleans as ``true``/``false``).
        timeout_s: how long the change may take to show (seconds).

    Returns:
        The configs as set (strings).

    Raises:
        LedgerError: the broker refused a config (its message names it) or
            did not report the new values within ``timeout_s``.
    """
    full = settings.topic(topic)
    values = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in config.items()}
    admin = AdminClient(admin_config(settings))
    resource = ConfigResource(
        ResourceType.TOPIC,
        full,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in values.items()
        ],
    )
    try:
        for future in admin.incremental_alter_configs(
            [resource], request_timeout=ADMIN_TIMEOUT_S
        ).values():
            future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise LedgerError(f"topic_config on {topic}: the broker refused it: {exc.args[0]}") from exc
    deadline = time.monotonic() + timeout_s
    seen: dict[str, str | None] = {}
    while time.monotonic() < deadline:
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, full)])
        entries = next(iter(described.values())).result(timeout=ADMIN_TIMEOUT_S)
        seen = {k: (entries[k].value if k in entries else None) for k in values}
        if seen == values:
            return values
        time.sleep(0.2)
    raise LedgerError(
        f"topic_config on {topic}: the broker still reports {seen} after {timeout_s:g} s, "
        f"not {values}"
    )


def topic_layout_problems(settings: LedgerSettings) -> list[str]:
    """What :func:`ledger.topics.check_topics` refuses in the ledger's topic layout, one line each.

    The check every stage runs at start and every command (``ledger audit``,
    ``ledger status``) runs first: an empty list when the layout is safe.

    Raises:
        BrokerUnavailableError: the broker does not answer.
    """
    try:
        check_topics(settings)
    except TopicConfigError as exc:
        lines = exc.message.splitlines()
        problems = [line.removeprefix("  - ") for line in lines if line.startswith("  - ")]
        return problems or [exc.message]
    return []
