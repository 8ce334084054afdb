"""The original's tally decides every compensation's claim on its effect (ledger.fold.tally).

Two compensations of one original, each decided where nothing showed the
other (the processor's observation of ``ledger.state`` came back empty),
reach the original's tally in either order: at most the original's amount
is granted, the one refused is abandoned with a reason naming the first,
a compensation abandoned without effect returns its share, and asking again
is answered the same.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledger.events import (
    CompensationTally,
    Disposition,
    Event,
    Intent,
    JournalEntry,
    OperationState,
)
from ledger.fold import CompensationFacts, Decision, decide, journal_entry, replay
from ledger.fold.tally import grants_of
from ledger.states import RecoveryState as S
from tests import helpers

ORIGINAL = "credit:t1:v1"
FIRST = "credit-reversal:t1:v1"
SECOND = "credit-reversal:t1:v2"
AMOUNT = 5000


def reversal(op: str, amount: int = AMOUNT, approval: str | None = "ap-r") -> Intent:
    i = helpers.intent(op, amount=amount, sink="credits", approval=approval)
    return i.model_copy(update={"compensates": ORIGINAL})


def observed(*, tally: bool = True) -> CompensationFacts:
    """The original settled, and no other compensation of it seen."""
    return CompensationFacts(
        original_state="OUTCOME_VERIFIED",
        original_sink="credits",
        consequence="reversible-internal",
        compensable=True,
        observed_scope=True,
        original_subject="customer-1",
        original_account='"acct-1"',
        original_amount_minor=AMOUNT,
        amount_field="amount_minor",
        tally=tally,
    )


class Ledger:
    """The fold's states and journal, one input at a time, as the processors decide."""

    def __init__(self) -> None:
        self.states: dict[str, OperationState] = {}
        self.entries: list[JournalEntry] = []
        self.offset = 0
        i = helpers.intent(ORIGINAL, amount=AMOUNT, sink="credits")
        for event in (i, helpers.admission(i), helpers.receipt(ORIGINAL, f"{ORIGINAL}#1.1")):
            self.feed(event)
        assert self.states[ORIGINAL].state == S.EFFECT_COMMITTED  # settled

    def feed(self, event: Event, facts: CompensationFacts | None = None) -> Decision:
        key = event.operation_id  # type: ignore[attr-defined]
        topic = "compensation-tally" if isinstance(event, CompensationTally) else "in"
        self.offset += 1
        d = decide(self.states.get(key), event, f"{topic}:0:{self.offset}", compensation=facts)
        entry = journal_entry(d, event, event.to_bytes(), topic, 0, self.offset, compensation=facts)
        self.entries.append(entry)
        if d.outcome == "APPLIED" and d.state is not None:
            self.states[key] = d.state
        return d

    def tally_facts(self) -> CompensationFacts:
        return observed()  # the original's amount, as its owner observes it

    def at_original(self, request: CompensationTally) -> CompensationTally:
        d = self.feed(request, self.tally_facts())
        (verdict,) = tallies(d)
        return verdict


def tallies(d: Decision) -> list[CompensationTally]:
    return [o.event for o in d.outputs if isinstance(o.event, CompensationTally)]


def ask(ledger: Ledger, i: Intent) -> CompensationTally:
    d = ledger.feed(i, observed())
    assert d.state is not None and d.state.state == S.NOT_ADMITTED, d.reason
    assert d.state.tally == "REQUESTED"
    assert not [o for o in d.outputs if o.topic == "admission-requests"], "no approval is used"
    (request,) = tallies(d)
    return request


