"""A committed receipt that carries its postcondition readback (receipt schema version 4).

The relay may read the postcondition right after the sink commits and record
the verdict in the ``COMMITTED`` receipt itself (issue 15 item 2). The fold
then reaches what the ``VERIFY`` path would reach, from that one record and
without a ``VERIFY`` dispatch; a receipt of the old shape folds as before; the
auditor accepts the new evidence and still refuses an OUTCOME_VERIFIED that
rests on none.
"""

from __future__ import annotations

import io
import json
from typing import Any

from fastavro import parse_schema, schemaless_writer

from ledger.audit import audit
from ledger.events import (
    Dispatch,
    EffectReceipt,
    Event,
    JournalEntry,
    OperatingEvent,
    OperationState,
    RecoveryReceipt,
    decode_event,
)
from ledger.fold import Decision, current_dispatch_id, decide, journal_entry
from ledger.serde import MARKER, SCHEMA_DIR, registry
from ledger.states import RecoveryState as S
from tests import helpers

OP = "refund:c1:v1"
SOURCE = "payments GET /accounts/acct-1"


def admitted() -> OperationState:
    i = helpers.intent()
    state = decide(None, i, "t:0:0").state
    state = decide(state, helpers.admission(i), "t:0:1").state
    assert state is not None and state.state == S.EFFECT_PENDING
    return state


def checked(
    state: OperationState, verdict: str, *, on_resume: bool = False, at_ms: int = 2100
) -> EffectReceipt:
    """A COMMITTED receipt of the current dispatch carrying the postcondition's ``verdict``."""
    return helpers.receipt(OP, current_dispatch_id(state), on_resume=on_resume).model_copy(
        update={
            "postcondition_status": verdict,
            "postcondition_source": SOURCE,
            "postcondition_detail": f"account acct-1: {verdict.lower()}",
            "postcondition_observed_at_ms": at_ms,
        }
    )


def of(d: Decision, kind: type[Event]) -> list[Any]:
    return [o.event for o in d.outputs if isinstance(o.event, kind)]


# --- the fold ------------------------------------------------------------------------------------


def test_a_plain_committed_receipt_still_dispatches_its_verification() -> None:
    state = admitted()
    d = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:1")
    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    assert [v.kind for v in of(d, Dispatch)] == ["VERIFY"]
    assert d.hops == ((S.EFFECT_PENDING, S.EFFECT_COMMITTED),)


def test_a_matching_postcondition_in_the_receipt_verifies_without_a_dispatch() -> None:
    state = admitted()
    d = decide(state, checked(state, "MATCH"), "r:0:1")
    assert d.outcome == "APPLIED" and d.state is not None
    assert d.state.state == S.OUTCOME_VERIFIED
    assert d.hops == (
        (S.EFFECT_PENDING, S.EFFECT_COMMITTED),
        (S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED),
    )
    assert of(d, Dispatch) == [] and of(d, RecoveryReceipt) == []
    assert d.state.dispatches == state.dispatches  # no VERIFY issued
    assert d.state.effect_id == "payments-1"
    assert d.state.observation_status == "VERIFIED"
    assert d.state.observation_source == SOURCE and d.state.observed_at_ms == 2100


def test_the_one_record_reaches_the_state_the_two_hops_reach() -> None:
    state = admitted()
    inline = decide(state, checked(state, "MATCH"), "r:0:1").state
    committed = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:1").state
    assert committed is not None
    readback = helpers.readback(OP, current_dispatch_id(committed), "MATCH", "POSTCONDITION")
    verified = decide(committed, readback, "b:0:1").state
    assert inline is not None and verified is not None
    same = ("state", "effect_id", "observation_status", "recovery_receipts", "epoch")
    assert {f: getattr(inline, f) for f in same} == {f: getattr(verified, f) for f in same}


def test_a_mismatch_in_the_receipt_leaves_it_committed_as_the_verify_path_does() -> None:
    state = admitted()
    d = decide(state, checked(state, "MISMATCH"), "r:0:1")
    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    assert of(d, Dispatch) == []
    assert [e.kind for e in of(d, OperatingEvent)] == ["POSTCONDITION_MISMATCH"]
    # The VERIFY path: committed, then the mismatching readback changes nothing.
    old = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:1").state
    assert old is not None
    mismatch = helpers.readback(OP, current_dispatch_id(old), "MISMATCH", "POSTCONDITION")
    after = decide(old, mismatch, "b:0:1")
    assert after.state is not None and after.state.state == d.state.state
    assert [e.kind for e in of(after, OperatingEvent)] == ["POSTCONDITION_MISMATCH"]


def test_a_resume_writes_one_recovery_receipt_naming_the_postcondition() -> None:
    state = admitted()
    d = decide(state, checked(state, "MATCH", on_resume=True), "r:0:1")
    assert d.state is not None and d.state.state == S.OUTCOME_VERIFIED
    (r,) = of(d, RecoveryReceipt)
    assert r.action == "COMPLETE" and r.observation_status == "COMMITTED"
    assert r.effect_id == "payments-1" and r.postcondition.startswith("verified")
    assert r.uncertainty == "none"
    assert d.state.recovery_receipts == state.recovery_receipts + 1


