"""What each stage is doing, as Kafka sees it: ``ledger status``.

Every stage instance is a member of its component's consumer group
(``{prefix}.{component}``, static member ``{component}-{instance}``) while its
loop heartbeats, and commits its input offsets in each transaction. So the
broker alone says, without any file a dead process leaves behind:

* liveness: the group's members (a member that stops heartbeating leaves
  after ``session.timeout.ms``, 10 s);
* assignment: the input partitions each member holds;
* last commit: the committed offset of every input partition, and the
  time of the last input record committed past (its Kafka timestamp);
* lag: each partition's last stable offset minus its committed offset.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not in its __all__
    AdminClient,
    OffsetSpec,
)

from consumers.retry import is_retriable
from consumers.stages import STAGES
from consumers.twins import LOOK_S, incarnations, local_processes, twins
from ledger.errors import BrokerError, BrokerUnavailableError
from ledger.kafka import (
    REFUSAL_CODES,
    admin_config,
    bootstrap_servers,
    kafka_error,
    make_consumer,
)
from ledger.settings import LedgerSettings

#: Seconds one admin request may take.
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Member:
    """One live stage instance (a member of its component's group).

    Attributes:
        instance: its static member ID (``processor-0``), else its client ID.
        host: the address the broker sees it from.
        member_id: the broker's member ID.
        partitions: input partitions assigned to it, ``topic[partition]``
            with short topic names, sorted.
    """

    instance: str
    host: str
    member_id: str
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class PartitionProgress:
    """One input partition of a stage: how far it has committed.

    Attributes:
        topic: short topic name.
        partition: partition number.
        committed: the committed offset (next input to process), ``None``
            when the group never committed on it.
        end: the last stable offset (``read_committed`` end).
        lag: records not yet committed past: ``end - committed`` (or
            ``end`` when never committed), never negative.
        last_input_ms: Kafka timestamp (Unix milliseconds) of the last input
            record committed past, ``None`` when there is none (or it was not
            found among the few records before the committed offset).
    """

    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int
    last_input_ms: int | None = None


@dataclass(frozen=True)
class StageStatus:
    """One component's group: who runs it, what they hold, how far behind.

    Attributes:
        component: ``processor``, ``authority`` or ``relay``.
        group: its consumer group ID.
        group_state: the group's state as the broker says it (``STABLE``,
            ``EMPTY``, ``PREPARING_REBALANCING`` ...; ``DEAD`` when the
            group never existed).
        members: the live instances.
        partitions: every input partition's progress.
        twins: member name -> the processes seen holding it while status
            looked (``relay-0.4711 at /10.0.0.5``), for names more than one
            process held: two live processes with one instance name
            (:mod:`consumers.twins`), or one restarted meanwhile.
        unseen: input topics (short names) whose last records this client's
            principal may not read, so ``last_input_ms`` is unknown there
            (the operator of ``ledger acl plan`` reads no stage input).
    """

    component: str
    group: str
    group_state: str
    members: tuple[Member, ...] = ()
    partitions: tuple[PartitionProgress, ...] = field(default=())
    twins: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unseen: tuple[str, ...] = ()

    @property
    def live(self) -> bool:
        """At least one instance is a member of the group (heartbeating)."""
        return bool(self.members)

    @property
    def lag(self) -> int:
        """Records behind, summed over the stage's input partitions."""
        return sum(p.lag for p in self.partitions)

    @property
    def last_commit_ms(self) -> int | None:
        """Latest :attr:`PartitionProgress.last_input_ms` over the inputs (Unix ms)."""
        found = [p.last_input_ms for p in self.partitions if p.last_input_ms is not None]
        return max(found) if found else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields, plus ``live``, ``lag`` and ``last_commit_ms``."""
        return {
            **asdict(self),
            "live": self.live,
            "lag": self.lag,
            "last_commit_ms": self.last_commit_ms,
            "twins": {name: list(who) for name, who in self.twins.items()},
        }


def _short(settings: LedgerSettings, topic: str) -> str:
    prefix = settings.topic_prefix + "."
    return topic[len(prefix) :] if topic.startswith(prefix) else topic


def _unanswered(settings: LedgerSettings, exc: BaseException) -> BrokerError:
    err = kafka_error(exc)
    if err is not None and err.code() in REFUSAL_CODES:
        groups = ", ".join(f"{settings.topic_prefix}.{c}" for c in STAGES)
        return BrokerError(
            f"Kafka at {bootstrap_servers(settings)} refuses this client's principal what "
            f"`ledger status` asks ({err.name()}: not authorised, not a broker outage): it "
            f"needs DESCRIBE on the groups {groups} and {settings.topic_prefix}.status and on "
            "the ledger's topics; run it as the operator (LEDGER_KAFKA_CONFIG_FILE with the "
            "operator's credentials) after `ledger acl apply`, which grants them "
            "(`ledger acl plan` lists them)",
            expected="DESCRIBE on the stage groups",
            observed=err.name(),
        )
    return BrokerUnavailableError(
        f"Kafka at {bootstrap_servers(settings)} did not say how the stages' groups stand "
        f"({exc}); is it running (`ledger broker status`)?",
        expected="broker answering",
        observed=str(exc),
    )


def stage_status(
    settings: LedgerSettings, partitions: int | None = None, look_s: float = LOOK_S
) -> list[StageStatus]:
    """Ask the broker how every stage stands (see the module docstring).

    The groups are looked at again for ``look_s`` seconds, to see two
    processes that hold one instance name in turn (:mod:`consumers.twins`).

    Retriable Kafka errors (a partition leader moving just after topics
    were created or the broker restarted) are asked again for up to
    :data:`REQUEST_TIMEOUT_S` seconds.

    Args:
        settings: ledger settings (prefix, bootstrap servers, client properties).
        partitions: partitions of each operation-keyed input (default
            ``settings.partitions``; control topics are not stage inputs).
        look_s: how long to watch the groups' members (seconds; 0: one look).

    Returns:
        One :class:`StageStatus` per component of :data:`consumers.stages.STAGES`,
        in that order.

    Raises:
        BrokerUnavailableError: Kafka did not answer in time.
    """
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while True:
        try:
            count = settings.partitions if partitions is None else partitions
            return _with_local_twins(settings, _ask(settings, count, look_s))
        except (KafkaException, TimeoutError) as exc:
            if not is_retriable(exc) or time.monotonic() > deadline:
                raise _unanswered(settings, exc) from exc
            time.sleep(0.5)


def _with_local_twins(settings: LedgerSettings, stages: list[StageStatus]) -> list[StageStatus]:
    """Add the names that two live processes of this host run (their own files)."""
    local = {
        name: pids for name, pids in local_processes(settings.run_dir).items() if len(pids) > 1
    }
    out = []
    for st in stages:
        found = dict(st.twins)
        for name, pids in local.items():
            if name.rpartition("-")[0] == st.component:
                here = tuple(f"pid {pid} on this host" for pid in pids)
                found[name] = tuple(found.get(name, ())) + here
        out.append(replace(st, twins=found))
    return out


def _ask(settings: LedgerSettings, count: int, look_s: float) -> list[StageStatus]:
    """One round of questions for :func:`stage_status` (Kafka's errors pass through)."""
    admin = AdminClient(admin_config(settings))
    groups = {component: f"{settings.topic_prefix}.{component}" for component in STAGES}
    inputs = {
        component: [
            TopicPartition(settings.topic(t), p) for t in stage.inputs for p in range(count)
        ]
        for component, stage in STAGES.items()
    }

    def describe() -> dict[str, Any]:
        return {
            group: future.result(timeout=REQUEST_TIMEOUT_S)
            for group, future in admin.describe_consumer_groups(
                list(groups.values()), request_timeout=REQUEST_TIMEOUT_S
            ).items()
        }

    described = describe()
    held_by = incarnations(describe, described, look_s=look_s)
    committed: dict[str, dict[tuple[str, int], int | None]] = {}
    for component, group in groups.items():
        request = [ConsumerGroupTopicPartitions(group, inputs[component])]
        answer = admin.list_consumer_group_offsets(request, request_timeout=REQUEST_TIMEOUT_S)[
            group
        ].result(timeout=REQUEST_TIMEOUT_S)
        committed[component] = {
            (tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None
            for tp in answer.topic_partitions or []
        }
    every = {tp for tps in inputs.values() for tp in tps}
    ends = {
        (tp.topic, tp.partition): future.result(timeout=REQUEST_TIMEOUT_S).offset
        for tp, future in admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in every},  # type: ignore[no-untyped-call]  # untyped in confluent-kafka
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=REQUEST_TIMEOUT_S,
        ).items()
    }
    last_input, refused = _last_inputs(
        settings,
        {at: offset for offsets in committed.values() for at, offset in offsets.items()},
    )
    out: list[StageStatus] = []
    for component, group in groups.items():
        description = described[group]
        members = tuple(
            sorted(
                (
                    Member(
                        instance=m.group_instance_id or m.client_id,
                        host=m.host,
                        member_id=m.member_id,
                        partitions=tuple(
                            sorted(
                                f"{_short(settings, tp.topic)}[{tp.partition}]"
                                for tp in (m.assignment.topic_partitions or [])
                            )
                        ),
                    )
                    for m in description.members
                ),
                key=lambda m: m.instance,
            )
        )
        progress = []
        for tp in inputs[component]:
            at = committed[component].get((tp.topic, tp.partition))
            end = int(ends[(tp.topic, tp.partition)])
            progress.append(
                PartitionProgress(
                    topic=_short(settings, tp.topic),
                    partition=tp.partition,
                    committed=at,
                    end=end,
                    lag=max(0, end - (at or 0)),
                    last_input_ms=last_input.get((tp.topic, tp.partition)),
                )
            )
        state = description.state
        out.append(
            StageStatus(
                component=component,
                group=group,
                group_state=getattr(state, "name", str(state)),
                members=members,
                partitions=tuple(progress),
                twins={
                    name: tuple(str(who) for who in seen)
                    for name, seen in twins(held_by.get(group, {})).items()
                },
                unseen=tuple(
                    sorted({_short(settings, tp.topic) for tp in inputs[component]} & refused)
                ),
            )
        )
    return out


