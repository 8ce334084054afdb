"""An approval binds what the reviewer approved: every scope field, the amount where
the sink's contract says it is, and a signature over all of it (issue 11, item 4)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastavro import parse_schema, schemaless_writer

from ledger.authority import (
    REASON_ADMITTED,
    REASON_AMOUNT,
    REASON_LEGACY_REQUEST,
    SCOPE_FIELDS,
    SHOWN_CHARS,
    Admission,
    evaluate,
    merge_approval,
)
from ledger.contracts import EffectContract
from ledger.events import AdmissionRequest, Approval, decode_event
from ledger.fold import decide
from ledger.identity import canonical_json
from ledger.serde import MARKER, SCHEMA_DIR, registry
from ledger.signing import OPTIONAL_SIGNED_FIELDS, ReviewerKey, signed_body, verify
from tests import helpers

KEY = ReviewerKey.generate("rev-key")
TRUSTED = {KEY.key_id: KEY.private.public_key()}


def decide_admission(
    approval: Approval, req: AdmissionRequest, amount_field: str | None = "amount_minor"
) -> Admission:
    return evaluate(
        approval,
        req,
        now_ms=1000,
        policy_version=1,
        decided_by="k",
        trusted=TRUSTED,
        amount_field=amount_field,
    )


def with_params(req: AdmissionRequest, params: dict[str, Any]) -> AdmissionRequest:
    return req.model_copy(update={"params_json": canonical_json(params)})


# The request's values (helpers.admission_request): action refund, sink payments,
# params currency GBP and account acct-1, purpose fee-remediation.
REQ = helpers.admission_request()
#: scope field -> (the operation's own value, another value)
SCOPE = {
    "scope_action": ("refund", "payout"),
    "scope_sink": ("payments", "payments-eu"),
    "scope_currency": ("GBP", "EUR"),
    "scope_account": ("acct-1", "acct-2"),
    "scope_purpose": ("fee-remediation", "goodwill"),
    "scope_parameter_digest": (REQ.parameter_digest, "f" * 64),
}


@pytest.mark.parametrize("field", SCOPE)
def test_a_scope_field_equal_to_the_operations_value_admits(field: str) -> None:
    mine, _ = SCOPE[field]
    result = decide_admission(KEY.sign(helpers.approval(**{field: mine}), ledger_id="ledger"), REQ)
    assert result.decision.admitted and result.decision.reason == REASON_ADMITTED
    assert result.use is not None


@pytest.mark.parametrize("field", SCOPE)
def test_a_scope_field_that_differs_refuses_naming_the_field_and_both_values(field: str) -> None:
    mine, other = SCOPE[field]
    result = decide_admission(KEY.sign(helpers.approval(**{field: other}), ledger_id="ledger"), REQ)
    name = field.removeprefix("scope_")
    assert not result.decision.admitted and result.use is None
    assert result.decision.reason == f"out of scope: {name} {mine}, approved {other}"


@pytest.mark.parametrize("field", SCOPE)
def test_a_scope_field_left_unset_puts_no_constraint(field: str) -> None:
    """An approval without the field admits an operation with any value there."""
    _, other = SCOPE[field]
    req = {
        "scope_action": REQ.model_copy(update={"action": other}),
        "scope_sink": REQ.model_copy(update={"sink": other}),
        "scope_currency": with_params(REQ, {"amount_minor": 5000, "currency": other}),
        "scope_account": with_params(REQ, {"amount_minor": 5000, "account": other}),
        "scope_purpose": REQ.model_copy(update={"purpose": other}),
        "scope_parameter_digest": REQ.model_copy(update={"parameter_digest": other}),
    }[field]
    assert decide_admission(KEY.sign(helpers.approval(), ledger_id="ledger"), req).decision.admitted


def test_the_public_case_5000_gbp_does_not_admit_5000_eur() -> None:
    gbp = KEY.sign(helpers.approval(scope_currency="GBP"), ledger_id="ledger")
    eur = helpers.admission_request(currency="EUR")
    assert decide_admission(gbp, eur).decision.reason == "out of scope: currency EUR, approved GBP"


@pytest.mark.parametrize(
    "params, shown",
    [
        ({"amount_minor": 5000}, "(absent)"),
        ({"amount_minor": 5000, "currency": None}, "null (not a string)"),
        ({"amount_minor": 5000, "currency": ["GBP"]}, '["GBP"] (not a string)'),
        ({"amount_minor": 5000, "currency": "gbp"}, "gbp"),
        ({"amount_minor": 5000, "currency": "GBP "}, '"GBP "'),
        ({"amount_minor": 5000, "currency": "X" * 100}, "X" * (SHOWN_CHARS - 3) + "..."),
    ],
)
def test_a_params_scope_field_refuses_a_missing_or_odd_value(
    params: dict[str, Any], shown: str
) -> None:
    gbp = KEY.sign(helpers.approval(scope_currency="GBP"), ledger_id="ledger")
    reason = decide_admission(gbp, with_params(REQ, params)).decision.reason
    assert reason == f"out of scope: currency {shown}, approved GBP"


def test_an_integer_account_is_not_the_approved_account_string() -> None:
    approval = KEY.sign(helpers.approval(scope_account="1842"), ledger_id="ledger")
    result = decide_admission(approval, helpers.admission_request(account=1842))
    assert not result.decision.admitted
    assert result.decision.reason == "out of scope: account 1842 (not a string), approved 1842"


def test_every_scope_field_is_checked_for_a_redelivery_too() -> None:
    """A use (forged or not) never carries an operation outside the scope."""
    approval = KEY.sign(helpers.approval(scope_currency="GBP"), ledger_id="ledger")
    use = decide_admission(approval, REQ).use
    assert use is not None
    eur = with_params(REQ, {"amount_minor": 5000, "currency": "EUR", "account": "acct-1"})
    result = evaluate(
        approval, eur, use=use, now_ms=1000, policy_version=1, decided_by="k", trusted=TRUSTED
    )
    assert not result.decision.admitted and "currency EUR" in result.decision.reason


# --------------------------------------------------------------------- the amount


def test_the_amount_is_read_from_the_field_the_contract_names() -> None:
    cents = EffectContract(amount_field="amount_cents")
    approval = KEY.sign(helpers.approval(max_amount=5000), ledger_id="ledger")
    within = with_params(REQ, {"amount_cents": 5000, "amount_minor": 999_999})
    over = with_params(REQ, {"amount_cents": 5001, "amount_minor": 1})
    assert decide_admission(approval, within, cents.amount_field).decision.admitted
    reason = decide_admission(approval, over, cents.amount_field).decision.reason
    assert reason == f"{REASON_AMOUNT}: amount_cents 5001, approved up to 5000"


def test_a_cap_of_one_never_admits_an_amount_under_another_field_name() -> None:
    """The instance the issue measured: ``"amount": 999999999`` under a cap of 1."""
    approval = KEY.sign(helpers.approval(max_amount=1), ledger_id="ledger")
    req = with_params(REQ, {"account": "acct-1", "amount": 999_999_999, "currency": "GBP"})
    result = decide_admission(approval, req)
    assert not result.decision.admitted and result.use is None
    assert "amount_minor" in result.decision.reason and "lack" in result.decision.reason


@pytest.mark.parametrize("amount", ["5000", 5000.0, True, -1, None, {"minor": 5}])
def test_an_amount_that_is_not_a_non_negative_integer_is_refused(amount: object) -> None:
    req = with_params(REQ, {"amount_minor": amount})
    result = decide_admission(KEY.sign(helpers.approval(), ledger_id="ledger"), req)
    assert not result.decision.admitted and result.use is None
    assert result.decision.reason.startswith("parameter amount_minor is ")


def test_a_sink_without_a_registered_contract_is_refused_before_consumption() -> None:
    result = evaluate(
        KEY.sign(helpers.approval(), ledger_id="ledger"),
        REQ,
        now_ms=1000,
        policy_version=1,
        decided_by="k",
        trusted=TRUSTED,
        sink_registered=False,
    )
    assert not result.decision.admitted and result.use is None
    assert "sink payments is not registered" in result.decision.reason


def test_a_sink_whose_effects_carry_no_amount_has_no_cap_to_check() -> None:
    """A notification sink declares ``amount_field: null``: an email has no amount."""
    mailer = EffectContract(amount_field=None)
    assert EffectContract.model_validate_json(mailer.model_dump_json()) == mailer
    email = with_params(REQ, {"to": "customer-1", "template": "refund-confirmation"})
    result = decide_admission(
        KEY.sign(helpers.approval(max_amount=0), ledger_id="ledger"), email, mailer.amount_field
    )
    assert result.decision.admitted


@pytest.mark.parametrize("missing", ["sink", "action", "purpose", "params_json"])
def test_a_request_without_the_operation_is_refused(missing: str) -> None:
    """Requests of earlier releases carry no params: fail closed, never guess."""
    req = REQ.model_copy(update={missing: None})
    result = decide_admission(KEY.sign(helpers.approval(), ledger_id="ledger"), req)
    assert (result.decision.admitted, result.decision.reason) == (False, REASON_LEGACY_REQUEST)


@pytest.mark.parametrize("raw", ["[1, 2]", "not json", '"text"'])
def test_parameters_that_are_not_an_object_are_refused(raw: str) -> None:
    result = decide_admission(
        KEY.sign(helpers.approval(), ledger_id="ledger"),
        REQ.model_copy(update={"params_json": raw}),
    )
    assert not result.decision.admitted and "not a JSON object" in result.decision.reason


def test_the_processor_sends_the_operation_with_its_admission_request() -> None:
    intent = helpers.intent(currency="EUR")
    (out,) = decide(None, intent, "intents:0:0").outputs
    req = out.event
    assert isinstance(req, AdmissionRequest)
    assert (req.sink, req.action, req.purpose, req.params_json) == (
        intent.sink,
        intent.action,
        intent.purpose,
        intent.params_json,
    )
    # and it survives the wire
    assert decode_event(req.to_bytes()) == req


# --------------------------------------------------------------------- signatures


def test_the_kernel_checks_what_the_reviewer_signs() -> None:
    assert {field for field, _, _ in SCOPE_FIELDS} == set(OPTIONAL_SIGNED_FIELDS) == set(SCOPE)


def test_the_signature_covers_every_scope_field_that_is_set() -> None:
    for field, (mine, other) in SCOPE.items():
        signed = KEY.sign(helpers.approval(**{field: mine}), ledger_id="ledger")
        assert verify(signed, TRUSTED, "ledger") is None
        for tampered in (other, None):
            forged = signed.model_copy(update={field: tampered})
            problem = verify(forged, TRUSTED, "ledger") or ""
            assert problem.startswith("approval signature is invalid"), field
    unscoped = KEY.sign(helpers.approval(), ledger_id="ledger")
    added = unscoped.model_copy(update={"scope_currency": "GBP"})
    assert (verify(added, TRUSTED, "ledger") or "").startswith("approval signature is invalid")
    # The signature covers the ledger too: the same grant is refused by another ledger.
    assert (verify(unscoped, TRUSTED, "other") or "").startswith("approval signature is invalid")


def _v1_body(a: dict[str, Any]) -> bytes:
    """The body a reviewer signed before the optional scope fields existed (version 1)."""
    names = [
        "approval_id",
        "expires_at_ms",
        "granted_at_ms",
        "key_id",
        "policy_version",
        "reviewer",
        "scope_max_amount_minor",
        "scope_operation_id",
        "scope_subject",
    ]
    return json.dumps({n: a[n] for n in names}, sort_keys=True, separators=(",", ":")).encode()


def test_an_approval_signed_before_grants_named_their_ledger_decodes_and_admits_nothing() -> None:
    """Written with Approval v1 and signed over v1's body (no ledger): it still decodes,
    but a signature that names no ledger could be any ledger's, so it is refused."""
    private = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    trusted = {"old-key": private.public_key()}
    v1 = json.loads((SCHEMA_DIR / "history" / "approval.v1.avsc").read_text())
    grant: dict[str, Any] = {
        "approval_id": "ap-old",
        "reviewer": "alice",
        "policy_version": 1,
        "expires_at_ms": 3_600_000,
        "scope_subject": "customer-1842",
        "scope_max_amount_minor": 5000,
        "scope_operation_id": None,
        "status": "GRANTED",
        "consumed_by": None,
        "consumed_at_ms": None,
        "revoked_by": None,
        "granted_at_ms": 0,
        "key_id": "old-key",
    }
    grant["signature"] = private.sign(_v1_body(grant))
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(v1), grant)
    v1_fp = next(s.fingerprint for s in registry().by_fingerprint.values() if s.raw == v1)
    approval = decode_event(MARKER + v1_fp + buf.getvalue())
    assert isinstance(approval, Approval) and approval.scope_currency is None
    assert signed_body(approval, "ledger") != _v1_body(grant)
    assert (verify(approval, trusted, "ledger") or "").startswith("approval signature is invalid")
    req = helpers.admission_request(subject="customer-1842")
    result = evaluate(approval, req, now_ms=1, policy_version=1, decided_by="k", trusted=trusted)
    assert not result.decision.admitted


def test_a_grant_resent_with_another_scope_is_another_decision() -> None:
    grant = KEY.sign(helpers.approval(scope_currency="GBP"), ledger_id="ledger")
    table = merge_approval(None, grant).approval
    assert merge_approval(table, grant).note is None
    other = KEY.sign(helpers.approval(scope_currency="EUR"), ledger_id="ledger")
    merged = merge_approval(table, other)
    assert merged.approval == grant and merged.note is not None