def test_a_resumed_mismatch_names_its_owner_in_the_recovery_receipt() -> None:
    state = admitted()
    d = decide(state, checked(state, "MISMATCH", on_resume=True), "r:0:1")
    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    (r,) = of(d, RecoveryReceipt)
    assert r.postcondition.startswith("mismatch") and r.uncertainty_owner == "operator"
    assert d.state.recovery_receipts == 1


def test_from_unknown_outcome_it_leaves_the_reconciliation_queue() -> None:
    state = admitted()
    held = decide(state, helpers.receipt(OP, current_dispatch_id(state), "AMBIGUOUS"), "r:0:1")
    assert held.state is not None and held.state.state == S.UNKNOWN_OUTCOME
    d = decide(held.state, checked(held.state, "MATCH"), "r:0:2")
    assert d.state is not None and d.state.state == S.OUTCOME_VERIFIED
    assert [o.event for o in d.outputs if o.topic == "reconciliation"] == [None]


def test_an_effect_already_committed_is_left_to_its_verification() -> None:
    state = admitted()
    committed = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:1").state
    assert committed is not None
    d = decide(committed, checked(committed, "MATCH"), "r:0:2")
    assert d.outcome == "NOOP" and d.state is not None and d.state.state == S.EFFECT_COMMITTED


def test_a_later_postcondition_readback_is_only_noted() -> None:
    state = admitted()
    verified = decide(state, checked(state, "MATCH"), "r:0:1").state
    assert verified is not None
    readback = helpers.readback(OP, current_dispatch_id(verified), "MATCH", "POSTCONDITION")
    d = decide(verified, readback, "b:0:1")
    assert d.outcome == "NOOP" and d.state is not None
    assert d.state.state == S.OUTCOME_VERIFIED


def test_an_operation_never_admitted_is_refused_as_before() -> None:
    state = decide(None, helpers.intent(approval=None), "t:0:0").state
    assert state is not None and state.state == S.NEEDS_REAUTHORISATION
    d = decide(state, checked(state, "MATCH"), "r:0:1")
    assert d.outcome == "REFUSED" and d.state is not None
    assert d.state.state == S.NEEDS_REAUTHORISATION


# --- the record -----------------------------------------------------------------------------


def test_the_receipt_round_trips_with_its_postcondition() -> None:
    r = checked(admitted(), "MATCH")
    assert decode_event(r.to_bytes()) == r


def test_a_receipt_of_version_3_decodes_without_one_and_folds_as_before() -> None:
    old = json.loads((SCHEMA_DIR / "history" / "receipt.v3.avsc").read_text())
    state = admitted()
    record = helpers.receipt(OP, current_dispatch_id(state)).model_dump(
        include={f["name"] for f in old["fields"]}
    )
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(old), record)
    fingerprint = next(s.fingerprint for s in registry().by_fingerprint.values() if s.raw == old)
    event = decode_event(MARKER + fingerprint + buf.getvalue())
    assert isinstance(event, EffectReceipt) and event.postcondition_status is None
    d = decide(state, event, "r:0:1")
    assert d.state is not None and d.state.state == S.EFFECT_COMMITTED
    assert [v.kind for v in of(d, Dispatch)] == ["VERIFY"]


# --- the audit ------------------------------------------------------------------------------


def _ledger(
    events: list[Event],
) -> tuple[
    list[JournalEntry], dict[str, OperationState], dict[str, Dispatch], dict[str, RecoveryReceipt]
]:
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


def _inline(verdict: str, *, on_resume: bool = False) -> list[Event]:
    i = helpers.intent()
    state = admitted()
    return [i, helpers.admission(i), checked(state, verdict, on_resume=on_resume)]


def test_the_audit_accepts_an_operation_verified_by_its_receipt() -> None:
    journal, states, dispatches, receipts = _ledger(_inline("MATCH", on_resume=True))
    assert states[OP].state == S.OUTCOME_VERIFIED
    report = audit(journal, states, dispatches, receipts, {OP: 1})
    assert report.violations == []
    assert report.checked["verified-evidence"] == 1
    assert report.checked["recovery-receipt"] == 1


def test_the_audit_refuses_a_verified_state_whose_receipt_carries_a_mismatch() -> None:
    journal, states, dispatches, receipts = _ledger(_inline("MISMATCH"))
    states[OP] = states[OP].model_copy(update={"state": S.OUTCOME_VERIFIED})
    report = audit(journal, states, dispatches, receipts)
    verified = [v for v in report.violations if v.invariant == "verified-evidence"]
    assert len(verified) == 1 and "postcondition readback" in verified[0].evidence


def test_the_audit_refuses_a_verified_state_on_a_plain_receipt() -> None:
    i = helpers.intent()
    state = admitted()
    journal, states, dispatches, receipts = _ledger(
        [i, helpers.admission(i), helpers.receipt(OP, current_dispatch_id(state))]
    )
    states[OP] = states[OP].model_copy(update={"state": S.OUTCOME_VERIFIED})
    report = audit(journal, states, dispatches, receipts)
    assert [v.invariant for v in report.violations if v.invariant == "verified-evidence"] == [
        "verified-evidence"
    ]
