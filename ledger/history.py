"""One operation's history: every record about it, in causal order, and five answers.

Pure: :func:`build_history` takes the records a reader found (see
``consumers/history.py``) and returns a :class:`History`; no Kafka client, no
clock. The same history serves ``ledger history OP`` (text, ``--json``,
``--html``) and the operator console.

**Causal order.** The processor journals every input it decides on
(:class:`~ledger.events.JournalEntry` names the input's position), and writes
its outputs in the same transaction as the entry. So the journal of the
operation (one partition, in offset order) is the spine:

* each journaled input (intent, admission decision, receipt, readback, claim,
  disposition ...) is placed just before the entry that decided it;
* the processor's outputs are placed just after the entry that wrote them:
  the state version ``v`` after the applied entry with ``seq == v``; a
  dispatch or admission request after the entry with ``seq`` equal to its
  ``state_version``; a recovery receipt or the processor's operating event
  after the entry whose input it names;
* a record nothing links to the spine (an approval, the authority kernel's
  use of it, a receipt the processor has not decided on yet, another
  component's operating event) is placed by its Kafka timestamp after the
  last journal entry written before it.

A journaled input whose record is no longer on its topic (compacted away) is
shown from the copy the journal keeps (``via_journal``).

**Evidence that is not believed.** A record that fails authentication (no
trusted writer sealed it) or does not decode is listed with its problem and
never used in the answers.

**The five questions** (DESIGN.md, the seed): who initiated the case, which
exact effect was admitted, what the target system did, why the resumer chose
its branch, and what verified business outcome followed. An answer the
evidence does not give says ``not recorded``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ledger.events import (
    AdmissionDecision,
    AdmissionRequest,
    Approval,
    ApprovalUse,
    Claim,
    Dispatch,
    Disposition,
    EffectReceipt,
    Event,
    Intent,
    JournalEntry,
    OperatingEvent,
    OperationState,
    Outcome,
    Readback,
    RecoveryReceipt,
    decode_event,
)
from ledger.instants import clock_time
from ledger.scope import open_fields
from ledger.topology import Topic

__all__ = [
    "NOT_RECORDED",
    "QUESTIONS",
    "Answer",
    "History",
    "HistoryEntry",
    "HistoryRecord",
    "build_history",
    "describe",
    "journal_move",
]

#: What a journal entry's move says when the operation has no state before or after
#: it (an input refused before the operation existed: an unknown sink, bad input).
NO_STATE = "(no state)"


def journal_move(entry: JournalEntry) -> str:
    """The state move a journal entry records, in words.

    Args:
        entry: the processor's journal entry.

    Returns:
        ``FROM -> TO``; ``(new) -> TO`` for an operation it created; ``TO``
        alone when the state stayed; ``(no state)`` when the operation has
        none before or after (an input refused before the operation existed),
        never ``None``.
    """
    if entry.to_state is None:
        return NO_STATE if entry.from_state is None else f"{entry.from_state} -> {NO_STATE}"
    if entry.from_state == entry.to_state:
        return str(entry.to_state)
    return f"{entry.from_state or '(new)'} -> {entry.to_state}"


#: What an answer says when the evidence does not give it.
NOT_RECORDED = "not recorded"

#: The five questions, in the order they are answered (key, question).
QUESTIONS: tuple[tuple[str, str], ...] = (
    ("initiated", "Who initiated the case?"),
    ("admitted", "Which exact effect was admitted?"),
    ("target", "What did the target system do?"),
    ("resume", "Why did the resumer choose its branch?"),
    ("outcome", "What verified business outcome followed?"),
)


@dataclass(frozen=True)
class HistoryRecord:
    """One record a reader found about the operation (the input of :func:`build_history`).

    Attributes:
        topic: short topic name (``journal``, ``dispatches`` ...).
        partition: partition.
        offset: offset.
        timestamp_ms: the record's Kafka timestamp (milliseconds since the
            epoch, wall clock), ``None`` when the broker gave none.
        key: the record key as text.
        event: the decoded event, ``None`` when the value does not decode.
        problem: why the record is not believed (failed authentication, does
            not decode), ``None`` when it is.
        via_journal: the record is the copy a journal entry keeps of its input
            (the original is no longer on its topic).
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: str
    event: Event | None
    problem: str | None = None
    via_journal: bool = False

    @property
    def position(self) -> tuple[str, int, int]:
        """``(topic, partition, offset)``."""
        return (self.topic, self.partition, self.offset)

    @property
    def believed(self) -> bool:
        """Authentic and decoded: usable as evidence."""
        return self.problem is None and self.event is not None


