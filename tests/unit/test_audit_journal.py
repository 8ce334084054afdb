"""The auditor checks the hops each journal entry records against the replay."""

from __future__ import annotations

from ledger.audit import Provenance, audit
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


def test_a_state_that_differs_only_outside_the_summary_names_the_fields_that_differ() -> None:
    """State, version and epoch agree: the evidence names what differs, not the same words twice."""
    entries, states = _journal()
    held = states[OP].model_copy(update={"reason": "forged reason", "dispatches": 99})
    [evidence] = _state_violations(entries, {OP: held})
    summary = f"{held.state} v{held.version} epoch {held.epoch}"
    assert evidence.startswith(f"ledger.state and replaying the journal both give {summary}")
    assert f"holds {summary} but replaying the journal gives {summary}" not in evidence
    assert "reason: 'forged reason' in ledger.state" in evidence
    assert "dispatches: 99 in ledger.state" in evidence
    assert "version:" not in evidence and "epoch:" not in evidence and "state:" not in evidence


def test_a_state_with_another_version_names_it_in_the_summary_and_the_fields() -> None:
    entries, states = _journal()
    want = states[OP]
    held = want.model_copy(update={"version": want.version + 1})
    [evidence] = _state_violations(entries, {OP: held})
    assert f"holds {held.state} v{want.version + 1} epoch {held.epoch} but replaying" in evidence
    assert f"version: {want.version + 1} in ledger.state, {want.version} replayed" in evidence


def test_long_values_are_cut_in_the_evidence() -> None:
    entries, states = _journal()
    held = states[OP].model_copy(update={"reason": "x" * 500})
    [evidence] = _state_violations(entries, {OP: held})
    assert "x" * 500 not in evidence and "..." in evidence


def test_a_missing_state_names_the_record_that_displaced_it() -> None:
    """After compaction an unauthenticated record left no authentic state: the finding names it."""
    entries, _states = _journal()
    provenance = Provenance(
        unauthenticated={("state", 2, 41): "no ledger-auth header"},
        undecodable={},
        uses={},
        grants={},
        displaced_states={OP: (("state", 2, 41), "not authentic: no ledger-auth header")},
    )
    report = audit(entries, {}, {}, {}, provenance=provenance)
    [evidence] = [v.evidence for v in report.violations if v.invariant == "state"]
    assert evidence.startswith("ledger.state holds nothing but replaying the journal gives")
    assert "at state:2:41, displaced its authentic state (not authentic: no ledger-auth" in evidence


def test_a_displacing_record_is_named_only_where_the_state_disagrees() -> None:
    """Not compacted yet: the authentic state still agrees, so there is nothing to name."""
    entries, states = _journal()
    provenance = Provenance(
        unauthenticated={("state", 2, 41): "no ledger-auth header"},
        undecodable={},
        uses={},
        grants={},
        displaced_states={OP: (("state", 2, 41), "not authentic: no ledger-auth header")},
    )
    report = audit(entries, states, {}, {}, provenance=provenance)
    assert [v for v in report.violations if v.invariant == "state"] == []