def test_a_compensation_that_passes_waits_for_the_tally_of_its_original() -> None:
    ledger = Ledger()
    request = ask(ledger, reversal(FIRST, 2000))
    assert (request.kind, request.operation_id, request.compensation) == (
        "REQUEST",
        ORIGINAL,
        FIRST,
    )
    assert (request.subject, request.account, request.amount_minor) == (
        "customer-1",
        '"acct-1"',
        2000,
    )
    assert "waiting for the original's tally" in ledger.states[FIRST].reason
    verdict = ledger.at_original(request)
    assert (verdict.kind, verdict.operation_id) == ("GRANTED", FIRST)
    d = ledger.feed(verdict)
    assert d.state is not None and d.state.tally == "GRANTED" and d.state.state == S.NOT_ADMITTED
    (admission,) = [o.event for o in d.outputs if o.topic == "admission-requests"]
    assert admission.state_version == d.state.entered_version == 1  # the episode it answers
    admitted = ledger.feed(helpers.admission(reversal(FIRST, 2000)))
    assert admitted.to_state == S.EFFECT_PENDING


@given(
    a=st.integers(min_value=0, max_value=AMOUNT),
    b=st.integers(min_value=0, max_value=AMOUNT),
    swapped=st.booleans(),
)
def test_two_compensations_unseen_by_each_other_are_granted_at_most_the_effect(
    a: int, b: int, swapped: bool
) -> None:
    ledger = Ledger()
    requests = {FIRST: ask(ledger, reversal(FIRST, a)), SECOND: ask(ledger, reversal(SECOND, b))}
    order = [SECOND, FIRST] if swapped else [FIRST, SECOND]
    verdicts = {op: ledger.at_original(requests[op]) for op in order}
    first, second = order
    amounts = {FIRST: a, SECOND: b}
    granted = [op for op in order if verdicts[op].kind == "GRANTED"]
    assert verdicts[first].kind == "GRANTED"
    assert sum(amounts[op] for op in granted) <= AMOUNT
    assert (verdicts[second].kind == "GRANTED") == (a + b <= AMOUNT)
    assert grants_of(ledger.states[ORIGINAL]) == tuple((op, amounts[op]) for op in granted)
    for op in order:
        d = ledger.feed(verdicts[op])
        assert d.state is not None
        if op in granted:
            assert d.state.state == S.NOT_ADMITTED and d.state.tally == "GRANTED"
            assert [o.topic for o in d.outputs] == ["admission-requests"]
        else:
            assert d.state.state == S.ABANDONED and d.state.tally == "REFUSED"
            assert f"already compensated by {first} (granted, {amounts[first]})" in d.state.reason
            assert not d.outputs
    assert replay(ledger.entries) == ledger.states


def test_asking_again_is_answered_the_same_and_counted_once() -> None:
    ledger = Ledger()
    request = ask(ledger, reversal(FIRST))
    assert ledger.at_original(request).kind == "GRANTED"
    before = ledger.states[ORIGINAL]
    again = ledger.feed(request, ledger.tally_facts())
    assert again.outcome == "NOOP" and [v.kind for v in tallies(again)] == ["GRANTED"]
    assert ledger.states[ORIGINAL] == before
    assert grants_of(before) == ((FIRST, AMOUNT),)
    other = ledger.at_original(ask(ledger, reversal(SECOND, 1)))
    assert other.kind == "REFUSED" and f"{AMOUNT} of its {AMOUNT} minor units" in other.reason


def test_a_granted_compensation_abandoned_without_effect_returns_its_share() -> None:
    ledger = Ledger()
    ledger.feed(ledger.at_original(ask(ledger, reversal(FIRST))))
    ledger.feed(helpers.admission(reversal(FIRST)))
    rejected = ledger.feed(helpers.receipt(FIRST, f"{FIRST}#1.1", "REJECTED"))
    assert rejected.state is not None and rejected.state.state == S.ABANDONED
    assert rejected.state.tally == "RELEASED"
    (release,) = tallies(rejected)
    assert (release.kind, release.operation_id, release.compensation) == (
        "RELEASE",
        ORIGINAL,
        FIRST,
    )
    returned = ledger.feed(release)
    assert returned.outcome == "APPLIED" and grants_of(ledger.states[ORIGINAL]) == ()
    assert ledger.feed(release).outcome == "NOOP"  # a release read twice returns nothing more
    assert ledger.at_original(ask(ledger, reversal(SECOND))).kind == "GRANTED"
    assert replay(ledger.entries) == ledger.states