@dataclass(frozen=True)
class HistoryEntry:
    """One line of a history.

    Attributes:
        record: the record.
        kind: the event type (``Intent``, ``Dispatch`` ...) or ``UNREADABLE``.
        summary: one line of plain text saying what it records.
    """

    record: HistoryRecord
    kind: str
    summary: str

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dictionary.

        ``{"topic", "partition", "offset", "time_ms", "time", "key", "kind",
        "summary", "believed", "problem", "via_journal", "event"}``; ``time`` is
        ISO 8601 UTC (or ``None``), ``event`` the event's fields (bytes as hex)
        or ``None``.
        """
        r = self.record
        return {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "time_ms": r.timestamp_ms,
            "time": iso_time(r.timestamp_ms),
            "key": r.key,
            "kind": self.kind,
            "summary": self.summary,
            "believed": r.believed,
            "problem": r.problem,
            "via_journal": r.via_journal,
            "event": _plain(r.event.model_dump()) if r.event is not None else None,
        }


@dataclass(frozen=True)
class Answer:
    """The answer to one of the five questions.

    Attributes:
        key: ``initiated``, ``admitted``, ``target``, ``resume`` or ``outcome``.
        question: the question in words.
        answer: the answer in words; starts with ``not recorded`` when the
            evidence does not give it.
        recorded: whether the evidence gives the answer.
        evidence: positions (``topic:partition:offset``) of the records it rests on.
    """

    key: str
    question: str
    answer: str
    recorded: bool
    evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """``{"key", "question", "answer", "recorded", "evidence": [position]}``."""
        return {
            "key": self.key,
            "question": self.question,
            "answer": self.answer,
            "recorded": self.recorded,
            "evidence": list(self.evidence),
        }


@dataclass(frozen=True)
class History:
    """Everything the ledger holds about one operation.

    Attributes:
        operation_id: the operation.
        entries: every record, in causal order (see the module docstring).
        answers: the five answers, in :data:`QUESTIONS` order.
        final_state: the latest authentic state version, ``None`` when none is
            recorded.
        forks: operations whose intents name this one as ``forked_from``
            (found by the reader; empty when it did not look).
        compensated_by: the operations whose state names this one in
            ``compensates`` and whose effect settled (the original's side of
            the link; empty when none, or when the reader did not look).
    """

    operation_id: str
    entries: tuple[HistoryEntry, ...]
    answers: tuple[Answer, ...]
    final_state: OperationState | None = None
    #: Operations that are deliberate forks of this one (their intents name it).
    forks: tuple[str, ...] = ()
    #: Settled compensations of this one (their state names it in ``compensates``).
    compensated_by: tuple[str, ...] = ()

    @property
    def forked_from(self) -> str | None:
        """The operation this one forks, from its own intent (``None``: no fork)."""
        for e in self.entries:
            event = e.record.event
            if e.record.believed and isinstance(event, Intent) and event.forked_from:
                return event.forked_from
        return None

    @property
    def unbelieved(self) -> int:
        """Records listed but not believed (unauthenticated or undecodable)."""
        return sum(1 for e in self.entries if not e.record.believed)

    def answer(self, key: str) -> Answer:
        """The answer to the question ``key`` (see :data:`QUESTIONS`).

        Raises:
            KeyError: no such question.
        """
        for a in self.answers:
            if a.key == key:
                return a
        raise KeyError(key)

    def to_dict(self) -> dict[str, Any]:
        """The history as JSON-serialisable data.

        Returns:
            ``{"operation_id": str, "final_state": {state fields} | None,
            "compensates": str | None, "compensated_by": [str],
            "answers": [Answer.to_dict()], "records": [HistoryEntry.to_dict()],
            "counts": {"records": int, "unbelieved": int}, "forked_from": str
            | None, "forks": [str]}``, records in causal order.
        """
        return {
            "operation_id": self.operation_id,
            "forked_from": self.forked_from,
            "forks": list(self.forks),
            "compensates": self.final_state.compensates if self.final_state else None,
            "compensated_by": list(self.compensated_by),
            "final_state": _plain(self.final_state.model_dump())
            if self.final_state is not None
            else None,
            "answers": [a.to_dict() for a in self.answers],
            "records": [e.to_dict() for e in self.entries],
            "counts": {"records": len(self.entries), "unbelieved": self.unbelieved},
        }


def iso_time(ms: int | None) -> str | None:
    """Milliseconds since the epoch as ISO 8601 UTC with milliseconds, ``None`` kept."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def position_text(position: tuple[str, int, int]) -> str:
    """``topic:partition:offset``."""
    return f"{position[0]}:{position[1]}:{position[2]}"


