"""The auditor checks the hops each journal entry records against the replay."""

from __future__ import annotations

from ledger.audit import audit
from ledger.events import Event, JournalEntry, OperationState
from ledger.fold import decide, journal_entry
from tests.helpers import admission, intent, readback, receipt

OP = "refund:c1:v1"


def _journal() -> tuple[list[JournalEntry], dict[str, OperationState]]:
    i = intent(OP)
    events: list[Event] = [
        i,
        admission(i),
        receipt(OP, "refund:c1:v1#1.1", "AMBIGUOUS"),
        readback(OP, "refund:c1:v1#1.1", "ABSENT", on_resume=True),
    ]
    state: OperationState | None = None
    entries = []
    for offset, event in enumerate(events):
        decision = decide(state, event, f"in:0:{offset}")
        entries.append(journal_entry(decision, event, event.to_bytes(), "in", 0, offset))
        state = decision.state or state
    assert state is not None
    return entries, {OP: state}


def _state_violations(entries: list[JournalEntry], states: dict[str, OperationState]) -> list[str]:
    report = audit(entries, states, {}, {})
    return [v.evidence for v in report.violations if v.invariant == "state"]


def test_recorded_hops_agree_with_the_replay() -> None:
    entries, states = _journal()
    assert entries[-1].hops == ("UNKNOWN_OUTCOME->ADMITTED", "ADMITTED->EFFECT_PENDING")
    assert _state_violations(entries, states) == []


def test_entries_written_before_hops_were_recorded_still_audit() -> None:
    entries, states = _journal()
    v1 = [e.model_copy(update={"hops": None}) for e in entries]
    assert _state_violations(v1, states) == []


def test_a_journal_entry_with_other_hops_is_a_violation() -> None:
    entries, states = _journal()
    entries[-1] = entries[-1].model_copy(update={"hops": ("UNKNOWN_OUTCOME->EFFECT_PENDING",)})
    [evidence] = _state_violations(entries, states)
    assert "in:0:3 records hops ['UNKNOWN_OUTCOME->EFFECT_PENDING']" in evidence
