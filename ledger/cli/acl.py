"""``ledger acl ...``: print, apply and check the least-privilege ACL matrix.

The matrix itself is :mod:`ledger.acl` (pure); this module talks to the
cluster with the admin client (``describe_acls``, ``create_acls``), as the
admin principal (a super user, or one allowed ALTER and DESCRIBE on the
cluster): run it with that principal's ``LEDGER_KAFKA_CONFIG_FILE``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import click
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports these without marking them public, so
# mypy --strict wants them from their defining modules.
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from ledger import acl, quotas
from ledger.cli.common import EXIT_ERROR, current_settings, echo_json
from ledger.errors import BrokerError, BrokerUnavailableError
from ledger.kafka import admin_config, classify
from ledger.settings import LedgerSettings

_TIMEOUT_S = 30.0

_RESOURCE: dict[str, ResourceType] = {
    "TOPIC": ResourceType.TOPIC,
    "GROUP": ResourceType.GROUP,
    "TRANSACTIONAL_ID": ResourceType.TRANSACTIONAL_ID,
    "CLUSTER": ResourceType.BROKER,
}
_PATTERN: dict[str, ResourcePatternType] = {
    "LITERAL": ResourcePatternType.LITERAL,
    "PREFIXED": ResourcePatternType.PREFIXED,
}


def to_binding(entry: acl.Acl) -> AclBinding:
    """The admin client's ALLOW binding of one plan entry."""
    return AclBinding(
        _RESOURCE[entry.resource_type],
        entry.name,
        _PATTERN[entry.pattern],
        entry.principal,
        entry.host,
        AclOperation[entry.operation],
        AclPermissionType.ALLOW,
    )


def from_binding(binding: AclBinding) -> acl.Acl | None:
    """The plan entry a broker binding equals, or ``None``.

    ``None`` for a DENY, or an operation, resource type or pattern the plan
    never uses.
    """
    if binding.permission_type != AclPermissionType.ALLOW:
        return None
    # The admin client hands back enums; the annotations also allow str and int.
    restype: Any = binding.restype
    pattern_type: Any = binding.resource_pattern_type
    operation: Any = binding.operation
    rtype = {v: k for k, v in _RESOURCE.items()}.get(restype)
    pattern = {v: k for k, v in _PATTERN.items()}.get(pattern_type)
    op = getattr(operation, "name", str(operation))
    if rtype is None or pattern is None or op not in acl.OPERATIONS:
        return None
    # op is one of acl.OPERATIONS (checked above): the Literal the plan types it as.
    return acl.Acl(binding.principal, rtype, binding.name, pattern, op, binding.host)  # type: ignore[arg-type]  # see above


def _admin(settings: LedgerSettings) -> AdminClient:
    return AdminClient(admin_config(settings))


def _fail(what: str, exc: KafkaException) -> BrokerError:
    err = exc.args[0] if exc.args else exc
    code = getattr(err, "name", lambda: "")()
    if code in ("CLUSTER_AUTHORIZATION_FAILED", "SECURITY_DISABLED"):
        remedy = (
            "run it as the admin principal (LEDGER_KAFKA_CONFIG_FILE of a super user)"
            if code == "CLUSTER_AUTHORIZATION_FAILED"
            else "the cluster has no authorizer (authorizer.class.name): ACLs cannot be set"
        )
        return BrokerError(f"{what}: {err}; {remedy}", observed=code)
    if isinstance(err, KafkaError) and classify(err) == "retriable":
        return BrokerUnavailableError(
            f"{what}: {err} (is the cluster up, and are the client's security settings "
            "those of its listener?)",
            observed=code,
        )
    return BrokerError(f"{what}: {err}", observed=code)