def build_history(
    operation_id: str,
    records: Iterable[HistoryRecord],
    forks: Iterable[str] = (),
    compensated_by: Iterable[str] = (),
) -> History:
    """Assemble one operation's history from the records found about it.

    Args:
        operation_id: the operation.
        records: every record found on the ledger's topics about it, in any
            order (duplicates by position are dropped); approval records may
            be included for the approvals the operation names.
        forks: operations found to be forks of this one (intents naming it).
        compensated_by: settled compensations of the operation, as found on
            ``ledger.state`` (see :attr:`History.compensated_by`).

    Returns:
        The history: entries in causal order, the five answers, the final state.
    """
    unique: dict[tuple[str, int, int, bool], HistoryRecord] = {}
    for rec in records:
        unique.setdefault((*rec.position, rec.via_journal), rec)
    found = list(unique.values())
    found.extend(_journal_copies(found))
    ordered = _causal_order(found)
    entries = tuple(HistoryEntry(r, _kind(r), describe(r.event, r.problem)) for r in ordered)
    believed = [r for r in ordered if r.believed]
    final = _final_state(believed)
    answers = (
        _initiated(believed, final),
        _admitted(operation_id, believed),
        _target(believed),
        _resume(believed),
        _outcome(believed, final),
    )
    return History(
        operation_id,
        entries,
        answers,
        final,
        tuple(sorted(set(forks))),
        tuple(sorted(compensated_by)),
    )


# ---------------------------------------------------------------------- order


def _journal_copies(found: Sequence[HistoryRecord]) -> list[HistoryRecord]:
    """Inputs journaled but not found on their topic, from the journal's copy."""
    have = {r.position for r in found}
    copies: list[HistoryRecord] = []
    for r in found:
        e = r.event
        if not (r.believed and isinstance(e, JournalEntry)):
            continue
        where = (e.input_topic, e.input_partition, e.input_offset)
        if where in have:
            continue
        have.add(where)
        event: Event | None = None
        if e.repeat_of is not None and not e.input_event:
            problem: str | None = (
                f"journaled by reference: a repeat of the intent at {e.repeat_of} "
                f"(sha256 {e.input_sha256}), its bytes not copied again"
            )
        else:
            try:
                event, problem = decode_event(e.input_event), None
            except Exception as exc:  # shown as such, never fatal
                problem = f"journaled input does not decode: {type(exc).__name__}: {exc}"
        copies.append(
            HistoryRecord(*where, r.timestamp_ms, r.key, event, problem, via_journal=True)
        )
    return copies


def _causal_order(found: Sequence[HistoryRecord]) -> list[HistoryRecord]:
    """Sort records along the journal spine (module docstring)."""
    spine = sorted(
        (r for r in found if r.believed and isinstance(r.event, JournalEntry)),
        key=lambda r: (r.partition, r.offset),
    )
    journals: list[JournalEntry] = [r.event for r in spine]  # type: ignore[misc]  # filtered above
    index_of_input: dict[tuple[str, int, int], int] = {}
    for i, j in enumerate(journals):
        index_of_input.setdefault((j.input_topic, j.input_partition, j.input_offset), i)
    index_of_ref = {f"{t}:{p}:{o}": i for (t, p, o), i in index_of_input.items()}
    times = [r.timestamp_ms for r in spine]

    def by_seq(seq: int, applied_only: bool) -> int | None:
        hits = [
            i
            for i, j in enumerate(journals)
            if j.seq == seq and (j.outcome == "APPLIED" or not applied_only)
        ]
        return hits[-1] if applied_only and hits else (hits[0] if hits else None)

    def by_time(ts: int | None) -> int:
        if ts is None:
            return len(spine) - 1
        last = -1
        for i, t in enumerate(times):
            if t is not None and t <= ts:
                last = i
        return last

    spine_pos = {r.position: i for i, r in enumerate(spine)}

    def key(r: HistoryRecord) -> tuple[int, int, int, int]:
        e = r.event
        tie = (r.timestamp_ms or 0, r.offset)
        if r.position in spine_pos and not r.via_journal:
            return (spine_pos[r.position], 1, *tie)
        if r.position in index_of_input:
            return (index_of_input[r.position], 0, *tie)
        anchor: int | None = None
        if isinstance(e, OperationState):
            anchor = by_seq(e.version, True)
        elif isinstance(e, Dispatch | AdmissionRequest):
            anchor = by_seq(e.state_version, False)
        elif isinstance(e, RecoveryReceipt):
            anchor = index_of_ref.get(e.receipt_id.removeprefix("recovery:"))
        elif (
            isinstance(e, OperatingEvent)
            and e.source_topic is not None
            and e.source_partition is not None
            and e.source_offset is not None
        ):
            anchor = index_of_input.get((e.source_topic, e.source_partition, e.source_offset))
        elif isinstance(e, Outcome):  # processor:TOPIC:P:O names the input it answers
            topic, _, rest = e.outcome_id.removeprefix("processor:").partition(":")
            part, _, off = rest.partition(":")
            if part.isdigit() and off.isdigit():
                anchor = index_of_input.get((topic, int(part), int(off)))
        if anchor is not None:
            return (anchor, 2, *tie)
        return (by_time(r.timestamp_ms), 3, *tie)

    return sorted(found, key=key)


