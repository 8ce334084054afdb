"""Create, check, compact and export the ledger's topics (``{prefix}.{name}`` for each of TOPICS).

* :func:`create_topics` creates missing topics with the layout of
  :data:`ledger.topology.TOPICS`, replicated as :func:`replication_for`
  says, with ``unclean.leader.election.enable=false``; it never alters an
  existing topic.
* :func:`check_topics` refuses a layout that would make the ledger unsafe
  (retention, co-partitioning, replication), naming the fix for each topic;
  every component calls it at start-up.
* :func:`manifest` describes the layout without a broker, for GitOps
  (``ledger topics manifest``: JSON or Strimzi ``KafkaTopic`` resources).
* :func:`force_compaction` makes the broker compact the compacted topics now
  (demos, game days, tests).

Reserved key: :data:`COMPACTION_KEY` (``__compaction__``). ``force_compaction``
appends a tombstone with this key to every non-empty partition of each
compacted topic (Kafka only rolls a segment on append). **Every reader of a
compacted ledger topic must skip records whose key is** ``__compaction__``
(see :func:`is_reserved_key`); they carry no value and no meaning.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports these without marking them public, so
# mypy --strict wants them from their defining modules.
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from ledger.authn import legacy_accepted
from ledger.errors import BrokerError, BrokerUnavailableError, SettingsError, TopicConfigError
from ledger.kafka import admin_config, bootstrap_servers, consumer_config, producer_config
from ledger.settings import LedgerSettings
from ledger.topology import COMPACTION_KEY, TOPIC_BY_NAME, TOPICS, TopicSpec, is_reserved_key

#: Key of the roll-forcing tombstones written by :func:`force_compaction`.

#: Segment roll interval of compacted topics (ms): the active segment is never
#: compacted, so this bounds how much uncompacted history a state rebuild
#: reads, without creating a file set per minute on a busy ledger.
COMPACTED_SEGMENT_MS = 10 * 60 * 1000

#: Topic configs :func:`force_compaction` applies while it runs.
FORCE_COMPACTION_CONFIG: Mapping[str, str] = {
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}

_ADMIN_TIMEOUT_S = 30.0
#: Seconds after which force_compaction appends another roll tombstone.
_REROLL_S = 3.0
#: (topic, partition)
_TP = tuple[str, int]


def topic_names(settings: LedgerSettings, names: Iterable[str] | None = None) -> list[str]:
    """Full names (``{prefix}.{name}``) of the given short names, or of all TOPICS."""
    return [settings.topic(spec.name) for spec in _specs(names)]


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


# --------------------------------------------------------------------------- replication

#: Brokers from which a cluster gets the replicated defaults
#: (:data:`REPLICATED_FACTOR` replicas, :data:`REPLICATED_MIN_INSYNC` in sync).
REPLICATED_BROKERS = 3
#: Default replication factor on a cluster of :data:`REPLICATED_BROKERS` or more.
REPLICATED_FACTOR = 3
#: Default ``min.insync.replicas`` where the replication factor is 3 or more.
REPLICATED_MIN_INSYNC = 2


@dataclass(frozen=True)
class Replication:
    """How every ledger topic is replicated (see :func:`replication_for`).

    Attributes:
        replication_factor: replicas of each partition (1 or more).
        min_insync_replicas: the topics' ``min.insync.replicas``: replicas
            that must hold a record before an ``acks=all`` write succeeds.
        factor_origin: where the factor came from, for messages
            (``LEDGER_REPLICATION_FACTOR`` or the cluster's default).
        min_insync_origin: where ``min_insync_replicas`` came from.
    """

    replication_factor: int
    min_insync_replicas: int
    factor_origin: str
    min_insync_origin: str


def _brokers_text(count: int) -> str:
    return f"{count} broker" + ("" if count == 1 else "s")


def replication_for(settings: LedgerSettings, brokers: int) -> Replication:
    """The replication of the ledger's topics: the settings, else derived from the cluster.

    * replication factor: ``settings.replication_factor``
      (``LEDGER_REPLICATION_FACTOR``) when set; else 3 on a cluster of three
      or more brokers, 1 on a smaller one;
    * ``min.insync.replicas``: ``settings.min_insync_replicas``
      (``LEDGER_MIN_INSYNC_REPLICAS``) when set; else 2 when the factor is 3
      or more, 1 when it is 1 or 2.

    An explicit setting always wins. The broker count is of the brokers
    that answer metadata requests: create topics while every broker is up,
    or set both variables (advised in production).

    Args:
        settings: uses ``replication_factor`` and ``min_insync_replicas``.
        brokers: brokers of the cluster (:data:`REPLICATED_BROKERS` for a
            manifest of a replicated cluster, written without one).

    Returns:
        The :class:`Replication` in force.

    Raises:
        SettingsError: ``min.insync.replicas`` above the replication factor
            (every ``acks=all`` write would fail), or equal to it with a
            factor above 1 (writes would stop as soon as one replica is down).
    """
    if settings.replication_factor is not None:
        factor, factor_origin = settings.replication_factor, "LEDGER_REPLICATION_FACTOR"
    else:
        factor = REPLICATED_FACTOR if brokers >= REPLICATED_BROKERS else 1
        factor_origin = f"the default on a cluster of {_brokers_text(brokers)}"
    if settings.min_insync_replicas is not None:
        insync, insync_origin = settings.min_insync_replicas, "LEDGER_MIN_INSYNC_REPLICAS"
    else:
        insync = REPLICATED_MIN_INSYNC if factor >= 3 else 1
        insync_origin = f"the default for replication factor {factor}"
    if insync > factor or (factor > 1 and insync >= factor):
        effect = (
            "every acks=all write would fail"
            if insync > factor
            else "acks=all writes would stop as soon as one replica is down"
        )
        raise SettingsError(
            f"min.insync.replicas {insync} ({insync_origin}) with replication factor {factor} "
            f"({factor_origin}): {effect}; set LEDGER_MIN_INSYNC_REPLICAS to at most "
            f"{max(1, factor - 1)}, or raise LEDGER_REPLICATION_FACTOR",
            expected=f"min.insync.replicas <= {max(1, factor - 1)}",
            observed=insync,
        )
    return Replication(factor, insync, factor_origin, insync_origin)


def cluster_replication(settings: LedgerSettings) -> Replication:
    """The replication in force for the cluster the settings reach (one metadata request).

    Args:
        settings: uses the client settings, ``replication_factor`` and
            ``min_insync_replicas``.

    Returns:
        :func:`replication_for` with the number of brokers that answer.

    Raises:
        BrokerUnavailableError: the broker does not answer (retryable).
        SettingsError: as :func:`replication_for`.
    """
    return replication_for(settings, len(_cluster(_admin(settings), settings).brokers))


class TopicProblem(NamedTuple):
    """One reason :func:`check_topics` refuses a topic.

    Attributes:
        topic: full topic name (or names, comma-separated).
        config: the offending setting: a topic config (``cleanup.policy``,
            ``min.insync.replicas`` ...), ``partitions``,
            ``replication.factor`` or ``existence``.
        expected: what the ledger needs.
        observed: what the broker has.
        message: one line: what is wrong and how to fix it.
    """

    topic: str
    config: str
    expected: object
    observed: object
    message: str


def _kafka_configs(bootstrap: str, topic: str, key: str, value: str) -> str:
    return (
        f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
        f"--entity-name {topic} --add-config {key}={value}"
    )


def replication_problems(
    name: str,
    replicas: Mapping[int, Sequence[int]],
    config: Mapping[str, str | None],
    wanted: Replication,
    brokers: int,
    bootstrap: str,
) -> list[TopicProblem]:
    """What in one topic's replication could lose evidence or stop writes (pure).

    Refused: a replication factor (the smallest of its partitions) below
    ``wanted``; ``min.insync.replicas`` below ``wanted``, above the factor,
    or equal to it with a factor above 1; ``unclean.leader.election.enable``
    true (an out-of-sync replica could become leader and drop records
    acknowledged to ``acks=all`` producers). A factor above the wanted one
    is fine.

    Args:
        name: full topic name.
        replicas: partition -> replica broker IDs (from metadata).
        config: the topic's effective configs (``min.insync.replicas``,
            ``unclean.leader.election.enable``; a missing key reads as
            Kafka's default).
        wanted: the replication in force (:func:`replication_for`).
        brokers: brokers in the cluster, to say whether the factor can be
            raised at all.
        bootstrap: bootstrap servers, for the fix commands.

    Returns:
        One :class:`TopicProblem` per finding, each naming its fix: a
        ``kafka-configs.sh`` command, or ``kafka-reassign-partitions.sh``
        with the plan of :func:`reassignment_plan`.
    """
    problems: list[TopicProblem] = []
    factor = min((len(r) for r in replicas.values()), default=0)
    if factor < wanted.replication_factor:
        if brokers < wanted.replication_factor:
            fix = (
                f"the cluster has only {_brokers_text(brokers)}: add brokers and then replicas "
                f"(kafka-reassign-partitions.sh), or set LEDGER_REPLICATION_FACTOR={brokers}"
            )
        else:
            fix = "add replicas with kafka-reassign-partitions.sh and the plan below"
        problems.append(
            TopicProblem(
                name,
                "replication.factor",
                wanted.replication_factor,
                factor,
                f"{name}: replication factor {factor}, below {wanted.replication_factor} "
                f"({wanted.factor_origin}): a lost disk loses evidence; fix: {fix}",
            )
        )
    insync_raw = config.get("min.insync.replicas") or "1"
    try:
        insync = int(insync_raw)
    except ValueError:
        insync = 1
    blocking = insync > factor or (factor > 1 and insync >= factor)
    # Where replicas are missing and min.insync.replicas is what the ledger wants,
    # adding the replicas is the fix (reported above), not lowering it.
    if blocking and factor < wanted.replication_factor:
        blocking = insync > wanted.min_insync_replicas
    if factor > 0 and blocking:
        target = min(wanted.min_insync_replicas, max(1, factor - 1))
        effect = (
            "every acks=all write fails"
            if insync > factor
            else "acks=all writes stop as soon as one replica is down"
        )
        problems.append(
            TopicProblem(
                name,
                "min.insync.replicas",
                target,
                insync,
                f"{name}: min.insync.replicas={insync} with {factor} replicas: {effect}; "
                f"fix: {_kafka_configs(bootstrap, name, 'min.insync.replicas', str(target))}",
            )
        )
    elif insync < wanted.min_insync_replicas:
        after = " (after adding the replicas)" if factor < wanted.replication_factor else ""
        problems.append(
            TopicProblem(
                name,
                "min.insync.replicas",
                wanted.min_insync_replicas,
                insync,
                f"{name}: min.insync.replicas={insync}, below {wanted.min_insync_replicas} "
                f"({wanted.min_insync_origin}): a write acknowledged by {insync} replica(s) "
                f"can be lost with them; fix{after}: "
                + _kafka_configs(
                    bootstrap, name, "min.insync.replicas", str(wanted.min_insync_replicas)
                ),
            )
        )
    unclean = (config.get("unclean.leader.election.enable") or "false").strip().lower()
    if unclean == "true":
        problems.append(
            TopicProblem(
                name,
                "unclean.leader.election.enable",
                "false",
                unclean,
                f"{name}: unclean.leader.election.enable=true lets an out-of-sync replica "
                "become leader and drop acknowledged evidence; fix: "
                + _kafka_configs(bootstrap, name, "unclean.leader.election.enable", "false"),
            )
        )
    return problems


def reassignment_plan(
    replicas: Mapping[str, Mapping[int, Sequence[int]]],
    broker_ids: Sequence[int],
    replication_factor: int,
) -> dict[str, Any]:
    """A ``kafka-reassign-partitions.sh`` plan that raises partitions to a replication factor.

    Each partition keeps its replicas, in order (the preferred leader
    stays), and gains the missing ones from the other brokers, taken in
    turn so that new replicas spread over the cluster. Partitions that
    already have enough replicas are left out.

    Args:
        replicas: topic -> partition -> replica broker IDs.
        broker_ids: the cluster's broker IDs (at least ``replication_factor``).
        replication_factor: replicas each partition must have.

    Returns:
        ``{"version": 1, "partitions": [{"topic", "partition", "replicas"}, ...]}``,
        the JSON ``--reassignment-json-file`` takes.
    """
    ids = sorted(set(broker_ids))
    turn = 0
    partitions: list[dict[str, Any]] = []
    for topic in sorted(replicas):
        for part in sorted(replicas[topic]):
            current = list(replicas[topic][part])
            if len(current) >= replication_factor:
                continue
            others = [b for b in ids if b not in current]
            start = turn % len(others) if others else 0
            rotated = others[start:] + others[:start]
            added = rotated[: replication_factor - len(current)]
            turn += 1
            partitions.append({"topic": topic, "partition": part, "replicas": current + added})
    return {"version": 1, "partitions": partitions}


def create_topics(settings: LedgerSettings) -> list[str]:
    """Create every topic of TOPICS that does not exist yet (idempotent).

    Operation-keyed topics get ``settings.partitions`` partitions, control
    (single-partition) topics one; the replication factor and
    ``min.insync.replicas`` of :func:`replication_for` (from the settings,
    else from the number of brokers); configs from :func:`topic_config`,
    with ``unclean.leader.election.enable=false``. Existing topics are left
    exactly as they are (use :func:`check_topics` to validate them).

    Args:
        settings: uses ``bootstrap_servers``, ``topic_prefix``, ``partitions``,
            ``replication_factor`` and ``min_insync_replicas``.

    Returns:
        Full names of the topics this call created (empty when all existed).

    Raises:
        BrokerUnavailableError: the broker does not answer (retryable).
        BrokerError: the broker refuses a creation for a reason other than
            "already exists".
        SettingsError: the replication settings contradict each other, or
            the replication factor exceeds the brokers of the cluster.
    """
    admin = _admin(settings)
    cluster = _cluster(admin, settings)  # a broker that does not answer: say so, with the remedy
    brokers = len(cluster.brokers)
    replication = replication_for(settings, brokers)
    missing = [s for s in TOPICS if settings.topic(s.name) not in cluster.replicas]
    if missing and replication.replication_factor > brokers:
        raise SettingsError(
            f"replication factor {replication.replication_factor} "
            f"({replication.factor_origin}) but the cluster at {bootstrap_servers(settings)} "
            f"has {_brokers_text(brokers)}; set LEDGER_REPLICATION_FACTOR={brokers} or start "
            "the missing brokers",
            expected=f"at most {brokers}",
            observed=replication.replication_factor,
        )
    new = [
        NewTopic(
            settings.topic(spec.name),
            num_partitions=partitions_for(settings, spec),
            replication_factor=replication.replication_factor,
            config=topic_config(spec, replication),
        )
        for spec in missing
    ]
    if not new:
        return []
    futures = admin.create_topics(new, operation_timeout=_ADMIN_TIMEOUT_S)
    created: list[str] = []
    for name, future in futures.items():
        try:
            future.result(timeout=_ADMIN_TIMEOUT_S)
        except TimeoutError as exc:
            raise BrokerUnavailableError(
                f"Kafka at {bootstrap_servers(settings)} did not create {name} within "
                f"{_ADMIN_TIMEOUT_S:g} s; is the broker up (ledger broker status)?",
                expected="topic created",
                observed="no answer",
            ) from exc
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise BrokerError(
                f"could not create topic {name}: {err}; is the broker at "
                f"{bootstrap_servers(settings)} up (ledger broker status)?",
                expected="topic created",
                observed=str(err),
            ) from exc
        created.append(name)
    # Wait until the new topics are visible in metadata, so callers can use them at once.
    _wait_metadata(admin, settings, created)
    return [n for n in topic_names(settings) if n in created]


def check_topics(settings: LedgerSettings, names: Iterable[str] | None = None) -> list[str]:
    """Refuse to run on a topic layout that could lose evidence or break co-partitioning.

    Checks, for the given short names (default: all of TOPICS):

    * the topic exists (when none of them does: one line, "topics not
      created: run `ledger topics create`");
    * ``cleanup.policy`` is the spec's (``compact`` or ``delete``), never
      ``compact,delete``;
    * an audited ``delete`` topic keeps everything: ``retention.ms=-1`` and
      ``retention.bytes=-1``;
    * a control topic has exactly 1 partition; all operation-keyed topics
      have the same partition count, equal to ``settings.partitions``;
    * replication (:func:`replication_problems`): a replication factor at
      least :func:`replication_for`'s, ``min.insync.replicas`` at least its
      and below the factor, ``unclean.leader.election.enable`` false.

    One metadata request and one ``describe_configs`` for all topics, as
    before replication was checked: the broker count and replicas come from
    the metadata.

    Args:
        settings: uses ``bootstrap_servers``, ``topic_prefix``, ``partitions``,
            ``replication_factor`` and ``min_insync_replicas``.
        names: short topic names to check (e.g. ``["intents", "state"]``).

    Returns:
        Full names of the checked topics (all fine).

    Raises:
        TopicConfigError: one line per problem, each naming its topic and
            its fix (a command); its fields hold the first problem
            (``topic``, ``config``, ``expected``, ``observed``).
        SettingsError: the replication settings contradict each other.
        BrokerUnavailableError: the broker does not answer (retryable).
    """
    specs = _specs(names)
    admin = _admin(settings)
    cluster = _cluster(admin, settings)
    metadata = cluster.partitions()
    bootstrap = bootstrap_servers(settings)
    wanted = replication_for(settings, len(cluster.brokers))
    present = [spec for spec in specs if settings.topic(spec.name) in metadata]
    if not present:
        first = settings.topic(specs[0].name)
        raise TopicConfigError(
            "topics not created: run `ledger topics create` (no ledger topic with prefix "
            f"{settings.topic_prefix!r} at {bootstrap}; LEDGER_TOPIC_PREFIX names the prefix)",
            topic=first,
            config="existence",
            expected="exists",
            observed="missing",
        )
    problems: list[TopicProblem] = [
        TopicProblem(
            settings.topic(spec.name),
            "existence",
            "exists",
            "missing",
            f"{settings.topic(spec.name)} is missing (ledger topics create)",
        )
        for spec in specs
        if spec not in present
    ]

    configs = _describe(admin, [settings.topic(s.name) for s in present])
    under_replicated: dict[str, dict[int, tuple[int, ...]]] = {}
    for spec in present:
        name = settings.topic(spec.name)
        problems.extend(_config_problems(name, spec, configs[name]))
        found = replication_problems(
            name,
            cluster.replicas[name],
            {k: e.value for k, e in configs[name].items()},
            wanted,
            len(cluster.brokers),
            bootstrap,
        )
        problems.extend(found)
        if any(p.config == "replication.factor" for p in found):
            under_replicated[name] = cluster.replicas[name]

    keyed = {settings.topic(s.name): metadata[settings.topic(s.name)] for s in present}
    for spec in present:
        name = settings.topic(spec.name)
        if spec.single_partition and keyed[name] != 1:
            problems.append(
                TopicProblem(
                    name,
                    "partitions",
                    1,
                    keyed[name],
                    f"{name} has {keyed[name]} partitions, needs 1",
                )
            )
    counts = {
        settings.topic(s.name): keyed[settings.topic(s.name)]
        for s in present
        if not s.single_partition
    }
    if counts:
        common, _ = Counter(counts.values()).most_common(1)[0]
        odd = {n: c for n, c in counts.items() if c != common}
        for name, count in odd.items():
            problems.append(
                TopicProblem(
                    name,
                    "partitions",
                    common,
                    count,
                    f"{name} has {count} partitions but the other operation-keyed topics have "
                    f"{common}; co-partitioning is broken (recreate it with {common})",
                )
            )
        if not odd and common != settings.partitions:
            problems.append(
                TopicProblem(
                    ", ".join(sorted(counts)),
                    "partitions",
                    settings.partitions,
                    common,
                    f"the operation-keyed topics have {common} partitions but "
                    f"LEDGER_PARTITIONS is {settings.partitions}; set LEDGER_PARTITIONS={common}",
                )
            )
    if problems:
        first_problem = problems[0]
        lines = "\n".join(f"  - {p.message}" for p in problems)
        footer = (
            "Wrong configs: alter them back as each line says, or with any Kafka admin tool "
            "(`ledger topics list` shows the layout), or use a fresh LEDGER_TOPIC_PREFIX."
        )
        if any(p.config == "existence" for p in problems):
            footer = "Missing topics: run `ledger topics create`. " + footer
        if under_replicated and len(cluster.brokers) >= wanted.replication_factor:
            plan = reassignment_plan(under_replicated, cluster.brokers, wanted.replication_factor)
            footer += (
                "\nTo add the missing replicas, save this plan as replicas.json and run "
                f"kafka-reassign-partitions.sh --bootstrap-server {bootstrap} "
                "--reassignment-json-file replicas.json --execute (then the same with --verify):"
                f"\n{json.dumps(plan, separators=(',', ':'))}"
            )
        if any("kafka-" in p.message for p in problems):
            footer += (
                "\nOn a secured cluster, give the Kafka tools your client's Java properties "
                "with --command-config."
            )
        raise TopicConfigError(
            f"unsafe ledger topic layout for prefix {settings.topic_prefix!r}:\n{lines}\n" + footer,
            topic=first_problem.topic,
            config=first_problem.config,
            expected=first_problem.expected,
            observed=first_problem.observed,
        )
    return [settings.topic(s.name) for s in specs]


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
    admin = _admin(settings)
    cluster = _cluster(admin, settings)
    present = cluster.partitions()
    names = topic_names(settings)
    configs = _describe(admin, [n for n in names if n in present])
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


@dataclass(frozen=True)
class CompactionResult:
    """What :func:`force_compaction` did to one topic.

    Attributes:
        topic: full topic name.
        records_before: ledger records a reader saw before (reserved key excluded).
        records_after: ledger records in the closed segments after compaction.
        elapsed_s: seconds from forcing until compaction was observed.
    """

    topic: str
    records_before: int
    records_after: int
    elapsed_s: float


def force_compaction(
    settings: LedgerSettings,
    timeout_s: float = 60,
    names: Iterable[str] | None = None,
) -> list[CompactionResult]:
    """Make the broker's log cleaner compact every compacted ledger topic now.

    Contract:

    * On return, for every non-empty partition of each compacted topic, the
      records below the roll point (everything written before the call) hold
      **at most one record per key**: the latest value, or a tombstone that
      has not been purged yet. Records written concurrently by other
      producers may remain uncompacted; run it while writers are quiet.
    * It appends one tombstone with the reserved key ``__compaction__`` (see
      :data:`COMPACTION_KEY`) to every non-empty partition, possibly more if
      a roll has to be repeated. Readers must skip that key; it is itself
      compacted away by later runs.
    * Tombstones of real keys may be purged (``delete.retention.ms`` is
      100 ms while it runs), as a long-running cluster would do after a day.
    * The topic configs are restored afterwards (also on failure): values
      that were topic overrides are set back, the rest are deleted again.
    * Open transactions hold the cleaner (and read_committed readers) at the
      last stable offset, so a partition with a hanging transaction cannot be
      compacted past it; the call then times out.

    How: set :data:`FORCE_COMPACTION_CONFIG` on the topics, append the
    tombstone so that the active segment rolls (Kafka 4 rolls only on append,
    once ``segment.ms`` has passed), then re-read each partition up to the
    tombstone, polling until no key repeats; the roll is repeated every few
    seconds if needed. On the local broker (``log.cleaner.backoff.ms=500``)
    this takes about one to a few seconds; brokers with the default 15 s
    backoff take longer.

    Args:
        settings: uses ``bootstrap_servers`` and ``topic_prefix``.
        timeout_s: overall bound (seconds).
        names: short names of compacted topics (default: all compacted TOPICS).

    Returns:
        One :class:`CompactionResult` per compacted topic, in TOPICS order.

    Raises:
        TopicConfigError: a named topic is missing or is not a compacted topic.
        BrokerUnavailableError: the broker does not answer, or a read did not
            reach its end in time (retryable).
        BrokerError: compaction was not observed within ``timeout_s``
            (configs are restored all the same).
    """
    names = None if names is None else list(names)
    specs = [s for s in _specs(names) if s.cleanup == "compact"]
    if names is not None:
        bad = [s.name for s in _specs(names) if s.cleanup != "compact"]
        if bad:
            raise TopicConfigError(
                f"force_compaction only works on compacted topics; {bad} are not",
                topic=settings.topic(bad[0]),
                config="cleanup.policy",
                expected="compact",
                observed="delete",
            )
    topics = [settings.topic(s.name) for s in specs]
    admin = _admin(settings)
    metadata = _list_topics(admin, settings)
    missing = [t for t in topics if t not in metadata]
    if missing:
        raise TopicConfigError(
            f"cannot compact missing topics {missing}; run `ledger topics create`",
            topic=missing[0],
            config="existence",
            expected="exists",
            observed="missing",
        )
    start = time.monotonic()
    deadline = start + timeout_s
    original = _describe(admin, topics)
    try:
        _alter(
            admin, {t: {k: (v, True) for k, v in FORCE_COMPACTION_CONFIG.items()} for t in topics}
        )
        _wait_configs(admin, topics, FORCE_COMPACTION_CONFIG, deadline)
        parts = _non_empty_partitions(settings, topics, metadata)
        before = _read_keys(settings, dict.fromkeys(parts), deadline)
        return _compact(settings, topics, before, start, deadline)
    finally:
        restore: dict[str, dict[str, tuple[str | None, bool]]] = {}
        for topic in topics:
            restore[topic] = {}
            for key in FORCE_COMPACTION_CONFIG:
                entry = original[topic].get(key)
                if entry is not None and _is_topic_override(entry):
                    restore[topic][key] = (entry.value, True)
                else:
                    restore[topic][key] = (None, False)
        _alter(admin, restore)


# --------------------------------------------------------------------------- helpers


def _specs(names: Iterable[str] | None) -> list[TopicSpec]:
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


def _admin(settings: LedgerSettings) -> AdminClient:
    return AdminClient(admin_config(settings))


@dataclass(frozen=True)
class _Cluster:
    """What one metadata request says: broker IDs, and per topic partition -> replicas."""

    brokers: tuple[int, ...]
    replicas: dict[str, dict[int, tuple[int, ...]]]

    def partitions(self) -> dict[str, int]:
        return {name: len(parts) for name, parts in self.replicas.items()}


def _cluster(admin: AdminClient, settings: LedgerSettings) -> _Cluster:
    """One metadata request: the brokers that answer and every topic's replicas."""
    try:
        md = admin.list_topics(timeout=_ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap_servers(settings)} does not answer ({exc.args[0]}); start it "
            "with `ledger broker start` or set KAFKA_BOOTSTRAP_SERVERS / LEDGER_BOOTSTRAP_SERVERS "
            "(or bootstrap.servers in LEDGER_KAFKA_CONFIG_FILE)",
            expected="broker answering",
            observed=str(exc.args[0]),
        ) from exc
    return _Cluster(
        brokers=tuple(sorted(md.brokers)),
        replicas={
            name: {p: tuple(pm.replicas) for p, pm in t.partitions.items()}
            for name, t in md.topics.items()
            if t.error is None
        },
    )


def _list_topics(admin: AdminClient, settings: LedgerSettings) -> dict[str, int]:
    """Map topic name to partition count."""
    return _cluster(admin, settings).partitions()


def _wait_metadata(admin: AdminClient, settings: LedgerSettings, names: Sequence[str]) -> None:
    deadline = time.monotonic() + _ADMIN_TIMEOUT_S
    while names:
        known = _list_topics(admin, settings)
        if all(known.get(n, 0) > 0 for n in names):
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                f"created topics {list(names)} did not appear in metadata; see the broker log",
                expected="topics visible",
                observed="not visible",
            )
        time.sleep(0.05)


