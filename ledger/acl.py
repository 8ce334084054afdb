"""The Kafka ACL matrix of the ledger: least privilege per principal (pure data, no I/O).

DESIGN.md "Trust boundary", first wall: each principal may write only its
own topics, read only what it reads, use only its own transactional-ID
prefix and consumer groups. :func:`plan` derives the matrix from
:mod:`ledger.topology` (the writer roles and table readers of every topic)
and the names the stages really use:

* a stage's transactional ID is ``{prefix}.{component}.{instance}``, so the
  stage gets the *prefixed* transactional-ID resource ``{prefix}.{component}.``;
* a stage's consumer group is ``{prefix}.{component}``;
* readers that assign partitions themselves still name a group, and
  librdkafka looks its coordinator up (FindCoordinator, which needs DESCRIBE
  on the group; without it the broker logs a denial every few hundred
  milliseconds): ``{prefix}.reader`` (whole-topic reads), ``{prefix}.settle``
  (waiting out open transactions) and ``{prefix}.table.{topic}`` /
  ``{prefix}.table.{topic}.hw`` (a followed table and its probes of the
  partitions' ends, committed and uncommitted). They get DESCRIBE only:
  nothing joins them or commits offsets.

Principals (role names; the Kafka principal of each is configurable, see
:func:`principal_names`):

* ``processor``, ``authority``, ``relay``: the transactional stages;
* ``reconciler``: ``ledger reconcile run`` (reads the queue, writes readbacks);
* ``auditor``: ``ledger audit`` (reads every audited, sealed topic; writes nothing);
* ``service``: publishes intents and reads ``outcomes`` (what became of its
  operations, signed with the outcome key: :mod:`producers.outcomes`),
  nothing internal; its outcome reader assigns one partition and names the
  group ``{prefix}.outcomes`` (DESCRIBE only: never joined, never committed);
* ``reviewer``: publishes approvals and revocations (reads approvals, as
  ``ledger revoke`` does);
* ``operator``: dispositions, claims, policy and revocations, and reads what
  its commands read (state, journal, approvals, the reconciliation queue);
  it may DESCRIBE the stages' groups (``ledger status``: members, committed
  offsets), never join them.

``admin`` (the super user that creates topics and applies this matrix) is
not in it. Every principal may DESCRIBE and DESCRIBE_CONFIGS every ledger
topic: ``check_topics`` runs first in every stage and command and reads each
topic's metadata and configs (never its records).

Operating events (dead letters, refused transitions) are written by the three
stages only (topology role ``every component``): the publishers and the
reconciler raise errors to their caller instead. No principal but its owner
may write ``admissions``, ``approval-uses`` (authority), ``dispatches``,
``state``, ``journal`` (processor).

Idempotent (non-transactional) producers need no ``IDEMPOTENT_WRITE`` on the
cluster since Kafka 3.0 (KIP-679: WRITE on any topic suffices); pass
``idempotent_write=True`` for an older broker.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ledger.errors import AccessPlanError
from ledger.topology import TOPICS, Topic

ResourceType = Literal["TOPIC", "GROUP", "TRANSACTIONAL_ID", "CLUSTER"]
PatternType = Literal["LITERAL", "PREFIXED"]
Operation = Literal["READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE"]

#: Every operation the matrix grants.
OPERATIONS: frozenset[str] = frozenset(
    {"READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE"}
)

#: The principals of the matrix, by role name, in the order tables list them.
ROLES: tuple[str, ...] = (
    "processor",
    "authority",
    "relay",
    "reconciler",
    "auditor",
    "service",
    "reviewer",
    "operator",
)

#: The super user (creates topics, applies ACLs); not in the matrix.
ADMIN = "admin"

#: Default Kafka principal of a role: ``User:{name}`` (SASL/SCRAM user names).
DEFAULT_PRINCIPAL_FORMAT = "User:{name}"

#: Kafka's name of the cluster resource.
CLUSTER_NAME = "kafka-cluster"

#: The transactional stages: role -> ``Stage.component`` (transactional ID
#: ``{prefix}.{component}.{instance}``, group ``{prefix}.{component}``).
STAGE_COMPONENTS: Mapping[str, str] = {
    "processor": "processor",
    "authority": "authority",
    "relay": "relay",
}

#: Topics each stage consumes in its group (``Stage.inputs``; a unit test
#: holds these to the stage classes).
STAGE_INPUTS: Mapping[str, tuple[str, ...]] = {
    "processor": (
        Topic.INTENTS,
        Topic.ADMISSIONS,
        Topic.RECEIPTS,
        Topic.READBACKS,
        Topic.CLAIMS,
        Topic.DISPOSITIONS,
        Topic.COMPENSATION_TALLY,
    ),
    "authority": (Topic.ADMISSION_REQUESTS,),
    "relay": (Topic.DISPATCHES,),
}

#: Writer and table roles of :data:`ledger.topology.TOPICS` -> the principals
#: (role names) that play them.
ROLE_PRINCIPALS: Mapping[str, tuple[str, ...]] = {
    "services": ("service",),
    "review systems": ("reviewer",),
    "authority kernel": ("authority",),
    "processor": ("processor",),
    "relay": ("relay",),
    "reconcilers": ("reconciler",),
    "resumers": ("operator",),
    "operators": ("operator",),
    "policy administrators": ("operator",),
    # Dead letters and refused transitions: written by the stages' loops only.
    "every component": ("processor", "authority", "relay"),
}

#: Writes beyond the topology's writer roles, with the reason.
EXTRA_WRITES: Mapping[str, Mapping[str, str]] = {
    "operator": {
        Topic.APPROVALS: "revocations (DESIGN.md: operators revoke; the authority kernel "
        "accepts an operator's signature on a revocation only, never on a grant)",
    },
}

#: Reads beyond stage inputs and tables: role -> topic -> what reads it.
EXTRA_READS: Mapping[str, Mapping[str, str]] = {
    "processor": {
        Topic.JOURNAL: "a restore that refused the latest state record of an operation "
        "rebuilds it from its journal entries; every restore reads each partition's last "
        "entry to continue its hash chain",
    },
    "authority": {},
    "relay": {},
    "reconciler": {
        Topic.RECONCILIATION: "the queue of unknown outcomes (open_items)",
        Topic.STATE: "each queued operation's state and fencing token",
        Topic.RECEIPTS: "the contract version each queued operation was attempted under "
        "(a readback across a sink upgrade the release manifest does not allow is held)",
        Topic.OPERATING_EVENTS: "postcondition mismatches: such a committed operation is an "
        "open item of its own, not stranded (consumers.stranding)",
    },
    "service": {
        Topic.OUTCOMES: "what became of its operations (producers.outcomes, the service SDK)",
    },
    "reviewer": {Topic.APPROVALS: "ledger revoke reads the grant it revokes"},
    "operator": {
        Topic.APPROVALS: "ledger revoke reads the grant it revokes",
        Topic.STATE: "ledger state, ledger claim",
        Topic.JOURNAL: "the processor's decision on what it published (--wait-s)",
        Topic.RECONCILIATION: "ledger reconcile list",
        Topic.OPERATING_EVENTS: "the console's stranded operations (postcondition mismatches "
        "are not stranded)",
    },
}


def auditor_topics() -> tuple[str, ...]:
    """Topics the auditor replays: every audited topic whose records are sealed.

    (``consumers.auditor.run_audit`` reads exactly these; a unit test holds them equal.)
    """
    return tuple(t.name for t in TOPICS if t.audited and t.auth)


#: Roles that follow a table (a ``TableFollower``): role -> topics, beyond
#: the topology's ``tables`` (the operator follows the journal to see a decision).
EXTRA_FOLLOWS: Mapping[str, tuple[str, ...]] = {"operator": (Topic.JOURNAL,)}

#: Roles that run ``ledger status`` and the console's stages page: they
#: describe the stages' groups (members, committed offsets) and name the
#: status reader's group ``{prefix}.status`` (DESCRIBE only, read-only: no
#: join, no commit, no offset reset).
STATUS_READERS: frozenset[str] = frozenset({"operator"})

#: Roles that look for intents the processor has not consumed (the stranded
#: reason ``intent_not_consumed``: ``ledger audit``, ``ledger reconcile run``,
#: the console): they fetch the processor group's committed offsets on
#: ``intents`` (DESCRIBE on ``{prefix}.processor``) and read the records past
#: them, keys and timestamps (READ on ``intents``). Without these the audit is
#: NOT VERIFIED rather than blind.
UNCONSUMED_READERS: frozenset[str] = frozenset({"auditor", "reconciler", "operator"})

#: Roles that read whole topics with ``read_partition`` (group ``{prefix}.reader``).
WHOLE_TOPIC_READERS: frozenset[str] = frozenset(
    {"processor", "reconciler", "auditor", "reviewer", "operator"}
)


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW access control entry.

    Attributes:
        principal: Kafka principal (``User:processor``).
        resource_type: ``TOPIC``, ``GROUP``, ``TRANSACTIONAL_ID`` or ``CLUSTER``.
        name: the resource name (full topic name, group, transactional-ID
            prefix, or ``kafka-cluster``).
        pattern: ``LITERAL`` or ``PREFIXED`` (the name is a prefix).
        operation: ``READ``, ``WRITE``, ``DESCRIBE``, ``DESCRIBE_CONFIGS`` or
            ``IDEMPOTENT_WRITE``.
        host: client host, ``*`` for any.
    """

    principal: str
    resource_type: ResourceType
    name: str
    pattern: PatternType
    operation: Operation
    host: str = "*"

    def to_dict(self) -> dict[str, str]:
        """The entry as JSON-ready strings (``permission`` is always ``ALLOW``)."""
        return {
            "principal": self.principal,
            "resource_type": self.resource_type,
            "name": self.name,
            "pattern": self.pattern,
            "operation": self.operation,
            "host": self.host,
            "permission": "ALLOW",
        }


