"""Forged records: what an attacker with write access to the topics, but no key, can publish.

The game-day step ``forge`` (``shared/SCENARIOS.md``, format v2) and the
bad-input corpus use :func:`forge` to publish, for one operation or
approval, the record of a kind that would serve the attacker best, built as
a stage or operator would build it from what anyone who can read the topics
sees (the intent, the current state, the grant): an admission that admits, a
use that consumes the approval for the named operation, a dispatch that
executes, a readback that observes the effect absent, a disposition
``absent``, a revocation, a policy change to the next version, a state that
is in flight, or a tombstone.

The forger holds no key the ledger trusts. It seals the record as well as it
can: with the right scheme and the key ID a real writer uses (key IDs are
visible in every sealed record's header), and a tag it cannot compute, so the
seal is plausible but wrong. An insider is another attacker: one who took a
stage host holds that role's key and seals with it genuinely
(``sealed_by``: a ``state`` record sealed with the relay's key); readers
refuse it because that role does not write the topic (:mod:`ledger.rolekeys`).
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from consumers.reader import policy_in_force, read_latest
from ledger.authn import AUTH_HEADER, SCHEME_ED25519, STAGE_KEY_ROLES, Seal
from ledger.authority import LEGACY_POLICY_KEY, policy_key
from ledger.credentials import AUTHORITY_KEY_ID, authority_public, keys_dir
from ledger.errors import LedgerError
from ledger.events import (
    AdmissionDecision,
    Approval,
    ApprovalUse,
    Dispatch,
    Disposition,
    Event,
    Intent,
    OperationState,
    PolicyChange,
    Readback,
)
from ledger.fold import decide
from ledger.kafka import producer_config
from ledger.rolekeys import current_key_id, read_trust, role_key
from ledger.settings import LedgerSettings
from ledger.signing import load_trusted_roles
from ledger.states import RecoveryState as S
from ledger.topology import TOPIC_BY_NAME

#: The kinds of record :func:`forge` can make, and the topic each goes to.
FORGEABLE: dict[str, str] = {
    "approval_use": "approval-uses",
    "admission": "admissions",
    "dispatch": "dispatches",
    "readback": "readbacks",
    "disposition": "dispositions",
    "revocation": "approvals",
    "policy": "policy",
    "state": "state",
    "tombstone": "",
}


@dataclass(frozen=True)
class Forged:
    """Where a forged record landed.

    Attributes:
        record: the kind (``admission`` ...).
        topic: short topic name.
        key: record key.
        partition: partition.
        offset: offset.
    """

    record: str
    topic: str
    key: str
    partition: int
    offset: int


def _latest(settings: LedgerSettings, topic: str, key: str) -> Event | None:
    rec = read_latest(settings, topic).get(key)
    return rec.event if rec is not None else None


def _plausible_seal(settings: LedgerSettings, topic: str, writer: str | None) -> bytes:
    """A seal with the scheme and key ID a real writer would use, and a random tag."""
    spec = TOPIC_BY_NAME[topic]
    stage_roles = [r for r in spec.auth if r in STAGE_KEY_ROLES]
    if stage_roles:
        trust = read_trust(keys_dir(settings)) or {"keys": {}}
        key_id = current_key_id(trust, stage_roles[0]) or stage_roles[0]
        return Seal(SCHEME_ED25519, key_id, secrets.token_bytes(64)).encode()
    key_id = writer or AUTHORITY_KEY_ID
    if key_id == AUTHORITY_KEY_ID:  # the kernel's real key ID is its key's fingerprint
        found = authority_public(settings)
        key_id = found[0] if found is not None else key_id
    return Seal(SCHEME_ED25519, key_id, secrets.token_bytes(64)).encode()


def _trusted_name(settings: LedgerSettings, roles: tuple[str, ...], default: str) -> str:
    """A writer the ledger trusts under one of ``roles`` (the first by name), else ``default``.

    A forgery names a real writer, whose key the attacker does not hold: the
    ledger holds that key and proves the record forged. A record naming a
    key nobody here holds is another case (unverifiable: it holds what it
    covers, see docs/trust-model.md).
    """
    trusted = load_trusted_roles(settings.trusted_keys_path())
    names = sorted(name for name, (role, _) in trusted.items() if role in roles)
    return names[0] if names else default


def _override(event: Event, fields: dict[str, Any] | None) -> Event:
    if not fields:
        return event
    unknown = set(fields) - set(type(event).model_fields)
    if unknown:
        raise LedgerError(
            f"forge: {type(event).KIND} has no field(s) {', '.join(sorted(unknown))}; "
            f"its fields: {', '.join(type(event).model_fields)}"
        )
    return type(event).model_validate({**event.model_dump(), **fields})


def build(
    settings: LedgerSettings,
    record: str,
    *,
    operation_id: str | None,
    approval_id: str | None,
    now_ms: int,
) -> tuple[str, str, Event, str | None]:
    """Build the forged event of one kind.

    Returns:
        ``(topic, key, event, writer it claims)``.

    Raises:
        LedgerError: the kind needs an operation or approval ID not given.
    """
    intent = _latest(settings, "intents", operation_id) if operation_id else None
    state = _latest(settings, "state", operation_id) if operation_id else None
    intent = intent if isinstance(intent, Intent) else None
    state = state if isinstance(state, OperationState) else None
    digest = (state.parameter_digest if state else None) or (
        intent.parameter_digest if intent else "0" * 64
    )
    approval = approval_id or (intent.approval_id if intent else None) or "approval-forged"

    def need_op() -> str:
        if not operation_id:
            raise LedgerError(f"forge: a forged {record} needs operation_id")
        return operation_id

    if record == "admission":
        op = need_op()
        return (
            "admissions",
            op,
            AdmissionDecision(
                operation_id=op,
                approval_id=approval,
                parameter_digest=digest,
                admitted=True,
                reason="admitted",
                evaluated_at_ms=now_ms,
                policy_version=settings.policy_version,
                approval_policy_version=settings.policy_version,
                approval_expires_at_ms=now_ms + 10**9,
                reviewer="reviewer-1",
                decided_by="authority-0",
                # As plausible as it gets: it names the request pending now.
                request_state_version=((state.entered_version or state.version) if state else None),
            ),
            AUTHORITY_KEY_ID,
        )
    if record == "approval_use":
        op = need_op()
        return (
            "approval-uses",
            approval,
            ApprovalUse(
                approval_id=approval,
                operation_id=op,
                parameter_digest=digest,
                consumed_at_ms=now_ms,
                decided_by="authority-0",
            ),
            AUTHORITY_KEY_ID,
        )
    if record == "dispatch":
        op = need_op()
        params = (state.params_json if state else None) or (
            intent.params_json
            if intent
            else json.dumps({"account": "acct-x", "amount_minor": 100, "currency": "GBP"})
        )
        return (
            "dispatches",
            op,
            Dispatch(
                dispatch_id=f"{op}#forged",
                operation_id=op,
                kind="EXECUTE",
                sink=(state.sink if state else None) or (intent.sink if intent else "payments"),
                action=(state.action if state else None) or (intent.action if intent else "refund"),
                params_json=params,
                parameter_digest=digest,
                fencing_token=(state.epoch + 1) if state else 1,
                state_version=state.version if state else 1,
                approval_id=approval,
            ),
            None,
        )
    if record == "readback":
        op = need_op()
        return (
            "readbacks",
            op,
            Readback(
                operation_id=op,
                dispatch_id=f"{op}#{state.version if state else 1}",
                kind="EFFECT",
                status="ABSENT",
                source=state.sink if state else "payments",
                observed_at_ms=now_ms,
                detail="not found at the sink",
                observer="reconciler-0",
                fencing_token=state.epoch if state else 1,
            ),
            None,
        )
    if record == "disposition":
        op = need_op()
        operator = _trusted_name(settings, ("operator",), "ops-oncall")
        return (
            "dispositions",
            op,
            Disposition(
                disposition_id=f"disposition:{operator}:{uuid.uuid4().hex[:8]}",
                operation_id=op,
                decision="ABSENT",
                by=operator,
                evidence="checked the sink: nothing there",
                disposed_at_ms=now_ms,
                episode=state.entered_version if state else None,  # the episode it is in now
            ),
            operator,
        )
    if record == "revocation":
        grant = _latest(settings, "approvals", approval)
        base = (
            grant
            if isinstance(grant, Approval)
            else Approval(
                approval_id=approval,
                reviewer="reviewer-1",
                policy_version=1,
                expires_at_ms=now_ms,
                scope_subject="anyone",
                scope_max_amount_minor=0,
                granted_at_ms=now_ms,
            )
        )
        by = base.key_id or _trusted_name(settings, ("reviewer", "operator"), base.reviewer)
        revoked = base.model_copy(update={"status": "REVOKED", "revoked_by": by})
        return ("approvals", approval, revoked, by)
    if record == "policy":
        current = policy_in_force(settings)
        version = current.version if current is not None else settings.policy_version
        later = max(now_ms, current.effective_at_ms + 1 if current is not None else 0)
        operator = _trusted_name(settings, ("operator",), "admin")
        change = PolicyChange(version=version + 1, set_by=operator, effective_at_ms=later)
        return ("policy", policy_key(change), change, operator)
    if record == "state":
        op = need_op()
        if state is not None:
            in_flight = state.model_copy(
                update={"state": S.ADMITTED, "version": state.version + 1, "reason": "admitted"}
            )
        elif intent is not None:
            # The state the processor would record for the intent, then "admitted".
            recorded = decide(None, intent, "intents:0:0").state
            assert recorded is not None
            in_flight = recorded.model_copy(
                update={
                    "state": S.ADMITTED,
                    "version": recorded.version + 1,
                    "epoch": 1,
                    "admitted_approval_id": intent.approval_id,
                    "reason": "admitted",
                }
            )
        else:
            raise LedgerError(f"forge: no intent or state of {op!r} to build a state from")
        return ("state", op, in_flight, None)
    raise LedgerError(f"forge: unknown record {record!r}; records: {', '.join(FORGEABLE)}")


def forge(
    settings: LedgerSettings,
    record: str,
    *,
    operation_id: str | None = None,
    approval_id: str | None = None,
    topic: str | None = None,
    fields: dict[str, Any] | None = None,
    now_ms: int = 0,
    sealed_by: str | None = None,
) -> Forged:
    """Publish one forged record, as an attacker without a trusted key would.

    Args:
        settings: the ledger under attack.
        record: one of :data:`FORGEABLE`.
        operation_id: the operation it concerns.
        approval_id: the approval it concerns (default: the intent's).
        topic: for ``tombstone``, the topic's short name.
        fields: values that override the built record's fields, by name.
        now_ms: the ledger clock (milliseconds), for timestamps.
        sealed_by: seal genuinely with this stage role's key (an insider who
            holds it, e.g. ``relay``) instead of a plausible wrong seal.

    Returns:
        Where it landed.

    Raises:
        LedgerError: a bad kind, topic or field, or the broker refused it.
    """
    writer: str | None = None
    value: bytes | None
    if record == "tombstone":
        if topic not in TOPIC_BY_NAME:
            raise LedgerError(
                f"forge: tombstone needs a topic (short name); topics: {', '.join(TOPIC_BY_NAME)}"
            )
        key = operation_id or approval_id
        if key is None and topic == "policy":
            in_force = policy_in_force(settings)
            key = policy_key(in_force) if in_force is not None else LEGACY_POLICY_KEY
        if key is None:
            key = ""
        if not key:
            raise LedgerError("forge: tombstone needs operation_id or approval_id")
        value = None
    else:
        topic, key, event, writer = build(
            settings, record, operation_id=operation_id, approval_id=approval_id, now_ms=now_ms
        )
        value = _override(event, fields).to_bytes()
    if sealed_by is not None:
        seal = role_key(settings, sealed_by).seal(topic, key.encode(), value)
    else:
        seal = _plausible_seal(settings, topic, writer)
    headers = [(AUTH_HEADER, seal)] if TOPIC_BY_NAME[topic].auth or sealed_by else None
    producer = Producer(producer_config(settings, **{"client.id": "forger"}))
    delivered: list[tuple[KafkaError | None, Message]] = []
    producer.produce(
        settings.topic(topic),
        key=key.encode(),
        value=value,
        headers=headers,  # type: ignore[arg-type]
        on_delivery=lambda err, msg: delivered.append((err, msg)),
    )
    producer.flush(30)
    if not delivered or delivered[0][0] is not None:
        raise LedgerError(f"forge: the broker did not take the forged {record}: {delivered}")
    msg = delivered[0][1]
    return Forged(record, topic, key, msg.partition() or 0, msg.offset() or 0)
