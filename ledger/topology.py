"""The ledger's topics: names, keys, cleanup policies (pure data, no I/O).

Every operation-keyed topic is co-partitioned (same partition count, same
``murmur2_random`` partitioner), so partition *i* of each holds the same
operations and one consumer of a ``range``-assigned group owns them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Cleanup = Literal["compact", "delete"]


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
        writers: who writes it (prose, for ``ledger topics list`` and the README).
        roles: the writer roles, one entry each (``("relay", "reconcilers")``).
        tables: the components that rebuild a table from this topic (a
            compacted topic they read whole). Such a topic must have one
            writer role: compaction keeps only the latest record of a key, so
            a second writer's record would erase the first's evidence
            (DESIGN.md "Kafka layout"; a test holds every entry to it).
        auth: the key roles whose seal a reader accepts on this topic's
            records (:mod:`ledger.authn`): ``stage`` (the deployment MAC),
            ``authority`` (the kernel's signature), ``operator`` or
            ``reviewer`` (a person's signature); empty for ``intents``,
            which services publish unsealed (the approval is what carries
            authority, DESIGN.md "Trust boundary").
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


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(
        "intents",
        "operation ID",
        "compact",
        writers="services (LedgerPublisher)",
        roles=("services",),
        auth=(),
    ),
    TopicSpec(
        "approvals",
        "approval ID",
        "compact",
        writers="review systems (grants, revocations)",
        roles=("review systems",),
        tables=("authority kernel", "relay"),
        auth=("reviewer", "operator"),
    ),
    TopicSpec(
        "approval-uses",
        "approval ID",
        "compact",
        writers="authority kernel only",
        roles=("authority kernel",),
        tables=("authority kernel",),
        auth=("authority",),
    ),
    TopicSpec(
        "admission-requests",
        "approval ID",
        "delete",
        retention_ms=7 * 24 * 3600 * 1000,
        audited=False,
        writers="processor",
        roles=("processor",),
    ),
    TopicSpec(
        "admissions",
        "operation ID",
        "compact",
        writers="authority kernel",
        roles=("authority kernel",),
        auth=("authority",),
    ),
    TopicSpec(
        "dispatches",
        "operation ID",
        "compact",
        writers="processor (the outbox)",
        roles=("processor",),
    ),
    TopicSpec(
        "receipts",
        "operation ID",
        "compact",
        writers="relay",
        roles=("relay",),
        tables=("relay",),
    ),
    TopicSpec(
        "readbacks",
        "operation ID",
        "compact",
        writers="relay, reconcilers",
        roles=("relay", "reconcilers"),
    ),
    TopicSpec("claims", "operation ID", "compact", writers="resumers", roles=("resumers",)),
    TopicSpec(
        "dispositions",
        "operation ID",
        "compact",
        writers="operators (ledger reconcile dispose)",
        roles=("operators",),
        auth=("operator",),
    ),
    TopicSpec(
        "state",
        "operation ID",
        "compact",
        writers="processor only",
        roles=("processor",),
        tables=("processor",),
    ),
    TopicSpec(
        "journal",
        "operation ID",
        "delete",
        retention_ms=-1,
        writers="processor only",
        roles=("processor",),
    ),
    TopicSpec(
        "recovery-receipts", "operation ID", "compact", writers="processor", roles=("processor",)
    ),
    TopicSpec(
        "reconciliation", "operation ID", "compact", writers="processor", roles=("processor",)
    ),
    TopicSpec(
        "operating-events",
        "operation ID",
        "delete",
        retention_ms=-1,
        writers="every component: rejected transitions, dead letters",
        roles=("every component",),
    ),
    TopicSpec(
        "policy",
        "'current'",
        "compact",
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