@dataclass(frozen=True)
class Grant:
    """What one principal may do (one row of the matrix).

    Attributes:
        role: role name (``processor`` ...).
        principal: its Kafka principal.
        writes: short topic names it may WRITE (and DESCRIBE).
        reads: short topic names it may READ (and DESCRIBE).
        describes: short topic names it may DESCRIBE and DESCRIBE_CONFIGS
            (every ledger topic: ``check_topics``).
        transactional_id_prefix: full prefix of its transactional IDs, or
            ``None`` (not transactional).
        group: its own consumer group (stages, READ), or ``None``.
        helper_groups: groups its partition readers name (DESCRIBE only:
            never joined, never committed).
        idempotent_write: IDEMPOTENT_WRITE on the cluster.
        notes: topic -> why it is written or read beyond the topology.
    """

    role: str
    principal: str
    writes: tuple[str, ...]
    reads: tuple[str, ...]
    describes: tuple[str, ...]
    transactional_id_prefix: str | None
    group: str | None
    helper_groups: tuple[str, ...]
    idempotent_write: bool
    notes: Mapping[str, str] = field(default_factory=dict)

    def groups(self) -> tuple[str, ...]:
        """Every group it names: its own (READ) first, then the helpers (DESCRIBE)."""
        return ((self.group,) if self.group else ()) + self.helper_groups

    def acls(self, topic_prefix: str) -> list[Acl]:
        """The entries that grant this row, in a stable order.

        Args:
            topic_prefix: the ledger's topic prefix (``ledger``).

        Returns:
            One :class:`Acl` per (resource, operation), sorted.
        """
        p = self.principal
        out: set[Acl] = set()
        for short in self.describes:
            full = f"{topic_prefix}.{short}"
            out.add(Acl(p, "TOPIC", full, "LITERAL", "DESCRIBE"))
            out.add(Acl(p, "TOPIC", full, "LITERAL", "DESCRIBE_CONFIGS"))
        for short in self.writes:
            out.add(Acl(p, "TOPIC", f"{topic_prefix}.{short}", "LITERAL", "WRITE"))
        for short in self.reads:
            out.add(Acl(p, "TOPIC", f"{topic_prefix}.{short}", "LITERAL", "READ"))
        if self.transactional_id_prefix is not None:
            txn = self.transactional_id_prefix
            out.add(Acl(p, "TRANSACTIONAL_ID", txn, "PREFIXED", "WRITE"))
            out.add(Acl(p, "TRANSACTIONAL_ID", txn, "PREFIXED", "DESCRIBE"))
        if self.group is not None:
            out.add(Acl(p, "GROUP", self.group, "LITERAL", "READ"))
        for group in self.helper_groups:
            out.add(Acl(p, "GROUP", group, "LITERAL", "DESCRIBE"))
        if self.idempotent_write:
            out.add(Acl(p, "CLUSTER", CLUSTER_NAME, "LITERAL", "IDEMPOTENT_WRITE"))
        return sorted(out)

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
        return {
            "role": self.role,
            "principal": self.principal,
            "writes": list(self.writes),
            "reads": list(self.reads),
            "describes": list(self.describes),
            "transactional_id_prefix": self.transactional_id_prefix,
            "group": self.group,
            "helper_groups": list(self.helper_groups),
            "idempotent_write": self.idempotent_write,
            "notes": dict(self.notes),
        }


