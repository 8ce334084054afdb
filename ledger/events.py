"""Ledger events as frozen pydantic models, one per Avro schema in ``schemas/``.

Field names and types mirror the ``.avsc`` files exactly (a test checks it).
Times are milliseconds on the ledger clock (``*_ms``); money is in minor
currency units (``*_minor``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_serializer

from ledger.errors import DecodeError
from ledger.serde import registry
from ledger.states import RecoveryState


class Event(BaseModel):
    """Base of every ledger event: frozen, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=True)
    KIND: ClassVar[str] = ""

    def to_bytes(self) -> bytes:
        """Single-object-encode this event (see :mod:`ledger.serde`)."""
        return registry().encode(self.KIND, self.model_dump())


class Intent(Event):
    """A service's request for one consequential operation (key: operation ID).

    ``forked_from`` (schema version 2) names the operation this one is a
    deliberate fork of (``ledger fork``): the fork is a new operation with its
    own ID, approval, admission and effects; it inherits no admission and no
    claim over the original's effects, and the original is not touched.
    """

    KIND: ClassVar[str] = "Intent"
    operation_id: str
    sink: str
    action: str
    params_json: str
    actor: str
    subject: str
    purpose: str
    decision_version: int
    approval_id: str | None = None
    amount_minor: int
    parameter_digest: str
    published_at_ms: int
    #: The operation this one forks (schema version 2; ``None``: no fork).
    forked_from: str | None = None
    compensates: str | None = None


class Approval(Event):
    """A review decision: a grant or its revocation (key: approval ID).

    Its scope: ``scope_subject`` and ``scope_max_amount_minor`` always; each
    optional ``scope_*`` field (schema version 2), when set, must equal the
    operation's own value (``scope_currency`` and ``scope_account`` are
    compared with ``params["currency"]`` and ``params["account"]``). ``None``
    puts no constraint on that field.
    """

    KIND: ClassVar[str] = "Approval"
    approval_id: str
    reviewer: str
    policy_version: int
    expires_at_ms: int
    scope_subject: str
    scope_max_amount_minor: int
    scope_operation_id: str | None = None
    status: Literal["GRANTED", "CONSUMED", "REVOKED"] = "GRANTED"
    consumed_by: str | None = None
    consumed_at_ms: int | None = None
    revoked_by: str | None = None
    granted_at_ms: int
    key_id: str | None = None
    signature: bytes | None = None
    scope_action: str | None = None
    scope_sink: str | None = None
    scope_currency: str | None = None
    scope_account: str | None = None
    scope_purpose: str | None = None
    scope_parameter_digest: str | None = None


class ApprovalUse(Event):
    """An approval consumed by one operation (key: approval ID; written by the kernel only)."""

    KIND: ClassVar[str] = "ApprovalUse"
    approval_id: str
    operation_id: str
    parameter_digest: str
    consumed_at_ms: int
    decided_by: str


class AdmissionRequest(Event):
    """Processor asks the authority kernel to admit an operation (key: approval ID).

    It carries the operation as recorded (schema version 2: ``sink``,
    ``action``, ``purpose``, ``params_json``), so the kernel checks the
    approval's scope against the operation itself. ``amount_minor`` is the
    publisher's reading of ``params["amount_minor"]`` (0 when absent) and is
    not what the kernel checks: it reads the amount from the parameter the
    sink's contract names. Requests written before version 2 read those
    fields as ``None`` and are refused.
    """

    KIND: ClassVar[str] = "AdmissionRequest"
    operation_id: str
    approval_id: str
    parameter_digest: str
    subject: str
    amount_minor: int
    state_version: int
    sink: str | None = None
    action: str | None = None
    purpose: str | None = None
    params_json: str | None = None
    compensates: str | None = None


class AdmissionDecision(Event):
    """Authority kernel's decision on one exact operation (key: operation ID)."""

    KIND: ClassVar[str] = "AdmissionDecision"
    operation_id: str
    approval_id: str
    parameter_digest: str
    admitted: bool
    reason: str
    evaluated_at_ms: int
    policy_version: int
    approval_policy_version: int | None = None
    approval_expires_at_ms: int | None = None
    reviewer: str | None = None
    decided_by: str


DispatchKind = Literal["EXECUTE", "READBACK", "VERIFY"]


