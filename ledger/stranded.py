"""Stranded operations: work not resting where it should, for longer than a bound.

One pure definition drives everything an operator sees of stuck work: the
audit's open items (a CLEAN audit means nothing is stranded), the
``ledger_stranded_operations`` and ``ledger_stranded_oldest_age_seconds``
metrics and the alert on them, the console's queue, and the exit status of
``ledger reconcile run``. No clock, no I/O: the caller passes what the
ledger knows of the operation (:class:`Evidence`) and the time now.

An operation is **resting** when nothing in the stages is expected to move
it: it is terminal (OUTCOME_VERIFIED, ABANDONED), it waits for a person
(UNKNOWN_OUTCOME for a readback or a disposition, NEEDS_REAUTHORISATION for
a new approval: those are open items in their own right), or it is
EFFECT_COMMITTED at a sink that cannot verify (no postcondition query) or
whose postcondition contradicted the effect (an open item of its own). Any
other state is a waypoint: a stage owes it a next step. It is **stranded**
when it has stayed at a waypoint for longer than the waypoint's bound
(:class:`StrandedBounds`, seconds, one setting each):

* ``in_flight_without_owner``: ADMITTED or EFFECT_PENDING, and no live
  relay is known to hold its partition (``LEDGER_STRANDED_IN_FLIGHT_S``);
* ``in_flight_overdue``: the same, while a live relay holds its partition
  but has recorded no outcome (same bound);
* ``committed_unverified``: EFFECT_COMMITTED at a sink that can verify, with
  no verification come back (e.g. a ``committed`` disposition whose
  verification failed; ``LEDGER_STRANDED_COMMITTED_S``);
* ``not_admitted_undecided``: NOT_ADMITTED with no admission decision (or,
  for a compensation, no tally from its original's owner;
  ``LEDGER_STRANDED_NOT_ADMITTED_S``);
* ``held_refused_record``: a reader holds the operation behind a record it
  refused (a seal it cannot verify), whatever its state
  (``LEDGER_STRANDED_HELD_S``);
* ``intent_not_consumed``: an intent on ``intents`` past the processor's
  committed offset (its consumer group has not consumed it), so the
  operation has no state at all: the processor is down or stuck
  (``LEDGER_STRANDED_INTENTS_S``; :func:`unconsumed`).

Ages are measured from ``since_ms``, the time the operation's latest state
was written, on the caller's clock (the broker's record timestamps for the
readers, as the audit's open items); a time ahead of ``now_ms`` counts as
age 0. The idea is a progress deadline, as a Kubernetes Deployment's
``progressDeadlineSeconds`` (a rollout that makes no progress within it is
reported ``ProgressDeadlineExceeded``, not rolled back): being stranded
releases nothing, it only names the work and its remedy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ledger.states import RecoveryState as S


class StrandedReason(StrEnum):
    """Why an operation is stranded (the metric's ``reason`` label)."""

    IN_FLIGHT_WITHOUT_OWNER = "in_flight_without_owner"
    IN_FLIGHT_OVERDUE = "in_flight_overdue"
    COMMITTED_UNVERIFIED = "committed_unverified"
    NOT_ADMITTED_UNDECIDED = "not_admitted_undecided"
    HELD_REFUSED_RECORD = "held_refused_record"
    INTENT_NOT_CONSUMED = "intent_not_consumed"


#: The state shown for an operation whose intent the processor has not consumed
#: (it has no recovery state yet).
UNPROCESSED = "INTENT_NOT_PROCESSED"


#: States in flight towards the effect: a relay owes them an outcome.
IN_FLIGHT_WAYPOINTS: frozenset[S] = frozenset({S.ADMITTED, S.EFFECT_PENDING})


@dataclass(frozen=True)
class StrandedBounds:
    """How long an operation may stay at each waypoint before it is stranded (seconds).

    Attributes:
        in_flight_s: ADMITTED / EFFECT_PENDING (``LEDGER_STRANDED_IN_FLIGHT_S``).
        committed_s: EFFECT_COMMITTED at a sink that can verify
            (``LEDGER_STRANDED_COMMITTED_S``).
        not_admitted_s: NOT_ADMITTED (``LEDGER_STRANDED_NOT_ADMITTED_S``).
        held_s: held behind a refused record (``LEDGER_STRANDED_HELD_S``).
        intents_s: an intent published and not consumed by the processor's
            group (``LEDGER_STRANDED_INTENTS_S``).

    Raises:
        ValueError: a bound is negative.
    """

    in_flight_s: float = 300.0
    committed_s: float = 300.0
    not_admitted_s: float = 300.0
    held_s: float = 60.0
    intents_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("in_flight_s", "committed_s", "not_admitted_s", "held_s", "intents_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"stranded bound {name} must be >= 0 seconds")


@dataclass(frozen=True)
class Evidence:
    """What the ledger knows of one operation besides its state.

    Attributes:
        since_ms: when its latest state was written (milliseconds, the
            clock of ``now_ms``); ``None``: unknown, and it is not judged.
        owner_live: whether a live relay holds its partition (``None``:
            not known, e.g. the consumer groups could not be read).
        held: why a reader holds it behind a record it refused (``None``:
            not held).
        verifiable: whether its sink offers a postcondition query (an
            EFFECT_COMMITTED operation at a sink without one rests there).
        mismatched: whether its sink's postcondition contradicted the
            committed effect (an open item of its own, not stranded).
    """

    since_ms: int | None
    owner_live: bool | None = None
    held: str | None = None
    verifiable: bool = True
    mismatched: bool = False


@dataclass(frozen=True)
class Stranded:
    """One stranded operation.

    Attributes:
        operation_id: the operation.
        state: its recovery state.
        sink: its sink.
        reason: why it is stranded.
        since_ms: when its latest state was written (the caller's clock, ms).
        age_s: seconds from ``since_ms`` to now, never negative.
        bound_s: the bound it overstayed (seconds).
        remedy: what moves it on, in words, with the command.
        read_back: whether reading it back now can move it (a verification
            readback, never a second mutating request).
    """

    operation_id: str
    state: str
    sink: str
    reason: StrandedReason
    since_ms: int
    age_s: float
    bound_s: float
    remedy: str
    read_back: bool = False

    @property
    def sentence(self) -> str:
        """One line: the reason, how long against its bound, and the remedy."""
        return (
            f"stranded ({self.reason}): {self.state} for {self.age_s:.0f} s, over its bound of "
            f"{self.bound_s:g} s; {self.remedy}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The stranded operation as a JSON-ready dictionary.

        ``{"operation_id", "state", "sink", "reason", "since_ms", "age_s", "bound_s",
        "remedy", "read_back"}``.
        """
        return {
            "operation_id": self.operation_id,
            "state": self.state,
            "sink": self.sink,
            "reason": str(self.reason),
            "since_ms": self.since_ms,
            "age_s": self.age_s,
            "bound_s": self.bound_s,
            "remedy": self.remedy,
            "read_back": self.read_back,
        }


def _remedy(reason: StrandedReason, operation_id: str, held: str | None) -> str:
    if reason is StrandedReason.IN_FLIGHT_WITHOUT_OWNER:
        return (
            "no live relay is known to hold its partition: run 'ledger status' first; if it "
            "shows the relay DOWN, start the relay (it reads the effect back before any second "
            "attempt); if NOT RESPONDING, it is alive but silent: inspect or kill it, and do "
            "not start another beside it"
        )
    if reason is StrandedReason.IN_FLIGHT_OVERDUE:
        return (
            f"a relay holds its partition but recorded no outcome: see 'ledger history "
            f"{operation_id}' and the relay's log (its sink may hang)"
        )
    if reason is StrandedReason.COMMITTED_UNVERIFIED:
        return (
            "its verification has not come back: 'ledger reconcile run' (or 'read back now' "
            "in the console) reads its postcondition back"
        )
    if reason is StrandedReason.NOT_ADMITTED_UNDECIDED:
        return (
            "no admission decision came: is the authority kernel (or, for a compensation, "
            "the processor owning its original) running? see 'ledger status'"
        )
    if reason is StrandedReason.INTENT_NOT_CONSUMED:
        return (
            "not yet processed: the processor has not consumed its intent; is the processor "
            "running? see 'ledger status' (start it, or look at its log if it runs)"
        )
    return (
        f"a reader holds it behind a record it refused ({held}): restore the keys folder "
        "the ledger's records were sealed with, then restart the stage"
    )


def evaluate(
    operation_id: str,
    state: str,
    sink: str,
    evidence: Evidence,
    now_ms: int,
    bounds: StrandedBounds,
) -> Stranded | None:
    """Whether one operation is stranded (see the module docstring).

    Args:
        operation_id: the operation.
        state: its recovery state (a :class:`~ledger.states.RecoveryState` value).
        sink: its sink.
        evidence: what the ledger knows of it besides its state.
        now_ms: the time now, milliseconds, on the clock of ``evidence.since_ms``.
        bounds: the bound of each waypoint (seconds).

    Returns:
        ``None`` when it rests, is within its waypoint's bound, or its age is
        unknown; else the :class:`Stranded` naming why and the remedy.
    """
    if evidence.since_ms is None:
        return None
    age_s = max(0, now_ms - evidence.since_ms) / 1000
    reason: StrandedReason | None = None
    bound_s = 0.0
    read_back = False
    if evidence.held is not None:
        reason, bound_s = StrandedReason.HELD_REFUSED_RECORD, bounds.held_s
    elif state in IN_FLIGHT_WAYPOINTS:
        reason = (
            StrandedReason.IN_FLIGHT_OVERDUE
            if evidence.owner_live
            else StrandedReason.IN_FLIGHT_WITHOUT_OWNER
        )
        bound_s = bounds.in_flight_s
    elif state == S.EFFECT_COMMITTED and evidence.verifiable and not evidence.mismatched:
        reason, bound_s, read_back = StrandedReason.COMMITTED_UNVERIFIED, bounds.committed_s, True
    elif state == S.NOT_ADMITTED:
        reason, bound_s = StrandedReason.NOT_ADMITTED_UNDECIDED, bounds.not_admitted_s
    if reason is None or age_s <= bound_s:
        return None
    return Stranded(
        operation_id=operation_id,
        state=str(state),
        sink=sink,
        reason=reason,
        since_ms=evidence.since_ms,
        age_s=age_s,
        bound_s=bound_s,
        remedy=_remedy(reason, operation_id, evidence.held),
        read_back=read_back,
    )


@dataclass(frozen=True)
class PublishedIntent:
    """One record on ``intents``, as a reader found it (no seal checked: its key only).

    Attributes:
        operation_id: the record's key.
        partition: its ``intents`` partition.
        offset: its offset there.
        written_ms: its Kafka timestamp (milliseconds, the clock of
            ``now_ms``); ``None``: unknown, and it is not judged.
    """

    operation_id: str
    partition: int
    offset: int
    written_ms: int | None


def unconsumed(
    intents: Iterable[PublishedIntent],
    committed: Mapping[int, int | None],
    now_ms: int,
    bounds: StrandedBounds,
) -> list[Stranded]:
    """The intents the processor's group has not consumed past their bound (pure).

    An intent at or past its partition's committed offset has not been
    consumed (a processor commits the offset after the record with the
    transaction of what it decided); a partition the group never committed
    on has consumed nothing. An operation with several such intents counts
    once, from its oldest.

    Args:
        intents: records read on ``intents`` (any offsets; those below the
            committed offset are consumed and ignored).
        committed: partition -> the processor group's committed offset
            (``None`` or absent: never committed).
        now_ms: the time now, milliseconds, on the clock of ``written_ms``.
        bounds: ``intents_s`` is the bound (seconds).

    Returns:
        One :class:`Stranded` (reason ``intent_not_consumed``, state
        :data:`UNPROCESSED`, no sink) per operation, oldest first.
    """
    oldest: dict[str, int] = {}
    for intent in intents:
        at = committed.get(intent.partition)
        if intent.written_ms is None or (at is not None and intent.offset < at):
            continue
        prior = oldest.get(intent.operation_id)
        oldest[intent.operation_id] = (
            intent.written_ms if prior is None else min(prior, intent.written_ms)
        )
    reason = StrandedReason.INTENT_NOT_CONSUMED
    found = [
        Stranded(
            operation_id=op,
            state=UNPROCESSED,
            sink="",
            reason=reason,
            since_ms=since,
            age_s=max(0, now_ms - since) / 1000,
            bound_s=bounds.intents_s,
            remedy=_remedy(reason, op, None),
        )
        for op, since in oldest.items()
        if max(0, now_ms - since) / 1000 > bounds.intents_s
    ]
    return order(found)


@dataclass(frozen=True)
class StrandedSummary:
    """Stranded operations by reason: how many, and the oldest's age (the metrics).

    Attributes:
        count: reason -> stranded operations (every reason, 0 when none).
        oldest_age_s: reason -> age of the oldest (seconds; 0 when none).
    """

    count: Mapping[StrandedReason, int] = field(default_factory=dict)
    oldest_age_s: Mapping[StrandedReason, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Stranded operations in all."""
        return sum(self.count.values())


def summarise(items: Iterable[Stranded]) -> StrandedSummary:
    """Count stranded operations by reason, with the oldest age of each.

    Args:
        items: stranded operations.

    Returns:
        A :class:`StrandedSummary` naming every reason (0 when none), so a
        gauge of a reason that cleared drops to 0 instead of vanishing.
    """
    count = dict.fromkeys(StrandedReason, 0)
    oldest = dict.fromkeys(StrandedReason, 0.0)
    for item in items:
        count[item.reason] += 1
        oldest[item.reason] = max(oldest[item.reason], item.age_s)
    return StrandedSummary(count, oldest)


def order(items: Iterable[Stranded]) -> list[Stranded]:
    """Stranded operations oldest first, then by operation ID.

    Args:
        items: stranded operations.

    Returns:
        A new list, oldest first.
    """
    return sorted(items, key=lambda s: (-s.age_s, s.operation_id))