@dataclass(frozen=True)
class AclPlan:
    """The whole matrix for one ledger (topic prefix).

    Attributes:
        topic_prefix: the ledger's topic prefix.
        grants: one :class:`Grant` per role, in :data:`ROLES` order.
    """

    topic_prefix: str
    grants: tuple[Grant, ...]

    def grant(self, role: str) -> Grant:
        """The row of ``role``.

        Raises:
            LedgerError: ``role`` is not one of :data:`ROLES`.
        """
        for g in self.grants:
            if g.role == role:
                return g
        raise AccessPlanError(f"unknown role {role!r}; one of {', '.join(ROLES)}", observed=role)

    def acls(self) -> list[Acl]:
        """Every entry of the matrix, sorted, without duplicates."""
        return sorted({a for g in self.grants for a in g.acls(self.topic_prefix)})

    def writers_of(self, topic: str) -> set[str]:
        """Roles that may WRITE a short topic name."""
        return {g.role for g in self.grants if topic in g.writes}

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data: rows and every entry."""
        return {
            "topic_prefix": self.topic_prefix,
            "principals": [g.to_dict() for g in self.grants],
            "acls": [a.to_dict() for a in self.acls()],
        }


def parse_principal_mapping(items: Iterable[str]) -> dict[str, str]:
    """Parse ``ROLE=PRINCIPAL`` strings (``relay=User:sa-4kq2``).

    Args:
        items: each ``role=principal``; the principal has a type
            (``User:``, ``Group:`` ...) and a non-empty name.

    Returns:
        role -> principal.

    Raises:
        LedgerError: malformed item, unknown role, a role given twice, or a
            principal without ``Type:``.
    """
    out: dict[str, str] = {}
    for item in items:
        role, sep, principal = item.partition("=")
        role, principal = role.strip(), principal.strip()
        if not sep or not role or not principal:
            raise AccessPlanError(
                f"principal mapping {item!r} is not ROLE=PRINCIPAL (e.g. relay=User:relay-sa)",
                observed=item,
            )
        if role not in ROLES:
            raise AccessPlanError(
                f"principal mapping {item!r}: unknown role {role!r}; one of {', '.join(ROLES)}",
                observed=role,
            )
        if role in out:
            raise AccessPlanError(f"principal mapping: role {role!r} given twice", observed=item)
        _check_principal(principal, item)
        out[role] = principal
    return out


def _check_principal(principal: str, origin: str) -> None:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name or any(c.isspace() for c in principal):
        raise AccessPlanError(
            f"{origin!r}: a Kafka principal is TYPE:NAME without spaces (User:relay), "
            f"got {principal!r}",
            observed=principal,
        )


def principal_names(
    mapping: Mapping[str, str] | None = None, principal_format: str = DEFAULT_PRINCIPAL_FORMAT
) -> dict[str, str]:
    """The Kafka principal of every role.

    Args:
        mapping: role -> principal for the roles a deployment names itself
            (Confluent service accounts, mTLS distinguished names ...).
        principal_format: the principal of every other role, ``{name}``
            standing for the role (default ``User:{name}``).

    Returns:
        role -> principal for every role of :data:`ROLES`.

    Raises:
        LedgerError: the format lacks ``{name}`` or yields a malformed
            principal; a mapping names an unknown role; two roles share a
            principal (least privilege would then be their union).
    """
    mapping = dict(mapping or {})
    unknown = sorted(set(mapping) - set(ROLES))
    if unknown:
        raise AccessPlanError(
            f"unknown role(s) {', '.join(unknown)}; one of {', '.join(ROLES)}", observed=unknown
        )
    if "{name}" not in principal_format:
        raise AccessPlanError(
            f"principal format {principal_format!r} must contain {{name}} (e.g. User:{{name}})",
            observed=principal_format,
        )
    out: dict[str, str] = {}
    for role in ROLES:
        principal = mapping.get(role) or principal_format.replace("{name}", role)
        _check_principal(principal, f"principal of {role}")
        out[role] = principal
    shared: dict[str, list[str]] = {}
    for role, principal in out.items():
        shared.setdefault(principal, []).append(role)
    clashes = {p: r for p, r in shared.items() if len(r) > 1}
    if clashes:
        raise AccessPlanError(
            "each role needs its own principal, or least privilege becomes their union: "
            + "; ".join(f"{p} for {', '.join(r)}" for p, r in sorted(clashes.items())),
            observed=clashes,
        )
    return out


def _writes() -> dict[str, dict[str, str]]:
    """Role -> topic -> reason, from the topology's writer roles and EXTRA_WRITES."""
    out: dict[str, dict[str, str]] = {role: {} for role in ROLES}
    for spec in TOPICS:
        for writer_role in spec.roles:
            if writer_role not in ROLE_PRINCIPALS:
                raise AccessPlanError(
                    f"topic {spec.name}: writer role {writer_role!r} has no principal in "
                    "ledger.acl.ROLE_PRINCIPALS; add it there",
                    observed=writer_role,
                )
            for role in ROLE_PRINCIPALS[writer_role]:
                out[role][spec.name] = f"writer ({spec.writers})"
    for role, extra in EXTRA_WRITES.items():
        out[role].update(extra)
    return out


