"""Property-based tests of the fold (hypothesis): random inputs never make a
forbidden transition (every hop the fold takes is in the table, hop by hop),
and folding the journal equals the compacted state log."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.events import Disposition, Event, OperationState
from ledger.fold import current_dispatch_id, decide, journal_entry, replay
from ledger.states import ENTRY, allowed
from ledger.states import RecoveryState as S
from tests import helpers

OPS = ["refund:a:v1", "refund:b:v1", "refund:c:v1"]


@st.composite
def step(draw):
    """A description of one input; turned into an event against the live state."""
    kind = draw(
        st.sampled_from(
            [
                "intent",
                "drift",
                "reauth",
                "admit",
                "reject",
                "receipt",
                "checked",
                "readback",
                "post",
                "claim",
                "dispose",
            ]
        )
    )
    return (
        kind,
        draw(st.sampled_from(OPS)),
        draw(st.sampled_from(["COMMITTED", "AMBIGUOUS", "REJECTED", "UNAVAILABLE", "ATTEMPTED"])),
        draw(st.sampled_from(["COMMITTED", "ABSENT", "UNKNOWN", "UNSUPPORTED"])),
        draw(st.booleans()),
        draw(st.integers(min_value=-1, max_value=2)),
    )


def build(kind, op, rstatus, bstatus, flag, delta, state: OperationState | None) -> Event:
    i = helpers.intent(op=op)
    current = current_dispatch_id(state) if state else f"{op}#0.0"
    stale = f"{op}#0.0"
    dispatch = current if flag or state is None else stale
    if kind == "intent":
        return i
    if kind == "drift":
        return helpers.intent(op=op, amount=4000)
    if kind == "reauth":
        return helpers.intent(op=op, approval=f"ap-{delta + 5}")
    # The request the decision answers: the one pending, or (delta 2) an earlier one.
    request = 1 if state is None or state.entered_version is None else state.entered_version
    request -= 1 if delta == 2 else 0
    if kind == "admit":
        return (
            helpers.admission(i, request=request)
            if state is None or state.approval_id == "ap-1"
            else helpers.admission(
                i.model_copy(update={"approval_id": state.approval_id}), request=request
            )
        )
    if kind == "reject":
        return helpers.admission(i, admitted=False, reason="approval has expired", request=request)
    if kind == "receipt":
        return helpers.receipt(op, dispatch, rstatus, on_resume=flag)
    if kind == "checked":
        # A committed receipt carrying the postcondition read right after the effect.
        return helpers.receipt(op, dispatch, "COMMITTED", on_resume=delta == 2).model_copy(
            update={
                "postcondition_status": "MATCH" if delta >= 0 else "MISMATCH",
                "postcondition_source": "payments GET /accounts/acct-1",
                "postcondition_detail": "seen",
                "postcondition_observed_at_ms": 2100,
            }
        )
    if kind == "readback":
        return helpers.readback(op, dispatch, bstatus, on_resume=flag)
    if kind == "post":
        return helpers.readback(op, dispatch, "MATCH" if flag else "MISMATCH", kind="POSTCONDITION")
    if kind == "dispose":
        return Disposition(
            disposition_id=f"d-{op}",
            operation_id=op,
            decision={-1: "COMMITTED", 0: "ABSENT", 1: "ABANDON", 2: "ABSENT"}[delta],
            by="operator-1",
            evidence="provider statement",
            disposed_at_ms=9_000,
            # The episode it answers: the current one, or (delta 2) an earlier one.
            episode=None
            if state is None or state.entered_version is None
            else state.entered_version - (1 if delta == 2 else 0),
        )
    version = (state.version if state else 1) + delta
    return helpers.claim(op, f"w{delta}", version)


@settings(max_examples=300, deadline=None)
@given(st.lists(step(), min_size=1, max_size=40))
def test_no_forbidden_transition_and_replay_equals_compacted_state(steps) -> None:
    states: dict[str, OperationState] = {}
    state_log: list[tuple[str, OperationState]] = []
    journal = []
    for n, (kind, op, rstatus, bstatus, flag, delta) in enumerate(steps):
        before = states.get(op)
        event = build(kind, op, rstatus, bstatus, flag, delta, before)
        d = decide(before, event, f"in:0:{n}")
        entry = journal_entry(d, event, event.to_bytes(), "in", 0, n)
        journal.append(entry)
        # Every journaled hop is in the table, recorded as the fold took it.
        assert entry.hops is not None
        journaled = [tuple(S(s) for s in hop.split("->")) for hop in entry.hops]
        assert journaled == list(d.hops)
        assert all(allowed(*hop) for hop in journaled), entry.hops
        if d.outcome != "APPLIED":
            assert d.state == before, "a refused or no-op input changed the state"
            assert d.hops == (), "a refused or no-op input took a hop"
            continue
        after = d.state
        assert after is not None
        # Every hop is in the table, and the hops lead from before to after
        # (none for a self-loop; a new operation enters at ENTRY).
        assert all(allowed(*hop) for hop in d.hops), d.hops
        here = S(before.state) if before is not None else ENTRY
        for frm, to in d.hops:
            assert frm == here != to
            here = to
        assert here == after.state
        if before is not None:
            assert after.version == before.version + 1
            if after.state == S.EFFECT_PENDING and before.state == S.UNKNOWN_OUTCOME:
                # Only an observed absence releases an unknown outcome for a retry.
                assert (kind, bstatus) == ("readback", "ABSENT") or kind == "dispose"
                assert d.hops == ((S.UNKNOWN_OUTCOME, S.ADMITTED), (S.ADMITTED, S.EFFECT_PENDING))
        states[op] = after
        state_log.append((op, after))
    compacted = dict(state_log)  # latest value per key, as compaction keeps it
    assert replay(journal) == compacted == states
