"""What an audit reports: violations, facts checked per invariant, the report."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any


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
        authenticity_checked: whether seals were checked at all.
    """

    operations: int = 0
    journal_entries: int = 0
    violations: list[Violation] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unauthenticated_records: list[dict[str, Any]] = field(default_factory=list)
    undecodable_records: list[dict[str, Any]] = field(default_factory=list)
    authenticity_checked: bool = False

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
            ``{"operations": int, "journal_entries": int, "checked": {invariant:
            facts checked}, "violations": [{"invariant": str, "operation_id":
            str | None, "evidence": str}], "unauthenticated_records": [...],
            "authenticity_checked": bool}``, violations in the order found.
        """
        return {
            "operations": self.operations,
            "journal_entries": self.journal_entries,
            "authenticity_checked": self.authenticity_checked,
            "unauthenticated_records": list(self.unauthenticated_records),
            "undecodable_records": list(self.undecodable_records),
            "checked": dict(self.checked),
            "violations": [
                {"invariant": v.invariant, "operation_id": v.operation_id, "evidence": v.evidence}
                for v in self.violations
            ],
        }