def _follows() -> dict[str, set[str]]:
    """Role -> topics it follows as a table (TableFollower or a state restore)."""
    out: dict[str, set[str]] = {role: set() for role in ROLES}
    for spec in TOPICS:
        for table_role in spec.tables:
            for role in ROLE_PRINCIPALS[table_role]:
                out[role].add(spec.name)
    for role, topics in EXTRA_FOLLOWS.items():
        out[role].update(topics)
    return out


def _reads() -> dict[str, dict[str, str]]:
    """Role -> topic -> reason."""
    out: dict[str, dict[str, str]] = {role: {} for role in ROLES}
    for role, inputs in STAGE_INPUTS.items():
        for topic in inputs:
            out[role][topic] = "stage input"
    for role, topics in _follows().items():
        for topic in topics:
            out[role].setdefault(topic, "table it rebuilds")
    for topic in auditor_topics():
        out["auditor"][topic] = "audit replay"
    for role, extra in EXTRA_READS.items():
        for topic, why in extra.items():
            out[role].setdefault(topic, why)
    for role in UNCONSUMED_READERS:
        out[role].setdefault(
            Topic.INTENTS, "intents the processor has not consumed (stranded: intent_not_consumed)"
        )
    return out


def _helper_groups(role: str, topic_prefix: str) -> tuple[str, ...]:
    """Groups a role's partition readers name (never joined, never committed)."""
    groups: list[str] = []
    follows = sorted(_follows()[role])
    # State restore and table follows wait out open transactions first.
    if role == "processor" or follows:
        groups.append(f"{topic_prefix}.settle")
    if role in WHOLE_TOPIC_READERS:
        groups.append(f"{topic_prefix}.reader")
    if role == "service":
        groups.append(f"{topic_prefix}.outcomes")  # the outcome reader's (never joined)
    if role in STATUS_READERS:
        groups += [f"{topic_prefix}.{component}" for component in STAGE_COMPONENTS.values()]
        groups.append(f"{topic_prefix}.status")
    elif role in UNCONSUMED_READERS:
        groups.append(f"{topic_prefix}.processor")  # its committed offsets on intents
    for topic in follows:
        if role == "processor" and topic == Topic.STATE:
            continue  # the processor restores state with read_partition, not a follower
        groups.append(f"{topic_prefix}.table.{topic}")
        groups.append(f"{topic_prefix}.table.{topic}.hw")
    return tuple(groups)


