"""The topic-level configs of one ledger topic (pure: no broker).

:func:`topic_config` is what ``ledger topics create`` sets and what a
manifest carries; :func:`partitions_for` its partition count.
"""

from __future__ import annotations

# confluent_kafka.admin re-exports these without marking them public, so
# mypy --strict wants them from their defining modules.
from ledger.authn import legacy_accepted
from ledger.settings import LedgerSettings
from ledger.topics.replication import Replication
from ledger.topology import TopicSpec

#: Segment roll interval of compacted topics (ms): the active segment is never
#: compacted, so this bounds how much uncompacted history a state rebuild
#: reads, without creating a file set per minute on a busy ledger.
COMPACTED_SEGMENT_MS = 10 * 60 * 1000


#: The topic config that makes the broker stamp records, and the value sealed topics need.
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"


def broker_timed(spec: TopicSpec) -> bool:
    """Whether the broker stamps the topic's records (``LogAppendTime``).

    Topics a stage role seals do: their keys rotate, and the legacy shared
    key sealed them, so a reader must tell whether a record was appended by
    a key's not-after time (:mod:`ledger.rolekeys`). Other topics keep the
    producer's time (``outcomes``: a service seeks by the time it published).
    """
    return legacy_accepted(spec.auth)


def topic_config(spec: TopicSpec, replication: Replication | None = None) -> dict[str, str]:
    """The topic-level configs :func:`create_topics` sets for one spec.

    Args:
        spec: the topic.
        replication: the replication in force (:func:`replication_for`);
            ``None`` leaves ``min.insync.replicas`` out.

    Returns:
        ``cleanup.policy`` plus, for compacted topics, ``min.compaction.lag.ms=0``
        and ``segment.ms`` (:data:`COMPACTED_SEGMENT_MS`); for delete topics
        ``retention.ms`` (``-1`` = forever) and ``retention.bytes=-1``; always
        ``unclean.leader.election.enable=false``; for topics stage roles
        seal (:func:`broker_timed`) ``message.timestamp.type=LogAppendTime``
        (the broker stamps each
        record at append, which tells whether a retired key sealed it before
        its not-after time: :mod:`ledger.rolekeys`); and
        ``min.insync.replicas`` when ``replication`` is given. Values are
        strings, as Kafka takes them.
    """
    config: dict[str, str] = {"cleanup.policy": spec.cleanup}
    if spec.cleanup == "compact":
        config["min.compaction.lag.ms"] = "0"
        config["segment.ms"] = str(COMPACTED_SEGMENT_MS)
    else:
        config["retention.ms"] = str(spec.retention_ms)
        config["retention.bytes"] = "-1"
    config["unclean.leader.election.enable"] = "false"
    if broker_timed(spec):
        config[TIMESTAMP_TYPE] = LOG_APPEND_TIME
    if replication is not None:
        config["min.insync.replicas"] = str(replication.min_insync_replicas)
    return config


def partitions_for(settings: LedgerSettings, spec: TopicSpec) -> int:
    """Partition count of a topic: 1 for control topics, else ``settings.partitions``."""
    return 1 if spec.single_partition else settings.partitions