# ---------------------------------------------------------------------- summaries


def _kind(r: HistoryRecord) -> str:
    return type(r.event).__name__ if r.event is not None else "UNREADABLE"


def describe(event: Event | None, problem: str | None = None) -> str:
    """One line of plain text saying what an event records.

    Args:
        event: the event, ``None`` for a record that does not decode.
        problem: why the record is not believed; prefixed as ``NOT BELIEVED``.
    """
    text = _describe(event) if event is not None else "record does not decode"
    return f"NOT BELIEVED ({problem}): {text}" if problem else text


def _describe(e: Event) -> str:  # noqa: PLR0911 - one branch per event type
    if isinstance(e, Intent):
        return (
            f"intent by {e.actor} for {e.subject} ({e.purpose}): {e.action} at {e.sink} "
            f"{e.params_json}, digest {e.parameter_digest}, approval {e.approval_id or 'none'}"
            + (f", a fork of {e.forked_from}" if e.forked_from else "")
            + (f", compensates {e.compensates}" if e.compensates else "")
        )
    if isinstance(e, Approval):
        extra = ""
        if e.consumed_by:
            extra = f", consumed by {e.consumed_by}"
        if e.revoked_by:
            extra += f", revoked by {e.revoked_by}"
        if e.scope_operation_id:
            extra = f", for {e.scope_operation_id}{extra}"
        opened = open_fields(e)
        if opened:
            extra += f"; open to any {', '.join(opened)}"
        return (
            f"approval {e.approval_id} {e.status} by {e.reviewer}: subject {e.scope_subject}, "
            f"up to {e.scope_max_amount_minor} minor units, policy {e.policy_version}, "
            f"expires at {clock_time(e.expires_at_ms)}{extra}"
        )
    if isinstance(e, ApprovalUse):
        return (
            f"approval {e.approval_id} used by {e.operation_id} (digest {e.parameter_digest}), "
            f"decided by {e.decided_by}"
        )
    if isinstance(e, AdmissionRequest):
        return (
            f"admission requested under approval {e.approval_id} (digest {e.parameter_digest}, "
            f"state version {e.state_version})"
        )
    if isinstance(e, AdmissionDecision):
        verdict = "ADMITTED" if e.admitted else "NOT ADMITTED"
        return (
            f"{verdict} under approval {e.approval_id} (policy {e.policy_version}, reviewer "
            f"{e.reviewer or '?'}): {e.reason}; decided by {e.decided_by}"
        )
    if isinstance(e, Dispatch):
        return (
            f"dispatch {e.dispatch_id}: {e.kind} {e.action} at {e.sink}, fencing token "
            f"{e.fencing_token}, state version {e.state_version}"
            + (", on resume" if e.on_resume else "")
        )
    if isinstance(e, EffectReceipt):
        return (
            f"receipt {e.status}"
            + (f" (reservation {e.reservation})" if e.reservation else "")
            + f" from {e.sink} for {e.dispatch_id} (fencing token "
            f"{e.fencing_token}, effect {e.effect_id or 'none'}): {e.detail}"
            + (
                f"; postcondition {e.postcondition_status} via {e.postcondition_source}: "
                f"{e.postcondition_detail}"
                if e.postcondition_status is not None
                else ""
            )
            + f"; observer {e.observer}"
        )
    if isinstance(e, Readback):
        return (
            f"readback {e.kind} {e.status} via {e.source} for {e.dispatch_id} (fencing token "
            f"{e.fencing_token}, effect {e.effect_id or 'none'}): {e.detail}; observer {e.observer}"
        )
    if isinstance(e, Claim):
        return f"claim {e.claim_id} by {e.worker}, expecting state version {e.expected_version}"
    if isinstance(e, OperationState):
        return f"state version {e.version}: {e.state} (epoch {e.epoch}): {e.reason}"
    if isinstance(e, JournalEntry):
        return (
            f"journal seq {e.seq}: {e.outcome} {e.kind} {journal_move(e)}: {e.reason} "
            f"(input {e.input_topic}:{e.input_partition}:{e.input_offset})"
        )
    if isinstance(e, RecoveryReceipt):
        return (
            f"recovery receipt: {e.action} by {e.claimant} at checkpoint {e.checkpoint_version}: "
            f"observed {e.observation_status} via {e.observation_source}; postcondition "
            f"{e.postcondition}; uncertainty {e.uncertainty}"
            + (f" (owner {e.uncertainty_owner})" if e.uncertainty_owner else "")
            + (f"; released by {e.release_condition}" if e.release_condition else "")
        )
    if isinstance(e, OperatingEvent):
        where = (
            f" (record {e.source_topic}:{e.source_partition}:{e.source_offset})"
            if e.source_topic
            else ""
        )
        return f"operating event {e.kind} from {e.component}: {e.reason}{where}"
    if isinstance(e, Disposition):
        return f"disposition {e.decision} by {e.by}: {e.evidence}"
    if isinstance(e, Outcome):
        return f"outcome for the service: {e.kind} ({e.state or 'no operation'}): {e.reason}"
    return type(e).__name__


