"""A compensation is of its original's effect, at most once: the fold's refusal, the audit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledger.audit import INVARIANTS, audit
from ledger.events import Intent, OperationState
from ledger.fold import (
    CompensationFacts,
    PriorCompensation,
    current_dispatch_id,
    decide,
    journal_entry,
    priors_of,
    replay,
)
from ledger.states import RecoveryState as S
from tests import helpers

ORIGINAL = "credit:c1:v1"
FIRST = "credit-reversal:c1:v1"
SECOND = "credit-reversal:c1:v2"
AMOUNT = 5000


def reversal(
    op: str = SECOND,
    amount: int = AMOUNT,
    subject: str = "customer-1",
    account: str = "acct-1",
) -> Intent:
    i = helpers.intent(op, amount=amount, subject=subject, sink="credits", account=account)
    return i.model_copy(update={"compensates": ORIGINAL})


def facts(
    *prior: PriorCompensation,
    total: int | None = AMOUNT,
    amount_field: str | None = "amount_minor",
    observed: bool = True,
) -> CompensationFacts:
    return CompensationFacts(
        original_state="OUTCOME_VERIFIED",
        original_sink="credits",
        consequence="reversible-internal",
        compensable=True,
        observed_scope=observed,
        original_subject="customer-1",
        original_account='"acct-1"',
        original_amount_minor=total,
        amount_field=amount_field,
        prior=prior,
    )


def settled(op: str = FIRST, amount: int | None = AMOUNT, state: str = "OUTCOME_VERIFIED"):  # type: ignore[no-untyped-def]
    return PriorCompensation(op, state, amount)


def decided(i: Intent, observed: CompensationFacts) -> OperationState:
    d = decide(None, i, "intents:0:0", compensation=observed)
    assert d.outcome == "APPLIED" and d.state is not None
    return d.state


def test_a_second_full_compensation_is_refused_naming_the_first() -> None:
    st_ = decided(reversal(), facts(settled()))
    assert st_.state == S.ABANDONED
    assert f"already compensated by {FIRST} (OUTCOME_VERIFIED, 5000)" in st_.reason
    assert decided(reversal(), facts()).state == S.NOT_ADMITTED  # the first one passes


def test_a_compensation_for_another_subject_or_account_is_refused() -> None:
    other = decided(reversal(subject="customer-2"), facts())
    assert other.state == S.ABANDONED and "subject customer-2" in other.reason
    assert "was for subject customer-1" in other.reason
    moved = decided(reversal(account="acct-9"), facts())
    assert moved.state == S.ABANDONED and 'account "acct-9"' in moved.reason


def test_partial_compensations_pass_within_the_original_and_the_one_beyond_is_refused() -> None:
    assert decided(reversal(amount=2000), facts(settled(amount=3000))).state == S.NOT_ADMITTED
    third = decided(
        reversal("credit-reversal:c1:v3", amount=1),
        facts(settled(amount=3000), settled(SECOND, amount=2000, state="EFFECT_PENDING")),
    )
    assert third.state == S.ABANDONED
    assert FIRST in third.reason and SECOND in third.reason
    assert "5000 of its 5000 minor units" in third.reason and "at most 0 remain" in third.reason


def test_one_compensation_larger_than_the_original_is_refused() -> None:
    st_ = decided(reversal(amount=AMOUNT + 1), facts())
    assert st_.state == S.ABANDONED and "more than the 5000" in st_.reason


def test_abandoned_siblings_free_their_amount_and_waiting_ones_keep_it() -> None:
    gone = settled(amount=AMOUNT, state="ABANDONED")
    assert decided(reversal(), facts(gone)).state == S.NOT_ADMITTED
    waiting = settled(amount=AMOUNT, state="NEEDS_REAUTHORISATION")
    assert decided(reversal(), facts(waiting)).state == S.ABANDONED


def test_an_original_without_an_amount_is_compensated_once() -> None:
    observed = facts(total=None, amount_field=None)
    assert decided(reversal(), observed).state == S.NOT_ADMITTED
    again = decided(reversal(), facts(settled(amount=None), total=None, amount_field=None))
    assert again.state == S.ABANDONED and "compensated once" in again.reason


def test_an_unreadable_amount_is_refused() -> None:
    st_ = decided(reversal(), facts(amount_field="amount_cents"))  # a field the params lack
    assert st_.state == S.ABANDONED and "not an amount in minor units" in st_.reason
    assert "amount_cents" in st_.reason


def test_facts_of_an_earlier_release_replay_as_it_decided() -> None:
    i = reversal()
    old = facts(settled(), observed=False)
    d = decide(None, i, "intents:0:0", compensation=old)
    assert d.state is not None and d.state.state == S.NOT_ADMITTED
    entry = journal_entry(d, i, i.to_bytes(), "intents", 0, 0, compensation=old)
    assert entry.compensation_facts is not None
    legacy = entry.model_copy(
        update={
            "compensation_facts": '{"compensable": true, "consequence": "reversible-internal", '
            '"original_sink": "credits", "original_state": "OUTCOME_VERIFIED"}'
        }
    )
    assert replay([legacy])[SECOND] == d.state


def test_replay_refuses_again_from_the_journaled_siblings() -> None:
    i = reversal()
    observed = facts(settled())
    d = decide(None, i, "intents:0:0", compensation=observed)
    entry = journal_entry(d, i, i.to_bytes(), "intents", 0, 0, compensation=observed)
    assert CompensationFacts.from_json(entry.compensation_facts) == observed
    assert replay([entry])[SECOND] == d.state and d.state is not None
    assert d.state.state == S.ABANDONED


@given(
    st.integers(min_value=0, max_value=10_000),
    st.lists(st.integers(min_value=0, max_value=6_000), max_size=8),
)
def test_compensations_decided_one_after_another_never_exceed_the_original(
    total: int, amounts: list[int]
) -> None:
    prior: list[PriorCompensation] = []
    for n, amount in enumerate(amounts):
        i = reversal(f"credit-reversal:c1:p{n}", amount=amount)
        st_ = decided(i, facts(*prior, total=total))
        claimed = sum(p.amount_minor or 0 for p in prior)
        if st_.state == S.NOT_ADMITTED:
            assert claimed + amount <= total
            prior.append(settled(i.operation_id, amount=amount))
        else:
            assert claimed + amount > total
            if amount > total:
                assert f"more than the {total}" in st_.reason
            else:
                assert prior[0].operation_id in st_.reason  # it names the first
    assert sum(p.amount_minor or 0 for p in prior) <= total


# ------------------------------------------------------------------------ audit


def _state(i: Intent, *, verified: bool = True, admitted_at: int = 1000) -> OperationState:
    st_ = decide(None, i, "intents:0:0", compensation=facts(observed=False)).state
    assert st_ is not None
    if not verified:
        return st_
    st_ = decide(st_, helpers.admission(i, at=admitted_at), "admissions:0:0").state
    assert st_ is not None
    st_ = decide(st_, helpers.receipt(i.operation_id, current_dispatch_id(st_)), "r:0:0").state
    assert st_ is not None and st_.state == S.EFFECT_COMMITTED
    return st_


def _bounds(*states: OperationState, fields: dict[str, str | None] | None = None):  # type: ignore[no-untyped-def]
    check = {"compensation-bounds": INVARIANTS["compensation-bounds"]}
    held = {s.operation_id: s for s in states}
    return audit([], held, {}, {}, invariants=check, amount_fields=fields).violations


def _original() -> OperationState:
    i = helpers.intent(ORIGINAL, amount=AMOUNT, sink="credits")
    return _state(i)


def test_the_audit_passes_compensations_within_the_original() -> None:
    a = _state(reversal(FIRST, amount=3000), admitted_at=1)
    b = _state(reversal(SECOND, amount=2000), admitted_at=2)
    refused = _state(reversal("credit-reversal:c1:v3"), verified=False)  # never admitted
    assert _bounds(_original(), a, b, refused) == []


def test_the_audit_flags_a_forged_over_compensation_naming_the_first() -> None:
    a = _state(reversal(FIRST), admitted_at=1)
    b = _state(reversal(SECOND, amount=1), admitted_at=2)
    [v] = _bounds(_original(), a, b)
    assert v.invariant == "compensation-bounds" and v.operation_id == SECOND
    assert f"{FIRST} (the first)" in v.evidence and "5001 minor units" in v.evidence


def test_the_audit_flags_a_compensation_of_another_subject_or_account() -> None:
    other = _state(reversal(FIRST, subject="customer-2"))
    [v] = _bounds(_original(), other)
    assert "for subject customer-2" in v.evidence and "customer-1" in v.evidence
    moved = _state(reversal(FIRST, account="acct-2"))
    [w] = _bounds(_original(), moved)
    assert 'on account "acct-2"' in w.evidence


def test_the_audit_reads_amounts_where_the_contract_says() -> None:
    a = _state(reversal(FIRST), admitted_at=1)
    b = _state(reversal(SECOND), admitted_at=2)
    [v] = _bounds(_original(), a, b, fields={"credits": None})
    assert v.operation_id == SECOND and "compensated once" in v.evidence


def test_priors_of_reads_each_siblings_amount() -> None:
    a = _state(reversal(FIRST, amount=1200))
    plain = _original()
    assert priors_of(ORIGINAL, [plain, a], {"credits": "amount_minor"}) == (
        PriorCompensation(FIRST, "EFFECT_COMMITTED", 1200),
    )
    assert priors_of(ORIGINAL, [a], {"credits": None})[0].amount_minor is None