def plan(
    topic_prefix: str,
    principals: Mapping[str, str] | None = None,
    *,
    principal_format: str = DEFAULT_PRINCIPAL_FORMAT,
    idempotent_write: bool = False,
) -> AclPlan:
    """Derive the ACL matrix of one ledger.

    Args:
        topic_prefix: the ledger's topic prefix (``LEDGER_TOPIC_PREFIX``).
        principals: role -> Kafka principal for the roles a deployment names
            itself (see :func:`principal_names`).
        principal_format: principal of the other roles (``User:{name}``).
        idempotent_write: also grant IDEMPOTENT_WRITE on the cluster to every
            principal that produces (only brokers before Kafka 3.0 need it).

    Returns:
        The plan, one row per role of :data:`ROLES`.

    Raises:
        LedgerError: bad principals (see :func:`principal_names`), an empty
            prefix, or a topology writer role without principals.
    """
    if not topic_prefix or any(c.isspace() for c in topic_prefix):
        raise AccessPlanError(f"topic prefix {topic_prefix!r} is empty or has spaces")
    names = principal_names(principals, principal_format)
    writes, reads = _writes(), _reads()
    every = tuple(t.name for t in TOPICS)
    grants = []
    for role in ROLES:
        component = STAGE_COMPONENTS.get(role)
        role_writes = tuple(t for t in every if t in writes[role])
        role_reads = tuple(t for t in every if t in reads[role])
        notes = {t: why for t, why in {**reads[role], **writes[role]}.items()}
        grants.append(
            Grant(
                role=role,
                principal=names[role],
                writes=role_writes,
                reads=role_reads,
                describes=every,
                transactional_id_prefix=(
                    f"{topic_prefix}.{component}." if component is not None else None
                ),
                group=f"{topic_prefix}.{component}" if component is not None else None,
                helper_groups=_helper_groups(role, topic_prefix),
                idempotent_write=idempotent_write and bool(role_writes),
                notes=notes,
            )
        )
    return AclPlan(topic_prefix, tuple(grants))


