"""How the ledger's topics are replicated, and what in a topic's replication loses evidence (pure).

:func:`replication_for` derives the replication factor and
``min.insync.replicas`` from the settings or the broker count;
:func:`replication_problems` judges one topic against it and
:func:`reassignment_plan` writes the ``kafka-reassign-partitions.sh`` plan
that adds missing replicas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

# confluent_kafka.admin re-exports these without marking them public, so
# mypy --strict wants them from their defining modules.
from ledger.errors import SettingsError
from ledger.settings import LedgerSettings

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


def brokers_text(count: int) -> str:
    """``1 broker`` or ``N brokers``."""
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
        factor_origin = f"the default on a cluster of {brokers_text(brokers)}"
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
                f"the cluster has only {brokers_text(brokers)}: add brokers and then replicas "
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
