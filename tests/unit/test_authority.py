"""The authority kernel's pure decision: every check, consume-once."""

from __future__ import annotations

import pytest

from ledger.authority import (
    REASON_AMOUNT,
    REASON_CONSUMED,
    REASON_EXPIRED,
    REASON_NOT_FOUND,
    REASON_OPERATION,
    REASON_POLICY,
    REASON_REVOKED,
    REASON_SUBJECT,
    evaluate,
)
from ledger.events import AdmissionRequest
from tests import helpers


def request(
    op: str = "refund:c1:v1", amount: int = 5000, subject: str = "customer-1"
) -> AdmissionRequest:
    return AdmissionRequest(
        operation_id=op,
        approval_id="ap-1",
        parameter_digest="d",
        subject=subject,
        amount_minor=amount,
        state_version=1,
    )


def decide(approval, req, now_ms=1000, policy=1):
    return evaluate(approval, req, now_ms=now_ms, policy_version=policy, decided_by="k")


def test_current_approval_admits_and_is_consumed() -> None:
    result = decide(helpers.approval(), request())
    assert result.decision.admitted and result.decision.evaluated_at_ms == 1000
    assert result.approval is not None and result.approval.consumed_by == "refund:c1:v1"


def test_consumed_approval_cannot_admit_another_operation() -> None:
    consumed = decide(helpers.approval(), request()).approval
    other = decide(consumed, request(op="refund:c2:v1"))
    assert not other.decision.admitted and other.decision.reason == REASON_CONSUMED


def test_redelivered_request_of_the_consuming_operation_stays_admitted_after_expiry() -> None:
    consumed = decide(helpers.approval(), request()).approval
    again = decide(consumed, request(), now_ms=99_999)
    assert again.decision.admitted and again.approval is None


@pytest.mark.parametrize(
    "approval, req, now, policy, reason",
    [
        (None, request(), 1000, 1, REASON_NOT_FOUND),
        (
            helpers.approval().model_copy(update={"status": "REVOKED"}),
            request(),
            1000,
            1,
            REASON_REVOKED,
        ),
        (helpers.approval(expires_at_ms=10_000), request(), 10_000, 1, REASON_EXPIRED),
        (helpers.approval(policy=12), request(), 1000, 13, REASON_POLICY),
        (helpers.approval(), request(subject="someone-else"), 1000, 1, REASON_SUBJECT),
        (helpers.approval(max_amount=4999), request(), 1000, 1, REASON_AMOUNT),
        (helpers.approval(operation_id="refund:other:v1"), request(), 1000, 1, REASON_OPERATION),
    ],
)
def test_each_failed_check_names_itself(approval, req, now, policy, reason) -> None:
    result = decide(approval, req, now, policy)
    assert not result.decision.admitted
    assert result.decision.reason == reason
    assert result.approval is None


# --------------------------------------------------------------------- signatures and merging

from ledger.authority import merge_approval  # noqa: E402
from ledger.signing import ReviewerKey  # noqa: E402

KEY = ReviewerKey.generate("rev-key")
TRUSTED = {KEY.key_id: KEY.private.public_key()}


def test_signed_approval_admits_under_trusted_key() -> None:
    result = evaluate(
        KEY.sign(helpers.approval()),
        request(),
        now_ms=1,
        policy_version=1,
        decided_by="k",
        trusted=TRUSTED,
    )
    assert result.decision.admitted


@pytest.mark.parametrize(
    "approval, reason",
    [
        (helpers.approval(), "approval is not signed"),
        (ReviewerKey.generate("stranger").sign(helpers.approval()), "unknown key stranger"),
        (
            KEY.sign(helpers.approval()).model_copy(update={"scope_max_amount_minor": 10**9}),
            "approval signature is invalid",
        ),
    ],
    ids=["unsigned", "unknown-key", "tampered"],
)
def test_unsigned_forged_or_tampered_approvals_are_refused(approval, reason) -> None:
    result = evaluate(
        approval, request(), now_ms=1, policy_version=1, decided_by="k", trusted=TRUSTED
    )
    assert not result.decision.admitted and reason in result.decision.reason
    assert result.approval is None


def test_same_decision_twice_is_one_approval_and_never_unconsumes() -> None:
    grant = KEY.sign(helpers.approval())
    table = merge_approval(None, grant).approval
    again = merge_approval(table, grant)
    assert again.approval == grant and not again.reassert and again.note is None
    consumed = decide(table, request()).approval
    assert consumed is not None
    table = merge_approval(table, consumed).approval
    regrant = merge_approval(table, grant)
    assert regrant.approval.consumed_by == "refund:c1:v1"
    assert regrant.reassert  # so compaction keeps the consumed record as the latest
    other = KEY.sign(helpers.approval(max_amount=1))
    assert merge_approval(table, other).note is not None


def test_revocation_keeps_the_consumption_and_the_admitted_operation() -> None:
    grant = KEY.sign(helpers.approval())
    consumed = decide(grant, request()).approval
    assert consumed is not None
    revoked = merge_approval(
        consumed, grant.model_copy(update={"status": "REVOKED", "revoked_by": "boss"})
    ).approval
    assert revoked.status == "REVOKED" and revoked.consumed_by == "refund:c1:v1"
    assert decide(revoked, request()).decision.admitted  # redelivery of the admitted op
    refused = decide(
        merge_approval(grant, grant.model_copy(update={"status": "REVOKED"})).approval, request()
    )
    assert refused.decision.reason == REASON_REVOKED