#: The five topics whose forgery would create or release authority.
PROTECTED_TOPICS: tuple[str, ...] = (
    Topic.ADMISSIONS,
    Topic.DISPATCHES,
    Topic.STATE,
    Topic.JOURNAL,
    Topic.APPROVAL_USES,
)


#: ``kafka-acls.sh`` spelling of each operation.
_CLI_OPERATION: Mapping[str, str] = {
    "READ": "Read",
    "WRITE": "Write",
    "DESCRIBE": "Describe",
    "DESCRIBE_CONFIGS": "DescribeConfigs",
    "IDEMPOTENT_WRITE": "IdempotentWrite",
}

#: ``kafka-acls.sh`` option of each resource type.
_CLI_RESOURCE: Mapping[str, str] = {
    "TOPIC": "--topic",
    "GROUP": "--group",
    "TRANSACTIONAL_ID": "--transactional-id",
}


def kafka_acls_commands(
    acl_plan: AclPlan,
    *,
    bootstrap: str = "$BOOTSTRAP",
    command_config: str = "admin.properties",
    tool: str = "kafka-acls.sh",
) -> list[str]:
    """The plan as ``kafka-acls.sh --add`` command lines.

    One per principal, resource kind and operation, naming every resource of that kind.

    Args:
        acl_plan: the plan.
        bootstrap: the ``--bootstrap-server`` argument (default ``$BOOTSTRAP``,
            left for the shell to expand).
        command_config: the admin client's properties file.
        tool: the script's name or path.

    Returns:
        Shell command lines, quoted for a POSIX shell (``$BOOTSTRAP`` unquoted).
    """

    def q(text: str) -> str:
        return text if text.startswith("$") else shlex.quote(text)

    batches: dict[tuple[str, str, str, str, str], list[str]] = {}
    for acl in acl_plan.acls():
        key = (acl.principal, acl.resource_type, acl.pattern, acl.operation, acl.host)
        batches.setdefault(key, []).append(acl.name)
    lines = []
    for (principal, rtype, pattern, op, host), names in batches.items():
        parts = [
            tool,
            "--bootstrap-server",
            q(bootstrap),
            "--command-config",
            q(command_config),
            "--add",
            "--allow-principal",
            shlex.quote(principal),
        ]
        if host != "*":
            parts += ["--allow-host", shlex.quote(host)]
        parts += ["--operation", _CLI_OPERATION[op]]
        if rtype == "CLUSTER":
            parts.append("--cluster")
        else:
            if pattern == "PREFIXED":
                parts += ["--resource-pattern-type", "prefixed"]
            for name in names:
                parts += [_CLI_RESOURCE[rtype], shlex.quote(name)]
        lines.append(" ".join(parts))
    return lines
