"""The auditor's invariants are a registry: one function each, all of them run.

The registry, the :mod:`ledger.audit` docstring and the names reports can
carry agree; a corrupted ledger is reported only under registered names; a
check registered in a throwaway registry (or passed to ``audit``) runs; and
the facts every check reads cannot be changed by one of them.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

import ledger.audit
from ledger.audit import INVARIANTS, AuditInput, Findings, Invariant, audit, gather, invariant
from ledger.events import Dispatch, Event, JournalEntry, OperationState, RecoveryReceipt
from ledger.fold import decide, journal_entry
from ledger.states import RecoveryState as S
from tests.helpers import admission, claim, intent, readback, receipt

#: Every invariant a report can name, in the order they run. Reports, HTML
#: pages and mission reports carry these names: renaming one is a change of
#: the report format.
NAMES = (
    "readable",
    "authenticity",
    "state",
    "admission",
    "unknown-release",
    "fencing",
    "single-effect",
    "consume-once",
    "verified-evidence",
    "recovery-receipt",
    "compensation-bounds",
)

A, B = "refund:a:v1", "refund:b:v1"


def _ledger(
    events: list[Event],
) -> tuple[
    list[JournalEntry], dict[str, OperationState], dict[str, Dispatch], dict[str, RecoveryReceipt]
]:
    """Fold events as the processor would: journal, state, outbox, recovery receipts."""
    states: dict[str, OperationState] = {}
    dispatches: dict[str, Dispatch] = {}
    receipts: dict[str, RecoveryReceipt] = {}
    journal = []
    for offset, event in enumerate(events):
        op = str(getattr(event, "operation_id", ""))
        decision = decide(states.get(op), event, f"in:0:{offset}")
        journal.append(journal_entry(decision, event, event.to_bytes(), "in", 0, offset))
        for out in decision.outputs:
            if isinstance(out.event, Dispatch):
                dispatches[op] = out.event
            elif isinstance(out.event, RecoveryReceipt):
                receipts[op] = out.event
        if decision.state is not None:
            states[op] = decision.state
    return journal, states, dispatches, receipts


def test_registry_docstring_and_report_names_agree() -> None:
    documented = re.findall(r"^\* ``([a-z-]+)``:", ledger.audit.__doc__ or "", re.MULTILINE)

    assert tuple(INVARIANTS) == NAMES
    assert tuple(documented) == NAMES
    for name, check in INVARIANTS.items():
        assert check.__doc__ and "Args:" in check.__doc__, f"{name} needs a Google docstring"


def test_a_corrupted_ledger_is_reported_only_under_registered_names() -> None:
    a, b = intent(A), intent(B)  # both name approval ap-1
    journal, states, dispatches, receipts = _ledger(
        [
            a,
            admission(a),
            b,
            admission(b),  # ap-1 admits a second operation: consume-once
            claim(A, "resumer", 2),
            readback(A, f"{A}#2.2", status="ABSENT", on_resume=True).model_copy(
                update={"fencing_token": 2}
            ),
            receipt(A, f"{A}#1.9-forged"),  # token 1 accepted after token 2: fencing
        ]
    )
    states[A] = states[A].model_copy(update={"recovery_receipts": 5})  # state, recovery-receipt
    states[B] = states[B].model_copy(update={"state": S.OUTCOME_VERIFIED})  # verified-evidence
    # ... and as a compensation of A for another subject: compensation-bounds
    states[B] = states[B].model_copy(update={"compensates": A, "subject": "customer-9"})
    dispatches[B] = dispatches[B].model_copy(update={"fencing_token": 99})  # admission

    report = audit(journal, states, dispatches, receipts, {A: 2})  # single-effect

    found = {v.invariant for v in report.violations}
    assert found <= set(INVARIANTS)
    # the fold itself never releases wrongly; seals and decoding are not what this ledger breaks
    assert found >= set(NAMES) - {"unknown-release", "readable", "authenticity"}
    assert set(report.checked) <= set(INVARIANTS)
    order = [NAMES.index(v.invariant) for v in report.violations]
    assert order == sorted(order), "violations are grouped by invariant, in registry order"


def test_a_registered_invariant_is_run_by_audit() -> None:
    registry: dict[str, Invariant] = {}

    @invariant("every-state-counted", registry=registry)
    def every_state_counted(facts: AuditInput, found: Findings) -> None:
        """Flags every operation in ledger.state (a stand-in for a new invariant).

        Args:
            facts: the audit's facts.
            found: where findings go.
        """
        for op in facts.states:
            found.check()
            found.violation(op, "seen")

    i = intent(A)
    journal, states, dispatches, receipts = _ledger([i, admission(i)])

    alone = audit(journal, states, dispatches, receipts, invariants=registry)
    assert [(v.invariant, v.operation_id) for v in alone.violations] == [("every-state-counted", A)]
    assert dict(alone.checked) == {"every-state-counted": 1}
    assert every_state_counted not in INVARIANTS.values()  # the real registry is untouched

    extended = audit(journal, states, dispatches, receipts, invariants={**INVARIANTS, **registry})
    default = audit(journal, states, dispatches, receipts)
    assert extended.violations == [*default.violations, *alone.violations]
    assert dict(extended.checked) == {**default.checked, "every-state-counted": 1}


def test_registering_a_name_twice_is_refused() -> None:
    registry: dict[str, Invariant] = {}
    invariant("x", registry=registry)(INVARIANTS["state"])

    with pytest.raises(ValueError, match="'x' is already registered"):
        invariant("x", registry=registry)(INVARIANTS["fencing"])


def test_the_facts_are_immutable() -> None:
    i = intent(A)
    journal, states, dispatches, receipts = _ledger([i, admission(i)])
    facts = gather(journal, states, dispatches, receipts)

    with pytest.raises(dataclasses.FrozenInstanceError):
        facts.states = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        facts.states[A] = states[A]  # type: ignore[index]
    with pytest.raises(TypeError):
        facts.generated_dispatches["x"] = dispatches[A]  # type: ignore[index]
    states.clear()  # the caller's mapping is copied, not shared
    assert A in facts.states and facts.operation_ids == (A,)
