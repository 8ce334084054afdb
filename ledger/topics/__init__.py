"""Create, check, describe and export the ledger's topics (``{prefix}.{name}`` for each of TOPICS).

* :func:`create_topics` creates missing topics with the layout of
  :data:`ledger.topology.TOPICS`, replicated as :func:`replication_for`
  says, with ``unclean.leader.election.enable=false``; it never alters an
  existing topic (:mod:`ledger.topics.check`).
* :func:`check_topics` refuses a layout that would make the ledger unsafe
  (retention, co-partitioning, replication), naming the fix for each topic;
  every component calls it at start-up (:mod:`ledger.topics.check`).
* :func:`manifest` describes the layout without a broker, for GitOps
  (``ledger topics manifest``: JSON or Strimzi ``KafkaTopic`` resources;
  :mod:`ledger.topics.describe`).
* Replication (:mod:`ledger.topics.replication`) and each topic's configs
  (:mod:`ledger.topics.config`) are pure; :mod:`ledger.topics.admin` holds
  the broker requests they share.
* Forcing compaction now (``ledger topics compact``, for demos, game days
  and tests) is the testbed's (``testbed.compaction``): nothing in the
  product needs it.

Reserved key: :data:`COMPACTION_KEY` (``__compaction__``). **Every reader of a
compacted ledger topic must skip records whose key is** ``__compaction__``
(see :func:`is_reserved_key`); they carry no value and no meaning.
"""

from __future__ import annotations

from ledger.topics.admin import non_empty_topics, topic_names
from ledger.topics.check import check_topics, cluster_replication, create_topics
from ledger.topics.config import (
    COMPACTED_SEGMENT_MS,
    LOG_APPEND_TIME,
    TIMESTAMP_TYPE,
    broker_timed,
    partitions_for,
    topic_config,
)
from ledger.topics.describe import (
    STRIMZI_API_VERSION,
    TopicInfo,
    TopicLayout,
    describe_ledger_topics,
    kubernetes_name,
    manifest,
    strimzi_topics,
)
from ledger.topics.replication import (
    REPLICATED_BROKERS,
    REPLICATED_FACTOR,
    REPLICATED_MIN_INSYNC,
    Replication,
    TopicProblem,
    reassignment_plan,
    replication_for,
    replication_problems,
)
from ledger.topology import COMPACTION_KEY, is_reserved_key

__all__ = [
    "COMPACTED_SEGMENT_MS",
    "COMPACTION_KEY",
    "LOG_APPEND_TIME",
    "REPLICATED_BROKERS",
    "REPLICATED_FACTOR",
    "REPLICATED_MIN_INSYNC",
    "STRIMZI_API_VERSION",
    "TIMESTAMP_TYPE",
    "Replication",
    "TopicInfo",
    "TopicLayout",
    "TopicProblem",
    "broker_timed",
    "check_topics",
    "cluster_replication",
    "create_topics",
    "describe_ledger_topics",
    "is_reserved_key",
    "kubernetes_name",
    "manifest",
    "non_empty_topics",
    "partitions_for",
    "reassignment_plan",
    "replication_for",
    "replication_problems",
    "strimzi_topics",
    "topic_config",
    "topic_names",
]