def _describe(admin: AdminClient, topics: Sequence[str]) -> dict[str, dict[str, ConfigEntry]]:
    if not topics:
        return {}
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, t) for t in topics], request_timeout=_ADMIN_TIMEOUT_S
    )
    out: dict[str, dict[str, ConfigEntry]] = {}
    for resource, future in futures.items():
        try:
            out[resource.name] = dict(future.result(timeout=_ADMIN_TIMEOUT_S))
        except KafkaException as exc:
            raise BrokerError(
                f"could not read the configs of {resource.name}: {exc.args[0]}",
                expected="topic configs",
                observed=str(exc.args[0]),
            ) from exc
        except TimeoutError as exc:  # no answer in time (a failover): worth trying again
            raise BrokerUnavailableError(
                f"reading the configs of {resource.name} got no answer in {_ADMIN_TIMEOUT_S} s",
                expected="topic configs",
                observed="no answer",
            ) from exc
    return out


def _alter(
    admin: AdminClient, changes: Mapping[str, Mapping[str, tuple[str | None, bool]]]
) -> None:
    """Apply ``{topic: {key: (value, set?)}}``; ``set? = False`` deletes the override."""
    resources = [
        ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(
                    key,
                    value,
                    incremental_operation=AlterConfigOpType.SET
                    if is_set
                    else AlterConfigOpType.DELETE,
                )
                for key, (value, is_set) in entries.items()
            ],
        )
        for topic, entries in changes.items()
        if entries
    ]
    if not resources:
        return
    futures = admin.incremental_alter_configs(resources, request_timeout=_ADMIN_TIMEOUT_S)
    for resource, future in futures.items():
        try:
            future.result(timeout=_ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerError(
                f"could not alter the configs of {resource.name}: {exc.args[0]}",
                expected="configs altered",
                observed=str(exc.args[0]),
            ) from exc


def _config_problems(
    name: str, spec: TopicSpec, config: Mapping[str, ConfigEntry]
) -> list[TopicProblem]:
    def value(key: str) -> str | None:
        entry = config.get(key)
        return None if entry is None else entry.value

    problems: list[TopicProblem] = []
    policy_raw = value("cleanup.policy") or ""
    policy = {p.strip() for p in policy_raw.split(",") if p.strip()}
    if policy == {"compact", "delete"}:
        problems.append(
            TopicProblem(
                name,
                "cleanup.policy",
                spec.cleanup,
                policy_raw,
                f"{name}: cleanup.policy={policy_raw} lets retention delete old segments"
                + (" (evidence auditors replay)" if spec.audited else "")
                + f"; set cleanup.policy={spec.cleanup}",
            )
        )
    elif policy != {spec.cleanup}:
        problems.append(
            TopicProblem(
                name,
                "cleanup.policy",
                spec.cleanup,
                policy_raw,
                f"{name}: cleanup.policy={policy_raw}, expected {spec.cleanup}",
            )
        )
    if spec.audited and "delete" in policy:
        for key in ("retention.ms", "retention.bytes"):
            if value(key) != "-1":
                problems.append(
                    TopicProblem(
                        name,
                        key,
                        "-1",
                        value(key),
                        f"{name}: {key}={value(key)} would delete evidence auditors replay; "
                        f"set {key}=-1",
                    )
                )
    if broker_timed(spec) and value(TIMESTAMP_TYPE) not in (None, LOG_APPEND_TIME):
        problems.append(
            TopicProblem(
                name,
                TIMESTAMP_TYPE,
                LOG_APPEND_TIME,
                value(TIMESTAMP_TYPE),
                f"{name}: {TIMESTAMP_TYPE}={value(TIMESTAMP_TYPE)} lets a writer choose its "
                "records' time, so a rotated key's not-after cannot be told (ledger.rolekeys); "
                f"set {TIMESTAMP_TYPE}={LOG_APPEND_TIME}",
            )
        )
    return problems


def _is_topic_override(entry: ConfigEntry) -> bool:
    """Tell whether a config value is set on the topic itself (not inherited)."""
    source: object = entry.source  # an int at run time, despite the annotation
    if isinstance(source, ConfigSource):
        source = source.value
    return source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


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
    from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

    from ledger.kafka import classify, kafka_error

    def retriable(exc: BaseException) -> bool:
        # a leader moving (e.g. just after the topics were created) is waited out
        err = kafka_error(exc)
        return err is not None and classify(err) == "retriable"

    specs = _specs(names)
    metadata = _cluster(_admin(settings), settings).partitions()
    present = [settings.topic(spec.name) for spec in specs if settings.topic(spec.name) in metadata]
    try:
        for attempt in Retrying(
            retry=retry_if_exception(retriable),
            stop=stop_after_delay(_ADMIN_TIMEOUT_S),
            wait=wait_random_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        ):
            with attempt:
                full = {topic for topic, _ in _non_empty_partitions(settings, present, metadata)}
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap_servers(settings)} does not say how many records the ledger "
            f"holds ({exc.args[0]}); try again once it answers",
            expected="watermarks",
            observed=str(exc.args[0]),
        ) from exc
    return [spec.name for spec in specs if settings.topic(spec.name) in full]


