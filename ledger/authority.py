"""The authority kernel's decision, as a pure function.

An approval admits one exact operation once: at decision time it must exist,
be neither revoked nor expired, have been granted under the current policy
version, cover the operation's subject and amount (and the operation itself
when bound to one), and not have been consumed by another operation. The
decision records its evaluation time, so replay needs no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.events import AdmissionDecision, AdmissionRequest, Approval

REASON_ADMITTED = "admitted"
REASON_NOT_FOUND = "approval not found"
REASON_REVOKED = "approval was revoked"
REASON_CONSUMED = "approval was consumed by another operation"
REASON_EXPIRED = "approval has expired"
REASON_POLICY = "policy version changed"
REASON_SUBJECT = "approval does not cover this subject"
REASON_AMOUNT = "amount exceeds approval scope"
REASON_OPERATION = "approval is bound to another operation"


@dataclass(frozen=True)
class Admission:
    """Result of :func:`evaluate`.

    Attributes:
        decision: the admission decision to publish (key: operation ID).
        approval: the approval's new record (consumed by this operation) to
            publish on its own partition, or ``None`` when unchanged.
    """

    decision: AdmissionDecision
    approval: Approval | None


def evaluate(
    approval: Approval | None,
    request: AdmissionRequest,
    *,
    now_ms: int,
    policy_version: int,
    decided_by: str,
) -> Admission:
    """Decide whether ``request`` may be admitted under ``approval`` at ``now_ms``.

    Args:
        approval: the approval's current record, or ``None`` if unknown.
        request: the admission request (one exact operation and digest).
        now_ms: ledger time of the decision (milliseconds).
        policy_version: policy version in force at ``now_ms``.
        decided_by: kernel instance name, recorded in the decision.

    Returns:
        The decision and, when admitted for the first time, the consumed
        approval. An operation that already consumed this approval is admitted
        again (redelivery), even after expiry: admission happened while the
        approval was current.
    """

    def result(admitted: bool, reason: str, new: Approval | None = None) -> Admission:
        return Admission(
            AdmissionDecision(
                operation_id=request.operation_id,
                approval_id=request.approval_id,
                parameter_digest=request.parameter_digest,
                admitted=admitted,
                reason=reason,
                evaluated_at_ms=now_ms,
                policy_version=policy_version,
                approval_policy_version=approval.policy_version if approval else None,
                approval_expires_at_ms=approval.expires_at_ms if approval else None,
                reviewer=approval.reviewer if approval else None,
                decided_by=decided_by,
            ),
            new,
        )

    if approval is None:
        return result(False, REASON_NOT_FOUND)
    if approval.status == "CONSUMED" and approval.consumed_by == request.operation_id:
        return result(True, REASON_ADMITTED)
    if approval.status == "REVOKED":
        return result(False, REASON_REVOKED)
    if approval.status == "CONSUMED":
        return result(False, REASON_CONSUMED)
    if now_ms >= approval.expires_at_ms:
        return result(False, REASON_EXPIRED)
    if approval.policy_version != policy_version:
        return result(False, REASON_POLICY)
    if approval.scope_subject != request.subject:
        return result(False, REASON_SUBJECT)
    if request.amount_minor > approval.scope_max_amount_minor:
        return result(False, REASON_AMOUNT)
    if approval.scope_operation_id is not None and approval.scope_operation_id != (
        request.operation_id
    ):
        return result(False, REASON_OPERATION)
    consumed = approval.model_copy(
        update={
            "status": "CONSUMED",
            "consumed_by": request.operation_id,
            "consumed_at_ms": now_ms,
        }
    )
    return result(True, REASON_ADMITTED, consumed)