# ---------------------------------------------------------------------- answers


def _of(records: Sequence[HistoryRecord], kind: type[Event]) -> list[HistoryRecord]:
    return [r for r in records if isinstance(r.event, kind)]


def _where(*records: HistoryRecord) -> tuple[str, ...]:
    return tuple(position_text(r.position) for r in records)


def _answer(key: str, text: str, recorded: bool, *records: HistoryRecord) -> Answer:
    question = dict(QUESTIONS)[key]
    return Answer(key, question, text, recorded, _where(*records))


def _final_state(believed: Sequence[HistoryRecord]) -> OperationState | None:
    states = [r.event for r in _of(believed, OperationState) if r.topic == Topic.STATE]
    best: OperationState | None = None
    for s in states:
        assert isinstance(s, OperationState)
        if best is None or s.version >= best.version:
            best = s
    return best


def _initiated(believed: Sequence[HistoryRecord], final: OperationState | None) -> Answer:
    intents = _of(believed, Intent)
    if intents:
        r = intents[0]
        i = r.event
        assert isinstance(i, Intent)
        more = f"; {len(intents) - 1} more intent record(s)" if len(intents) > 1 else ""
        return _answer(
            "initiated",
            f"{i.actor} for subject {i.subject}, purpose {i.purpose!r} (decision version "
            f"{i.decision_version}): {i.action} at {i.sink}, published at "
            f"{clock_time(i.published_at_ms)} (ledger clock){more}",
            True,
            r,
        )
    if final is not None:
        return _answer(
            "initiated",
            f"{final.actor} for subject {final.subject}, purpose {final.purpose!r} (from the "
            f"state; the intent record is {NOT_RECORDED})",
            True,
        )
    return _answer("initiated", f"{NOT_RECORDED}: no intent for this operation", False)


def _admitted(operation_id: str, believed: Sequence[HistoryRecord]) -> Answer:
    decisions = _of(believed, AdmissionDecision)
    yes = [r for r in decisions if r.event.admitted]  # type: ignore[union-attr]  # _of() keeps only that kind
    if yes:
        r = yes[-1]
        d = r.event
        assert isinstance(d, AdmissionDecision)
        uses = [
            u
            for u in _of(believed, ApprovalUse)
            if isinstance(u.event, ApprovalUse)
            and (u.event.approval_id, u.event.operation_id) == (d.approval_id, operation_id)
        ]
        dispatches = [x for x in _of(believed, Dispatch) if x.event.kind == "EXECUTE"]  # type: ignore[union-attr]  # _of() keeps only that kind
        text = (
            f"operation {operation_id}, parameter digest {d.parameter_digest}, approval "
            f"{d.approval_id} (reviewer {d.reviewer or '?'}, policy {d.policy_version}), "
            f"admitted by {d.decided_by}"
        )
        text += (
            f"; approval use recorded by {uses[-1].event.decided_by}"  # type: ignore[union-attr]  # _of() keeps only that kind
            if uses
            else f"; approval use {NOT_RECORDED}"
        )
        evidence = [r, *uses[-1:]]
        if dispatches:
            x = dispatches[0].event
            assert isinstance(x, Dispatch)
            text += f"; effect {x.action} at {x.sink} with {x.params_json}"
            evidence.append(dispatches[0])
        return _answer("admitted", text, True, *evidence)
    if decisions:
        r = decisions[-1]
        d = r.event
        assert isinstance(d, AdmissionDecision)
        return _answer(
            "admitted",
            f"nothing admitted: approval {d.approval_id} refused: {d.reason}",
            True,
            r,
        )
    return _answer("admitted", f"{NOT_RECORDED}: no admission decision for this operation", False)


