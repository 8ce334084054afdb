"""Make the broker compact the compacted ledger topics now (demos, game days, tests).

The testbed's, not the product's: the ledger never compacts on demand.

Reserved key: :data:`~ledger.topology.COMPACTION_KEY` (``__compaction__``).
:func:`force_compaction` appends a tombstone with this key to every
non-empty partition of each compacted topic (Kafka only rolls a segment on
append). **Every reader of a compacted ledger topic must skip records whose
key is** ``__compaction__`` (see :func:`~ledger.topology.is_reserved_key`);
they carry no value and no meaning.
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

from ledger.errors import BrokerError, BrokerUnavailableError, TopicConfigError
from ledger.kafka import (
    consumer_config,
    producer_config,
)
from ledger.settings import LedgerSettings
from ledger.topics.admin import (
    ADMIN_TIMEOUT_S,
    TP,
    admin_client,
    non_empty_partitions,
    partition_counts,
    read_configs,
    specs_for,
)
from ledger.topology import COMPACTION_KEY, is_reserved_key

#: Topic configs :func:`force_compaction` applies while it runs.
FORCE_COMPACTION_CONFIG: Mapping[str, str] = {
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}


#: Seconds after which force_compaction appends another roll tombstone.
_REROLL_S = 3.0


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
    specs = [s for s in specs_for(names) if s.cleanup == "compact"]
    if names is not None:
        bad = [s.name for s in specs_for(names) if s.cleanup != "compact"]
        if bad:
            raise TopicConfigError(
                f"force_compaction only works on compacted topics; {bad} are not",
                topic=settings.topic(bad[0]),
                config="cleanup.policy",
                expected="compact",
                observed="delete",
            )
    topics = [settings.topic(s.name) for s in specs]
    admin = admin_client(settings)
    metadata = partition_counts(admin, settings)
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
    original = read_configs(admin, topics)
    try:
        _alter(
            admin, {t: {k: (v, True) for k, v in FORCE_COMPACTION_CONFIG.items()} for t in topics}
        )
        _wait_configs(admin, topics, FORCE_COMPACTION_CONFIG, deadline)
        parts = non_empty_partitions(settings, topics, metadata)
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
    futures = admin.incremental_alter_configs(resources, request_timeout=ADMIN_TIMEOUT_S)
    for resource, future in futures.items():
        try:
            future.result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerError(
                f"could not alter the configs of {resource.name}: {exc.args[0]}",
                expected="configs altered",
                observed=str(exc.args[0]),
            ) from exc


def _is_topic_override(entry: ConfigEntry) -> bool:
    """Tell whether a config value is set on the topic itself (not inherited)."""
    source: object = entry.source  # an int at run time, despite the annotation
    if isinstance(source, ConfigSource):
        source = source.value
    return source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def _read_keys(
    settings: LedgerSettings, limits: Mapping[TP, int | None], deadline: float
) -> dict[TP, list[bytes | None]]:
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
    keys: dict[TP, list[bytes | None]] = {tp: [] for tp in limits}
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
        current = read_configs(admin, topics)
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


def _roll(settings: LedgerSettings, parts: Iterable[TP]) -> dict[TP, int]:
    """Append a ``__compaction__`` tombstone to each partition; return their offsets."""
    # Not evidence: a tombstone on a reserved key, sent to an explicit partition.
    producer = Producer(producer_config(settings, **{"linger.ms": 0}))
    offsets: dict[TP, int] = {}
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
    remaining = producer.flush(ADMIN_TIMEOUT_S)
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
    before: Mapping[TP, Sequence[bytes | None]],
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
