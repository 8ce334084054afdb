"""The admin helpers every topic operation shares: one metadata request, config reads, watermarks.

Each call opens its own :class:`~confluent_kafka.admin.AdminClient` from the
settings (:func:`admin_client`) and waits at most :data:`ADMIN_TIMEOUT_S`
seconds per request. A broker that does not answer raises
:class:`~ledger.errors.BrokerUnavailableError` naming how to start or reach it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import (
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports these without marking them public, so
# mypy --strict wants them from their defining modules.
from confluent_kafka.admin._config import (
    ConfigEntry,
    ConfigResource,
)
from confluent_kafka.admin._resource import ResourceType
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from ledger.errors import BrokerError, BrokerUnavailableError, TopicConfigError
from ledger.kafka import (
    admin_config,
    bootstrap_servers,
    classify,
    kafka_error,
    make_consumer,
)
from ledger.settings import LedgerSettings
from ledger.topology import TOPIC_BY_NAME, TOPICS, TopicSpec

#: Seconds each admin request (and each watermark query) may take.
ADMIN_TIMEOUT_S = 30.0

#: (topic, partition)
TP = tuple[str, int]


def topic_names(settings: LedgerSettings, names: Iterable[str] | None = None) -> list[str]:
    """Full names (``{prefix}.{name}``) of the given short names, or of all TOPICS."""
    return [settings.topic(spec.name) for spec in specs_for(names)]


def specs_for(names: Iterable[str] | None) -> list[TopicSpec]:
    """The specs of the given short names, in TOPICS order (all of TOPICS for ``None``).

    Raises:
        TopicConfigError: a name is not a ledger topic (the message lists the known ones).
    """
    if names is None:
        return list(TOPICS)
    wanted = list(names)
    unknown = [n for n in wanted if n not in TOPIC_BY_NAME]
    if unknown:
        raise TopicConfigError(
            f"unknown ledger topic name(s) {unknown}; known: {sorted(TOPIC_BY_NAME)}",
            topic=unknown[0],
            config="name",
            expected=sorted(TOPIC_BY_NAME),
            observed=unknown,
        )
    return [spec for spec in TOPICS if spec.name in wanted]


def admin_client(settings: LedgerSettings) -> AdminClient:
    """An admin client with the settings' client properties (:func:`ledger.kafka.admin_config`)."""
    return AdminClient(admin_config(settings))


@dataclass(frozen=True)
class Cluster:
    """What one metadata request says: broker IDs, and per topic partition -> replicas."""

    brokers: tuple[int, ...]
    replicas: dict[str, dict[int, tuple[int, ...]]]

    def partitions(self) -> dict[str, int]:
        """Partition count per topic name."""
        return {name: len(parts) for name, parts in self.replicas.items()}


def cluster_metadata(admin: AdminClient, settings: LedgerSettings) -> Cluster:
    """One metadata request: the brokers that answer and every topic's replicas."""
    try:
        md = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap_servers(settings)} does not answer ({exc.args[0]}); start it "
            "with `ledger broker start` or set KAFKA_BOOTSTRAP_SERVERS / LEDGER_BOOTSTRAP_SERVERS "
            "(or bootstrap.servers in LEDGER_KAFKA_CONFIG_FILE)",
            expected="broker answering",
            observed=str(exc.args[0]),
        ) from exc
    return Cluster(
        brokers=tuple(sorted(md.brokers)),
        replicas={
            name: {p: tuple(pm.replicas) for p, pm in t.partitions.items()}
            for name, t in md.topics.items()
            if t.error is None
        },
    )


def partition_counts(admin: AdminClient, settings: LedgerSettings) -> dict[str, int]:
    """Map topic name to partition count."""
    return cluster_metadata(admin, settings).partitions()


