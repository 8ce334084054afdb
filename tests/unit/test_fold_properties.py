"""Property-based tests of the fold (hypothesis): random inputs never make a
forbidden transition, and folding the journal equals the compacted state log."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.events import Event, OperationState
from ledger.fold import current_dispatch_id, decide, journal_entry, replay
from ledger.states import RecoveryState as S
from ledger.states import allowed
from tests import helpers

OPS = ["refund:a:v1", "refund:b:v1", "refund:c:v1"]


@st.composite
def step(draw):
    """A description of one input; turned into an event against the live state."""
    kind = draw(
        st.sampled_from(
            ["intent", "drift", "reauth", "admit", "reject", "receipt", "readback", "post", "claim"]
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
    if kind == "admit":
        return (
            helpers.admission(i)
            if state is None or state.approval_id == "ap-1"
            else helpers.admission(i.model_copy(update={"approval_id": state.approval_id}))
        )
    if kind == "reject":
        return helpers.admission(i, admitted=False, reason="approval has expired")
    if kind == "receipt":
        return helpers.receipt(op, dispatch, rstatus, on_resume=flag)
    if kind == "readback":
        return helpers.readback(op, dispatch, bstatus, on_resume=flag)
    if kind == "post":
        return helpers.readback(op, dispatch, "MATCH" if flag else "MISMATCH", kind="POSTCONDITION")
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
        journal.append(journal_entry(d, event, event.to_bytes(), "in", 0, n))
        if d.outcome != "APPLIED":
            assert d.state == before, "a refused or no-op input changed the state"
            continue
        after = d.state
        assert after is not None
        if before is not None:
            assert after.version == before.version + 1
            if before.state != after.state:
                hop = (S(before.state), S(after.state))
                # ADMITTED is passed through atomically with its dispatch.
                assert allowed(*hop) or (
                    allowed(hop[0], S.ADMITTED) and allowed(S.ADMITTED, hop[1])
                ), hop
            if after.state == S.EFFECT_PENDING and before.state == S.UNKNOWN_OUTCOME:
                assert kind == "readback" and bstatus == "ABSENT"
        states[op] = after
        state_log.append((op, after))
    compacted = dict(state_log)  # latest value per key, as compaction keeps it
    assert replay(journal) == compacted == states