class Dispatch(Event):
    """Outbox record the relay performs against a sink (key: operation ID)."""

    KIND: ClassVar[str] = "Dispatch"
    dispatch_id: str
    operation_id: str
    kind: DispatchKind
    sink: str
    action: str
    params_json: str
    parameter_digest: str
    fencing_token: int
    state_version: int
    approval_id: str | None = None
    on_resume: bool = False
    #: The rest of what the parameter digest binds, so that a sink can
    #: recompute it (``None`` in dispatches written before schema version 2).
    subject: str | None = None
    purpose: str | None = None
    decision_version: int | None = None
    #: The sink's contract version in the registry when the dispatch was
    #: written (schema version 3; ``None`` before: read as version 1), and
    #: the schema versions its writer wrote with (a JSON object, record name
    #: -> version). Stamped by the processor; see :mod:`ledger.upgrades`.
    contract_version: int | None = None
    schema_versions_json: str | None = None


ReceiptStatus = Literal[
    "ATTEMPTED",
    "COMMITTED",
    "REJECTED",
    "AMBIGUOUS",
    "STALE_TOKEN",
    "KEY_REUSED",
    "UNAVAILABLE",
    "UNREACHABLE",
    "CANCELLED",
    "EXPIRED",
]


class EffectReceipt(Event):
    """What the relay saw when it submitted an effect (key: operation ID).

    ``UNREACHABLE`` (schema version 2) says the relay could not reach the sink
    (connection refused, or the sink not registered) within its retry budget:
    the request never left, so no effect can have been made.

    Reservation sinks (schema version 3): ``reservation`` is the hold's end
    this receipt records -- ``CONFIRMED`` (with ``COMMITTED``: the effect is
    made), ``CANCELLED`` (status ``CANCELLED``: the admission no longer
    stood, the hold was released, no effect) or ``EXPIRED`` (status
    ``EXPIRED``: the sink released an unconfirmed hold by itself; the relay
    reserved again under the same key, so the operation goes on).
    """

    KIND: ClassVar[str] = "EffectReceipt"
    operation_id: str
    dispatch_id: str
    status: ReceiptStatus
    sink: str
    attempt_id: str
    fencing_token: int
    effect_id: str | None = None
    observed_at_ms: int
    first_attempt_at_ms: int
    detail: str
    on_resume: bool = False
    observer: str
    reservation: Literal["CONFIRMED", "CANCELLED", "EXPIRED"] | None = None
    #: The sink's contract version the relay acted under (schema version 3;
    #: ``None`` before). An ``ATTEMPTED`` receipt's is the version a resume
    #: of that attempt is checked against (:mod:`ledger.upgrades`).
    contract_version: int | None = None


ReadbackStatus = Literal[
    "COMMITTED", "ABSENT", "UNKNOWN", "UNSUPPORTED", "MATCH", "MISMATCH", "STALE_TOKEN"
]


class Readback(Event):
    """A non-mutating observation of an effect or its postcondition (key: operation ID)."""

    KIND: ClassVar[str] = "Readback"
    operation_id: str
    dispatch_id: str
    kind: Literal["EFFECT", "POSTCONDITION"]
    status: ReadbackStatus
    source: str
    effect_id: str | None = None
    observed_at_ms: int
    detail: str
    on_resume: bool = False
    observer: str
    fencing_token: int


class Claim(Event):
    """A resumer's compare-and-swap claim on an operation (key: operation ID)."""

    KIND: ClassVar[str] = "Claim"
    claim_id: str
    operation_id: str
    worker: str
    expected_version: int


class OperationState(Event):
    """Recovery state of one operation (key: operation ID; written by the processor only)."""

    KIND: ClassVar[str] = "OperationState"
    operation_id: str
    state: RecoveryState
    version: int
    epoch: int
    parameter_digest: str
    sink: str
    action: str
    params_json: str
    actor: str
    subject: str
    purpose: str
    decision_version: int
    approval_id: str | None = None
    amount_minor: int
    admitted_approval_id: str | None = None
    admitted_policy_version: int | None = None
    admitted_at_ms: int | None = None
    approval_expires_at_ms: int | None = None
    reason: str = ""
    owner: str | None = None
    effect_id: str | None = None
    observation_source: str | None = None
    observation_status: str | None = None
    observed_at_ms: int | None = None
    dispatches: int = 0
    reauthorisations: int = 0
    recovery_receipts: int = 0
    unavailable: int = 0
    absent_retries: int = 0
    compensates: str | None = None


