"""Create, check and compact the ledger's topics (``{prefix}.{name}`` for each of TOPICS).

* :func:`create_topics` creates missing topics with the layout of
  :data:`ledger.topology.TOPICS`; it never alters an existing topic.
* :func:`check_topics` refuses a layout that would make the ledger unsafe;
  every component calls it at start-up.
* :func:`force_compaction` makes the broker compact the compacted topics now
  (demos, game days, tests).

Reserved key: :data:`COMPACTION_KEY` (``__compaction__``). ``force_compaction``
appends a tombstone with this key to every non-empty partition of each
compacted topic (Kafka only rolls a segment on append). **Every reader of a
compacted ledger topic must skip records whose key is** ``__compaction__``
(see :func:`is_reserved_key`); they carry no value and no meaning.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

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

from ledger.errors import BrokerError, BrokerUnavailableError, TopicConfigError
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


def topic_config(spec: TopicSpec) -> dict[str, str]:
    """The topic-level configs :func:`create_topics` sets for one spec.

    Args:
        spec: the topic.

    Returns:
        ``cleanup.policy`` plus, for compacted topics, ``min.compaction.lag.ms=0``
        and ``segment.ms`` (:data:`COMPACTED_SEGMENT_MS`); for delete topics
        ``retention.ms`` (``-1`` = forever) and ``retention.bytes=-1``.
    """
    config: dict[str, str] = {"cleanup.policy": spec.cleanup}
    if spec.cleanup == "compact":
        config["min.compaction.lag.ms"] = "0"
        config["segment.ms"] = str(COMPACTED_SEGMENT_MS)
    else:
        config["retention.ms"] = str(spec.retention_ms)
        config["retention.bytes"] = "-1"
    return config


def partitions_for(settings: LedgerSettings, spec: TopicSpec) -> int:
    """Partition count of a topic: 1 for control topics, else ``settings.partitions``."""
    return 1 if spec.single_partition else settings.partitions


def create_topics(settings: LedgerSettings) -> list[str]:
    """Create every topic of TOPICS that does not exist yet (idempotent).

    Operation-keyed topics get ``settings.partitions`` partitions, control
    (single-partition) topics one; replication factor 1; configs from
    :func:`topic_config`. Existing topics are left exactly as they are (use
    :func:`check_topics` to validate them).

    Args:
        settings: uses ``bootstrap_servers``, ``topic_prefix`` and ``partitions``.

    Returns:
        Full names of the topics this call created (empty when all existed).

    Raises:
        BrokerUnavailableError: the broker does not answer (retryable).
        BrokerError: the broker refuses a creation for a reason other than
            "already exists".
    """
    admin = _admin(settings)
    _list_topics(admin, settings)  # a broker that does not answer: say so, with the remedy
    new = [
        NewTopic(
            settings.topic(spec.name),
            num_partitions=partitions_for(settings, spec),
            replication_factor=1,
            config=topic_config(spec),
        )
        for spec in TOPICS
    ]
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

    * the topic exists;
    * ``cleanup.policy`` is the spec's (``compact`` or ``delete``), never
      ``compact,delete``;
    * an audited ``delete`` topic keeps everything: ``retention.ms=-1`` and
      ``retention.bytes=-1``;
    * a control topic has exactly 1 partition; all operation-keyed topics
      have the same partition count, equal to ``settings.partitions``.

    Args:
        settings: uses ``bootstrap_servers``, ``topic_prefix``, ``partitions``.
        names: short topic names to check (e.g. ``["intents", "state"]``).

    Returns:
        Full names of the checked topics (all fine).

    Raises:
        TopicConfigError: naming every offending topic and config; its fields
            hold the first problem (``topic``, ``config``, ``expected``,
            ``observed``).
        BrokerUnavailableError: the broker does not answer (retryable).
    """
    specs = _specs(names)
    admin = _admin(settings)
    metadata = _list_topics(admin, settings)
    problems: list[tuple[str, str, object, object, str]] = []
    present: list[TopicSpec] = []
    for spec in specs:
        name = settings.topic(spec.name)
        if name not in metadata:
            problems.append(
                (
                    name,
                    "existence",
                    "exists",
                    "missing",
                    f"{name} is missing (ledger topics create)",
                )
            )
        else:
            present.append(spec)

    configs = _describe(admin, [settings.topic(s.name) for s in present])
    for spec in present:
        name = settings.topic(spec.name)
        problems.extend(_config_problems(name, spec, configs[name]))

    keyed = {settings.topic(s.name): metadata[settings.topic(s.name)] for s in present}
    for spec in present:
        name = settings.topic(spec.name)
        if spec.single_partition and keyed[name] != 1:
            problems.append(
                (
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
                (
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
                (
                    ", ".join(sorted(counts)),
                    "partitions",
                    settings.partitions,
                    common,
                    f"the operation-keyed topics have {common} partitions but "
                    f"LEDGER_PARTITIONS is {settings.partitions}; set LEDGER_PARTITIONS={common}",
                )
            )
    if problems:
        topic, config, expected, observed, _ = problems[0]
        lines = "\n".join(f"  - {p[4]}" for p in problems)
        raise TopicConfigError(
            f"unsafe ledger topic layout for prefix {settings.topic_prefix!r}:\n{lines}\n"
            "Missing topics: run `ledger topics create`. Wrong configs: alter them back with "
            "any Kafka admin tool (policy and retention of every topic are listed by "
            "`ledger topics list`), or use a fresh LEDGER_TOPIC_PREFIX.",
            topic=topic,
            config=config,
            expected=expected,
            observed=observed,
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
    """

    name: str
    spec: TopicSpec
    partitions: int | None
    cleanup_policy: str | None
    retention_ms: str | None


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
    present = _list_topics(admin, settings)
    names = topic_names(settings)
    configs = _describe(admin, [n for n in names if n in present])
    out: list[TopicInfo] = []
    for spec, name in zip(TOPICS, names, strict=True):
        cfg = configs.get(name, {})
        policy = cfg.get("cleanup.policy")
        retention = cfg.get("retention.ms")
        out.append(
            TopicInfo(
                name=name,
                spec=spec,
                partitions=present.get(name),
                cleanup_policy=None if policy is None else policy.value,
                retention_ms=None if retention is None else retention.value,
            )
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


def _list_topics(admin: AdminClient, settings: LedgerSettings) -> dict[str, int]:
    """Map topic name to partition count."""
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
    return {name: len(t.partitions) for name, t in md.topics.items() if t.error is None}


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
) -> list[tuple[str, str, object, object, str]]:
    def value(key: str) -> str | None:
        entry = config.get(key)
        return None if entry is None else entry.value

    problems: list[tuple[str, str, object, object, str]] = []
    policy_raw = value("cleanup.policy") or ""
    policy = {p.strip() for p in policy_raw.split(",") if p.strip()}
    if policy == {"compact", "delete"}:
        problems.append(
            (
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
            (
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
                    (
                        name,
                        key,
                        "-1",
                        value(key),
                        f"{name}: {key}={value(key)} would delete evidence auditors replay; "
                        f"set {key}=-1",
                    )
                )
    return problems


def _is_topic_override(entry: ConfigEntry) -> bool:
    """Tell whether a config value is set on the topic itself (not inherited)."""
    source: object = entry.source  # an int at run time, despite the annotation
    if isinstance(source, ConfigSource):
        source = source.value
    return source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


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
