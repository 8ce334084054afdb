"""What a contract allows: the pure decisions of :mod:`ledger.contracts`, table-tested."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from ledger.contracts import (
    ACCOUNT_CREDITS,
    PAYMENT_GATEWAY,
    UNSAFE_SINK,
    EffectContract,
    PostconditionQuery,
    Recovery,
    RecoveryAction,
    after_ambiguous_send,
    fencing_token_for,
    judge_postcondition,
    key_retained,
    marks_attempt_alone,
    postcondition_request,
    readback_unsupported,
    sends_idempotency_key,
)
from ledger.errors import LedgerError

RETENTION_S = 60
FIRST_MS = 1_000_000
#: ``now_ms`` inside the key retention, and at or past its end.
INSIDE_MS = FIRST_MS + RETENTION_S * 1000 - 1
OUTSIDE_MS = FIRST_MS + RETENTION_S * 1000

HOLD_NEITHER = "the sink has neither readback nor idempotency"
HOLD_EXPIRED = (
    f"the sink's key retention ({RETENTION_S} s) has passed since the first attempt at "
    f"{FIRST_MS} ms"
)


def contract(*, idempotent: bool, readback: bool) -> EffectContract:
    return EffectContract(idempotent=idempotent, readback=readback, key_retention_s=RETENTION_S)


# (idempotent, readback, now_ms) -> (action, HOLD_UNKNOWN reason or None)
AFTER_AMBIGUOUS = [
    (False, False, INSIDE_MS, Recovery.HOLD_UNKNOWN, HOLD_NEITHER),
    (False, False, OUTSIDE_MS, Recovery.HOLD_UNKNOWN, HOLD_NEITHER),
    (True, False, INSIDE_MS, Recovery.RESUBMIT_SAME_KEY, None),
    (True, False, OUTSIDE_MS, Recovery.HOLD_UNKNOWN, HOLD_EXPIRED),
    (False, True, INSIDE_MS, Recovery.READ_BACK, None),
    (False, True, OUTSIDE_MS, Recovery.READ_BACK, None),
    (True, True, INSIDE_MS, Recovery.READ_BACK, None),
    (True, True, OUTSIDE_MS, Recovery.READ_BACK, None),
]


@pytest.mark.parametrize(("idempotent", "readback", "now_ms", "action", "reason"), AFTER_AMBIGUOUS)
def test_after_ambiguous_send(
    idempotent: bool, readback: bool, now_ms: int, action: Recovery, reason: str | None
) -> None:
    decision = after_ambiguous_send(
        contract(idempotent=idempotent, readback=readback), first_seen_ms=FIRST_MS, now_ms=now_ms
    )
    assert isinstance(decision, RecoveryAction)
    assert decision.action is action
    assert decision.reason  # every decision says why
    if reason is not None:
        assert decision.reason == reason


def test_readback_wins_over_a_retained_key_and_no_retention_means_no_key() -> None:
    assert (
        after_ambiguous_send(PAYMENT_GATEWAY, first_seen_ms=0, now_ms=0).action
        is Recovery.READ_BACK
    )
    assert after_ambiguous_send(UNSAFE_SINK, first_seen_ms=0, now_ms=0) == RecoveryAction(
        Recovery.HOLD_UNKNOWN, HOLD_NEITHER
    )
    no_retention = EffectContract(idempotent=True, key_retention_s=0)
    assert after_ambiguous_send(no_retention, first_seen_ms=5, now_ms=5) == RecoveryAction(
        Recovery.HOLD_UNKNOWN,
        "the sink's key retention (0 s) has passed since the first attempt at 5 ms",
    )


@pytest.mark.parametrize(
    ("idempotent", "now_ms", "retained"),
    [
        (True, FIRST_MS, True),
        (True, INSIDE_MS, True),
        (True, OUTSIDE_MS, False),
        (False, FIRST_MS, False),
        (False, INSIDE_MS, False),
    ],
)
def test_key_retained(idempotent: bool, now_ms: int, retained: bool) -> None:
    c = contract(idempotent=idempotent, readback=False)
    assert key_retained(c, first_seen_ms=FIRST_MS, now_ms=now_ms) is retained


@pytest.mark.parametrize(
    ("idempotent", "readback", "alone", "unsupported"),
    [
        (False, False, True, "the sink offers no readback"),
        (True, False, True, "the sink offers no readback"),
        (False, True, False, None),
        (True, True, False, None),
    ],
)
def test_readback_decides_marking_and_readback_requests(
    idempotent: bool, readback: bool, alone: bool, unsupported: str | None
) -> None:
    c = contract(idempotent=idempotent, readback=readback)
    assert marks_attempt_alone(c) is alone
    assert readback_unsupported(c) == unsupported


@pytest.mark.parametrize(
    ("idempotent", "fresh", "sends"),
    [(True, False, True), (True, True, False), (False, False, False), (False, True, False)],
)
def test_sends_idempotency_key(idempotent: bool, fresh: bool, sends: bool) -> None:
    c = EffectContract(idempotent=idempotent)
    assert sends_idempotency_key(c, fresh_attempt_identity=fresh) is sends


def test_fencing_token_only_for_a_fencing_sink() -> None:
    assert fencing_token_for(PAYMENT_GATEWAY, 7) == 7
    assert fencing_token_for(PAYMENT_GATEWAY.model_copy(update={"fencing": False}), 7) is None
    assert fencing_token_for(UNSAFE_SINK, 7) is None


# --- postcondition ---------------------------------------------------------------------------

OP = "refund:1842:v3"
PARAMS: dict[str, object] = {"account": "acct-1842", "amount_minor": 5000, "currency": "GBP"}
UNSUPPORTED = ("UNSUPPORTED", "the sink offers no postcondition query")


@dataclass(frozen=True)
class Credit:
    operation_id: str
    amount_minor: int


@dataclass(frozen=True)
class Credits:
    status: str
    credits: tuple[Credit, ...] = ()
    detail: str = ""


def observed(*credits: tuple[str, int]) -> Credits:
    return Credits("observed", tuple(Credit(op, amount) for op, amount in credits))


@pytest.mark.parametrize(
    ("raw", "query"),
    [
        (True, ACCOUNT_CREDITS),
        (False, None),
        ({}, ACCOUNT_CREDITS),
        ({"subject_field": "iban"}, PostconditionQuery(subject_field="iban")),
        (
            {"query": "account-credits", "subject_field": "iban", "amount_field": "cents"},
            PostconditionQuery(subject_field="iban", amount_field="cents"),
        ),
    ],
)
def test_postcondition_field_reads_old_and_new_forms(
    raw: bool | dict[str, str], query: PostconditionQuery | None
) -> None:
    c = EffectContract.model_validate({"postcondition": raw})
    assert c.postcondition_query() == query
    # the registry format round-trips unchanged: ``true`` stays ``true``
    assert EffectContract.model_validate_json(c.model_dump_json()) == c
    if isinstance(raw, bool):
        assert c.model_dump()["postcondition"] is raw


def test_postcondition_true_is_the_account_credit_query() -> None:
    assert PAYMENT_GATEWAY.postcondition is True
    assert PAYMENT_GATEWAY.postcondition_query() == PostconditionQuery(
        query="account-credits", subject_field="account", amount_field="amount_minor"
    )
    assert UNSAFE_SINK.postcondition_query() is None


@pytest.mark.parametrize(
    "raw",
    ["yes", 1, {"query": "balance"}, {"subject_field": ""}, {"subject": "account"}],
)
def test_postcondition_refuses_anything_else(raw: object) -> None:
    with pytest.raises(ValidationError):
        EffectContract.model_validate({"postcondition": raw})


@pytest.mark.parametrize(
    ("postcondition", "params", "subject", "offered"),
    [
        (True, PARAMS, "acct-1842", True),
        (True, {"amount_minor": 5000}, "", False),
        (True, {"account": ""}, "", False),
        (False, PARAMS, "acct-1842", False),  # still names the account for the report
        (False, {}, "", False),
        (PostconditionQuery(subject_field="iban"), {"iban": "GB00", "account": "x"}, "GB00", True),
        (PostconditionQuery(subject_field="iban"), PARAMS, "", False),
        (True, {"account": 1842}, "1842", True),
    ],
)
def test_postcondition_request(
    postcondition: bool | PostconditionQuery,
    params: dict[str, object],
    subject: str,
    offered: bool,
) -> None:
    request = postcondition_request(EffectContract(postcondition=postcondition), params)
    assert (request.subject, request.offered) == (subject, offered)
    assert request.query == (
        postcondition if isinstance(postcondition, PostconditionQuery) else ACCOUNT_CREDITS
    )


MATCH = ("MATCH", "account acct-1842 shows one credit of 5000 for the operation")

JUDGE = [
    # no query, or no subject: nothing is asked, whatever would have been seen
    (False, PARAMS, None, UNSUPPORTED),
    (False, PARAMS, observed((OP, 5000)), UNSUPPORTED),
    (True, {"amount_minor": 5000}, None, UNSUPPORTED),
    # the sink gave no observation
    (
        True,
        PARAMS,
        Credits("ambiguous", detail="ReadTimeout: timed out"),
        ("UNKNOWN", "ReadTimeout: timed out"),
    ),
    (True, PARAMS, Credits("ambiguous"), ("UNKNOWN", "ambiguous")),
    (
        True,
        PARAMS,
        Credits("unsupported", detail="postcondition_not_supported"),
        ("UNKNOWN", "postcondition_not_supported"),
    ),
    # observations
    (True, PARAMS, observed((OP, 5000)), MATCH),
    (True, PARAMS, observed(("refund:9:v1", 700), (OP, 5000), ("refund:8:v1", 5000)), MATCH),
    (
        True,
        PARAMS,
        observed(),
        (
            "MISMATCH",
            "account acct-1842 shows 0 credit(s) [] for the operation; expected one of 5000",
        ),
    ),
    (
        True,
        PARAMS,
        observed((OP, 5000), (OP, 5000)),
        (
            "MISMATCH",
            "account acct-1842 shows 2 credit(s) [5000, 5000] for the operation; "
            "expected one of 5000",
        ),
    ),
    (
        True,
        PARAMS,
        observed((OP, 500)),
        (
            "MISMATCH",
            "account acct-1842 shows 1 credit(s) [500] for the operation; expected one of 5000",
        ),
    ),
    (
        True,
        {"account": "acct-1842"},  # no amount: one credit of 0 is expected
        observed((OP, 0)),
        ("MATCH", "account acct-1842 shows one credit of 0 for the operation"),
    ),
    # a declared query names other parameter fields
    (
        PostconditionQuery(subject_field="iban", amount_field="cents"),
        {"iban": "GB00", "cents": 42, "account": "acct-1842", "amount_minor": 5000},
        observed((OP, 42)),
        ("MATCH", "account GB00 shows one credit of 42 for the operation"),
    ),
]


@pytest.mark.parametrize(("postcondition", "params", "observation", "judged"), JUDGE)
def test_judge_postcondition(
    postcondition: bool | PostconditionQuery,
    params: dict[str, object],
    observation: Credits | None,
    judged: tuple[str, str],
) -> None:
    c = EffectContract(postcondition=postcondition)
    assert judge_postcondition(c, params, observation, OP) == judged


def test_judge_postcondition_refuses_to_judge_an_offered_query_left_unasked() -> None:
    with pytest.raises(LedgerError) as err:
        judge_postcondition(PAYMENT_GATEWAY, PARAMS, None, OP)
    assert err.value.operation_id == OP
    assert "ask it and pass its observation" in err.value.message
