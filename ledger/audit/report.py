"""What an audit reports: violations, facts checked per invariant, the report."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ledger.events import OperationState
from ledger.stranded import Stranded

#: States an operator must look at: held unknown outcomes, operations waiting
#: for a new approval, and operations given up.
OPEN_STATES: tuple[str, ...] = ("UNKNOWN_OUTCOME", "NEEDS_REAUTHORISATION", "ABANDONED")
#: An operation resting in EFFECT_COMMITTED is open only when its sink's
#: postcondition contradicted the committed effect (listed after the above).
MISMATCHED = "EFFECT_COMMITTED"
#: Open items whose outcome the ledger does not know: the verdict is not CLEAN
#: while one is open (:attr:`AuditReport.unsettled`).
UNSETTLED_STATES: frozenset[str] = frozenset({"UNKNOWN_OUTCOME", MISMATCHED})


#: Coverage words: sinks read back and at least one fact checked against them.
LEDGER_AND_SINKS = "ledger and sink readback"
#: Coverage words: sinks asked (no ``--no-sinks``) but no fact checked against them.
LEDGER_ONLY_NO_SINK_FACT = "ledger only; no sink readback"
#: Coverage words: ``--no-sinks``.
LEDGER_ONLY_SINKS_OFF = "ledger only, sink readback off"


def coverage_words(sink_readback: bool, sink_facts: int | None) -> str:
    """What an audit's verdict holds for, in words; sink readback only when it checked a fact.

    Args:
        sink_readback: whether sinks were asked (``ledger audit`` without
            ``--no-sinks``).
        sink_facts: facts checked against what the sinks read back (``None``
            when not asked).

    Returns:
        :data:`LEDGER_AND_SINKS` when at least one sink fact was checked,
        :data:`LEDGER_ONLY_NO_SINK_FACT` when sinks were asked but none was
        (no registered sink with readback holds an operation of this
        ledger, or none answered), else :data:`LEDGER_ONLY_SINKS_OFF`.
    """
    if not sink_readback:
        return LEDGER_ONLY_SINKS_OFF
    return LEDGER_AND_SINKS if sink_facts else LEDGER_ONLY_NO_SINK_FACT


@dataclass(frozen=True)
class Violation:
    """One broken invariant.

    Attributes:
        invariant: short name (see :mod:`ledger.audit`).
        operation_id: the operation concerned (``None`` for ledger-wide ones).
        evidence: what was found, with positions where known.
    """

    invariant: str
    operation_id: str | None
    evidence: str


@dataclass
class Findings:
    """What one invariant found, recorded under its name.

    :func:`ledger.audit.audit` hands each invariant a fresh ``Findings`` bound
    to the name it was registered with, so an invariant cannot report under
    another's name.

    Attributes:
        invariant: the invariant's registered name.
        checked: facts checked so far.
        violations: violations found so far, in the order found.
    """

    invariant: str
    checked: int = 0
    violations: list[Violation] = field(default_factory=list)

    def check(self, facts: int = 1) -> None:
        """Count facts checked (whether they hold or not).

        Args:
            facts: how many facts were checked.
        """
        self.checked += facts

    def violation(self, operation_id: str | None, evidence: str) -> None:
        """Record a violation of this invariant.

        Args:
            operation_id: the operation concerned (``None`` for ledger-wide ones).
            evidence: what was found, with positions where known.
        """
        self.violations.append(Violation(self.invariant, operation_id, evidence))


@dataclass(frozen=True)
class OpenItem:
    """An operation an operator must look at (see :data:`OPEN_STATES`).

    Attributes:
        operation_id: the operation.
        state: ``UNKNOWN_OUTCOME``, ``NEEDS_REAUTHORISATION``, ``ABANDONED``, or
            ``EFFECT_COMMITTED`` with a postcondition mismatch.
        sink: its sink.
        reason: the reason of its latest transition.
        since_ms: when its latest state record was written (Kafka timestamp,
            wall clock, milliseconds since the epoch), ``None`` if unknown.
        age_s: seconds from ``since_ms`` to the audit's start on the same
            clock, never negative; ``None`` if unknown.
    """

    operation_id: str
    state: str
    sink: str
    reason: str
    since_ms: int | None
    age_s: float | None

    @property
    def history_command(self) -> str:
        """The command that shows this item's history.

        The command that shows its history (``ledger policy show`` for the ledger-wide
        ``(policy)`` item of an unverifiable policy record).
        """
        if self.operation_id == "(policy)":
            return "ledger policy show"
        return f"ledger history {self.operation_id}"

    def to_dict(self) -> dict[str, Any]:
        """``{"operation_id", "state", "sink", "reason", "since_ms", "age_s", "history"}``."""
        return {
            "operation_id": self.operation_id,
            "state": self.state,
            "sink": self.sink,
            "reason": self.reason,
            "since_ms": self.since_ms,
            "age_s": self.age_s,
            "history": self.history_command,
        }


def open_items(
    states: Mapping[str, OperationState],
    since_ms: Mapping[str, int],
    now_ms: int,
    mismatched: Mapping[str, str] | None = None,
) -> list[OpenItem]:
    """The operations an operator must look at, oldest first.

    Args:
        states: latest state per operation.
        since_ms: operation -> when its latest state record was written
            (milliseconds, the same clock as ``now_ms``); missing: unknown.
        now_ms: the audit's start on that clock.
        mismatched: operation -> the detail of a ``POSTCONDITION_MISMATCH``
            operating event about it: such an operation resting in
            EFFECT_COMMITTED (e.g. committed by a disposition that the
            sink's postcondition then contradicted) is open too, since
            nothing in the ledger will move it on.

    Returns:
        One item per operation in :data:`OPEN_STATES` (and per mismatched
        one in EFFECT_COMMITTED), ordered by state (as listed there, the
        mismatched last), then oldest first, then by operation ID.
    """
    order = (*OPEN_STATES, MISMATCHED)
    items: list[OpenItem] = []
    for op, st in states.items():
        reason = st.reason
        if st.state == MISMATCHED and mismatched and op in mismatched:
            reason = (
                f"postcondition mismatch after the effect was recorded committed "
                f"({st.reason}): {mismatched[op]}; nothing moves it on, so look at the sink"
            )
        elif st.state not in OPEN_STATES:
            continue
        since = since_ms.get(op)
        age = max(0.0, (now_ms - since) / 1000) if since is not None else None
        items.append(OpenItem(op, str(st.state), st.sink, reason, since, age))
    items.sort(key=lambda i: (order.index(i.state), -(i.age_s or 0.0), i.operation_id))
    return items


def stranded_items(stranded: list[Stranded], already: list[OpenItem]) -> list[OpenItem]:
    """Open items for stranded operations (:mod:`ledger.stranded`), oldest first.

    Args:
        stranded: the stranded operations, oldest first.
        already: the open items listed so far (an operation is listed once).

    Returns:
        One item per stranded operation not in ``already``: its state, and
        as reason why it is stranded, for how long and its remedy.
    """
    listed = {i.operation_id for i in already}
    return [
        OpenItem(s.operation_id, s.state, s.sink, s.sentence, s.since_ms, s.age_s)
        for s in stranded
        if s.operation_id not in listed
    ]


@dataclass
class AuditReport:
    """The auditor's result.

    Attributes:
        operations: operations in the ledger.
        journal_entries: journal entries replayed.
        violations: every violation found (empty when the ledger is sound),
            grouped by invariant in the order the invariants run.
        checked: invariant name -> number of facts checked (an invariant
            that had nothing to check is absent).
        unauthenticated_records: every record on the ledger's topics that no
            trusted writer produced (``{"topic", "partition", "offset",
            "reason"}``), in position order; readers refused them, and a
            decision resting on one is a violation (``authenticity``).
        undecodable_records: records on the ledger's topics that do not
            decode but that a stage refused as bad input (a dead letter names
            them), ``{"topic", "partition", "offset", "reason"}``; an
            undecodable record nobody refused is a violation (``readable``).
        replayed_records: authentic state records older than a state of
            their operation read before them (copies of earlier states
            appended again), ``{"topic", "partition", "offset", "reason"}``;
            the highest version is the operation's state, so they are
            listed, not violations.
        authenticity_checked: whether seals were checked at all.
        sink_readback: whether sinks were asked how many effects they hold
            (``ledger audit --no-sinks`` does not ask).
        sink_facts: facts checked against sink readback (part of ``checked``;
            0 when ``sink_readback`` is off).
        started_at_ms: when the audit started (wall clock, milliseconds since
            the epoch; ``None`` when the caller did not say).
        took_s: how long it took (seconds).
        offsets: topic -> partition -> the end offset read to (every record
            before it, from the beginning, was read).
        open_items: operations an operator must look at (:class:`OpenItem`).
        unverifiable_records: the refused records whose seal names a key the
            auditor does not hold (``{"topic", "partition", "offset",
            "reason"}``): they may be authentic evidence, so the audit cannot
            say the ledger is clean while any is left; every operation they
            cover is an open item (state ``UNVERIFIABLE``).
        journal_chain: what the journal's hash chains were checked against
            (``{"partitions": [{"partition", "starts_at": offset of the
            first chained entry or None, "seq", "unchained": entries before
            it written by an earlier release}], "heads_checked": int,
            "witness": the witness files read, or None}``); its findings are
            violations of ``journal-chain`` (:mod:`ledger.audit.chain`).
        sink_unread: what sink readback could not read (``{"sink",
            "operations": how many were left unread, "reason"}``): a sink
            that gave no answer within its deadline, or ran out of its share
            of the audit, is asked nothing more.
        stranded: operations not resting where they should for longer than
            their bound (:mod:`ledger.stranded`), oldest first; each is an
            open item too, and the audit is not CLEAN while any is left.
        unverified: why evidence other than records could not be checked,
            one sentence each with its remedy (heads of the journal were
            published but no witness kept outside Kafka was given, or the
            witness holds fewer or older heads: :mod:`ledger.audit.witness`);
            the audit is NOT VERIFIED while any is left.
    """

    operations: int = 0
    journal_entries: int = 0
    violations: list[Violation] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unauthenticated_records: list[dict[str, Any]] = field(default_factory=list)
    undecodable_records: list[dict[str, Any]] = field(default_factory=list)
    replayed_records: list[dict[str, Any]] = field(default_factory=list)
    authenticity_checked: bool = False
    sink_readback: bool = False
    sink_facts: int = 0
    started_at_ms: int | None = None
    took_s: float | None = None
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    open_items: list[OpenItem] = field(default_factory=list)
    unverifiable_records: list[dict[str, Any]] = field(default_factory=list)
    sink_unread: list[dict[str, Any]] = field(default_factory=list)
    journal_chain: dict[str, Any] = field(default_factory=dict)
    stranded: list[Stranded] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Whether the evidence is sound: no violation, nothing unverified or stranded.

        No violation, nothing left unverified (records these keys cannot verify, heads
        not witnessed), nothing stranded.

        The evidence is sound; missions and game days judge a run by it. An
        outcome still unknown is not a fault of the evidence, so it does not
        count here; it does in :attr:`settled`, which the verdict and
        ``ledger audit``'s exit status follow.
        """
        return (
            not self.violations
            and not self.unverifiable_records
            and not self.unverified
            and not self.stranded
        )

    @property
    def unsettled(self) -> list[OpenItem]:
        """Open items whose outcome at the sink is not known to the ledger.

        An operation held in UNKNOWN_OUTCOME (nobody knows whether its
        effect happened) and one resting in EFFECT_COMMITTED after its
        sink's postcondition contradicted it (:data:`UNSETTLED_STATES`).
        NEEDS_REAUTHORISATION and ABANDONED are open items too, but their
        outcome is known (no effect), so they leave the verdict CLEAN.
        """
        return [i for i in self.open_items if i.state in UNSETTLED_STATES]

    @property
    def settled(self) -> bool:
        """:attr:`clean`, and no open item whose outcome is unknown (:attr:`unsettled`)."""
        return self.clean and not self.unsettled

    @property
    def facts(self) -> int:
        """Facts checked in all."""
        return sum(self.checked.values())

    @property
    def coverage(self) -> str:
        """What was checked, in words (:func:`coverage_words`).

        ``ledger and sink readback`` only when a fact was checked against a sink's readback.
        """
        return coverage_words(self.sink_readback, self.sink_facts)

    @property
    def verdict(self) -> str:
        """``CLEAN``, ``N VIOLATION(S)``, ``NOT VERIFIED``, ``STRANDED`` or ``OPEN``, with coverage.

        ``NOT VERIFIED`` (no violation found, but records sealed by keys the
        auditor does not hold are left, or the journal's published heads are
        not all in the witness given: :attr:`unverified`, the first named):
        evidence it could not check is never counted as absent. ``STRANDED``
        (no violation, every record checked, but operations stopped short of
        where they should rest): sound evidence of work that is not moving is
        not clean. ``OPEN`` (sound, nothing stranded, but an outcome is
        unknown: :attr:`unsettled`): a ledger that cannot say whether an
        effect happened is not clean.
        """
        n = len(self.violations)
        if n:
            head = f"{n} VIOLATION{'S' if n != 1 else ''}"
        elif self.unverifiable_records or self.unverified:
            u = len(self.unverifiable_records)
            why = [f"{u} record{'s' if u != 1 else ''} sealed by keys not held here"] if u else []
            if self.unverified:
                more = len(self.unverified) - 1
                why.append(self.unverified[0] + (f" (and {more} more)" if more else ""))
            head = "NOT VERIFIED: " + "; ".join(why)
        elif self.stranded:
            k = len(self.stranded)
            head = f"STRANDED: {k} operation{'s' if k != 1 else ''} not moving"
        elif self.unsettled:
            k = len(self.unsettled)
            head = (
                f"OPEN: {k} operation{'s' if k != 1 else ''} whose outcome is unknown, held for "
                "a person (open items below)"
            )
        else:
            head = "CLEAN"
        return f"{head} ({self.coverage})"

    def add(self, invariant: str, operation_id: str | None, evidence: str) -> None:
        """Record a violation.

        Args:
            invariant: the invariant's name.
            operation_id: the operation concerned (``None`` for ledger-wide ones).
            evidence: what was found.
        """
        self.violations.append(Violation(invariant, operation_id, evidence))

    def merge(self, findings: Findings) -> None:
        """Add what one invariant found: its facts checked and its violations.

        Args:
            findings: the invariant's findings; nothing is added to
                ``checked`` when it checked no fact.
        """
        if findings.checked:
            self.checked[findings.invariant] += findings.checked
        self.violations.extend(findings.violations)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-serialisable data.

        Returns:
            ``{"operations": int, "journal_entries": int, "verdict": str,
            "ran_at": ISO 8601 UTC | None, "ran_at_ms": int | None, "took_s":
            float | None, "coverage": {"sink_readback": bool, "facts": int,
            "ledger_facts": int, "sink_facts": int | None, "sink_unread":
            [{"sink", "operations", "reason"}]}, "offsets": {topic:
            {partition (str): end offset}}, "open_items": [OpenItem.to_dict()],
            "checked": {invariant: facts checked}, "violations": [{"invariant":
            str, "operation_id": str | None, "evidence": str}],
            "unauthenticated_records": [...], "unverified": [str],
            "undecodable_records": [...],
            "replayed_records": [...], "journal_chain": {...},
            "authenticity_checked": bool, "stranded": [Stranded.to_dict()]}``,
            violations in the order found; ``sink_facts`` is ``None`` when
            sink readback was off.
        """
        return {
            "operations": self.operations,
            "journal_entries": self.journal_entries,
            "verdict": self.verdict,
            "ran_at": datetime.fromtimestamp(self.started_at_ms / 1000, UTC).isoformat(
                timespec="seconds"
            )
            if self.started_at_ms is not None
            else None,
            "ran_at_ms": self.started_at_ms,
            "took_s": self.took_s,
            "coverage": {
                "sink_readback": self.sink_readback,
                "facts": self.facts,
                "ledger_facts": self.facts - self.sink_facts,
                "sink_facts": self.sink_facts if self.sink_readback else None,
                "sink_unread": list(self.sink_unread),
            },
            "offsets": {
                t: {str(p): end for p, end in sorted(parts.items())}
                for t, parts in sorted(self.offsets.items())
            },
            "open_items": [i.to_dict() for i in self.open_items],
            "stranded": [s.to_dict() for s in self.stranded],
            "authenticity_checked": self.authenticity_checked,
            "unauthenticated_records": list(self.unauthenticated_records),
            "unverifiable_records": list(self.unverifiable_records),
            "unverified": list(self.unverified),
            "undecodable_records": list(self.undecodable_records),
            "replayed_records": list(self.replayed_records),
            "journal_chain": dict(self.journal_chain),
            "checked": dict(self.checked),
            "violations": [
                {"invariant": v.invariant, "operation_id": v.operation_id, "evidence": v.evidence}
                for v in self.violations
            ],
        }