def _non_empty_partitions(
    settings: LedgerSettings, topics: Sequence[str], metadata: Mapping[str, int]
) -> list[_TP]:
    probe = Consumer(
        consumer_config(
            settings, f"ledger-compaction-probe-{uuid.uuid4().hex}", isolation="read_uncommitted"
        )
    )
    try:
        out: list[_TP] = []
        for topic in topics:
            for part in range(metadata[topic]):
                low, high = probe.get_watermark_offsets(
                    TopicPartition(topic, part), timeout=_ADMIN_TIMEOUT_S
                )
                if high > low:
                    out.append((topic, part))
        return out
    finally:
        probe.close()


def _read_keys(
    settings: LedgerSettings, limits: Mapping[_TP, int | None], deadline: float
) -> dict[_TP, list[bytes | None]]:
    """Read the keys of the committed records of some partitions, from the beginning.

    Args:
        settings: uses ``bootstrap_servers``.
        limits: per (topic, partition), the offset to stop before (exclusive),
            or None to read to the end.
        deadline: ``time.monotonic()`` bound.

    Returns:
        Keys in offset order per (topic, partition).

    Raises:
        BrokerUnavailableError: when the deadline passes (retryable).
        BrokerError: on a read error.
    """
    keys: dict[_TP, list[bytes | None]] = {tp: [] for tp in limits}
    if not limits:
        return keys
    consumer = Consumer(
        consumer_config(
            settings,
            f"ledger-compaction-check-{uuid.uuid4().hex}",
            extra={"enable.partition.eof": True, "fetch.wait.max.ms": 10},
        )
    )
    try:
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in limits])
        pending = set(limits)
        while pending:
            if time.monotonic() > deadline:
                raise BrokerUnavailableError(
                    f"reading {sorted(pending)} timed out; an open transaction may hold the "
                    "last stable offset",
                    expected="full read",
                    observed="timeout",
                )
            msg: Message | None = consumer.poll(0.2)
            if msg is None:
                continue
            topic, part, offset = msg.topic(), msg.partition(), msg.offset()
            if topic is None or part is None or (topic, part) not in pending:
                continue
            tp = (topic, part)
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(tp)
                    continue
                raise BrokerError(
                    f"reading {tp} failed: {err}", expected="records", observed=str(err)
                )
            limit = limits[tp]
            if offset is None:
                continue
            if limit is None or offset < limit:
                keys[tp].append(msg.key())
            if limit is not None and offset >= limit - 1:
                pending.discard(tp)
    finally:
        consumer.close()
    return keys