def wait_metadata(admin: AdminClient, settings: LedgerSettings, names: Sequence[str]) -> None:
    """Poll metadata until every topic of ``names`` has partitions (bounded).

    Raises:
        BrokerError: a topic did not appear in time.
    """
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while names:
        known = partition_counts(admin, settings)
        if all(known.get(n, 0) > 0 for n in names):
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                f"created topics {list(names)} did not appear in metadata; see the broker log",
                expected="topics visible",
                observed="not visible",
            )
        time.sleep(0.05)


def read_configs(admin: AdminClient, topics: Sequence[str]) -> dict[str, dict[str, ConfigEntry]]:
    """Every config entry of each topic, by topic and key (one ``describe_configs`` request).

    Raises:
        BrokerError: the broker refused to describe a topic.
        BrokerUnavailableError: no answer within :data:`ADMIN_TIMEOUT_S` (retryable).
    """
    if not topics:
        return {}
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, t) for t in topics], request_timeout=ADMIN_TIMEOUT_S
    )
    out: dict[str, dict[str, ConfigEntry]] = {}
    for resource, future in futures.items():
        try:
            out[resource.name] = dict(future.result(timeout=ADMIN_TIMEOUT_S))
        except KafkaException as exc:
            raise BrokerError(
                f"could not read the configs of {resource.name}: {exc.args[0]}",
                expected="topic configs",
                observed=str(exc.args[0]),
            ) from exc
        except TimeoutError as exc:  # no answer in time (a failover): worth trying again
            raise BrokerUnavailableError(
                f"reading the configs of {resource.name} got no answer in {ADMIN_TIMEOUT_S} s",
                expected="topic configs",
                observed="no answer",
            ) from exc
    return out


def non_empty_topics(settings: LedgerSettings, names: Iterable[str] | None = None) -> list[str]:
    """The ledger topics that hold records: what a reader checks before it says "empty".

    A partition holds records when its high watermark is above its low one
    (read uncommitted, so a transaction's markers count too: a topic only
    aborted transactions wrote is not empty either).

    Args:
        settings: uses ``bootstrap_servers`` and ``topic_prefix``.
        names: short topic names (default: all of TOPICS); missing topics
            are left out.

    Returns:
        Short names of the topics that hold records, in TOPICS order.

    Raises:
        BrokerUnavailableError: the broker does not answer (retryable).
    """

    def retriable(exc: BaseException) -> bool:
        # a leader moving (e.g. just after the topics were created) is waited out
        err = kafka_error(exc)
        return err is not None and classify(err) == "retriable"

    specs = specs_for(names)
    metadata = cluster_metadata(admin_client(settings), settings).partitions()
    present = [settings.topic(spec.name) for spec in specs if settings.topic(spec.name) in metadata]
    try:
        for attempt in Retrying(
            retry=retry_if_exception(retriable),
            stop=stop_after_delay(ADMIN_TIMEOUT_S),
            wait=wait_random_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        ):
            with attempt:
                full = {topic for topic, _ in non_empty_partitions(settings, present, metadata)}
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap_servers(settings)} does not say how many records the ledger "
            f"holds ({exc.args[0]}); try again once it answers",
            expected="watermarks",
            observed=str(exc.args[0]),
        ) from exc
    return [spec.name for spec in specs if settings.topic(spec.name) in full]


def non_empty_partitions(
    settings: LedgerSettings, topics: Sequence[str], metadata: Mapping[str, int]
) -> list[TP]:
    """The (topic, partition) pairs of ``topics`` whose high watermark is above the low one."""
    probe = make_consumer(
        settings, f"ledger-compaction-probe-{uuid.uuid4().hex}", isolation="read_uncommitted"
    )
    try:
        out: list[TP] = []
        for topic in topics:
            for part in range(metadata[topic]):
                low, high = probe.get_watermark_offsets(
                    TopicPartition(topic, part), timeout=ADMIN_TIMEOUT_S
                )
                if high > low:
                    out.append((topic, part))
        return out
    finally:
        probe.close()
