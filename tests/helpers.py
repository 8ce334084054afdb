"""Builders of events for tests (pure, no Kafka)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ledger.events import (
    AdmissionDecision,
    AdmissionRequest,
    Approval,
    Claim,
    EffectReceipt,
    Intent,
    OperationState,
    Readback,
)
from ledger.identity import amount_of, canonical_json, parameter_digest
from ledger.states import RecoveryState

#: The checkout: the folder that holds ``pyproject.toml``.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def intent(
    op: str = "refund:c1:v1",
    amount: int = 5000,
    approval: str | None = "ap-1",
    subject: str = "customer-1",
    sink: str = "payments",
    digest_version: int = 2,
    **params: Any,
) -> Intent:
    p = {"account": "acct-1", "amount_minor": amount, "currency": "GBP", **params}
    return Intent(
        operation_id=op,
        sink=sink,
        action="refund",
        params_json=canonical_json(p),
        actor="svc",
        subject=subject,
        purpose="fee-remediation",
        decision_version=1,
        approval_id=approval,
        amount_minor=amount_of(p),
        parameter_digest=parameter_digest(
            action="refund",
            params=p,
            subject=subject,
            purpose="fee-remediation",
            decision_version=1,
            sink=sink,
            version=digest_version,
        ),
        published_at_ms=0,
    )


def approval(
    approval_id: str = "ap-1",
    expires_at_ms: int = 10_000,
    subject: str = "customer-1",
    max_amount: int = 5000,
    policy: int = 1,
    operation_id: str | None = None,
    **scope: str | None,
) -> Approval:
    """An unsigned grant; ``scope`` sets optional scope fields by name (``scope_currency=...``)."""
    return Approval(
        approval_id=approval_id,
        reviewer="rev",
        policy_version=policy,
        expires_at_ms=expires_at_ms,
        scope_subject=subject,
        scope_max_amount_minor=max_amount,
        scope_operation_id=operation_id,
        granted_at_ms=0,
        **scope,  # type: ignore[arg-type]
    )


def admission_request(
    op: str = "refund:c1:v1",
    amount: int = 5000,
    subject: str = "customer-1",
    approval_id: str = "ap-1",
    **params: Any,
) -> AdmissionRequest:
    """The request the processor writes for :func:`intent`'s operation (params overridable)."""
    i = intent(op, amount, approval_id, subject, **params)
    return AdmissionRequest(
        operation_id=op,
        approval_id=approval_id,
        parameter_digest=i.parameter_digest,
        subject=subject,
        amount_minor=i.amount_minor,
        state_version=1,
        sink=i.sink,
        action=i.action,
        purpose=i.purpose,
        params_json=i.params_json,
    )


def admission(
    i: Intent,
    admitted: bool = True,
    reason: str = "admitted",
    at: int = 1000,
    request: int | None = 1,
) -> AdmissionDecision:
    """The kernel's decision on ``i``'s admission request of state version ``request``
    (1: the request written when the intent created the operation)."""
    return AdmissionDecision(
        operation_id=i.operation_id,
        approval_id=i.approval_id or "",
        parameter_digest=i.parameter_digest,
        admitted=admitted,
        reason=reason,
        evaluated_at_ms=at,
        policy_version=1,
        approval_policy_version=1,
        approval_expires_at_ms=10_000,
        reviewer="rev",
        decided_by="authority-0",
        request_state_version=request,
    )


def state(
    op: str = "refund:1:v1",
    state: RecoveryState = RecoveryState.EFFECT_PENDING,
    *,
    version: int = 3,
    reason: str = "",
) -> OperationState:
    """An operation's state record: a refund of 100 minor units at epoch 1."""
    return OperationState(
        operation_id=op,
        state=state,
        version=version,
        epoch=1,
        parameter_digest="0" * 64,
        sink="payments",
        action="refund",
        params_json="{}",
        actor="svc",
        subject="customer-1",
        purpose="remediation",
        decision_version=1,
        amount_minor=100,
        reason=reason,
    )


def receipt(
    op: str, dispatch_id: str, status: str = "COMMITTED", on_resume: bool = False
) -> EffectReceipt:
    return EffectReceipt(
        operation_id=op,
        dispatch_id=dispatch_id,
        status=status,  # type: ignore[arg-type]
        sink="payments",
        attempt_id=dispatch_id,
        fencing_token=1,
        effect_id="payments-1" if status == "COMMITTED" else None,
        observed_at_ms=2000,
        first_attempt_at_ms=1500,
        detail=status.lower(),
        on_resume=on_resume,
        observer="relay-0",
    )


def readback(
    op: str,
    dispatch_id: str,
    status: str = "COMMITTED",
    kind: str = "EFFECT",
    on_resume: bool = False,
) -> Readback:
    return Readback(
        operation_id=op,
        dispatch_id=dispatch_id,
        kind=kind,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        source="payments GET",
        effect_id="payments-1" if status == "COMMITTED" else None,
        observed_at_ms=3000,
        detail="",
        on_resume=on_resume,
        observer="relay-0",
        fencing_token=1,
    )


def keyed(settings: Any) -> Any:
    """``settings``, with its ledger's keys provisioned in its keys folder (as the testbed does).

    Stages never create keys; a test that builds one provisions them first.
    """
    from ledger.credentials import provision_keys

    provision_keys(settings)
    return settings


def claim(op: str, worker: str, version: int) -> Claim:
    return Claim(claim_id=f"c-{worker}", operation_id=op, worker=worker, expected_version=version)


def replay(settings: Any, topic: str, msg: Any) -> tuple[int, int]:
    """Append a message again as it was read (key, value, headers, partition), as an
    attacker copying an authentic record would; returns where it landed (partition, offset)."""
    from confluent_kafka import Producer

    from ledger.kafka import producer_config

    landed: list[tuple[int, int]] = []
    producer = Producer(producer_config(settings))
    producer.produce(
        settings.topic(topic),
        key=msg.key(),
        value=msg.value(),
        headers=msg.headers(),
        partition=msg.partition() or 0,
        on_delivery=lambda err, out: landed.append((out.partition() or 0, out.offset() or 0)),
    )
    assert producer.flush(30) == 0
    return landed[0]


def stage_seal(settings: Any, topic: str, key: str, value: bytes | None) -> list[Any]:
    """Headers sealing a hand-made record as its writer would (the topic's writer role's key).

    Tests that write internal records by hand (an insider's corruption, a
    takeover's open transaction) seal them so readers accept them; records
    left unsealed are refused as UNAUTHENTICATED.
    """
    from ledger.authn import seal_headers
    from ledger.credentials import provision_keys, stage_sealer
    from ledger.topology import TOPIC_BY_NAME

    provision_keys(settings)
    writer = TOPIC_BY_NAME[topic].auth[0]
    sealer = stage_sealer(settings, "processor" if writer == "outcome" else writer)
    return seal_headers(sealer(topic), topic, key.encode(), value) or []
