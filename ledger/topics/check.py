"""Create the ledger's topics, and refuse to run on a layout that could lose evidence.

:func:`create_topics` creates the missing topics and never alters an existing
one; :func:`check_topics` (every component calls it at start-up) names each
problem with its fix.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping

from confluent_kafka import (
    KafkaError,
    KafkaException,
)

# confluent_kafka.admin re-exports these without marking them public, so
# mypy --strict wants them from their defining modules.
from confluent_kafka.admin._config import (
    ConfigEntry,
)
from confluent_kafka.cimpl import NewTopic

from ledger.errors import BrokerError, BrokerUnavailableError, SettingsError, TopicConfigError
from ledger.kafka import (
    bootstrap_servers,
)
from ledger.settings import LedgerSettings
from ledger.topics.admin import (
    ADMIN_TIMEOUT_S,
    admin_client,
    cluster_metadata,
    read_configs,
    specs_for,
    topic_names,
    wait_metadata,
)
from ledger.topics.config import (
    LOG_APPEND_TIME,
    TIMESTAMP_TYPE,
    broker_timed,
    partitions_for,
    topic_config,
)
from ledger.topics.replication import (
    Replication,
    TopicProblem,
    brokers_text,
    reassignment_plan,
    replication_for,
    replication_problems,
)
from ledger.topology import TOPICS, TopicSpec


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
    return replication_for(
        settings, len(cluster_metadata(admin_client(settings), settings).brokers)
    )


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
    admin = admin_client(settings)
    cluster = cluster_metadata(
        admin, settings
    )  # a broker that does not answer: say so, with the remedy
    brokers = len(cluster.brokers)
    replication = replication_for(settings, brokers)
    missing = [s for s in TOPICS if settings.topic(s.name) not in cluster.replicas]
    if missing and replication.replication_factor > brokers:
        raise SettingsError(
            f"replication factor {replication.replication_factor} "
            f"({replication.factor_origin}) but the cluster at {bootstrap_servers(settings)} "
            f"has {brokers_text(brokers)}; set LEDGER_REPLICATION_FACTOR={brokers} or start "
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
    futures = admin.create_topics(new, operation_timeout=ADMIN_TIMEOUT_S)
    created: list[str] = []
    for name, future in futures.items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
        except TimeoutError as exc:
            raise BrokerUnavailableError(
                f"Kafka at {bootstrap_servers(settings)} did not create {name} within "
                f"{ADMIN_TIMEOUT_S:g} s; is the broker up (ledger broker status)?",
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
    wait_metadata(admin, settings, created)
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
    specs = specs_for(names)
    admin = admin_client(settings)
    cluster = cluster_metadata(admin, settings)
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

    configs = read_configs(admin, [settings.topic(s.name) for s in present])
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
