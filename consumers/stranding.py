"""Finding stranded operations in a running ledger (the readers' side of :mod:`ledger.stranded`).

The pure definition lives in :mod:`ledger.stranded`; this module gathers
what it needs from Kafka and the run folder: every operation's latest state
and when it was written (the record's Kafka timestamp), which relay holds
each partition (the consumer groups, as ``ledger status`` reads them),
whether each sink can verify (the sink registry), and the postcondition
mismatches (operating events), and the intents the processor has not
consumed (:mod:`consumers.unconsumed`). The audit, ``ledger reconcile run`` and the
console ask here; the processor's metric asks :mod:`consumers.strandwatch`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Message

from consumers.groups import stage_status
from consumers.reader import read_topic
from consumers.stage import Record, decode_record, kafka_timestamp_ms, key_text, read_partition
from consumers.strandwatch import bounds_of, verifiable_at
from consumers.unconsumed import not_consumed
from ledger.authn import unverifiable
from ledger.credentials import load_keyring
from ledger.errors import LedgerError
from ledger.events import OperatingEvent, OperationState
from ledger.settings import LedgerSettings
from ledger.stranded import Evidence, Stranded, evaluate, order
from ledger.topology import Topic, is_reserved_key, partition_for
from sinks.registry import load_sinks

log = logging.getLogger(__name__)


def relay_partitions(settings: LedgerSettings) -> set[int] | None:
    """The ``dispatches`` partitions a live relay holds now.

    Returns:
        Partition numbers, or ``None`` when the consumer groups could not be
        read (the broker did not answer, or this principal may not describe
        them): liveness is then unknown, never assumed.
    """
    try:
        stages = stage_status(settings)
    except LedgerError as exc:
        log.warning("stranded: relay liveness unknown (%s)", exc.message)
        return None
    held: set[int] = set()
    for stage in stages:
        if stage.component != "relay":
            continue
        for member in stage.members:
            for name in member.partitions:
                topic, _, rest = name.partition("[")
                if topic == Topic.DISPATCHES and rest.endswith("]") and rest[:-1].isdigit():
                    held.add(int(rest[:-1]))
    return held


def can_verify(settings: LedgerSettings) -> Callable[[OperationState], bool]:
    """:func:`verifiable_at` over the sink registry (unreadable: every sink can verify)."""
    try:
        sinks = load_sinks(settings.sinks_path())
    except LedgerError as exc:
        log.warning("stranded: sink registry unreadable (%s)", exc.message)
        return lambda _st: True
    return lambda st: verifiable_at(sinks, st)


def find_stranded(
    settings: LedgerSettings,
    states: Mapping[str, OperationState],
    since_ms: Mapping[str, int],
    now_ms: int,
    *,
    mismatched: frozenset[str] | set[str] = frozenset(),
    held: Mapping[str, str] | None = None,
    relay: set[int] | None = None,
    verifiable: Callable[[OperationState], bool] | None = None,
    intents: list[Stranded] | None = None,
    unknown: list[str] | None = None,
) -> list[Stranded]:
    """The stranded operations among ``states``, oldest first.

    Args:
        settings: ledger settings (bounds, partitions, sink registry, groups).
        states: latest state per operation.
        since_ms: operation -> Kafka timestamp of its latest state record
            (wall clock, ms); missing: its age is unknown and it is not judged.
        now_ms: wall clock now, milliseconds.
        mismatched: operations whose postcondition contradicted the effect.
        held: operation -> why a reader holds it behind a refused record (an
            operation held with no authentic state is judged too; its age
            runs from ``since_ms`` of the refused record).
        relay: ``dispatches`` partitions a live relay holds (default: asked
            of the consumer groups; ``None`` there: unknown).
        verifiable: whether an operation's sink can verify (default: the
            sink registry, :func:`can_verify`).
        intents: the operations whose intent the processor has not consumed
            past its bound (default: asked of Kafka,
            :func:`consumers.unconsumed.not_consumed`); listed unless
            stranded for another reason already.
        unknown: when given, what could not be looked for is added to it
            (:data:`consumers.unconsumed.UNCHECKED`).

    Returns:
        One :class:`~ledger.stranded.Stranded` per stranded operation.
    """
    bounds = bounds_of(settings)
    relay = relay_partitions(settings) if relay is None else relay
    check = can_verify(settings) if verifiable is None else verifiable
    held = held or {}
    found: list[Stranded] = []
    for op in set(states) | set(held):
        st = states.get(op)
        evidence = Evidence(
            since_ms=since_ms.get(op),
            owner_live=None if relay is None else partition_for(op, settings.partitions) in relay,
            held=held.get(op),
            verifiable=st is None or check(st),
            mismatched=op in mismatched,
        )
        state, sink = ("", "") if st is None else (str(st.state), st.sink)
        item = evaluate(op, state, sink, evidence, now_ms, bounds)
        if item is not None:
            found.append(item)
    if intents is None:
        intents = not_consumed(settings, now_ms, bounds, unknown)
    listed = {s.operation_id for s in found}
    found += [s for s in intents if s.operation_id not in listed]
    return order(found)


def mismatches(settings: LedgerSettings) -> set[str]:
    """Operations a ``POSTCONDITION_MISMATCH`` operating event names (authentic records only).

    A topic this principal cannot read is logged and read as none: such an
    operation is then shown stranded, never hidden.
    """
    try:
        records = read_topic(settings, Topic.OPERATING_EVENTS)
    except LedgerError as exc:
        log.warning("stranded: operating events unread, mismatches unknown (%s)", exc.message)
        return set()
    return {
        rec.event.operation_id
        for rec in records
        if isinstance(rec.event, OperatingEvent)
        and rec.event.kind == "POSTCONDITION_MISMATCH"
        and rec.event.operation_id is not None
    }


def ledger_stranded(settings: LedgerSettings) -> list[Stranded]:
    """Read the ledger and return its stranded operations, oldest first.

    Reads ``ledger.state`` (latest authentic record per operation, with its
    Kafka timestamp, and the operations whose latest record is sealed by a
    key not held here: every reader holds those), ``ledger.operating-events``,
    the consumer groups and the sink registry. Ages are on the wall clock, as
    the audit's.

    Raises:
        LedgerError: a topic could not be read to its end.
        LocalFileError: a key file is unreadable.
    """
    latest: dict[str, Message] = {}
    held: dict[str, str] = {}
    since: dict[str, int] = {}

    def keep(_rec: Record | None, msg: Message) -> None:
        key = key_text(msg)
        held.pop(key, None)
        if msg.value() is None:
            latest.pop(key, None)
        else:
            latest[key] = msg

    def refused(msg: Message, problem: str) -> None:
        key = key_text(msg)
        if unverifiable(problem) and not is_reserved_key(key.encode()):
            held[key] = f"state:{msg.partition()}:{msg.offset()} {problem}"
            latest.pop(key, None)
            stamp = kafka_timestamp_ms(msg)
            if stamp is not None:
                since[key] = stamp

    read_partition(
        settings,
        Topic.STATE,
        None,
        keep,
        decode=False,
        keyring=load_keyring(settings, missing_ok=True),
        on_refused=refused,
    )
    states: dict[str, OperationState] = {}
    for key, msg in latest.items():
        rec = decode_record(Topic.STATE, msg)
        if rec is not None and isinstance(rec.event, OperationState):
            states[key] = rec.event
            if rec.timestamp_ms is not None:
                since[key] = rec.timestamp_ms
    return find_stranded(
        settings,
        states,
        since,
        int(time.time() * 1000),
        mismatched=mismatches(settings),
        held=held,
    )