class JournalEntry(Event):
    """One input applied or refused by the processor, with its bytes (key: operation ID).

    ``hops`` lists the transitions the input took, ``FROM->TO`` (empty for a
    self-loop, a no-op or a refusal); ``None`` in entries written before
    schema version 2, which did not record them. ``sink_problem`` (version 3)
    is what the processor observed of an intent's sink when it decided (not
    registered, or the registry unreadable); replay decides with it.
    ``resumed_by`` (version 4) names the restarted processor that resumed the
    operation with this input (an admission decision it met after restoring
    the operation NOT_ADMITTED); replay decides with it too.
    """

    KIND: ClassVar[str] = "JournalEntry"
    operation_id: str
    seq: int
    kind: str
    outcome: Literal["APPLIED", "REFUSED", "NOOP"]
    from_state: str | None = None
    to_state: str | None = None
    reason: str
    input_topic: str
    input_partition: int
    input_offset: int
    input_event: bytes
    hops: tuple[str, ...] | None = None
    sink_problem: str | None = None
    resumed_by: str | None = None
    compensation_facts: str | None = None

    @field_serializer("hops")
    def _hops_as_list(self, hops: tuple[str, ...] | None) -> list[str] | None:
        # An Avro array is a list: fastavro reads a tuple in a union as
        # (branch name, value).
        return None if hops is None else list(hops)


RecoveryAction = Literal["COMPLETE", "EXECUTE", "COMPENSATE", "REAUTHORISE", "RECONCILE", "ABANDON"]


class RecoveryReceipt(Event):
    """Why acting after an interruption was safe (key: operation ID)."""

    KIND: ClassVar[str] = "RecoveryReceipt"
    receipt_id: str
    operation_id: str
    workflow_id: str
    checkpoint_version: int
    claimant: str
    parameter_digest: str
    actor: str
    subject: str
    purpose: str
    authority: str
    authority_policy_version: int | None = None
    authority_expires_at_ms: int | None = None
    observation_source: str
    observation_status: str
    observed_at_ms: int
    action: RecoveryAction
    effect_id: str | None = None
    postcondition: str
    uncertainty: str
    uncertainty_owner: str | None = None
    release_condition: str | None = None


class RecordHeader(BaseModel):
    """One Kafka record header kept with a dead letter (name, value bytes or ``None``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    value: bytes | None = None


class OperatingEvent(Event):
    """A refused transition, a dead letter or another operating fact.

    A dead letter keeps what it can of the record it refuses: its bytes, key
    bytes and headers while they are within the input bounds (v2 added the
    key and headers; v1 events read them as ``None``).
    """

    KIND: ClassVar[str] = "OperatingEvent"
    event_id: str
    operation_id: str | None = None
    component: str
    kind: str
    reason: str
    attempted_transition: str | None = None
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None
    original_bytes: bytes | None = None
    original_key: bytes | None = None
    original_headers: list[RecordHeader] | None = None


class Disposition(Event):
    """An attributable human disposition of an unknown outcome (key: operation ID)."""

    KIND: ClassVar[str] = "Disposition"
    disposition_id: str
    operation_id: str
    decision: Literal["COMMITTED", "ABSENT", "ABANDON"]
    by: str
    evidence: str
    disposed_at_ms: int


class PolicyChange(Event):
    """The policy version now in force (key: ``current``)."""

    KIND: ClassVar[str] = "PolicyChange"
    version: int
    set_by: str
    effective_at_ms: int


EVENT_TYPES: dict[str, type[Event]] = {
    cls.KIND: cls
    for cls in (
        Intent,
        Approval,
        ApprovalUse,
        AdmissionRequest,
        AdmissionDecision,
        Dispatch,
        EffectReceipt,
        Readback,
        Claim,
        OperationState,
        JournalEntry,
        RecoveryReceipt,
        OperatingEvent,
        Disposition,
        PolicyChange,
    )
}


def decode_event(data: bytes | None) -> Event:
    """Decode single-object-encoded bytes into the matching event model.

    Raises:
        DecodeError: malformed bytes, or fields that fail the model's checks.
        UnknownSchemaError: unknown writer-schema fingerprint.
    """
    name, record = registry().decode(data)
    cls = EVENT_TYPES.get(name)
    if cls is None:
        raise DecodeError(f"schema {name} has no event model")
    try:
        return cls.model_validate(record)
    except ValidationError as exc:
        raise DecodeError(f"{name} failed validation: {exc}") from exc


def encode_event(event: Event) -> bytes:
    """Single-object-encode an event; same as ``event.to_bytes()``."""
    return event.to_bytes()


def as_record(event: Event) -> dict[str, Any]:
    """The event as a plain dict of Avro-compatible values."""
    return event.model_dump()