def _target(believed: Sequence[HistoryRecord]) -> Answer:
    seen = [
        r
        for r in believed
        if isinstance(r.event, Readback)
        or (isinstance(r.event, EffectReceipt) and r.event.status != "ATTEMPTED")
    ]
    if not seen:
        return _answer(
            "target",
            f"{NOT_RECORDED}: no receipt (beyond 'about to send') or readback from the sink",
            False,
        )
    parts: list[str] = []
    for r in seen:
        e = r.event
        if isinstance(e, EffectReceipt):
            parts.append(
                f"receipt {e.status} (token {e.fencing_token}, effect {e.effect_id or 'none'})"
            )
        elif isinstance(e, Readback):
            parts.append(
                f"readback {e.kind} {e.status} via {e.source} (effect {e.effect_id or 'none'})"
            )
    return _answer("target", "; ".join(parts), True, *seen)


def _resume(believed: Sequence[HistoryRecord]) -> Answer:
    receipts = _of(believed, RecoveryReceipt)
    dispositions = _of(believed, Disposition)
    claims = _of(believed, Claim)
    parts: list[str] = []
    for r in receipts:
        e = r.event
        assert isinstance(e, RecoveryReceipt)
        parts.append(
            f"{e.action} by {e.claimant}: observed {e.observation_status} via "
            f"{e.observation_source}, postcondition {e.postcondition}, uncertainty {e.uncertainty}"
        )
    for r in dispositions:
        e = r.event
        assert isinstance(e, Disposition)
        parts.append(f"operator {e.by} disposed {e.decision}: {e.evidence}")
    if parts:
        return _answer("resume", "; ".join(parts), True, *receipts, *dispositions)
    if claims:
        workers = ", ".join(sorted({c.event.worker for c in claims}))  # type: ignore[union-attr]  # _of() keeps only that kind
        return _answer(
            "resume",
            f"claimed by {workers}; the recovery receipt is {NOT_RECORDED}",
            False,
            *claims,
        )
    return _answer(
        "resume",
        f"{NOT_RECORDED}: no resume (no claim, recovery receipt or disposition)",
        False,
    )


def _outcome(believed: Sequence[HistoryRecord], final: OperationState | None) -> Answer:
    # A postcondition readback is its own record, or carried by the committed
    # receipt of a relay that read it right after the effect.
    post = [
        r
        for r in believed
        if (isinstance(r.event, Readback) and r.event.kind == "POSTCONDITION")
        or (
            isinstance(r.event, EffectReceipt)
            and r.event.status == "COMMITTED"
            and r.event.postcondition_status is not None
        )
    ]
    if final is None:
        return _answer("outcome", f"{NOT_RECORDED}: no state for this operation", False)
    states = [r for r in _of(believed, OperationState) if r.event is final]
    head = f"{final.state} (state version {final.version}): {final.reason}"
    if post:
        p = post[-1].event
        if isinstance(p, EffectReceipt):
            seen = (
                f"{p.postcondition_status} via {p.postcondition_source} "
                f"(read right after the effect): {p.postcondition_detail}"
            )
        else:
            assert isinstance(p, Readback)
            seen = f"{p.status} via {p.source}: {p.detail}"
        return _answer(
            "outcome",
            f"{head}; postcondition readback {seen}",
            True,
            *states,
            post[-1],
        )
    return _answer(
        "outcome",
        f"{NOT_RECORDED}: no postcondition readback; final state {head}",
        False,
        *states,
    )


def _plain(value: Any) -> Any:
    """Model data as JSON-ready values: bytes as hex, tuples as lists."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