def test_a_refused_request_is_abandoned_and_nothing_is_released() -> None:
    ledger = Ledger()
    ledger.feed(ledger.at_original(ask(ledger, reversal(FIRST))))
    d = ledger.feed(ledger.at_original(ask(ledger, reversal(SECOND))))
    assert d.state is not None and d.state.state == S.ABANDONED
    assert not tallies(d)
    assert grants_of(ledger.states[ORIGINAL]) == ((FIRST, AMOUNT),)


def test_a_verdict_only_answers_the_waiting_episode() -> None:
    ledger = Ledger()
    verdict = ledger.at_original(ask(ledger, reversal(FIRST)))
    stale = verdict.model_copy(update={"request_state_version": 7})
    refused = ledger.feed(stale)
    assert refused.outcome == "REFUSED" and "REPLAYED" in str(refused.outputs[0].event)
    assert ledger.feed(verdict).outcome == "APPLIED"
    assert ledger.feed(verdict).outcome == "NOOP"  # no longer waiting: a copy changes nothing


def test_without_an_approval_a_granted_compensation_asks_for_one() -> None:
    ledger = Ledger()
    d = ledger.feed(ledger.at_original(ask(ledger, reversal(FIRST, approval=None))))
    assert d.state is not None and d.state.state == S.NEEDS_REAUTHORISATION
    assert d.hops == ((S.NOT_ADMITTED, S.NEEDS_REAUTHORISATION),)


def test_the_tally_checks_subject_and_account_against_the_original_itself() -> None:
    ledger = Ledger()
    request = ask(ledger, reversal(FIRST))
    moved = request.model_copy(update={"account": '"acct-9"'})
    assert ledger.at_original(moved).kind == "REFUSED"
    other = request.model_copy(update={"subject": "customer-2"})
    verdict = ledger.at_original(other)
    assert verdict.kind == "REFUSED" and "subject customer-2" in verdict.reason
    assert grants_of(ledger.states[ORIGINAL]) == ()


def test_an_unknown_original_refuses_without_a_state() -> None:
    ledger = Ledger()
    request = ask(ledger, reversal(FIRST))
    d = decide(None, request, "compensation-tally:0:9", compensation=None)
    assert d.state is None and d.outcome == "NOOP"
    assert [v.kind for v in tallies(d)] == ["REFUSED"] and "not known" in d.reason


def test_facts_journaled_before_the_tally_ask_for_admission_at_once() -> None:
    i = reversal(FIRST)
    legacy = observed(tally=False)
    d = decide(None, i, "intents:0:0", compensation=legacy)
    assert d.state is not None and d.state.tally is None
    assert [o.topic for o in d.outputs] == ["admission-requests"]
    entry = journal_entry(d, i, i.to_bytes(), "intents", 0, 0, compensation=legacy)
    text = entry.compensation_facts or ""
    assert '"tally": false' in text
    old = entry.model_copy(update={"compensation_facts": text.replace(', "tally": false', "")})
    assert CompensationFacts.from_json(old.compensation_facts) == legacy
    assert replay([old])[FIRST] == d.state


def test_a_compensation_abandoned_not_knowing_whether_it_acted_keeps_its_share() -> None:
    ledger = Ledger()
    ledger.feed(ledger.at_original(ask(ledger, reversal(FIRST))))
    ledger.feed(helpers.admission(reversal(FIRST)))
    unknown = ledger.feed(helpers.receipt(FIRST, f"{FIRST}#1.1", "AMBIGUOUS"))
    assert unknown.state is not None and unknown.state.state == S.UNKNOWN_OUTCOME
    abandon = Disposition(
        disposition_id="d-1",
        operation_id=FIRST,
        decision="ABANDON",
        by="operator-3",
        evidence="gateway cannot say",
        disposed_at_ms=9000,
        episode=unknown.state.entered_version,
    )
    d = ledger.feed(abandon)
    assert d.state is not None and d.state.state == S.ABANDONED and d.state.tally == "GRANTED"
    assert not tallies(d)
    assert grants_of(ledger.states[ORIGINAL]) == ((FIRST, AMOUNT),)
    assert ledger.at_original(ask(ledger, reversal(SECOND))).kind == "REFUSED"