def _wait_configs(
    admin: AdminClient, topics: Sequence[str], wanted: Mapping[str, str], deadline: float
) -> None:
    while True:
        current = _describe(admin, topics)
        if all(
            current[t].get(k) is not None and current[t][k].value == v
            for t in topics
            for k, v in wanted.items()
        ):
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                "the forced compaction configs did not take effect in time",
                expected=dict(wanted),
                observed="old configs",
            )
        time.sleep(0.1)


def _roll(settings: LedgerSettings, parts: Iterable[_TP]) -> dict[_TP, int]:
    """Append a ``__compaction__`` tombstone to each partition; return their offsets."""
    # Not evidence: a tombstone on a reserved key, sent to an explicit partition.
    producer = Producer(producer_config(settings, **{"linger.ms": 0}))
    offsets: dict[_TP, int] = {}
    errors: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(str(err))
            return
        topic, part, offset = msg.topic(), msg.partition(), msg.offset()
        if topic is not None and part is not None and offset is not None:
            offsets[(topic, part)] = offset

    for topic, part in parts:
        producer.produce(
            topic, key=COMPACTION_KEY, value=None, partition=part, on_delivery=delivered
        )
    remaining = producer.flush(_ADMIN_TIMEOUT_S)
    if errors or remaining:
        raise BrokerError(
            f"could not append the roll tombstones: {errors or f'{remaining} undelivered'}",
            expected="tombstones delivered",
            observed=errors or remaining,
        )
    return offsets


