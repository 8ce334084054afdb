"""The pure delivery decision (:mod:`ledger.delivery`): its branches, and three properties
over every contract, situation and sequence of sink answers hypothesis draws:

* no mutating request (submit, reserve, confirm) follows an observed effect;
* no resubmit without a readback once the key retention has passed (or when
  the sink has readback at all);
* every ambiguity ends held or observed, never dropped, never a rejection.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.contracts import EffectContract, key_retained
from ledger.delivery import (
    MUTATING,
    Decision,
    Observation,
    Observed,
    Receipt,
    Send,
    Situation,
    next_step,
)

#: What a sink may answer to each request (the adapters' vocabulary).
ANSWERS: dict[str, tuple[str, ...]] = {
    "submit": ("committed", "rejected", "stale_token", "key_reused", "unavailable", "ambiguous"),
    "readback": ("committed", "absent", "stale_token", "ambiguous"),
    "reserve": ("held", "confirmed", "released", "rejected", "stale_token", "ambiguous"),
    "read_hold": ("held", "confirmed", "released", "absent", "ambiguous"),
    "confirm": ("confirmed", "released", "absent", "ambiguous"),
    "cancel": ("released", "confirmed", "absent", "ambiguous"),
}
EFFECT_SEEN = {"committed", "confirmed"}
HELD = {"AMBIGUOUS", "UNKNOWN"}


def _situation(fresh: bool = True, **kw: object) -> Situation:
    base: dict[str, object] = {
        "kind": "EXECUTE",
        "mode": "ledger",
        "fresh": fresh,
        "first_attempt_ms": 0,
        "now_ms": 1_000,
        "sink": "payments",
    }
    base.update(kw)
    return Situation(**base)  # type: ignore[arg-type]


@dataclass
class Episode:
    """One run of the relay's loop against a scripted sink."""

    sends: list[Send]
    history: list[Observed]
    decisions: list[Decision]

    @property
    def records(self) -> list[Receipt | Observation]:
        return [r for d in self.decisions for r in d.records]


def _play(
    contract: EffectContract, situation: Situation, answers: list[tuple[str, bool]]
) -> Episode:
    """Drive :func:`next_step` as the relay does; the sink answers from ``answers`` in turn."""
    history: list[Observed] = []
    sends: list[Send] = []
    decisions: list[Decision] = []
    script = iter(answers)
    for _ in range(20):
        decision = next_step(contract, situation, history)
        decisions.append(decision)
        if decision.send is None:
            break
        sends.append(decision.send)
        pick, sent = next(script, ("ambiguous", True))
        vocabulary = ANSWERS[decision.send.request]
        status = pick if pick in vocabulary else vocabulary[len(pick) % len(vocabulary)]
        history.append(
            Observed(
                decision.send.request,
                status,
                sent=sent,
                effect_id="e-1" if status in EFFECT_SEEN else None,
                resubmit=decision.send.resubmit,
            )
        )
    else:
        raise AssertionError(f"no end after 20 steps: {[s.request for s in sends]}")
    return Episode(sends, history, decisions)


