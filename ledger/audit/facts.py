"""The facts every invariant is checked against, gathered once per audit.

:func:`gather` replays the journal with the processor's own fold
(:func:`ledger.fold.replay_decisions`) and derives the evidence that more
than one invariant reads. The result is immutable: invariants read it and
none changes what another sees.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ledger.events import (
    ApprovalUse,
    Dispatch,
    Disposition,
    EffectReceipt,
    Event,
    JournalEntry,
    OperationState,
    Readback,
    RecoveryReceipt,
)
from ledger.fold import Decision, replay_decisions

#: One replayed journal entry: ``(entry, input event, state before, decision)``.
Step = tuple[JournalEntry, Event, OperationState | None, Decision]

#: A record's position: ``(short topic, partition, offset)``.
Position = tuple[str, int, int]


@dataclass(frozen=True)
class Provenance:
    """What the auditor found about who wrote the ledger's records.

    Gathered by the auditor from every audited topic (seals checked with
    :meth:`ledger.authn.Keyring.check`); pure data here.

    Attributes:
        unauthenticated: position -> why the record is not authentic (no
            trusted writer produced it), for every record read.
        undecodable: position -> why the record does not decode, for records
            no stage refused (corrupted evidence: a violation).
        dead_lettered: position -> why the record does not decode, for
            records a stage refused with an operating event naming that
            position (bad input, handled: listed, not a violation).
        uses: approval ID -> the authority kernel's signed use of it (the
            latest authentic record of ``approval-uses``).
        grants: approval ID -> ``None`` when its latest authentic
            ``approvals`` record carries a grant signed by a trusted reviewer,
            else the reason it does not.
        records: records read and checked.
        displaced_states: operation ID -> (position, reason) of its latest
            ``ledger.state`` record, when no trusted writer produced it or it
            does not decode: that record displaced the operation's authentic
            state (once compacted, ``ledger.state`` holds no authentic state
            of it), and the findings about its state name it.
        misplaced: position -> (record key, reason) of every record whose
            seal verifies but that lies on a partition its key does not
            name (:func:`ledger.topology.misplaced`; readers refused it, and
            it is in ``unauthenticated`` too).
    """

    unauthenticated: Mapping[Position, str]
    undecodable: Mapping[Position, str]
    uses: Mapping[str, ApprovalUse]
    grants: Mapping[str, str | None]
    records: int = 0
    dead_lettered: Mapping[Position, str] = field(default_factory=dict)
    displaced_states: Mapping[str, tuple[Position, str]] = field(default_factory=dict)
    misplaced: Mapping[Position, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditInput:
    """What the auditor read, and what replaying the journal gives.

    Attributes:
        journal: every journal entry, in journal order per operation.
        states: latest ``OperationState`` per operation (``ledger.state``).
        dispatches: latest dispatch per operation (``ledger.dispatches``).
        recovery_receipts: latest recovery receipt per operation
            (``ledger.recovery-receipts``).
        sink_effects: effects each readback-capable sink holds per operation
            (``None`` when the sinks were not read).
        replayed: the state per operation that replaying the journal reaches.
        steps: one :data:`Step` per journal entry, in journal order.
        operation_ids: every operation in ``ledger.state`` or the replay, sorted.
        generated_dispatches: dispatch ID -> the dispatch the replay generated
            under that ID (the last one, should there be several).
        generated_recovery_receipts: operation -> the recovery receipts the
            replay generated for it, in journal order.
        effect_ids: operation -> the distinct effect IDs of the committed
            effect receipts and committed effect readbacks in the journal
            (operations without one are absent).
        effect_evidence: operations with a committed effect receipt, a
            committed effect readback or a ``COMMITTED`` disposition.
        postconditions: operations with a ``MATCH`` postcondition readback,
            or a committed effect receipt that carries one (the readback the
            relay made right after the effect, receipt schema version 4).
        unreadable: journal entries whose recorded input does not decode,
            with the reason (left out of the replay).
        provenance: who wrote the records (``None``: authenticity was not
            checked, e.g. pure tests).
        amount_fields: sink -> the parameter holding its amount, as its
            contract in the sink registry names it (``None``: its effects
            carry no amount); a sink not named reads ``amount_minor``.
    """

    journal: tuple[JournalEntry, ...]
    states: Mapping[str, OperationState]
    dispatches: Mapping[str, Dispatch]
    recovery_receipts: Mapping[str, RecoveryReceipt]
    sink_effects: Mapping[str, int] | None
    replayed: Mapping[str, OperationState]
    steps: tuple[Step, ...]
    operation_ids: tuple[str, ...]
    generated_dispatches: Mapping[str, Dispatch]
    generated_recovery_receipts: Mapping[str, tuple[RecoveryReceipt, ...]]
    effect_ids: Mapping[str, frozenset[str]]
    effect_evidence: frozenset[str]
    postconditions: frozenset[str]
    unreadable: tuple[tuple[JournalEntry, str], ...] = ()
    provenance: Provenance | None = None
    amount_fields: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))


def gather(
    journal: Iterable[JournalEntry],
    states: Mapping[str, OperationState],
    dispatches: Mapping[str, Dispatch],
    recovery_receipts: Mapping[str, RecoveryReceipt],
    sink_effects: Mapping[str, int] | None = None,
    provenance: Provenance | None = None,
    amount_fields: Mapping[str, str | None] | None = None,
) -> AuditInput:
    """Replay the journal once and gather the facts the invariants read.

    Args:
        journal: every journal entry, in journal order per operation.
        states: latest ``OperationState`` per operation (``ledger.state``).
        dispatches: latest dispatch per operation (``ledger.dispatches``).
        recovery_receipts: latest recovery receipt per operation.
        sink_effects: effects each readback-capable sink holds per operation
            (``None`` when the sinks were not read).
        provenance: who wrote the records (see :class:`Provenance`).
        amount_fields: sink -> the parameter holding its amount (see
            :class:`AuditInput`; ``None``: every sink reads ``amount_minor``).

    Returns:
        The facts; see :class:`AuditInput`.
    """
    entries = tuple(journal)
    unreadable: list[tuple[JournalEntry, str]] = []
    replayed, steps = replay_decisions(
        entries, lambda entry, exc: unreadable.append((entry, f"{type(exc).__name__}: {exc}"))
    )
    generated_dispatches: dict[str, Dispatch] = {}
    generated_receipts: dict[str, list[RecoveryReceipt]] = defaultdict(list)
    effect_ids: dict[str, set[str]] = defaultdict(set)
    effect_evidence: set[str] = set()
    postconditions: set[str] = set()
    for entry, event, _before, decision in steps:
        op = entry.operation_id
        for out in decision.outputs:
            if isinstance(out.event, Dispatch):
                generated_dispatches[out.event.dispatch_id] = out.event
            elif isinstance(out.event, RecoveryReceipt):
                generated_receipts[op].append(out.event)
        if isinstance(event, EffectReceipt | Readback):
            accepted = isinstance(event, EffectReceipt) and event.status == "COMMITTED"
            read_back = (
                isinstance(event, Readback)
                and event.kind == "EFFECT"
                and event.status == "COMMITTED"
            )
            if accepted or read_back:
                if event.effect_id:
                    effect_ids[op].add(event.effect_id)
                effect_evidence.add(op)
            if (
                isinstance(event, Readback)
                and event.kind == "POSTCONDITION"
                and event.status == "MATCH"
            ) or (
                isinstance(event, EffectReceipt)
                and accepted
                and event.postcondition_status == "MATCH"
            ):
                # A committed receipt may carry the postcondition readback the
                # relay made right after the effect (receipt schema version 4).
                postconditions.add(op)
        if isinstance(event, Disposition) and event.decision == "COMMITTED":
            effect_evidence.add(op)
    return AuditInput(
        journal=entries,
        states=MappingProxyType(dict(states)),
        dispatches=MappingProxyType(dict(dispatches)),
        recovery_receipts=MappingProxyType(dict(recovery_receipts)),
        sink_effects=None if sink_effects is None else MappingProxyType(dict(sink_effects)),
        replayed=MappingProxyType(replayed),
        steps=tuple(steps),
        operation_ids=tuple(sorted(set(states) | set(replayed))),
        generated_dispatches=MappingProxyType(generated_dispatches),
        generated_recovery_receipts=MappingProxyType(
            {op: tuple(receipts) for op, receipts in generated_receipts.items()}
        ),
        effect_ids=MappingProxyType({op: frozenset(ids) for op, ids in effect_ids.items()}),
        effect_evidence=frozenset(effect_evidence),
        postconditions=frozenset(postconditions),
        unreadable=tuple(unreadable),
        provenance=provenance,
        amount_fields=MappingProxyType(dict(amount_fields or {})),
    )
