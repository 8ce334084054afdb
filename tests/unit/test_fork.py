"""Forks (issue 14 item 5): a new identity, no inherited admission, no claim over effects."""

from __future__ import annotations

import json

import pytest

from ledger.authority import REASON_CONSUMED, evaluate
from ledger.errors import LedgerError
from ledger.events import AdmissionRequest, Intent, OperationState
from ledger.fold import current_dispatch_id, decide
from ledger.states import RecoveryState as S
from producers.publisher import fork_intent
from tests import helpers

OP = "refund:c1:v1"
FORK = "refund:c1:v1-fork1"


def verified() -> OperationState:
    state = None
    i = helpers.intent()
    for n, event in enumerate([i, helpers.admission(i)]):
        state = decide(state, event, f"t:0:{n}").state
    assert state is not None
    state = decide(state, helpers.receipt(OP, current_dispatch_id(state)), "r:0:2").state
    assert state is not None and state.state == S.EFFECT_COMMITTED
    return state


def test_a_fork_is_a_new_operation_linked_to_the_original() -> None:
    original = verified()
    intent = fork_intent(original, FORK, existing={OP}, approval_id="ap-fork")
    assert intent.forked_from == OP and intent.operation_id == FORK
    assert json.loads(intent.params_json) == json.loads(original.params_json)
    d = decide(None, intent, "intents:0:9")
    assert d.state is not None and d.state.state == S.NOT_ADMITTED
    assert d.state.epoch == 0 and d.state.admitted_approval_id is None  # nothing inherited
    assert d.state.effect_id is None and d.state.dispatches == 0  # no claim over effects
    assert "a fork of refund:c1:v1" in d.state.reason
    (request,) = [o.event for o in d.outputs if isinstance(o.event, AdmissionRequest)]
    assert request.operation_id == FORK and request.approval_id == "ap-fork"


def test_a_fork_without_its_own_approval_waits_for_reauthorisation() -> None:
    intent = fork_intent(verified(), FORK, existing={OP})
    d = decide(None, intent, "intents:0:9")
    assert d.state is not None and d.state.state == S.NEEDS_REAUTHORISATION
    assert "inherits no admission" in d.state.reason


def test_the_originals_consumed_approval_cannot_admit_the_fork() -> None:
    intent = fork_intent(verified(), FORK, existing={OP}, approval_id="ap-1")
    original_use = evaluate(
        helpers.approval(),
        helpers.admission_request(op=OP),
        use=None,
        now_ms=1000,
        policy_version=1,
        decided_by="k",
    ).use
    assert original_use is not None
    request = helpers.admission_request(op=intent.operation_id)
    result = evaluate(
        helpers.approval(), request, use=original_use, now_ms=2000, policy_version=1, decided_by="k"
    )
    assert not result.decision.admitted and result.decision.reason == REASON_CONSUMED


@pytest.mark.parametrize("new_id", [OP, "refund:c2:v1"])
def test_a_fork_onto_an_existing_operation_is_refused(new_id: str) -> None:
    with pytest.raises(LedgerError, match="already exists"):
        fork_intent(verified(), new_id, existing={OP, "refund:c2:v1"})


def test_the_fold_refuses_a_fork_of_itself() -> None:
    i = helpers.intent()
    selfish = Intent.model_validate({**i.model_dump(), "forked_from": OP})
    d = decide(None, selfish, "intents:0:0")
    assert d.outcome == "REFUSED" and "fork of itself" in d.reason


def test_a_fork_may_change_parameters_and_decision_version() -> None:
    intent = fork_intent(
        verified(),
        FORK,
        params={"account": "acct-1", "amount_minor": 3000, "currency": "GBP"},
        decision_version=2,
    )
    assert intent.amount_minor == 3000 and intent.decision_version == 2
    assert decide(None, intent, "intents:0:0").outcome == "APPLIED"
