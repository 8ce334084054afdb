"""The journal: the record of each decision, and its replay through :func:`decide`.

An intent re-published for an operation that already holds it (same
operation ID, same parameter digest), which the fold decides a no-op, is
journaled *by reference* (:func:`repeats`): its entry keeps no copy of the
input bytes, only ``repeat_of`` (the ref of the earlier input of the
operation whose bytes an earlier entry keeps) and ``input_sha256`` (what
was received). A service that may only write intents can then not grow the
never-deleted journal by an intent's size with each re-publish. Replay
decides such an entry with the referenced intent (:func:`replay_decisions`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from ledger.errors import DecodeError
from ledger.events import Event, Intent, JournalEntry, OperationState, decode_event
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
    repeat_of: str | None = None,
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
        repeat_of: the ref of an earlier input of this operation that the
            input repeats (see :func:`repeats`; the caller knows an earlier
            entry keeps its bytes): the entry then keeps no copy of ``raw``,
            only its SHA-256.

    Returns:
        The entry: outcome, states before and after, every hop, the reason,
        the input's position and its bytes (or, by reference, ``repeat_of``
        and ``input_sha256``); ``seq`` is the state version after the input
        (0 when there is no state). The chain fields are left unset (the
        processor links the entry into its partition's chain).
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
        input_event=raw if repeat_of is None else b"",
        hops=hop_names(decision),
        sink_problem=sink_problem,
        resumed_by=resumed_by,
        compensation_facts=compensation.to_json() if compensation is not None else None,
        repeat_of=repeat_of,
        input_sha256=hashlib.sha256(raw).hexdigest() if repeat_of is not None else None,
    )


def repeats(state: OperationState | None, event: Event, decision: Decision) -> bool:
    """Whether an input may be journaled by reference to an earlier intent of its operation.

    Only an intent that repeats the request the operation is bound to (same
    parameter digest) and that the fold decided a no-op qualifies: its
    decision needs nothing of its bytes that the operation's earlier intent
    does not hold. A reauthorisation (a new approval), a drift or a refusal
    is journaled with its bytes.

    Args:
        state: the operation's state before the input.
        event: the input.
        decision: what :func:`~ledger.fold.decide` made of it.

    Returns:
        True when the input may be journaled by reference.
    """
    return (
        isinstance(event, Intent)
        and state is not None
        and decision.outcome == "NOOP"
        and event.parameter_digest == state.parameter_digest
    )


def drifts(state: OperationState | None, event: Event, decision: Decision) -> bool:
    """Whether an input is a drifted intent the fold refused: another parameter digest.

    Such an intent is journaled with its bytes the first time; an identical
    one (the same bytes, SHA-256) of the same operation may then be journaled
    by reference to it, as :func:`repeats` allows for a bound intent. Without
    this, whoever may publish intents grows the journal, which is kept
    forever, by re-publishing one large drifted intent.

    Args:
        state: the operation's state before the input.
        event: the input.
        decision: what :func:`~ledger.fold.decide` made of it.

    Returns:
        True for a refused intent whose digest is not the operation's.
    """
    return (
        isinstance(event, Intent)
        and state is not None
        and decision.outcome == "REFUSED"
        and event.parameter_digest != state.parameter_digest
    )


def keeps_intent(event: Event, decision: Decision) -> bool:
    """Whether a journaled intent (with its bytes) can be referenced by later repeats.

    Args:
        event: the input, journaled with its bytes.
        decision: what the fold made of it.

    Returns:
        True for an intent applied or a no-op whose digest is the one its
        operation is bound to after it.
    """
    return (
        isinstance(event, Intent)
        and decision.outcome in ("APPLIED", "NOOP")
        and decision.state is not None
        and decision.state.parameter_digest == event.parameter_digest
    )


def _referenced(
    entry: JournalEntry, kept: dict[tuple[str, str], bytes], before: OperationState | None
) -> Event:
    """The event a by-reference entry is replayed with (see :func:`replay_decisions`).

    Raises:
        DecodeError: no earlier entry of the operation keeps the referenced
            input, or it is not an intent with the state's digest.
    """
    raw = kept.get((entry.operation_id, entry.repeat_of or ""))
    if raw is None:
        raise DecodeError(
            f"journal entry {entry.seq} of {entry.operation_id} repeats {entry.repeat_of}, "
            "whose bytes no earlier entry of the operation keeps"
        )
    event = decode_event(raw)
    if not isinstance(event, Intent) or before is None:
        raise DecodeError(
            f"journal entry {entry.seq} of {entry.operation_id} repeats {entry.repeat_of}, "
            "which is not an intent of a known operation"
        )
    if event.parameter_digest != before.parameter_digest:
        # A drifted intent repeated (:func:`drifts`): by reference only when the
        # bytes are the same, which the entry's SHA-256 pins.
        if hashlib.sha256(raw).hexdigest() != entry.input_sha256:
            raise DecodeError(
                f"journal entry {entry.seq} of {entry.operation_id} repeats the drifted "
                f"intent {entry.repeat_of}, whose bytes do not hash to its input_sha256"
            )
        return event
    # A repeat is decided as the referenced intent asking under the
    # operation's current approval: its approval is the one thing a no-op
    # repeat may differ in, and it changes nothing unless it is a
    # reauthorisation, which is never journaled by reference.
    return event.model_copy(update={"approval_id": before.approval_id})


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
    #: (operation, input ref) -> bytes of each intent journaled with its bytes.
    kept: dict[tuple[str, str], bytes] = {}
    for entry in entries:
        ref = ref_of(entry.input_topic, entry.input_partition, entry.input_offset)
        before = states.get(entry.operation_id)
        try:
            if entry.repeat_of is not None and not entry.input_event:
                event = _referenced(entry, kept, before)
            else:
                event = decode_event(entry.input_event)
                if isinstance(event, Intent):
                    kept[(entry.operation_id, ref)] = entry.input_event
        except Exception as exc:
            if on_unreadable is None:
                raise
            on_unreadable(entry, exc)
            continue
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
    exactly as the processor did (a by-reference entry with the input it
    references); the result must equal ``ledger.state``.

    Args:
        entries: journal entries in journal order (per operation).

    Returns:
        Operation ID -> its state after the last entry.

    Raises:
        DecodeError: an entry's input bytes do not decode, or a by-reference
            entry's reference is not found.
        UnknownSchemaError: an input was written with an unknown schema.
    """
    return replay_decisions(entries)[0]
