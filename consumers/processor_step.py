"""The processor's decision step: one input decided, journaled and turned into writes.

:class:`~consumers.processor.Processor` runs these for each input of a
batch, in order, inside its transaction: :func:`decide_input` observes what
the fold needs beyond the operation's state and runs the pure
:func:`ledger.fold.decide`; :func:`journal_of` builds the journal entry
(a repeat or an identical drift by reference to the entry that holds it);
:func:`writes_of` turns the decision's outputs into the records to write (a
refused input's dead letter carries its bytes; a dispatch is stamped, or
left out when it is a verification its sink cannot perform).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from consumers.input_facts import InputFacts
from consumers.journal_chain import JournalChain
from consumers.stage import Record
from ledger.events import Dispatch, Event, Intent, JournalEntry, OperatingEvent, OperationState
from ledger.fold import (
    CompensationFacts,
    Decision,
    decide,
    drifts,
    journal_entry,
    keeps_intent,
    ref_of,
    repeats,
)

# These lines are the processor's: operators filter its log by this name.
log = logging.getLogger("consumers.processor")


@dataclass(frozen=True)
class Step:
    """One input decided, with what it was decided with (journaled alongside, for replay).

    Attributes:
        decision: the fold's decision.
        ref: the input's position (``topic:partition:offset``).
        sink_problem: why an intent's sink cannot be used (``None``: usable or unchecked).
        resumed_by: the processor resuming the operation with this input, if any.
        compensation: what was observed for a compensation or a tally request.
    """

    decision: Decision
    ref: str
    sink_problem: str | None
    resumed_by: str | None
    compensation: CompensationFacts | None


def decide_input(
    rec: Record, state: OperationState | None, facts: InputFacts, resumed_by: str | None
) -> Step:
    """Observe what the fold needs for ``rec`` and decide it.

    Args:
        rec: an input whose key is its operation, not held.
        state: the operation's current state (``None``: a new operation).
        facts: the processor's observations (sink registry, compensations).
        resumed_by: the processor resuming the operation with this input, if any.

    Returns:
        The :class:`Step`.

    Raises:
        LedgerError: ``ledger.state`` could not be read for a compensation's facts.
    """
    ref = ref_of(rec.topic, rec.partition, rec.offset)
    sink_problem = facts.sink_problem(rec.event.sink) if isinstance(rec.event, Intent) else None
    compensation = facts.observed(rec.event, state)
    decision = decide(
        state,
        rec.event,
        ref,
        sink_problem=sink_problem,
        resumed_by=resumed_by,
        compensation=compensation,
    )
    return Step(decision, ref, sink_problem, resumed_by, compensation)


def journal_of(
    rec: Record, state: OperationState | None, step: Step, journal: JournalChain
) -> JournalEntry:
    """The journal entry of a decided input (by reference when it repeats one journaled).

    A re-published identical intent (:func:`ledger.fold.repeats`) and an
    identical drift (:func:`ledger.fold.drifts`, by the input's SHA-256) name
    the entry that already holds their bytes; the first of each is remembered
    in ``journal`` for the next.

    Args:
        rec: the input.
        state: the operation's state before the decision.
        step: the decided step.
        journal: the partitions' chains (which remember what was journaled).

    Returns:
        The entry to link into the input's partition chain.
    """
    op = rec.key  # the input's operation (the processor decides only inputs keyed by it)
    decision = step.decision
    repeat = journal.repeat_ref(op) if repeats(state, rec.event, decision) else None
    if drifts(state, rec.event, decision):  # an identical drift: by reference
        sha = hashlib.sha256(rec.raw).hexdigest()
        repeat = journal.drift_ref(op, sha)
        if repeat is None:
            journal.keep_drift(op, sha, step.ref)
    entry = journal_entry(
        decision,
        rec.event,
        rec.raw,
        rec.topic,
        rec.partition,
        rec.offset,
        sink_problem=step.sink_problem,
        resumed_by=step.resumed_by,
        compensation=step.compensation,
        repeat_of=repeat,
    )
    if repeat is None and keeps_intent(rec.event, decision):
        journal.keep_ref(op, step.ref)
    return entry


def writes_of(
    rec: Record, step: Step, facts: InputFacts
) -> Iterator[tuple[str, str, Event | None]]:
    """The records a decision's outputs are written as (``(topic, key, event or None)``, in order).

    A refused input's operating event carries the input's bytes (a dead
    letter); a dispatch is stamped (:meth:`InputFacts.stamped`), or left out
    when it is an ordinary verification its sink cannot perform
    (:meth:`InputFacts.verification_pointless`). A ``None`` event is a
    tombstone.

    Args:
        rec: the decided input.
        step: its step.
        facts: the processor's observations (sink registry).

    Yields:
        ``(topic, key, event)`` for each record to write.
    """
    for output in step.decision.outputs:
        event = output.event
        if isinstance(event, OperatingEvent) and event.original_bytes is None:
            # Refused inputs travel with their original bytes (a dead letter).
            event = event.model_copy(update={"original_bytes": rec.raw})
        if isinstance(event, Dispatch):
            if facts.verification_pointless(event):
                log.debug(
                    "%s: %s not written: %s offers no postcondition",
                    rec.key,
                    event.dispatch_id,
                    event.sink,
                )
                continue
            event = facts.stamped(event)
        yield output.topic, output.key, event