#: Records before a committed offset searched for the last input (transaction
#: markers take offsets too).
_LOOK_BACK = 6

#: Seconds :func:`_last_inputs` may read.
_LOOK_S = 5.0


def _last_inputs(
    settings: LedgerSettings, committed: dict[tuple[str, int], int | None]
) -> tuple[dict[tuple[str, int], int], set[str]]:
    """Kafka timestamp (ms) of the last record below each committed offset.

    Reads at most :data:`_LOOK_BACK` records before each offset, for at most
    :data:`_LOOK_S` seconds in all; a partition whose record is not found
    (aborted transactions only, or time up) is left out. A topic the broker
    refuses this client's principal to read is given up at once and named.

    Args:
        settings: ledger settings.
        committed: (full topic, partition) -> committed offset (``None``: never).

    Returns:
        ``((full topic, partition) -> ms, short names of the topics refused)``.
    """
    wanted = {tp: at for tp, at in committed.items() if at}
    refused: set[str] = set()
    if not wanted:
        return {}, refused
    consumer = make_consumer(
        settings,
        f"{settings.topic_prefix}.status",
        extra={"enable.partition.eof": True, "fetch.wait.max.ms": 50},
    )
    found: dict[tuple[str, int], int] = {}
    done: set[tuple[str, int]] = set()
    try:
        consumer.assign(
            [TopicPartition(t, p, max(0, at - _LOOK_BACK)) for (t, p), at in wanted.items()]
        )
        deadline = time.monotonic() + _LOOK_S
        while len(done) < len(wanted) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            where = (msg.topic() or "", msg.partition() or 0)
            if where in done or where not in wanted:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    done.add(where)
                elif err.code() in REFUSAL_CODES:
                    # Not allowed to read: what the principal cannot see is named.
                    topics = {where[0]} if msg.topic() else {t for t, _ in wanted}
                    done.update(tp for tp in wanted if tp[0] in topics)
                    refused.update(_short(settings, t) for t in topics)
                continue
            offset = msg.offset() or 0
            if offset >= wanted[where]:
                done.add(where)
                continue
            kind, stamp = msg.timestamp()
            if kind != TIMESTAMP_NOT_AVAILABLE:
                found[where] = stamp
    finally:
        consumer.close()
    return found, refused
