"""The journal: the record of each decision, and its replay through :func:`decide`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ledger.events import Event, JournalEntry, OperationState, decode_event
from ledger.fold.apply import decide
from ledger.fold.compensation import CompensationFacts
from ledger.fold.core import Decision


def hop_names(decision: Decision) -> tuple[str, ...]:
    """A decision's hops as the journal records them.

    Args:
        decision: a decision of :func:`~ledger.fold.decide`.

    Returns:
        One ``FROM->TO`` string per hop, in order (empty when none).
    """
    return tuple(f"{frm}->{to}" for frm, to in decision.hops)


def journal_entry(
    decision: Decision,
    event: Event,
    raw: bytes,
    topic: str,
    partition: int,
    offset: int,
    *,
    sink_problem: str | None = None,
    resumed_by: str | None = None,
    compensation: CompensationFacts | None = None,
) -> JournalEntry:
    """The journal record of one decision (the input bytes are the evidence).

    Args:
        decision: what :func:`~ledger.fold.decide` made of the input.
        event: the input event.
        raw: the input exactly as read (single-object encoded).
        topic: the input's topic (short name).
        partition: the input's partition.
        offset: the input's offset.
        sink_problem: the observation of the intent's sink the decision was
            made with (see :func:`~ledger.fold.decide`), kept for replay.
        resumed_by: the restarted processor that resumed the operation with
            this input (see :func:`~ledger.fold.decide`), kept for replay.
        compensation: what the processor observed of a compensation's
            original, kept for replay.

    Returns:
        The entry: outcome, states before and after, every hop, the reason,
        the input's position and its bytes; ``seq`` is the state version
        after the input (0 when there is no state).
    """
    op = getattr(event, "operation_id", "") or ""
    return JournalEntry(
        operation_id=op,
        seq=decision.state.version if decision.state else 0,
        kind=event.KIND,
        outcome=decision.outcome,
        from_state=decision.from_state,
        to_state=decision.to_state,
        reason=decision.reason,
        input_topic=topic,
        input_partition=partition,
        input_offset=offset,
        input_event=raw,
        hops=hop_names(decision),
        sink_problem=sink_problem,
        resumed_by=resumed_by,
        compensation_facts=compensation.to_json() if compensation is not None else None,
    )


def ref_of(topic: str, partition: int, offset: int) -> str:
    """The ``ref`` string of an input position.

    Args:
        topic: the input's topic (short name).
        partition: the input's partition.
        offset: the input's offset.

    Returns:
        ``topic:partition:offset``.
    """
    return f"{topic}:{partition}:{offset}"


def replay_decisions(
    entries: Iterable[JournalEntry],
    on_unreadable: Callable[[JournalEntry, Exception], None] | None = None,
) -> tuple[
    dict[str, OperationState], list[tuple[JournalEntry, Event, OperationState | None, Decision]]
]:
    """Fold journal entries like :func:`replay`, also returning every step.

    Args:
        entries: journal entries in journal order (per operation).
        on_unreadable: when given, an entry whose input bytes do not decode
            is passed to it with the error and skipped (the auditor reports
            it and goes on); when ``None`` the error is raised.

    Returns:
        ``(states, steps)``: the state of every operation, and one step per
        entry, ``(entry, input event, state before, decision)``, in journal
        order.

    Raises:
        DecodeError: an entry's input bytes do not decode (no ``on_unreadable``).
        UnknownSchemaError: an input was written with an unknown schema (idem).
    """
    states: dict[str, OperationState] = {}
    steps: list[tuple[JournalEntry, Event, OperationState | None, Decision]] = []
    for entry in entries:
        try:
            event = decode_event(entry.input_event)
        except Exception as exc:
            if on_unreadable is None:
                raise
            on_unreadable(entry, exc)
            continue
        ref = ref_of(entry.input_topic, entry.input_partition, entry.input_offset)
        before = states.get(entry.operation_id)
        decision = decide(
            before,
            event,
            ref,
            sink_problem=entry.sink_problem,
            resumed_by=entry.resumed_by,
            compensation=CompensationFacts.from_json(entry.compensation_facts),
        )
        steps.append((entry, event, before, decision))
        if decision.state is not None:
            states[entry.operation_id] = decision.state
    return states, steps


def replay(entries: Iterable[JournalEntry]) -> dict[str, OperationState]:
    """Fold journal entries (in journal order) into the state of every operation.

    Each entry's recorded input is decoded and applied with :func:`decide`,
    exactly as the processor did; the result must equal ``ledger.state``.

    Args:
        entries: journal entries in journal order (per operation).

    Returns:
        Operation ID -> its state after the last entry.

    Raises:
        DecodeError: an entry's input bytes do not decode.
        UnknownSchemaError: an input was written with an unknown schema.
    """
    states: dict[str, OperationState] = {}
    for entry in entries:
        event = decode_event(entry.input_event)
        ref = ref_of(entry.input_topic, entry.input_partition, entry.input_offset)
        decision = decide(
            states.get(entry.operation_id),
            event,
            ref,
            sink_problem=entry.sink_problem,
            resumed_by=entry.resumed_by,
            compensation=CompensationFacts.from_json(entry.compensation_facts),
        )
        if decision.state is not None:
            states[entry.operation_id] = decision.state
    return states