def _require_cluster_rights(admin: AdminClient, *operations: str) -> None:
    """Refuse early, with the remedy, a principal that may not manage ACLs.

    (A broker refuses DescribeAcls to such a principal, but the admin client
    hands back an empty list, which would read as "no ACLs at all".)

    Raises:
        BrokerError: the principal lacks one of ``operations`` on the cluster,
            or the cluster has no authorizer.
        BrokerUnavailableError: the cluster does not answer.
    """
    try:
        cluster = admin.describe_cluster(
            include_authorized_operations=True, request_timeout=_TIMEOUT_S
        ).result()
    except KafkaException as exc:
        raise _fail("cannot describe the cluster", exc) from exc
    allowed = {getattr(op, "name", str(op)) for op in cluster.authorized_operations or ()}
    lacking = [op for op in operations if op not in allowed]
    if lacking:
        raise BrokerError(
            f"this client's principal may not {' or '.join(lacking)} the cluster (so it cannot "
            "read or write ACLs), or the cluster has no authorizer: run `ledger acl` as the "
            "admin principal (a super user; LEDGER_KAFKA_CONFIG_FILE with its credentials) "
            "on a cluster with authorizer.class.name set",
            expected=list(operations),
            observed=sorted(allowed),
        )


def broker_acls(
    settings: LedgerSettings, principals: Iterable[str] | None = None
) -> list[AclBinding]:
    """Every binding the cluster holds for some principals, or for every principal.

    Args:
        settings: whose client configuration reaches the cluster as admin.
        principals: Kafka principals (``User:relay``); ``None``: every
            principal, the wildcard ``User:*`` included (what ``acl check``
            reads, so that a grant to anyone else is seen too).

    Returns:
        The bindings, any permission, resource and pattern.

    Raises:
        BrokerError: not allowed (not the admin), no authorizer, or another
            refusal; BrokerUnavailableError when the cluster does not answer.
    """
    admin = _admin(settings)
    _require_cluster_rights(admin, "DESCRIBE")
    out: list[AclBinding] = []
    # None matches any principal, name and host (the stubs say str).
    anything: Any = None
    for principal in [anything] if principals is None else sorted(set(principals)):
        query = AclBindingFilter(
            ResourceType.ANY,
            anything,
            ResourcePatternType.ANY,
            principal,
            anything,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        try:
            out.extend(admin.describe_acls(query, request_timeout=_TIMEOUT_S).result())
        except KafkaException as exc:
            whose = "every principal" if principal is None else principal
            raise _fail(f"cannot describe the ACLs of {whose}", exc) from exc
    return out


@dataclass(frozen=True)
class Comparison:
    """The plan against the cluster.

    Attributes:
        present: plan entries the cluster has.
        missing: plan entries the cluster lacks.
        extra: bindings of the plan's principals that the plan does not
            contain (DENY entries included), as the broker reports them.
        wildcard: ALLOW bindings on the ledger's resources held by a
            wildcard principal (``User:*``): every client, authenticated or
            not, gets them, whatever the plan says.
        others: ALLOW bindings on the ledger's resources held by a principal
            the plan does not name (and the caller did not accept).
    """

    present: list[acl.Acl]
    missing: list[acl.Acl]
    extra: list[AclBinding]
    wildcard: list[AclBinding] = dataclasses.field(default_factory=list)
    others: list[AclBinding] = dataclasses.field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing missing and nothing granted beyond the plan."""
        return not (self.missing or self.extra or self.wildcard or self.others)


def concerns(binding: AclBinding, topic_prefix: str) -> bool:
    """Tell whether a binding reaches the resources of the ledger with ``topic_prefix``.

    True for the cluster resource, for a name that begins with ``{prefix}.``,
    for the wildcard ``*``, and for a prefixed pattern that covers
    ``{prefix}.`` (``ledger``, ``led`` ...). Bindings of other ledgers on the
    same cluster (other prefixes) are not this plan's business.
    """
    restype: Any = binding.restype
    pattern: Any = binding.resource_pattern_type
    ours = topic_prefix + "."
    if restype == ResourceType.BROKER or binding.name == "*":
        return True
    if binding.name.startswith(ours):
        return True
    return bool(pattern == ResourcePatternType.PREFIXED and ours.startswith(binding.name))


def is_wildcard(principal: str) -> bool:
    """Tell whether a Kafka principal matches every client (``User:*``, ``*``)."""
    return principal == "*" or principal.partition(":")[2] == "*"


def compare(
    acl_plan: acl.AclPlan, bindings: Iterable[AclBinding], accepted: Iterable[str] = ()
) -> Comparison:
    """Compare a plan with the bindings the cluster holds (pure).

    Bindings that do not concern the plan's ledger (:func:`concerns`) are
    ignored: one cluster may carry several ledgers under one set of principals.
    A binding of a principal outside the plan counts only when it ALLOWs
    (a DENY takes rights away): held by a wildcard principal it is in
    ``wildcard``, by another principal not in ``accepted``, in ``others``.

    Args:
        acl_plan: the plan.
        bindings: what the cluster holds (any principals).
        accepted: principals outside the plan whose grants the deployment
            knows of (a monitoring agent ...): not reported.
    """
    wanted = set(acl_plan.acls())
    planned = {g.principal for g in acl_plan.grants}
    known = set(accepted)
    have: set[acl.Acl] = set()
    extra: list[AclBinding] = []
    wildcard: list[AclBinding] = []
    others: list[AclBinding] = []
    for binding in bindings:
        entry = from_binding(binding)
        if entry is not None and entry in wanted:
            have.add(entry)
            continue
        if not concerns(binding, acl_plan.topic_prefix):
            continue
        if binding.principal in planned:
            extra.append(binding)
        elif binding.permission_type != AclPermissionType.ALLOW:
            continue
        elif is_wildcard(binding.principal):
            wildcard.append(binding)
        elif binding.principal not in known:
            others.append(binding)
    return Comparison(
        present=sorted(have),
        missing=sorted(wanted - have),
        extra=sorted(extra, key=str),
        wildcard=sorted(wildcard, key=str),
        others=sorted(others, key=str),
    )


def apply_plan(
    settings: LedgerSettings,
    acl_plan: acl.AclPlan,
    *,
    dry_run: bool = False,
    wait_s: float = _TIMEOUT_S,
) -> tuple[list[acl.Acl], Comparison]:
    """Create the plan's missing entries (idempotent), then wait until the broker has them.

    Args:
        settings: whose client configuration reaches the cluster as admin.
        acl_plan: the plan.
        dry_run: only say what would be created.
        wait_s: longest wait (seconds) for a broker to report the new entries.

    Returns:
        The entries created (or that would be), and the comparison made first.

    Raises:
        BrokerError: the cluster refused (see :func:`broker_acls`) or refused
            one of the entries (the message names it).
    """
    before = compare(acl_plan, broker_acls(settings, (g.principal for g in acl_plan.grants)))
    if dry_run or not before.missing:
        return before.missing, before
    admin = _admin(settings)
    _require_cluster_rights(admin, "ALTER")
    futures = admin.create_acls(
        [to_binding(entry) for entry in before.missing], request_timeout=_TIMEOUT_S
    )
    failures: list[str] = []
    for binding, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            failures.append(f"{binding}: {exc.args[0] if exc.args else exc}")
    if failures:
        raise BrokerError(
            f"{len(failures)} of {len(futures)} ACLs were not created:\n  " + "\n  ".join(failures),
            observed=failures,
        )
    _await_visible(settings, acl_plan, wait_s)
    return before.missing, before


def _await_visible(settings: LedgerSettings, acl_plan: acl.AclPlan, wait_s: float) -> None:
    """Wait until a broker reports every entry of the plan.

    The controller commits new ACLs before brokers load them into their
    authorizers; a client that starts at once could still be refused.
    """
    deadline = time.monotonic() + wait_s
    while True:
        now = compare(acl_plan, broker_acls(settings, (g.principal for g in acl_plan.grants)))
        if not now.missing:
            return
        if time.monotonic() > deadline:
            raise BrokerUnavailableError(
                f"{len(now.missing)} ACLs created but not yet reported by the broker after "
                f"{wait_s:g} s (e.g. {now.missing[0]}); run `ledger acl check` again shortly",
                observed=len(now.missing),
            )
        time.sleep(0.2)


# ---------------------------------------------------------------------- the commands

_MATRIX_HELP = """Least-privilege Kafka ACLs of the ledger (DESIGN.md "Trust boundary").

\b
One principal per role: processor, authority, relay (the transactional
stages: their topics, transactional-ID prefix {prefix}.{component}. and
group {prefix}.{component}), reconciler, auditor, service (writes intents
only), reviewer (approvals), operator (dispositions, claims, policy,
revocations; reads what its commands read). Every principal may describe
every ledger topic (the start-up topic check). Principals are User:{role}
unless --principal-format or --principal ROLE=PRINCIPAL say otherwise.
The plan also bounds the service, reviewer and operator principals with
Kafka client quotas (--quota; set and read with kafka-configs.sh, given as
--kafka-configs). `apply` and `check` run as the admin principal: point
LEDGER_KAFKA_CONFIG_FILE at its client properties. `check` also reports a
wildcard principal (User:*) or any principal outside the plan allowed
something on the ledger's resources.
"""


def _plan_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--quota",
        "quota_items",
        multiple=True,
        metavar="ROLE:KEY=BYTES",
        help="A client quota of the plan (repeatable), bytes per second per broker, e.g. "
        "service:producer_byte_rate=2097152; 0 removes it. Keys: " + ", ".join(quotas.KEYS) + ".",
    )(func)
    func = click.option(
        "--idempotent-write",
        is_flag=True,
        help="Also grant IDEMPOTENT_WRITE on the cluster to every producing principal "
        "(only brokers before Kafka 3.0 need it).",
    )(func)
    func = click.option(
        "--principal-format",
        default=acl.DEFAULT_PRINCIPAL_FORMAT,
        show_default=True,
        help="Principal of each role not mapped by --principal; {name} is the role.",
    )(func)
    func = click.option(
        "--principal",
        "mapping",
        multiple=True,
        metavar="ROLE=PRINCIPAL",
        help="The principal of one role (repeatable), e.g. relay=User:sa-4kq2 for a "
        "Confluent service account.",
    )(func)
    return func


def _build_plan(
    settings: LedgerSettings, mapping: tuple[str, ...], principal_format: str, idem: bool
) -> acl.AclPlan:
    return acl.plan(
        settings.topic_prefix,
        acl.parse_principal_mapping(mapping),
        principal_format=principal_format,
        idempotent_write=idem,
    )


def _plan_quotas(
    mapping: tuple[str, ...], principal_format: str, quota_items: tuple[str, ...]
) -> tuple[quotas.Quota, ...]:
    names = acl.principal_names(acl.parse_principal_mapping(mapping), principal_format)
    return quotas.plan_quotas(names, quotas.parse_overrides(quota_items))


def _kafka_configs(
    settings: LedgerSettings, tool: str, args: list[str], command_config: str | None
) -> str:
    """Run Kafka's ``kafka-configs.sh`` as the admin; its output.

    Args:
        settings: the bootstrap servers and, when ``command_config`` is
            ``None``, ``LEDGER_KAFKA_CONFIG_FILE`` as the tool's client properties.
        tool: the script's path.
        args: its arguments after the connection's.
        command_config: the admin's Java client properties file, or ``None``.

    Raises:
        BrokerError: the tool cannot be run or fails (its last lines quoted).
    """
    cmd = [tool, "--bootstrap-server", settings.bootstrap_servers]
    config = command_config or settings.kafka_config_file
    if config is not None:
        cmd += ["--command-config", str(config)]
    try:
        done = subprocess.run(cmd + args, capture_output=True, text=True, timeout=180, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(
            f"cannot run {tool} ({exc}); give --kafka-configs the path of Kafka's kafka-configs.sh",
            observed=str(exc),
        ) from exc
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise BrokerError(
            f"{tool} {' '.join(args[:3])} failed (exit {done.returncode}): {tail}",
            observed=done.returncode,
        )
    return done.stdout


_KAFKA_CONFIGS_HELP = (
    "Kafka's kafka-configs.sh (its path): client quotas are set and read with it, "
    "confluent-kafka has no client-quota API."
)


def _tool_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--tool-config",
        default=None,
        help="For --kafka-configs: the admin's Java client properties (sasl.jaas.config, "
        "ssl.truststore.location ...); default LEDGER_KAFKA_CONFIG_FILE, whose keys are "
        "librdkafka's and serve only a cluster without SASL or TLS.",
    )(func)
    return click.option("--kafka-configs", "kafka_configs", default=None, help=_KAFKA_CONFIGS_HELP)(
        func
    )


_NO_QUOTA_API = (
    "confluent-kafka has no client-quota API: pass --kafka-configs PATH/kafka-configs.sh, "
    "or run `ledger acl plan --format kafka-configs`"
)


@click.group("acl", help=_MATRIX_HELP)
def acl_group() -> None:
    """Least-privilege ACLs (see the group help)."""


def _table(acl_plan: acl.AclPlan) -> str:
    rows = [("PRINCIPAL", "WRITES", "READS", "TRANSACTIONAL ID PREFIX", "GROUP", "DESCRIBE GROUPS")]
    for g in acl_plan.grants:
        rows.append(
            (
                g.principal,
                ",".join(g.writes) or "-",
                ",".join(g.reads) or "-",
                g.transactional_id_prefix or "-",
                g.group or "-",
                ",".join(g.helper_groups) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in rows
    )


@acl_group.command("plan")
@_plan_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "kafka-acls", "kafka-configs"]),
    default="table",
    show_default=True,
    help="table: one row per principal; json: rows, every entry and the client quotas; "
    "kafka-acls: kafka-acls.sh --add command lines; kafka-configs: kafka-configs.sh "
    "--alter lines that set the client quotas.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--command-config",
    default="admin.properties",
    show_default=True,
    help="For --format kafka-acls: the admin's client properties file.",
)
def acl_plan(
    mapping: tuple[str, ...],
    principal_format: str,
    idempotent_write: bool,
    quota_items: tuple[str, ...],
    fmt: str,
    as_json: bool,
    command_config: str,
) -> None:
    """Print the ACL matrix and client quotas for LEDGER_TOPIC_PREFIX (no cluster needed)."""
    settings = current_settings()
    the_plan = _build_plan(settings, mapping, principal_format, idempotent_write)
    the_quotas = _plan_quotas(mapping, principal_format, quota_items)
    if as_json or fmt == "json":
        data = the_plan.to_dict()
        data["quotas"] = [
            {"role": q.role, "principal": q.principal, **q.values} for q in the_quotas
        ]
        click.echo(json.dumps(data, indent=2))
    elif fmt == "kafka-configs":
        click.echo(
            f"# BOOTSTRAP=host:port; {command_config} holds the admin principal's client properties"
        )
        for line in quotas.kafka_configs_commands(the_quotas, command_config=command_config):
            click.echo(line)
    elif fmt == "kafka-acls":
        click.echo(
            f"# BOOTSTRAP=host:port; {command_config} holds the admin principal's client properties"
        )
        for line in acl.kafka_acls_commands(the_plan, command_config=command_config):
            click.echo(line)
    else:
        click.echo(_table(the_plan))
        click.echo(
            "# every principal may also DESCRIBE and DESCRIBE_CONFIGS every ledger topic "
            "(the start-up topic check); DESCRIBE GROUPS are named by partition readers "
            "(never joined); "
            f"{len(the_plan.acls())} entries in all (--format json lists them)"
        )
        click.echo(
            "# client quotas (bytes/s per broker; --format kafka-configs sets them): "
            + "; ".join(
                f"{q.principal} " + ", ".join(f"{k}={v}" for k, v in q.values.items())
                for q in the_quotas
            )
        )


@acl_group.command("apply")
@_plan_options
@click.option("--dry-run", is_flag=True, help="Only print what would be created.")
@_tool_options
def acl_apply(
    mapping: tuple[str, ...],
    principal_format: str,
    idempotent_write: bool,
    quota_items: tuple[str, ...],
    dry_run: bool,
    kafka_configs: str | None,
    tool_config: str | None,
) -> None:
    """Create the matrix's missing ACLs (idempotent), as the admin principal.

    Entries already there are left alone; entries not in the matrix are
    reported, never deleted (`ledger acl check` lists them). With
    --kafka-configs, the client quotas are set as well (setting them again
    is harmless); without it they are not set, and the command says so.
    """
    settings = current_settings()
    the_plan = _build_plan(settings, mapping, principal_format, idempotent_write)
    the_quotas = _plan_quotas(mapping, principal_format, quota_items)
    created, before = apply_plan(settings, the_plan, dry_run=dry_run)
    for q in the_quotas:
        if q.user is None or kafka_configs is None:
            continue
        if not dry_run:
            _kafka_configs(settings, kafka_configs, quotas.alter_args(q), tool_config)
        click.echo(
            f"{'would set' if dry_run else 'set'} quota: {q.principal} "
            + ", ".join(f"{k}={v}" for k, v in q.values.items())
        )
    if kafka_configs is None and the_quotas:
        click.echo(f"client quotas not set: {_NO_QUOTA_API}")
    verb = "would create" if dry_run else "created"
    for entry in created:
        click.echo(
            f"{verb}: {entry.principal} {entry.operation} {entry.resource_type} "
            f"{entry.name} ({entry.pattern.lower()})"
        )
    click.echo(
        f"{verb} {len(created)} ACLs, {len(before.present)} already present, "
        f"{len(before.extra)} not in the plan (see `ledger acl check`)"
    )


@acl_group.command("check")
@_plan_options
@click.option(
    "--accept",
    "accepted",
    multiple=True,
    metavar="PRINCIPAL",
    help="A principal outside the matrix whose grants on the ledger are known and "
    "wanted (repeatable), e.g. User:monitoring; never a wildcard.",
)
@_tool_options
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def acl_check(
    mapping: tuple[str, ...],
    principal_format: str,
    idempotent_write: bool,
    quota_items: tuple[str, ...],
    accepted: tuple[str, ...],
    kafka_configs: str | None,
    tool_config: str | None,
    as_json: bool,
) -> None:
    """Compare the cluster's ACLs on the ledger's resources with the matrix.

    Reads every principal's bindings, not only the matrix's: a wildcard
    principal (User:*) allowed anything on the ledger's topics, groups,
    transactional IDs or the cluster, and any other principal allowed
    something there, are reported as well as the matrix's own entries that
    are missing or beyond it. With --kafka-configs, each principal's client
    quotas are compared with the plan's too (without it they cannot be read,
    and the command says so). Exit status 1 when anything is reported. With
    --json: {"planned", "present", "missing": [{"principal", "resource_type",
    "name", "pattern", "operation", "host"}], "not_in_plan": [binding as
    text], "wildcard": [...], "other_principals": [...], "quotas": [problem]
    or null when not checked}.
    """
    wild = [p for p in accepted if is_wildcard(p)]
    if wild:
        raise click.UsageError(f"--accept {wild[0]}: a wildcard principal is never accepted")
    settings = current_settings()
    the_plan = _build_plan(settings, mapping, principal_format, idempotent_write)
    result = compare(the_plan, broker_acls(settings), accepted)
    the_quotas = _plan_quotas(mapping, principal_format, quota_items)
    quota_problems: list[str] | None = None
    if kafka_configs is not None:
        described = _kafka_configs(
            settings, kafka_configs, ["--describe", "--entity-type", "users"], tool_config
        )
        quota_problems = quotas.quota_problems(the_quotas, quotas.parse_described(described))
    bad = not result.clean or bool(quota_problems)
    if as_json:
        echo_json(
            {
                "planned": len(the_plan.acls()),
                "present": len(result.present),
                "missing": [dataclasses.asdict(entry) for entry in result.missing],
                "not_in_plan": [str(binding) for binding in result.extra],
                "wildcard": [str(binding) for binding in result.wildcard],
                "other_principals": [str(binding) for binding in result.others],
                "quotas": quota_problems,
            }
        )
        if bad:
            raise SystemExit(EXIT_ERROR)
        return
    for entry in result.missing:
        click.echo(
            f"missing: {entry.principal} {entry.operation} {entry.resource_type} "
            f"{entry.name} ({entry.pattern.lower()})"
        )
    for binding in result.extra:
        click.echo(f"not in the plan: {binding}")
    for binding in result.wildcard:
        click.echo(
            f"wildcard principal: {binding} (every client gets it; remove it with "
            "kafka-acls.sh --remove)"
        )
    for binding in result.others:
        click.echo(
            f"principal outside the plan: {binding} (remove it, or --accept "
            f"{binding.principal} if it is wanted)"
        )
    click.echo(
        f"{len(result.present)} of {len(the_plan.acls())} planned ACLs present, "
        f"{len(result.missing)} missing, {len(result.extra)} not in the plan, "
        f"{len(result.wildcard)} to a wildcard principal, "
        f"{len(result.others)} to principals outside the plan"
    )
    if quota_problems is None:
        click.echo(f"client quotas not checked: {_NO_QUOTA_API}")
    else:
        for problem in quota_problems:
            click.echo(f"quota: {problem}")
        click.echo(f"client quotas: {len(quota_problems)} not as planned")
    if bad:
        raise SystemExit(1)


COMMANDS: tuple[click.Command, ...] = (acl_group,)
