"""Ledger events as frozen pydantic models, one per Avro schema in ``schemas/``.

Field names and types mirror the ``.avsc`` files exactly (a test checks it).
Times are milliseconds on the ledger clock (``*_ms``); money is in minor
currency units (``*_minor``).
"""

from __future__ import annotations

from enum import Enum
from types import UnionType
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, field_serializer

from ledger.errors import DecodeError
from ledger.serde import registry
from ledger.states import RecoveryState


class Event(BaseModel):
    """Base of every ledger event: frozen, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=True)
    KIND: ClassVar[str] = ""

    def avro_record(self) -> dict[str, Any]:
        """The event's values as fastavro writes them (not to be modified).

        Its fields hold Avro values as they are (no nested model, no
        serializer), so this is the model's own ``__dict__``; an event with
        a nested model or a serializer overrides it.
        """
        return self.__dict__

    def to_bytes(self) -> bytes:
        """Single-object-encode this event (see :mod:`ledger.serde`).

        Its values were typed when it was built (validated by pydantic, or
        decoded with the schema), so fastavro does not validate them again
        (``typed=True``: a value the writer cannot write is still refused
        with :class:`~ledger.errors.SchemaValidationError`).
        """
        return registry().encode(self.KIND, self.avro_record(), typed=True)


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
    """An approval consumed by one operation (key: approval ID; written by the kernel only).

    ``request_state_version`` (schema version 2) is the state version of the
    admission request whose admission consumed it (``None`` in uses of
    version 1).
    """

    KIND: ClassVar[str] = "ApprovalUse"
    approval_id: str
    operation_id: str
    parameter_digest: str
    consumed_at_ms: int
    decided_by: str
    request_state_version: int | None = None


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
    """Authority kernel's decision on one exact operation (key: operation ID).

    ``request_state_version`` (schema version 2) names the admission request
    the decision answers (its ``state_version``): the processor applies it
    only while that request is the one pending (the state version at which
    the operation entered NOT_ADMITTED, ``OperationState.entered_version``),
    so an authentic decision appended again in a later request's episode
    changes nothing (see :mod:`ledger.fold.admissions`). ``None`` in
    decisions of version 1.
    """

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
    request_state_version: int | None = None


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

    Postcondition read right after the effect (schema version 4): a
    ``COMMITTED`` receipt may carry the postcondition readback the relay made
    at once, before it committed the receipt (``postcondition_status``
    ``MATCH`` or ``MISMATCH``, with its source, detail and time). The fold
    then takes the readback's verdict from this one record and dispatches no
    ``VERIFY``; without it (``None``: no readback made, or none that
    answered) the operation is verified by a ``VERIFY`` dispatch as before.
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
    #: of that attempt is checked against (:mod:`ledger.upgrades`). A receipt
    #: of a step held by an upgrade (nothing sent) names the earlier version
    #: the effect was attempted under: an operation's receipts share its key,
    #: so after compaction it may be the only one left to say so.
    contract_version: int | None = None
    postcondition_status: Literal["MATCH", "MISMATCH"] | None = None
    postcondition_source: str | None = None
    postcondition_detail: str | None = None
    postcondition_observed_at_ms: int | None = None


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


#: Where a compensation's claim on its original's effect stands (``OperationState.tally``).
TallyStatus = Literal["REQUESTED", "GRANTED", "REFUSED", "RELEASED"]

#: The records of the original's tally (:class:`CompensationTally`).
TallyKind = Literal["REQUEST", "GRANTED", "REFUSED", "RELEASE"]


class CompensationTally(Event):
    """A compensation's claim on its original's effect (written by the processor only).

    The owner of the original decides every claim on its effect, one at a
    time (see :mod:`ledger.fold.tally`): a compensation's ``REQUEST`` and,
    once it ends abandoned without effect, its ``RELEASE`` are keyed by the
    original's operation ID; the verdict (``GRANTED`` or ``REFUSED``, with
    the reason) is keyed by the compensation's. ``request_state_version`` is
    the compensation's episode when it asked (a verdict for another episode
    changes nothing). ``amount_minor`` is the compensation's amount in minor
    units (``None``: the whole effect); ``account`` its ``account`` parameter
    as JSON text.
    """

    KIND: ClassVar[str] = "CompensationTally"
    tally_id: str
    operation_id: str
    kind: TallyKind
    original: str
    compensation: str
    request_state_version: int
    subject: str | None = None
    account: str | None = None
    amount_minor: int | None = None
    reason: str = ""


class OperationState(Event):
    """Recovery state of one operation (key: operation ID; written by the processor only).

    ``entered_version`` (schema version 5) is the version at which the
    operation entered its current recovery state: every move that takes a
    transition sets it, a self-loop (a claim) keeps it. It names the episode
    that admission decisions (NOT_ADMITTED) and dispositions
    (UNKNOWN_OUTCOME) must answer; ``None`` in states of versions 1 to 4.

    Schema version 6: ``tally`` is where a compensation's claim on its
    original's effect stands (``REQUESTED`` while it waits for the
    original's owner, then ``GRANTED``, ``REFUSED`` or, granted and then
    abandoned without effect, ``RELEASED``); ``compensations_granted`` is an
    original's tally, a JSON array of ``[compensation ID, amount in minor
    units or null]`` in grant order (see :mod:`ledger.fold.tally`).
    """

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
    entered_version: int | None = None
    tally: TallyStatus | None = None
    compensations_granted: str | None = None


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

    Version 5: ``chain_seq`` and ``chain_prev`` link the entry into its
    partition's hash chain (:mod:`ledger.chain`; ``None`` in earlier
    entries). ``repeat_of`` is set when the input repeats an intent already
    journaled for the operation (same ID, same parameter digest, a no-op):
    the earlier input's ref, whose bytes an earlier entry keeps;
    ``input_event`` is then empty and ``input_sha256`` pins the bytes
    received (see :func:`ledger.fold.journal_entry`).
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
    chain_seq: int | None = None
    chain_prev: str | None = None
    repeat_of: str | None = None
    input_sha256: str | None = None

    @field_serializer("hops")
    def _hops_as_list(self, hops: tuple[str, ...] | None) -> list[str] | None:
        # An Avro array is a list: fastavro reads a tuple in a union as
        # (branch name, value).
        return None if hops is None else list(hops)

    def avro_record(self) -> dict[str, Any]:
        """The entry's values as fastavro writes them: ``hops`` as a list (see above)."""
        if self.hops is None:
            return self.__dict__
        return {**self.__dict__, "hops": list(self.hops)}