def _compact(
    settings: LedgerSettings,
    topics: Sequence[str],
    before: Mapping[_TP, Sequence[bytes | None]],
    start: float,
    deadline: float,
) -> list[CompactionResult]:
    """Roll, then poll until every partition in ``before`` shows no repeated key."""
    todo = set(before)
    after: Counter[str] = Counter()
    done_at = {t: time.monotonic() for t in topics if not any(tp[0] == t for tp in todo)}
    while todo:
        marks = _roll(settings, todo)
        rolled_at = time.monotonic()
        # If the roll did not happen (config not applied to the log yet), roll again later.
        while todo and time.monotonic() - rolled_at < _REROLL_S:
            keys = _read_keys(settings, {tp: marks[tp] for tp in todo}, deadline)
            now = time.monotonic()
            for tp, part_keys in keys.items():
                if max(Counter(part_keys).values(), default=0) <= 1:
                    todo.discard(tp)
                    after[tp[0]] += sum(1 for k in part_keys if not is_reserved_key(k))
            for topic in topics:
                if topic not in done_at and not any(tp[0] == topic for tp in todo):
                    done_at[topic] = now
            if not todo:
                break
            if now > deadline:
                pending = sorted(todo)
                raise BrokerError(
                    f"compaction was not observed within the timeout for {pending}; check that "
                    "the broker's log cleaner runs (log.cleaner.enable, log.cleaner.backoff.ms, "
                    "its log) and that no transaction is left open, or raise the timeout",
                    expected="at most one record per key",
                    observed=pending,
                )
            time.sleep(0.2)
    return [
        CompactionResult(
            topic=t,
            records_before=sum(
                1 for tp, ks in before.items() if tp[0] == t for k in ks if not is_reserved_key(k)
            ),
            records_after=after[t],
            elapsed_s=round(done_at[t] - start, 3),
        )
        for t in topics
    ]
