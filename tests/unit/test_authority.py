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
    merge_approval,
)
from ledger.events import AdmissionRequest
from tests import helpers


def request(
    op: str = "refund:c1:v1", amount: int = 5000, subject: str = "customer-1"
) -> AdmissionRequest:
    return helpers.admission_request(op=op, amount=amount, subject=subject)


def decide(approval, req, now_ms=1000, policy=1, use=None):
    return evaluate(approval, req, use=use, now_ms=now_ms, policy_version=policy, decided_by="k")


def test_current_approval_admits_and_is_consumed() -> None:
    result = decide(helpers.approval(), request())
    assert result.decision.admitted and result.decision.evaluated_at_ms == 1000
    assert result.use is not None and result.use.operation_id == "refund:c1:v1"
    assert (result.use.approval_id, result.use.consumed_at_ms) == ("ap-1", 1000)


def test_consumed_approval_cannot_admit_another_operation() -> None:
    use = decide(helpers.approval(), request()).use
    other = decide(helpers.approval(), request(op="refund:c2:v1"), use=use)
    assert not other.decision.admitted and other.decision.reason == REASON_CONSUMED


def test_a_grant_republished_after_its_use_does_not_erase_the_use() -> None:
    """The grant's record carries no consumption: the use alone decides (s09)."""
    grant = helpers.approval()
    use = decide(grant, request()).use
    again = merge_approval(grant, grant).approval  # the review system re-sends it
    other = decide(again, request(op="refund:c2:v1"), use=use)
    assert other.decision.reason == REASON_CONSUMED


def test_a_consumed_record_on_the_approvals_topic_refuses_but_never_admits() -> None:
    """Earlier releases (or a forger) wrote CONSUMED records on approvals."""
    legacy = helpers.approval().model_copy(
        update={"status": "CONSUMED", "consumed_by": "refund:c1:v1"}
    )
    for op in ("refund:c1:v1", "refund:c2:v1"):
        result = decide(legacy, request(op=op))
        assert not result.decision.admitted and result.decision.reason == REASON_CONSUMED


def test_a_use_naming_an_operation_never_carries_it_outside_the_scope() -> None:
    """A use record (forged, or for another digest) cannot admit beyond the approval."""
    use = decide(helpers.approval(max_amount=5000), request()).use
    assert use is not None
    over = decide(helpers.approval(max_amount=5000), request(amount=999_999), use=use)
    assert over.decision.reason.startswith(REASON_AMOUNT)
    elsewhere = decide(helpers.approval(), request(subject="someone-else"), use=use)
    assert elsewhere.decision.reason == REASON_SUBJECT
    drifted = AdmissionRequest(**{**request().model_dump(), "parameter_digest": "other"})
    assert decide(helpers.approval(), drifted, use=use).decision.reason == REASON_CONSUMED


def test_the_consuming_operation_asking_again_is_admitted_only_while_the_approval_stands() -> None:
    """Not refused as consumed, and no second use; but expiry and policy apply again.

    The use does not say which request consumed the approval, so an operation
    steered back to its own approval after it lapsed (intents are unsealed)
    must not be readmitted; a true redelivery finds the operation past
    admission and its decision is ignored by the processor.
    """
    use = decide(helpers.approval(), request()).use
    assert use is not None
    again = decide(helpers.approval(), request(), use=use)
    assert again.decision.admitted and again.use is None
    expired = decide(helpers.approval(), request(), now_ms=99_999, use=use)
    assert not expired.decision.admitted and expired.decision.reason == REASON_EXPIRED
    assert expired.use is None
    changed = decide(helpers.approval(), request(), use=use, policy=2)
    assert not changed.decision.admitted and changed.decision.reason == REASON_POLICY


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
        (
            helpers.approval(max_amount=4999),
            request(),
            1000,
            1,
            f"{REASON_AMOUNT}: amount_minor 5000, approved up to 4999",
        ),
        (helpers.approval(operation_id="refund:other:v1"), request(), 1000, 1, REASON_OPERATION),
    ],
)
def test_each_failed_check_names_itself(approval, req, now, policy, reason) -> None:
    result = decide(approval, req, now, policy)
    assert not result.decision.admitted
    assert result.decision.reason == reason
    assert result.use is None


# --------------------------------------------------------------------- signatures and merging

from ledger.signing import ReviewerKey  # noqa: E402

KEY = ReviewerKey.generate("rev-key")
TRUSTED = {KEY.key_id: KEY.private.public_key()}


def test_signed_approval_admits_under_trusted_key() -> None:
    result = evaluate(
        KEY.sign(helpers.approval(), ledger_id="ledger"),
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
        (
            ReviewerKey.generate("stranger").sign(helpers.approval(), ledger_id="ledger"),
            "unknown key stranger",
        ),
        (
            KEY.sign(helpers.approval(), ledger_id="ledger").model_copy(
                update={"scope_max_amount_minor": 10**9}
            ),
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
    assert result.use is None


def test_same_decision_twice_is_one_approval_and_a_grant_never_unrevokes() -> None:
    grant = KEY.sign(helpers.approval(), ledger_id="ledger")
    table = merge_approval(None, grant).approval
    again = merge_approval(table, grant)
    assert again.approval == grant and again.note is None
    revoked = merge_approval(table, grant.model_copy(update={"status": "REVOKED"})).approval
    assert merge_approval(revoked, grant).approval.status == "REVOKED"
    other = KEY.sign(helpers.approval(max_amount=1), ledger_id="ledger")
    assert merge_approval(table, other).note is not None


def test_a_revoked_approval_admits_nothing_more() -> None:
    grant = KEY.sign(helpers.approval(), ledger_id="ledger")
    use = decide(grant, request()).use
    revoked = merge_approval(
        grant, grant.model_copy(update={"status": "REVOKED", "revoked_by": "boss"})
    ).approval
    assert revoked.status == "REVOKED"
    # The consuming operation asking again after the revocation is refused too.
    assert decide(revoked, request(), use=use).decision.reason == REASON_REVOKED
    refused = decide(revoked, request())
    assert refused.decision.reason == REASON_REVOKED