class JournalHead(Event):
    """The head of one journal partition's hash chain (key: ``journal:{partition}``).

    Written by the processor that owns the partition, on the ``heads`` topic,
    and handed to the witnesses outside Kafka (:mod:`consumers.heads`): the
    auditor checks each journal chain against them (:mod:`ledger.audit.chain`).
    ``offset`` and ``seq`` name the partition's last committed chained entry;
    ``chain_hash`` is its chain hash (hex SHA-256, :func:`ledger.chain.entry_hash`);
    ``published_at_ms`` is wall-clock milliseconds.
    """

    KIND: ClassVar[str] = "JournalHead"
    journal_partition: int
    offset: int
    seq: int
    chain_hash: str
    published_at_ms: int
    writer: str


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

    def avro_record(self) -> dict[str, Any]:
        """The event's values as fastavro writes them: its headers as plain records."""
        return self.model_dump()


class Disposition(Event):
    """An attributable human disposition of an unknown outcome (key: operation ID).

    ``episode`` (schema version 2) names the unknown outcome it answers: the
    operation's state version when it entered UNKNOWN_OUTCOME
    (``OperationState.entered_version``). The processor applies it only in
    that episode, so an authentic disposition appended again in a later
    episode changes nothing (see :mod:`ledger.fold.dispositions`). ``None``
    in dispositions of version 1.
    """

    KIND: ClassVar[str] = "Disposition"
    disposition_id: str
    operation_id: str
    decision: Literal["COMMITTED", "ABSENT", "ABANDON"]
    by: str
    evidence: str
    disposed_at_ms: int
    episode: int | None = None


