"""The ledger's topics: names, keys, cleanup policies (pure data, no I/O).

Every operation-keyed topic is co-partitioned (same partition count, same
``murmur2_random`` partitioner), so partition *i* of each holds the same
operations and one consumer of a ``range``-assigned group owns them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Cleanup = Literal["compact", "delete"]


class Topic(StrEnum):
    """The ledger's topics by short name: the one place a topic's name is spelt.

    A member is its short name (``Topic.INTENTS == "intents"``), so it goes
    wherever a short name does (:meth:`ledger.settings.LedgerSettings.topic`,
    dictionary keys, f-strings); the full name is ``{prefix}.{name}``.
    """

    INTENTS = "intents"
    APPROVALS = "approvals"
    APPROVAL_USES = "approval-uses"
    ADMISSION_REQUESTS = "admission-requests"
    ADMISSIONS = "admissions"
    DISPATCHES = "dispatches"
    RECEIPTS = "receipts"
    READBACKS = "readbacks"
    CLAIMS = "claims"
    DISPOSITIONS = "dispositions"
    STATE = "state"
    JOURNAL = "journal"
    HEADS = "heads"
    RECOVERY_RECEIPTS = "recovery-receipts"
    RECONCILIATION = "reconciliation"
    COMPENSATION_TALLY = "compensation-tally"
    OUTCOMES = "outcomes"
    OPERATING_EVENTS = "operating-events"
    POLICY = "policy"


@dataclass(frozen=True)
class TopicSpec:
    """One ledger topic.

    Attributes:
        name: short name; the full name is ``{prefix}.{name}``.
        key: what the record key is (``operation ID``, ``approval ID``, ...).
        cleanup: ``compact`` (latest value per key is kept, forever) or
            ``delete`` (kept ``retention_ms``; ``-1`` means forever).
        retention_ms: for ``delete`` topics, ``-1`` (no time limit) or a limit
            in milliseconds; only topics nobody replays may have a limit.
        audited: auditors replay this topic from the beginning, so nothing in
            it may ever be deleted by retention.
        single_partition: a control topic (one partition, read whole by every
            instance) rather than an operation-keyed, co-partitioned one.
        writers: who writes it (prose, for ``ledger topics list`` and the docs).
        roles: the writer roles, one entry each (``("relay", "reconcilers")``).
        tables: the components that rebuild a table from this topic (read
            whole). Such a topic must have one writer role: compaction keeps
            only the latest record of a key, so a second writer's record
            would erase the first's evidence (DESIGN.md "Kafka layout"; a
            test holds every entry to it). The tables of authority
            (``approvals``, ``approval-uses``, ``policy``) are never
            compacted: Kafka's cleaner does not check seals, so a forged
            tombstone or a replayed genuine record, refused by every reader,
            would still make compaction delete the authentic record under
            it (a use, a revocation, the policy in force).
        auth: the key roles whose seal a reader accepts on this topic's
            records (:mod:`ledger.authn`), one per writer role: a stage
            role's own key (``processor``, ``relay``, ``reconciler``,
            ``resumer``), ``authority`` (the kernel's signature), ``outcome``
            (the processor's outcome key, which a service verifies with its
            public half and no secret), ``operator`` or ``reviewer`` (a
            person's signature); empty for ``intents``, which services
            publish unsealed (the approval is what carries authority,
            DESIGN.md "Trust boundary"). ``stage`` (the default) names the
            legacy deployment key alone, which verifies only records of
            earlier releases: a new topic must name its writer's key role
            (a unit test holds every topic to it).
    """

    name: str
    key: str
    cleanup: Cleanup
    retention_ms: int = -1
    audited: bool = True
    single_partition: bool = False
    writers: str = ""
    roles: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    auth: tuple[str, ...] = ("stage",)

    def __post_init__(self) -> None:
        # The short name as a plain str (a Topic member's repr names the enum).
        object.__setattr__(self, "name", str(self.name))


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(
        Topic.INTENTS,
        "operation ID",
        "compact",
        writers="services (LedgerPublisher)",
        roles=("services",),
        auth=(),
    ),
    TopicSpec(
        Topic.APPROVALS,
        "approval ID",
        "delete",
        writers="review systems (grants, revocations)",
        roles=("review systems",),
        tables=("authority kernel", "relay"),
        auth=("reviewer", "operator"),
    ),
    TopicSpec(
        Topic.APPROVAL_USES,
        "approval ID",
        "delete",
        writers="authority kernel only",
        roles=("authority kernel",),
        tables=("authority kernel",),
        auth=("authority",),
    ),
    TopicSpec(
        Topic.ADMISSION_REQUESTS,
        "approval ID",
        "delete",
        retention_ms=7 * 24 * 3600 * 1000,
        audited=False,
        writers="processor",
        roles=("processor",),
        auth=("processor",),
    ),
    TopicSpec(
        Topic.ADMISSIONS,
        "operation ID",
        "compact",
        writers="authority kernel",
        roles=("authority kernel",),
        auth=("authority",),
    ),
    TopicSpec(
        Topic.DISPATCHES,
        "operation ID",
        "compact",
        writers="processor (the outbox)",
        roles=("processor",),
        auth=("processor",),
    ),
    TopicSpec(
        Topic.RECEIPTS,
        "operation ID",
        "compact",
        writers="relay",
        roles=("relay",),
        auth=("relay",),
        tables=("relay",),
    ),
    TopicSpec(
        Topic.READBACKS,
        "operation ID",
        "compact",
        writers="relay, reconcilers",
        roles=("relay", "reconcilers"),
        auth=("relay", "reconciler"),
    ),
    TopicSpec(
        Topic.CLAIMS,
        "operation ID",
        "compact",
        writers="resumers (ledger claim) and the processor (claiming what it restored)",
        roles=("resumers", "processor"),
        auth=("resumer", "processor"),
    ),
    TopicSpec(
        Topic.DISPOSITIONS,
        "operation ID",
        "compact",
        writers="operators (ledger reconcile dispose)",
        roles=("operators",),
        auth=("operator",),
    ),
    TopicSpec(
        Topic.STATE,
        "operation ID",
        "compact",
        writers="processor only",
        roles=("processor",),
        auth=("processor",),
        tables=("processor",),
    ),
    TopicSpec(
        Topic.JOURNAL,
        "operation ID",
        "delete",
        retention_ms=-1,
        writers="processor only",
        roles=("processor",),
        auth=("processor",),
    ),
    TopicSpec(
        Topic.HEADS,
        "'journal:{partition}'",
        "delete",
        retention_ms=-1,
        single_partition=True,
        writers="processor only (the head of each journal partition's hash chain, "
        "also handed to a witness outside Kafka)",
        roles=("processor",),
        auth=("processor",),
    ),
    TopicSpec(
        Topic.RECOVERY_RECEIPTS,
        "operation ID",
        "compact",
        writers="processor",
        roles=("processor",),
        auth=("processor",),
    ),
    TopicSpec(
        Topic.RECONCILIATION,
        "operation ID",
        "compact",
        writers="processor",
        roles=("processor",),
        auth=("processor",),
    ),
    TopicSpec(
        Topic.COMPENSATION_TALLY,
        "operation ID",
        "delete",
        retention_ms=7 * 24 * 3600 * 1000,
        audited=False,
        writers="processor (a request or release keyed by the original, whose owner "
        "decides it; the verdict keyed by the compensation)",
        roles=("processor",),
        auth=("processor",),
    ),
    TopicSpec(
        Topic.OUTCOMES,
        "operation ID",
        "delete",
        retention_ms=7 * 24 * 3600 * 1000,
        audited=False,
        writers="processor (what became of each operation, for the services that asked; "
        "signed with the outcome key, whose public half services hold)",
        roles=("processor",),
        auth=("outcome",),
    ),
    TopicSpec(
        Topic.OPERATING_EVENTS,
        "operation ID",
        "delete",
        retention_ms=-1,
        writers="every component: rejected transitions, dead letters",
        roles=("every component",),
        auth=("processor", "relay", "authority"),
    ),
    TopicSpec(
        Topic.POLICY,
        "'v{version}@{effective_at_ms}' (earlier releases: 'current')",
        "delete",
        single_partition=True,
        writers="policy administrators (ledger policy set)",
        roles=("policy administrators",),
        tables=("authority kernel", "relay"),
        auth=("operator",),
    ),
)

TOPIC_BY_NAME: dict[str, TopicSpec] = {t.name: t for t in TOPICS}


#: The reserved record key of the tombstones ``ledger topics compact`` appends to roll a
#: segment; every reader of a compacted ledger topic skips it.
COMPACTION_KEY = b"__compaction__"


def is_reserved_key(key: bytes | str | None) -> bool:
    """Tell whether a record key is reserved (a :func:`force_compaction` tombstone).

    Args:
        key: the record key as read (bytes) or decoded (str).

    Returns:
        True for ``__compaction__``; readers must skip such records.
    """
    if isinstance(key, str):
        key = key.encode()
    return key == COMPACTION_KEY


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash of ``data`` (the Java client's ``Utils.murmur2``), signed."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    full = length - length % 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str | bytes, partitions: int) -> int:
    """The partition a keyed record lands on under ``murmur2_random`` (the ledger's partitioner).

    Args:
        key: the record key.
        partitions: the topic's partition count (1 or more).

    Returns:
        ``(murmur2(key) & 0x7fffffff) % partitions``, as the Java client computes it.
    """
    raw = key.encode() if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions


#: How the reason of a misplaced record begins (:func:`misplaced`): such a record is
#: refused even where ``LEDGER_REQUIRE_AUTHENTICATED_RECORDS=false`` lets unsealed ones by.
MISPLACED = "misplaced:"


def misplaced(topic: str, key: bytes, partition: int | None, partitions: int) -> str | None:
    """Why a keyed record is not on the partition its key names, or ``None``.

    A record's seal covers its topic, key and value but not its partition:
    the partition follows from the key (:func:`partition_for`), and the stage
    that owns that partition is the only one that may decide about the key.
    An authentic record copied to another partition would otherwise reach a
    stage that does not own its operation, which would decide from no state.

    Args:
        topic: short topic name (a control topic, or one this module does
            not know, is never misplaced).
        key: the record key bytes.
        partition: the partition it was read from (``None``: not known).
        partitions: the operation-keyed topics' partition count
            (``LEDGER_PARTITIONS``; 0 or 1 checks nothing).

    Returns:
        ``None``, or a reason naming both partitions.
    """
    spec = TOPIC_BY_NAME.get(topic)
    if spec is None or spec.single_partition or partitions <= 1 or partition is None:
        return None
    home = partition_for(key, partitions)
    if home == partition:
        return None
    return (
        f"{MISPLACED} its key belongs on partition {home} of {partitions} (murmur2_random), "
        f"not {partition}; only that partition's owner decides about it"
    )
