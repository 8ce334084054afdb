"""The ledger's topics as the broker has them, and as a GitOps manifest would declare them.

:func:`describe_ledger_topics` asks the broker (``ledger topics list``);
:func:`manifest` and :func:`strimzi_topics` need none (``ledger topics manifest``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# confluent_kafka.admin re-exports these without marking them public, so
# mypy --strict wants them from their defining modules.
from confluent_kafka.admin._config import (
    ConfigEntry,
)

from ledger.settings import LedgerSettings
from ledger.topics.admin import admin_client, cluster_metadata, read_configs, topic_names
from ledger.topics.config import partitions_for, topic_config
from ledger.topics.replication import Replication
from ledger.topology import TOPICS, TopicSpec


@dataclass(frozen=True)
class TopicInfo:
    """One ledger topic as the broker has it (see :func:`describe_ledger_topics`).

    Attributes:
        name: full topic name.
        spec: its entry in TOPICS.
        partitions: partition count, or None when the topic does not exist.
        cleanup_policy: the topic's ``cleanup.policy`` (None when missing).
        retention_ms: the topic's ``retention.ms`` (None when missing).
        replication_factor: replicas of its least replicated partition
            (None when missing).
        min_insync_replicas: its ``min.insync.replicas`` (None when missing).
        unclean_leader_election: its ``unclean.leader.election.enable``
            (None when missing).
    """

    name: str
    spec: TopicSpec
    partitions: int | None
    cleanup_policy: str | None
    retention_ms: str | None
    replication_factor: int | None = None
    min_insync_replicas: str | None = None
    unclean_leader_election: str | None = None


def describe_ledger_topics(settings: LedgerSettings) -> list[TopicInfo]:
    """Describe every ledger topic for ``settings.topic_prefix``, in TOPICS order.

    Args:
        settings: uses ``bootstrap_servers`` and ``topic_prefix``.

    Returns:
        One :class:`TopicInfo` per spec; missing topics have ``partitions=None``.

    Raises:
        BrokerUnavailableError: the broker does not answer (retryable).
    """
    admin = admin_client(settings)
    cluster = cluster_metadata(admin, settings)
    present = cluster.partitions()
    names = topic_names(settings)
    configs = read_configs(admin, [n for n in names if n in present])
    out: list[TopicInfo] = []
    for spec, name in zip(TOPICS, names, strict=True):
        cfg = configs.get(name, {})

        def value(key: str, cfg: Mapping[str, ConfigEntry] = cfg) -> str | None:
            entry = cfg.get(key)
            return None if entry is None else entry.value

        replicas = cluster.replicas.get(name)
        out.append(
            TopicInfo(
                name=name,
                spec=spec,
                partitions=present.get(name),
                cleanup_policy=value("cleanup.policy"),
                retention_ms=value("retention.ms"),
                replication_factor=(
                    None
                    if replicas is None
                    else min((len(r) for r in replicas.values()), default=0)
                ),
                min_insync_replicas=value("min.insync.replicas"),
                unclean_leader_election=value("unclean.leader.election.enable"),
            )
        )
    return out


# --------------------------------------------------------------------------- manifest

#: API version of the Strimzi ``KafkaTopic`` resources :func:`strimzi_topics` writes.
STRIMZI_API_VERSION = "kafka.strimzi.io/v1beta2"


@dataclass(frozen=True)
class TopicLayout:
    """One ledger topic as :func:`create_topics` would create it (no broker involved).

    Attributes:
        name: full topic name (``{prefix}.{name}``).
        spec: its entry in TOPICS.
        partitions: partition count.
        replication_factor: replicas per partition.
        config: topic configs (:func:`topic_config`, with ``min.insync.replicas``).
    """

    name: str
    spec: TopicSpec
    partitions: int
    replication_factor: int
    config: Mapping[str, str]


def manifest(settings: LedgerSettings, replication: Replication) -> list[TopicLayout]:
    """The layout of every ledger topic, in TOPICS order, for GitOps tools.

    Pure: no broker is asked. ``ledger topics manifest`` prints it as JSON or
    as Strimzi ``KafkaTopic`` resources (:func:`strimzi_topics`).

    Args:
        settings: uses ``topic_prefix`` and ``partitions``.
        replication: the replication to write (:func:`replication_for`).

    Returns:
        One :class:`TopicLayout` per topic.
    """
    return [
        TopicLayout(
            name=settings.topic(spec.name),
            spec=spec,
            partitions=partitions_for(settings, spec),
            replication_factor=replication.replication_factor,
            config=topic_config(spec, replication),
        )
        for spec in TOPICS
    ]


def _typed(value: str) -> bool | int | str:
    """A config value as YAML should carry it: ``-1`` as a number, ``false`` as a boolean."""
    if value in ("true", "false"):
        return value == "true"
    if re.fullmatch(r"-?[0-9]+", value):
        return int(value)
    return value


def kubernetes_name(topic: str) -> str:
    """A Kubernetes resource name for a topic (``metadata.name`` of its ``KafkaTopic``).

    Lower-cased; characters other than ``a-z0-9.-`` become ``-``; trimmed to
    a leading and trailing alphanumeric; when that changed the name, a short
    hash of the topic is appended so that two topics never share a resource.

    Args:
        topic: the full topic name.

    Returns:
        A DNS-subdomain name of at most 253 characters.
    """
    name = re.sub(r"[^a-z0-9.-]", "-", topic.lower()).strip(".-")
    if name != topic:
        name = f"{name[:240]}-{hashlib.sha256(topic.encode()).hexdigest()[:8]}".strip(".-")
    return name[:253]


def strimzi_topics(
    layouts: Sequence[TopicLayout], cluster: str, namespace: str | None = None
) -> list[dict[str, Any]]:
    """Strimzi ``KafkaTopic`` resources for a layout (one per topic, as dictionaries).

    Args:
        layouts: from :func:`manifest`.
        cluster: the Strimzi ``Kafka`` resource's name (the
            ``strimzi.io/cluster`` label the Topic Operator selects on).
        namespace: ``metadata.namespace``; ``None`` leaves it to ``kubectl``.

    Returns:
        One resource per topic: ``apiVersion`` :data:`STRIMZI_API_VERSION`,
        ``kind: KafkaTopic``, ``metadata`` (``name`` from
        :func:`kubernetes_name`, the cluster label), ``spec`` (``topicName``,
        ``partitions``, ``replicas``, ``config`` with numbers and booleans
        typed).
    """
    out: list[dict[str, Any]] = []
    for layout in layouts:
        metadata: dict[str, Any] = {
            "name": kubernetes_name(layout.name),
            "labels": {"strimzi.io/cluster": cluster},
        }
        if namespace:
            metadata["namespace"] = namespace
        out.append(
            {
                "apiVersion": STRIMZI_API_VERSION,
                "kind": "KafkaTopic",
                "metadata": metadata,
                "spec": {
                    "topicName": layout.name,
                    "partitions": layout.partitions,
                    "replicas": layout.replication_factor,
                    "config": {k: _typed(v) for k, v in layout.config.items()},
                },
            }
        )
    return out