class PolicyChange(Event):
    """The policy version now in force (key: ``current``)."""

    KIND: ClassVar[str] = "PolicyChange"
    version: int
    set_by: str
    effective_at_ms: int


#: What became of an operation, as a service sees it (:class:`Outcome`).
OutcomeKind = Literal[
    "VERIFIED", "COMMITTED", "NEEDS_REAUTHORISATION", "HELD", "REFUSED", "ABANDONED", "PENDING"
]


class Outcome(Event):
    """What became of one operation, for the service that asked (key: operation ID).

    Written by the processor only, in the transaction that decides it, and
    signed with its outcome key (a service checks it with the public half).
    Derived from the operation's state by :func:`ledger.outcomes.outcome_of`.
    ``state`` is ``None`` (and ``state_version`` 0) for an intent refused
    before its operation existed; ``parameter_digest`` is the digest of the
    request it answers (a refused drift names the refused intent's);
    ``at_ms`` is the Kafka timestamp of the decided input (Unix ms).
    """

    KIND: ClassVar[str] = "Outcome"
    outcome_id: str
    operation_id: str
    kind: OutcomeKind
    state: str | None = None
    state_version: int = 0
    reason: str
    remedy: str = ""
    refusal_kind: str | None = None
    parameter_digest: str
    effect_id: str | None = None
    postcondition: str | None = None
    approval_id: str | None = None
    policy_version: int | None = None
    owner: str | None = None
    release_condition: str | None = None
    at_ms: int


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
        JournalHead,
        RecoveryReceipt,
        OperatingEvent,
        Disposition,
        PolicyChange,
        CompensationTally,
        Outcome,
    )
}


#: A field the Avro schema does not fully type for its model: ``(name,
#: allowed values or None, convert to a tuple)``; see :func:`_decode_plan`.
_FieldFix = tuple[str, frozenset[Any] | None, bool]

#: Avro primitive types that decode to exactly the model's Python type.
_SAME_TYPE: dict[Any, frozenset[str]] = {
    str: frozenset({"string"}),
    int: frozenset({"int", "long"}),
    bool: frozenset({"boolean"}),
    bytes: frozenset({"bytes"}),
}


def _branches(annotation: Any) -> tuple[bool, list[Any]]:
    """``(nullable, the other members)`` of a model field's annotation."""
    if get_origin(annotation) in (Union, UnionType):
        members = get_args(annotation)
        return type(None) in members, [m for m in members if m is not type(None)]
    return False, [annotation]


