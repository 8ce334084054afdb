"""The transition table is law: every hop the fold takes is in it, checked in one place.

One case per way an input moves an operation. Each says which hops it takes;
together they must take every entry of the table, and removing any entry from
the table must make the fold refuse that input (so no handler moves a state
without asking the table).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledger.events import Disposition, Event, OperationState, decode_event
from ledger.fold import MAX_UNAVAILABLE, current_dispatch_id, decide, journal_entry
from ledger.states import ENTRY, TRANSITIONS, allowed
from ledger.states import RecoveryState as S
from tests import helpers

OP = "refund:c1:v1"
Hop = tuple[S, S]
Case = Callable[[], tuple[OperationState | None, Event]]


def run(*events: Event) -> OperationState:
    state: OperationState | None = None
    for n, event in enumerate(events):
        state = decide(state, event, f"setup:0:{n}").state
    assert state is not None
    return state


def then(state: OperationState, make: Callable[[OperationState], Event]) -> OperationState:
    d = decide(state, make(state), f"setup:1:{state.version}")
    assert d.outcome == "APPLIED" and d.state is not None, d.reason
    return d.state


def fresh() -> OperationState:
    return run(helpers.intent())


def pending() -> OperationState:
    i = helpers.intent()
    return run(i, helpers.admission(i))


def refused() -> OperationState:
    i = helpers.intent()
    return run(i, helpers.admission(i, admitted=False, reason="approval has expired"))


def unknown() -> OperationState:
    return then(pending(), lambda s: helpers.receipt(OP, current_dispatch_id(s), "AMBIGUOUS"))


def committed() -> OperationState:
    return then(pending(), lambda s: helpers.receipt(OP, current_dispatch_id(s)))


def abandoned() -> OperationState:
    return then(pending(), lambda s: helpers.receipt(OP, current_dispatch_id(s), "REJECTED"))


def unavailable(times: int) -> OperationState:
    state = pending()
    for _ in range(times):
        state = then(state, lambda s: helpers.receipt(OP, current_dispatch_id(s), "UNAVAILABLE"))
    return state


def disposition(decision: str, episode: int | None = None) -> Disposition:
    return Disposition(
        disposition_id=f"d-{decision}",
        operation_id=OP,
        decision=decision,  # type: ignore[arg-type]
        by="operator-1",
        evidence="provider statement",
        disposed_at_ms=9_000,
        episode=episode,
    )


def on(state: Callable[[], OperationState], make: Callable[[OperationState], Event]) -> Case:
    def case() -> tuple[OperationState | None, Event]:
        before = state()
        return before, make(before)

    return case


def new(event: Event) -> Case:
    return lambda: (None, event)


NA, NR, A, EP = S.NOT_ADMITTED, S.NEEDS_REAUTHORISATION, S.ADMITTED, S.EFFECT_PENDING
EC, OV, UO, AB = S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED, S.UNKNOWN_OUTCOME, S.ABANDONED

#: name -> (the state before and the input, the hops the input takes).
CASES: dict[str, tuple[Case, list[Hop]]] = {
    "intent": (new(helpers.intent()), []),
    "intent without approval": (new(helpers.intent(approval=None)), [(NA, NR)]),
    "admission": (on(fresh, lambda s: helpers.admission(helpers.intent())), [(NA, A), (A, EP)]),
    "admission refused": (
        on(fresh, lambda s: helpers.admission(helpers.intent(), admitted=False)),
        [(NA, NR)],
    ),
    "compensation of an unobserved original": (
        new(helpers.intent().model_copy(update={"compensates": "credit:c0:v1"})),
        [(NA, AB)],
    ),
    "reauthorisation": (on(refused, lambda s: helpers.intent(approval="ap-2")), [(NR, NA)]),
    "receipt committed": (
        on(pending, lambda s: helpers.receipt(OP, current_dispatch_id(s))),
        [(EP, EC)],
    ),
    "receipt ambiguous": (
        on(pending, lambda s: helpers.receipt(OP, current_dispatch_id(s), "AMBIGUOUS")),
        [(EP, UO)],
    ),
    "reservation cancelled (admission withdrawn)": (
        on(pending, lambda s: helpers.receipt(OP, current_dispatch_id(s), "CANCELLED")),
        [(EP, NR)],
    ),
    "receipt rejected": (
        on(pending, lambda s: helpers.receipt(OP, current_dispatch_id(s), "REJECTED")),
        [(EP, AB)],
    ),
    "sink unavailable once too often": (
        on(
            lambda: unavailable(MAX_UNAVAILABLE - 1),
            lambda s: helpers.receipt(OP, current_dispatch_id(s), "UNAVAILABLE"),
        ),
        [(EP, AB)],
    ),
    "absent while pending: dispatched again": (
        on(pending, lambda s: helpers.readback(OP, current_dispatch_id(s), "ABSENT")),
        [],
    ),
    "claim": (on(pending, lambda s: helpers.claim(OP, "w2", s.version)), []),
    "readback committed after unknown": (
        on(unknown, lambda s: helpers.readback(OP, current_dispatch_id(s), on_resume=True)),
        [(UO, EC)],
    ),
    "readback absent after unknown": (
        on(unknown, lambda s: helpers.readback(OP, current_dispatch_id(s), "ABSENT")),
        [(UO, A), (A, EP)],
    ),
    "disposition committed": (
        on(unknown, lambda s: disposition("COMMITTED", s.entered_version)),
        [(UO, EC)],
    ),
    "disposition absent": (
        on(unknown, lambda s: disposition("ABSENT", s.entered_version)),
        [(UO, A), (A, EP)],
    ),
    "disposition abandon": (
        on(unknown, lambda s: disposition("ABANDON", s.entered_version)),
        [(UO, AB)],
    ),
    "postcondition verified": (
        on(
            committed,
            lambda s: helpers.readback(OP, current_dispatch_id(s), "MATCH", kind="POSTCONDITION"),
        ),
        [(EC, OV)],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_every_hop_the_fold_takes_is_in_the_table(name: str) -> None:
    case, hops = CASES[name]
    before, event = case()
    d = decide(before, event, "in:0:1")
    assert d.outcome == "APPLIED", d.reason
    assert list(d.hops) == hops
    assert all(allowed(*hop) for hop in d.hops)
    # The hops are a path from the state before to the state after.
    start = S(before.state) if before else ENTRY
    assert d.from_state == (str(start) if before else None)
    path = [start, *(to for _, to in d.hops)]
    assert [frm for frm, _ in d.hops] == path[:-1]
    assert d.to_state == path[-1]


def test_the_cases_take_every_entry_of_the_table() -> None:
    taken = {hop for _, hops in CASES.values() for hop in hops}
    assert taken == set(TRANSITIONS)


HOPS = [(name, hop) for name, (_, hops) in CASES.items() for hop in hops]


@pytest.mark.parametrize("name, hop", HOPS, ids=[f"{n}: {a}->{b}" for n, (a, b) in HOPS])
def test_a_hop_removed_from_the_table_is_refused_and_leaves_the_state(
    name: str, hop: Hop, monkeypatch: pytest.MonkeyPatch
) -> None:
    case, _ = CASES[name]
    before, event = case()
    monkeypatch.delitem(TRANSITIONS, hop)
    d = decide(before, event, "in:0:1")
    assert d.outcome == "REFUSED" and d.state == before and d.hops == ()
    assert d.from_state == d.to_state
    [out] = d.outputs
    assert out.topic == "operating-events"
    assert out.event is not None and out.event.kind == "FORBIDDEN_TRANSITION"
    assert out.event.attempted_transition == f"{hop[0]}->{hop[1]}"
    assert d.reason.startswith(f"{hop[0]}->{hop[1]} refused for {OP}: ")


@pytest.mark.parametrize(
    "state, make, transition",
    [
        (
            abandoned,
            lambda s: helpers.receipt(OP, current_dispatch_id(s)),
            "ABANDONED->EFFECT_COMMITTED",
        ),
        (
            fresh,
            lambda s: helpers.receipt(OP, current_dispatch_id(s)),
            "NOT_ADMITTED->EFFECT_COMMITTED",
        ),
        (
            committed,
            lambda s: helpers.receipt(OP, current_dispatch_id(s), "AMBIGUOUS"),
            "EFFECT_COMMITTED->UNKNOWN_OUTCOME",
        ),
        # In the table, but not on this evidence: a disposition releases only
        # UNKNOWN_OUTCOME.
        (pending, lambda s: disposition("COMMITTED"), "EFFECT_PENDING->EFFECT_COMMITTED"),
        (fresh, lambda s: disposition("ABSENT"), "NOT_ADMITTED->ADMITTED"),
    ],
)
def test_a_forbidden_hop_is_refused_and_leaves_the_state(
    state: Callable[[], OperationState],
    make: Callable[[OperationState], Event],
    transition: str,
) -> None:
    before = state()
    d = decide(before, make(before), "in:0:1")
    assert d.outcome == "REFUSED" and d.state == before and d.hops == ()
    [out] = d.outputs
    assert out.event is not None and out.event.kind == "FORBIDDEN_TRANSITION"
    assert out.event.attempted_transition == transition


def test_the_journal_records_every_hop_of_a_compound_move() -> None:
    case, _ = CASES["readback absent after unknown"]
    before, event = case()
    d = decide(before, event, "readbacks:0:9")
    entry = journal_entry(d, event, event.to_bytes(), "readbacks", 0, 9)
    assert (entry.from_state, entry.to_state) == ("UNKNOWN_OUTCOME", "EFFECT_PENDING")
    assert entry.hops == ("UNKNOWN_OUTCOME->ADMITTED", "ADMITTED->EFFECT_PENDING")
    assert decode_event(entry.to_bytes()) == entry


def test_a_self_loop_or_refusal_is_journaled_with_no_hops() -> None:
    state = pending()
    for event in (helpers.claim(OP, "w2", state.version), helpers.claim(OP, "w3", 0)):
        d = decide(state, event, "claims:0:1")
        assert journal_entry(d, event, event.to_bytes(), "claims", 0, 1).hops == ()