contracts = st.builds(
    EffectContract,
    idempotent=st.booleans(),
    readback=st.booleans(),
    fencing=st.booleans(),
    key_retention_s=st.sampled_from([0, 60, 86_400]),
    reservation=st.booleans(),
)
situations = st.builds(
    _situation,
    fresh=st.booleans(),
    readback_on_resume=st.sampled_from([None, None, True, False]),
    first_attempt_ms=st.sampled_from([0, 500]),
    now_ms=st.sampled_from([1_000, 61_000, 90_000_000]),
    admission_withdrawn=st.sampled_from([None, None, "revoked"]),
)
scripts = st.lists(
    st.tuples(
        st.sampled_from(sorted({a for v in ANSWERS.values() for a in v})),
        st.booleans(),
    ),
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(contracts, situations, scripts)
def test_no_mutating_request_follows_an_observed_effect(
    contract: EffectContract, situation: Situation, script: list[tuple[str, bool]]
) -> None:
    ep = _play(contract, situation, script)
    seen = False
    for send, answer in zip(ep.sends, ep.history, strict=False):
        assert not (seen and send.request in MUTATING), (ep.sends, ep.history)
        seen = seen or (answer.sent and answer.status in EFFECT_SEEN)


@settings(max_examples=400, deadline=None)
@given(contracts, situations, scripts)
def test_no_resubmit_without_a_readback_past_the_key_retention(
    contract: EffectContract, situation: Situation, script: list[tuple[str, bool]]
) -> None:
    ep = _play(contract, situation, script)
    for send in ep.sends:
        if send.request == "submit" and send.resubmit:
            assert not contract.readback, "a sink with readback is read back, never resubmitted"
            assert key_retained(
                contract, first_seen_ms=situation.first_attempt_ms, now_ms=situation.now_ms
            ), (contract, situation)


@settings(max_examples=400, deadline=None)
@given(contracts, situations, scripts)
def test_every_ambiguity_ends_held_or_observed(
    contract: EffectContract, situation: Situation, script: list[tuple[str, bool]]
) -> None:
    ep = _play(contract, situation, script)
    last = ep.decisions[-1]
    assert last.records or last.not_reached is not None, "an episode ended with nothing"
    if last.not_reached is not None or not ep.history:
        return
    final = ep.history[-1]
    ended = last.records[-1]
    if final.sent and final.status == "ambiguous":
        # No later definite answer: the end is held, never a rejection or "absent".
        assert ended.status in HELD, (ep.history, ended)
    if ended.status in ("REJECTED", "ABSENT"):
        assert final.status in ("rejected", "absent"), (ep.history, ended)


def test_a_fresh_submit_then_a_lost_answer_is_read_back_not_resent() -> None:
    gateway = EffectContract(idempotent=True, readback=True, key_retention_s=60)
    ep = _play(gateway, _situation(), [("ambiguous", True), ("committed", True)])
    assert [s.request for s in ep.sends] == ["submit", "readback"]
    assert [(type(r).__name__, r.status) for r in ep.records] == [("Observation", "COMMITTED")]


def test_an_idempotent_sink_without_readback_is_resubmitted_within_retention_only() -> None:
    keyed = EffectContract(idempotent=True, key_retention_s=60)
    within = _play(keyed, _situation(now_ms=30_000), [("ambiguous", True), ("committed", True)])
    assert [(s.request, s.resubmit) for s in within.sends] == [
        ("submit", False),
        ("submit", True),
    ]
    assert within.records[-1].status == "COMMITTED" and within.records[-1].on_resume
    past = _play(keyed, _situation(now_ms=61_000), [("ambiguous", True)])
    assert [s.request for s in past.sends] == ["submit"]
    assert past.records[-1].status == "AMBIGUOUS" and "retention" in past.records[-1].detail


def test_a_resumed_dispatch_is_never_sent_blindly() -> None:
    mail = EffectContract()  # no readback, no idempotency
    ep = _play(mail, _situation(fresh=False), [])
    assert ep.sends == [] and ep.records[-1].status == "AMBIGUOUS"
    assert ep.records[-1].on_resume


def test_a_request_that_never_left_is_parked_not_recorded() -> None:
    ep = _play(EffectContract(), _situation(), [("unavailable", False)])
    assert ep.decisions[-1].not_reached is not None and ep.records == []


def test_a_withdrawn_admission_cancels_the_hold_instead_of_confirming() -> None:
    booking = EffectContract(reservation=True)
    ep = _play(
        booking,
        _situation(admission_withdrawn="approval revoked"),
        [("held", True), ("released", True)],
    )
    assert [s.request for s in ep.sends] == ["reserve", "cancel"]
    assert ep.records[-1].reservation == "CANCELLED" and "revoked" in ep.records[-1].detail


def test_checkpoint_only_sends_a_fresh_identity_and_believes_the_answer() -> None:
    ep = _play(
        EffectContract(readback=True), _situation(mode="checkpoint-only"), [("ambiguous", True)]
    )
    assert ep.sends == [Send("submit", fresh_identity=True)]
    assert ep.records[-1].status == "AMBIGUOUS" and ep.records[-1].fresh_identity


def test_a_held_send_keeps_the_adapters_account_of_why_it_is_ambiguous() -> None:
    # An operator must tell a deadline set too short from a faulty network.
    mail = EffectContract()  # no readback, no idempotency: the send is held
    why = "the message was sent but the deadline of 0.5 s passed before the server answered"
    decision = next_step(mail, _situation(), [Observed("submit", "ambiguous", detail=why)])
    (receipt,) = decision.records
    assert receipt.status == "AMBIGUOUS" and decision.done
    assert why in receipt.detail and "neither readback nor idempotency" in receipt.detail