def _symbols(annotation: Any) -> frozenset[Any] | None:
    """The values a ``Literal`` or an enum annotation admits (``None``: neither)."""
    if get_origin(annotation) is Literal:
        return frozenset(get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return frozenset(member.value for member in annotation)
    return None


def _field_fix(annotation: Any, avro: Any) -> _FieldFix | None | Literal[False]:
    """What a value decoded with Avro type ``avro`` still needs for ``annotation``.

    Returns:
        ``None`` when the Avro type already guarantees the model's type, a
        fix (with an empty name) when a check or a conversion makes it so,
        or ``False`` when the field must go through pydantic.
    """
    nullable, members = _branches(annotation)
    avro_members = avro if isinstance(avro, list) else [avro]
    if "null" in avro_members and not nullable:
        return False
    avro_rest = [a for a in avro_members if a != "null"]
    if len(members) != 1 or len(avro_rest) != 1:
        return False
    py, av = members[0], avro_rest[0]
    if isinstance(av, str) and av in _SAME_TYPE.get(py, ()):
        return None
    allowed = _symbols(py)
    if allowed is not None:
        if isinstance(av, dict) and av.get("type") == "enum" and set(av["symbols"]) <= allowed:
            return None  # the reader's enum admits only its symbols
        if av == "string":
            return ("", allowed, False)  # a string the model narrows: checked
        return False
    if (
        get_origin(py) is tuple
        and get_args(py) in ((str, Ellipsis),)
        and isinstance(av, dict)
        and av.get("type") == "array"
        and av.get("items") == "string"
    ):
        return ("", None, True)  # an Avro array is a list; the model keeps a tuple
    return False


def _decode_plan(cls: type[Event]) -> tuple[_FieldFix, ...] | None:
    """How a record decoded with ``cls``'s current schema becomes a ``cls`` without pydantic.

    A record that fastavro decoded with the reader schema already has every
    field of the model (Avro schema resolution fills the defaults of fields
    an older writer did not have) with the Python type the model declares,
    so pydantic's validation would only repeat it. What the schema does not
    say is done here: the values of a ``Literal`` carried as an Avro string
    are checked, an array the model keeps as a tuple is converted.

    Returns:
        The fixes, field by field; ``None`` when the model needs pydantic
        (a field whose type the schema does not pin down, a nested model, a
        validator or private attributes, fields that differ from the
        schema's): such a kind is decoded with ``model_validate``.
    """
    decorators = cls.__pydantic_decorators__
    if (
        cls.__pydantic_post_init__
        or cls.__private_attributes__
        or decorators.validators
        or decorators.field_validators
        or decorators.root_validators
        or decorators.model_validators
    ):
        return None
    fields = registry().schema(cls.KIND).raw["fields"]
    if [f["name"] for f in fields] != list(cls.model_fields):
        return None
    fixes: list[_FieldFix] = []
    for f in fields:
        fix = _field_fix(cls.model_fields[f["name"]].annotation, f["type"])
        if fix is False:
            return None
        if fix is not None:
            fixes.append((str(f["name"]), fix[1], fix[2]))
    return tuple(fixes)


_PLANS: dict[str, tuple[_FieldFix, ...] | None] = {}


def _from_record(name: str, cls: type[Event], record: dict[str, Any]) -> Event:
    """Build the event from a record fastavro decoded with the current schema.

    Raises:
        DecodeError: a value the model does not admit.
    """
    try:
        plan = _PLANS[name]
    except KeyError:
        plan = _PLANS[name] = _decode_plan(cls)
    if plan is None:
        try:
            return cls.model_validate(record)
        except ValidationError as exc:
            raise DecodeError(f"{name} failed validation: {exc}") from exc
    for field, allowed, as_tuple in plan:
        value = record[field]
        if value is None:
            continue
        if allowed is not None and value not in allowed:
            raise DecodeError(
                f"{name} failed validation: {field} is {value!r}, not one of "
                f"{', '.join(sorted(map(str, allowed)))}",
                observed=value,
            )
        if as_tuple:
            record[field] = tuple(value)
    # What BaseModel.model_construct does, for a record that has every field.
    event = cls.__new__(cls)
    object.__setattr__(event, "__dict__", record)
    object.__setattr__(event, "__pydantic_fields_set__", set(record))
    object.__setattr__(event, "__pydantic_extra__", None)
    object.__setattr__(event, "__pydantic_private__", None)
    return event


def decode_event(data: bytes | None) -> Event:
    """Decode single-object-encoded bytes into the matching event model.

    Decoding with the schema is the validation: the record is built from
    fastavro's values without a second pass through pydantic (see
    :func:`_decode_plan`; a value the schema admits but the model does not,
    such as an unknown ``reservation``, is still refused).

    Raises:
        DecodeError: malformed bytes, or fields that fail the model's checks.
        UnknownSchemaError: unknown writer-schema fingerprint.
    """
    name, record = registry().decode(data)
    cls = EVENT_TYPES.get(name)
    if cls is None:
        raise DecodeError(f"schema {name} has no event model")
    return _from_record(name, cls, record)


def encode_event(event: Event) -> bytes:
    """Single-object-encode an event; same as ``event.to_bytes()``."""
    return event.to_bytes()


def as_record(event: Event) -> dict[str, Any]:
    """The event as a plain dict of Avro-compatible values."""
    return event.model_dump()
