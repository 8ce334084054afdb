"""The auditor's fencing check orders sink contacts by dispatch, not by journal position.

The processor reads receipts and readbacks from two topics, so the journal
may record a receipt for an earlier dispatch after the readback of a later
one. The relay contacted the sink in outbox order, so that is not a stale
token accepted; a receipt for a dispatch the fold never issued, carrying a
lower token than the sink had already been shown, is.
"""

from __future__ import annotations

from ledger.audit import audit
from ledger.events import Event, JournalEntry, OperationState
from ledger.fold import decide, journal_entry
from tests.helpers import admission, claim, intent, readback, receipt

OP = "refund:c1:v1"


def _journal(events: list[Event]) -> tuple[list[JournalEntry], dict[str, OperationState]]:
    state: OperationState | None = None
    entries = []
    for offset, event in enumerate(events):
        ref = f"in:0:{offset}"
        decision = decide(state, event, ref)
        entries.append(journal_entry(decision, event, event.to_bytes(), "in", 0, offset))
        state = decision.state or state
    assert state is not None
    return entries, {OP: state}


def _with_token(event: Event, token: int) -> Event:
    return event.model_copy(update={"fencing_token": token})


def _fencing(entries: list[JournalEntry], states: dict[str, OperationState]) -> list[str]:
    report = audit(entries, states, {}, {})
    assert report.checked["fencing"] >= 1
    return [v.evidence for v in report.violations if v.invariant == "fencing"]


def test_receipt_journaled_after_a_later_dispatchs_readback_is_not_stale() -> None:
    i = intent(OP)
    # #1.1 executes with token 1; a resume claim makes token 2 and reads back (#2.2);
    # the processor happens to journal the readback before #1.1's receipt.
    entries, states = _journal(
        [
            i,
            admission(i),
            claim(OP, "resumer", 2),
            _with_token(readback(OP, "refund:c1:v1#2.2", on_resume=True), 2),
            receipt(OP, "refund:c1:v1#1.1"),
        ]
    )
    assert [e.outcome for e in entries] == ["APPLIED"] * 4 + ["NOOP"]
    assert _fencing(entries, states) == []


def test_effect_accepted_with_a_token_older_than_the_sink_was_shown_is_caught() -> None:
    i = intent(OP)
    entries, states = _journal(
        [
            i,
            admission(i),
            claim(OP, "resumer", 2),
            _with_token(readback(OP, "refund:c1:v1#2.2", status="ABSENT", on_resume=True), 2),
            # a worker outside the outbox got token 1 accepted after the sink saw token 2
            receipt(OP, "refund:c1:v1#1.9-forged"),
        ]
    )
    found = _fencing(entries, states)
    assert len(found) == 1
    assert "token 1 after the sink had been shown token 2" in found[0]
