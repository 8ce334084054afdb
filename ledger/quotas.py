"""Kafka client quotas of the ACL plan's principals (pure data, no I/O).

ACLs say what a principal may do, not how much of it: a service allowed to
WRITE ``intents`` could republish one large intent thousands of times, and
every copy is kept. Kafka's client quotas (KIP-13, KIP-55: per user
principal, enforced by every broker by delaying the client's responses)
bound how fast each principal may produce and fetch.

:data:`DEFAULT_QUOTAS` bounds the principals outside the ledger's own
processes: the services, the review systems and the operators. The
transactional stages, the reconciler and the auditor are not throttled: a
throttled stage delays every operation behind it, and they run code the
deployment controls. ``ledger acl plan --quota ROLE:KEY=VALUE`` changes a
value, ``0`` removes that key.

confluent-kafka has no client-quota admin API, so the quotas are set and
read with Kafka's ``kafka-configs.sh`` (:func:`kafka_configs_commands`,
:func:`parse_described`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ledger.errors import AccessPlanError

#: The quota keys the plan sets (Kafka's names; bytes per second per broker).
KEYS: tuple[str, ...] = ("producer_byte_rate", "consumer_byte_rate")

#: role -> quota key -> bytes per second (per broker).
DEFAULT_QUOTAS: Mapping[str, Mapping[str, int]] = {
    # An intent is at most a few kB: 1 MiB/s is hundreds a second per broker.
    "service": {"producer_byte_rate": 1 << 20, "consumer_byte_rate": 1 << 20},
    "reviewer": {"producer_byte_rate": 256 << 10, "consumer_byte_rate": 4 << 20},
    "operator": {"producer_byte_rate": 256 << 10, "consumer_byte_rate": 8 << 20},
}


@dataclass(frozen=True)
class Quota:
    """The client quota of one principal.

    Attributes:
        role: the plan's role name.
        principal: its Kafka principal (``User:service``).
        values: quota key -> bytes per second per broker.
    """

    role: str
    principal: str
    values: Mapping[str, int]

    @property
    def user(self) -> str | None:
        """The user name Kafka's ``users`` quota entity takes, or ``None`` (not a ``User:``)."""
        kind, _, name = self.principal.partition(":")
        return name if kind == "User" else None


def parse_overrides(items: Iterable[str]) -> dict[str, dict[str, int]]:
    """Parse ``ROLE:KEY=VALUE`` (``service:producer_byte_rate=2097152``).

    Raises:
        LedgerError: malformed item, unknown key, or a value that is not a
            whole number of bytes per second (0 removes the key).
    """
    out: dict[str, dict[str, int]] = {}
    for item in items:
        match = re.fullmatch(r"([a-z]+):([a-z_]+)=(\d+)", item.strip())
        if match is None or match.group(2) not in KEYS:
            raise AccessPlanError(
                f"quota {item!r} is not ROLE:KEY=BYTES_PER_SECOND with KEY one of "
                f"{', '.join(KEYS)} (e.g. service:producer_byte_rate=2097152)",
                observed=item,
            )
        out.setdefault(match.group(1), {})[match.group(2)] = int(match.group(3))
    return out


def plan_quotas(
    principals: Mapping[str, str],
    overrides: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[Quota, ...]:
    """The quotas of the plan's principals.

    Args:
        principals: role -> Kafka principal (``ledger.acl.principal_names``).
        overrides: role -> key -> value over :data:`DEFAULT_QUOTAS` (0 removes).

    Returns:
        One :class:`Quota` per role with at least one key, in ``principals`` order.

    Raises:
        LedgerError: an override names a role not in ``principals``.
    """
    overrides = overrides or {}
    unknown = sorted(set(overrides) - set(principals))
    if unknown:
        raise AccessPlanError(
            f"quota for unknown role(s) {', '.join(unknown)}; one of {', '.join(principals)}",
            observed=unknown,
        )
    out = []
    for role, principal in principals.items():
        values = {**DEFAULT_QUOTAS.get(role, {}), **overrides.get(role, {})}
        values = {k: v for k, v in values.items() if v > 0}
        if values:
            out.append(Quota(role, principal, dict(sorted(values.items()))))
    return tuple(out)


def _config_text(values: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(values.items()))


def kafka_configs_commands(
    quotas: Iterable[Quota],
    *,
    bootstrap: str = "$BOOTSTRAP",
    command_config: str = "admin.properties",
    tool: str = "kafka-configs.sh",
) -> list[str]:
    """The quotas as ``kafka-configs.sh --alter`` lines (a comment for a non-``User:`` principal).

    Args:
        quotas: the plan's quotas.
        bootstrap: the ``--bootstrap-server`` argument (``$BOOTSTRAP`` is left unquoted).
        command_config: the admin client's properties file.
        tool: the script's name or path.
    """
    lines = []
    for q in quotas:
        if q.user is None:
            lines.append(
                f"# {q.principal} ({q.role}): not a User principal; set its quota "
                f"({_config_text(q.values)}) on the entity your brokers map it to"
            )
            continue
        connect = [tool, "--bootstrap-server", bootstrap, "--command-config", command_config]
        lines.append(
            " ".join(a if a.startswith("$") else shlex.quote(a) for a in connect + alter_args(q))
        )
    return lines


def alter_args(quota: Quota) -> list[str]:
    """The ``kafka-configs.sh`` arguments (after the connection's) that set one user's quota.

    Args:
        quota: a quota of a ``User:`` principal.
    """
    assert quota.user is not None
    return [
        "--alter",
        "--entity-type",
        "users",
        "--entity-name",
        quota.user,
        "--add-config",
        _config_text(quota.values),
    ]


#: ``kafka-configs.sh --describe --entity-type users``: one line per user.
_DESCRIBED = re.compile(r"Quota configs for user-principal '(?P<user>[^']*)' are (?P<configs>.*)$")


def parse_described(text: str) -> dict[str, dict[str, float]]:
    """Read ``kafka-configs.sh --describe --entity-type users`` output.

    Args:
        text: the tool's standard output.

    Returns:
        user name -> quota key -> value, for every user line with quotas.
    """
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _DESCRIBED.search(line.strip())
        if match is None:
            continue
        values: dict[str, float] = {}
        for part in match.group("configs").split(","):
            key, sep, value = part.strip().partition("=")
            if sep:
                try:
                    values[key] = float(value)
                except ValueError:
                    continue
        out[match.group("user")] = values
    return out


def quota_problems(
    quotas: Iterable[Quota], described: Mapping[str, Mapping[str, float]]
) -> list[str]:
    """What the cluster's quotas lack against the plan (pure).

    Args:
        quotas: the plan's quotas.
        described: user -> key -> value, as :func:`parse_described` reads them.

    Returns:
        One line per quota key missing or different (a looser value, or a
        stricter one: both are not the plan), empty when they match.
    """
    problems = []
    for q in quotas:
        if q.user is None:
            continue
        have = described.get(q.user, {})
        for key, want in q.values.items():
            got = have.get(key)
            if got is None:
                problems.append(f"{q.principal}: no {key} quota (the plan sets {want})")
            elif got != float(want):
                problems.append(f"{q.principal}: {key} is {got:g}, the plan sets {want}")
    return problems
