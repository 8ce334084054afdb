"""Every schema round-trips; bad bytes get clear errors."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ledger.errors import DecodeError, SchemaValidationError, UnknownSchemaError
from ledger.events import (
    EVENT_TYPES,
    ApprovalUse,
    JournalEntry,
    OperatingEvent,
    RecordHeader,
    decode_event,
)
from ledger.serde import MARKER, registry, schema_files
from tests import helpers


def _sample(name: str):  # one valid instance of every event kind
    i = helpers.intent()
    samples = {
        "Intent": i,
        "Approval": helpers.approval(operation_id="refund:c1:v1").model_copy(
            update={"signature": b"\x01\x02", "key_id": "k1"}
        ),
        "AdmissionDecision": helpers.admission(i),
        "ApprovalUse": ApprovalUse(
            approval_id="ap-1",
            operation_id=i.operation_id,
            parameter_digest=i.parameter_digest,
            consumed_at_ms=5,
            decided_by="authority-0",
        ),
        "EffectReceipt": helpers.receipt(i.operation_id, "refund:c1:v1#1.1"),
        "Readback": helpers.readback(i.operation_id, "refund:c1:v1#1.1"),
        "Claim": helpers.claim(i.operation_id, "w", 3),
        "OperatingEvent": OperatingEvent(
            event_id="e",
            component="processor",
            kind="BAD_INPUT",
            reason="r",
            original_bytes=b"\xff",
            original_key=b"\xfe\x00k",
            original_headers=[
                RecordHeader(name="traceparent", value=b"00-ab"),
                RecordHeader(name="traceparent", value=None),
            ],
        ),
    }
    if name in samples:
        return samples[name]
    from ledger.fold import decide, journal_entry
    from ledger.outcomes import outcome_of

    d = decide(None, i, "intents:0:7")
    assert d.state is not None
    admitted = decide(d.state, helpers.admission(i), "admissions:0:1")
    derived = {
        "OperationState": d.state,
        "AdmissionRequest": d.outputs[0].event,
        "JournalEntry": journal_entry(d, i, i.to_bytes(), "intents", 0, 7),
        "Dispatch": admitted.outputs[0].event,
        "Outcome": outcome_of(d.state, "processor:intents:0:7", 1_000),
        "RecoveryReceipt": None,
        "PolicyChange": EVENT_TYPES["PolicyChange"](version=2, set_by="ops", effective_at_ms=5),
        "JournalHead": EVENT_TYPES["JournalHead"](
            journal_partition=1,
            offset=41,
            seq=40,
            chain_hash="ab" * 32,
            published_at_ms=1_000,
            writer="processor-0",
        ),
        "CompensationTally": EVENT_TYPES["CompensationTally"](
            tally_id="tally:intents:0:7",
            operation_id="credit:o1:v1",
            kind="REQUEST",
            original="credit:o1:v1",
            compensation=i.operation_id,
            request_state_version=1,
            subject="customer-1",
            account='"acct-1"',
            amount_minor=2500,
        ),
        "Disposition": EVENT_TYPES["Disposition"](
            disposition_id="d1",
            operation_id=i.operation_id,
            decision="COMMITTED",
            by="operator-3",
            evidence="provider log",
            disposed_at_ms=600_000,
        ),
    }
    if name == "RecoveryReceipt":
        resumed = decide(
            admitted.state,
            helpers.readback(i.operation_id, "refund:c1:v1#1.1", on_resume=True),
            "readbacks:0:3",
        )
        return next(o.event for o in resumed.outputs if o.topic == "recovery-receipts")
    return derived[name]


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_every_schema_round_trips(name: str) -> None:
    event = _sample(name)
    assert event is not None and event.KIND == name
    data = event.to_bytes()
    assert data[:2] == MARKER
    assert decode_event(data) == event


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_models_mirror_schemas(name: str) -> None:
    schema = registry().schema(name).raw
    assert [f["name"] for f in schema["fields"]] == list(EVENT_TYPES[name].model_fields)


def test_every_avsc_has_namespace_version_and_model() -> None:
    files = schema_files()
    assert len(files) == len(EVENT_TYPES)
    for path in files:
        raw = json.loads(path.read_text())
        assert raw["namespace"] and raw["version"] >= 1, path
        assert raw["name"] in EVENT_TYPES, path


def test_fingerprint_is_crc64_avro_little_endian() -> None:
    # Avro spec test vector: CRC-64-AVRO of the canonical form "int".
    from fastavro.schema import fingerprint

    assert fingerprint('"int"', "CRC-64-AVRO") == "8f5c393f1ad57572"


@pytest.mark.parametrize(
    "data, error",
    [
        (None, DecodeError),
        (b"", DecodeError),
        (b"not avro at all", DecodeError),
        (MARKER + b"\x00" * 8 + b"\x02a", UnknownSchemaError),
    ],
)
def test_bad_bytes_are_refused_clearly(data: bytes | None, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode_event(data)


def test_truncated_body_is_a_decode_error() -> None:
    data = helpers.intent().to_bytes()
    with pytest.raises(DecodeError, match="malformed Intent"):
        decode_event(data[:-5])


def test_trailing_bytes_are_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_event(helpers.claim("op", "w", 1).to_bytes() + b"\x00")


def test_wrong_types_are_refused_before_sending() -> None:
    with pytest.raises(SchemaValidationError):
        registry().encode(
            "Claim", {"claim_id": "c", "operation_id": "o", "worker": 3, "expected_version": "x"}
        )


def _as_validated(data: bytes):  # the same bytes through pydantic's validation
    name, record = registry().decode(data)
    return EVENT_TYPES[name].model_validate(record)


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_decoding_builds_what_validation_builds(name: str) -> None:
    # decode_event does not validate the decoded record a second time; what
    # it builds must be the model pydantic would have built, value for value.
    data = _sample(name).to_bytes()
    fast, validated = decode_event(data), _as_validated(data)
    assert type(fast) is type(validated) and fast == validated
    assert list(fast.__dict__) == list(validated.__dict__)
    for field, value in validated.__dict__.items():
        assert type(fast.__dict__[field]) is type(value), field
    assert fast.model_fields_set == validated.model_fields_set
    assert repr(fast) == repr(validated)
    if name != "OperatingEvent":  # its headers are a list: no hash either way
        assert hash(fast) == hash(validated)
    assert fast.model_dump() == validated.model_dump()
    assert fast.to_bytes() == data


def test_decoded_nested_values_have_the_model_types() -> None:
    hops = ("NOT_ADMITTED->ADMITTED", "ADMITTED->EFFECT_PENDING")
    entry = decode_event(_sample("JournalEntry").model_copy(update={"hops": hops}).to_bytes())
    assert isinstance(entry, JournalEntry) and entry.hops == hops
    dead = decode_event(_sample("OperatingEvent").to_bytes())
    assert isinstance(dead, OperatingEvent) and dead.original_headers is not None
    assert all(isinstance(h, RecordHeader) for h in dead.original_headers)


def test_a_value_the_schema_admits_but_the_model_does_not_is_refused() -> None:
    # EffectReceipt.reservation is an Avro string; the model admits three values.
    record = _sample("EffectReceipt").model_dump() | {"reservation": "MAYBE"}
    data = registry().encode("EffectReceipt", record)
    with pytest.raises(DecodeError, match="reservation is 'MAYBE'"):
        decode_event(data)
    with pytest.raises(ValidationError):  # what pydantic says of it too
        _as_validated(data)


def test_encoding_a_built_event_still_refuses_what_its_schema_refuses() -> None:
    # Encoding skips fastavro's validation for events (typed when built), but
    # a value that bypassed pydantic (model_copy does not validate) is still
    # refused with a clear error, never written.
    claim = helpers.claim("op", "w", 1)
    with pytest.raises(SchemaValidationError, match="Claim"):
        claim.model_copy(update={"expected_version": "x"}).to_bytes()
    with pytest.raises(SchemaValidationError, match="Claim"):
        claim.model_copy(update={"worker": None}).to_bytes()
    for number in (True, 1.5, 2**63):  # fastavro's writer would write the first two
        with pytest.raises(SchemaValidationError, match="Claim"):
            claim.model_copy(update={"expected_version": number}).to_bytes()
    receipt = _sample("EffectReceipt")
    with pytest.raises(SchemaValidationError, match="EffectReceipt"):  # not a boolean
        receipt.model_copy(update={"on_resume": 1}).to_bytes()
    state = _sample("OperationState")
    with pytest.raises(SchemaValidationError, match="OperationState"):  # an Avro int is 32-bit
        state.model_copy(update={"admitted_policy_version": 2**31}).to_bytes()
    with pytest.raises(SchemaValidationError, match="OperationState"):
        state.model_copy(update={"state": "SOMEWHERE"}).to_bytes()
    ok = state.model_copy(update={"admitted_policy_version": 2**31 - 1}).to_bytes()
    assert decode_event(ok) == state.model_copy(update={"admitted_policy_version": 2**31 - 1})
