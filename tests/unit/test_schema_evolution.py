"""Schema evolution: every released schema version stays readable by the current one.

``schemas/history/NAME.vN.avsc`` keeps each released version. A change to a
schema in ``schemas/`` must be backward compatible: records written with any
released version decode under the current schema (Avro schema resolution),
and a released version may never be edited.
"""

from __future__ import annotations

import io
import json
from importlib.resources.abc import Traversable
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from pydantic import ValidationError

from ledger.errors import DecodeError
from ledger.events import EVENT_TYPES, decode_event
from ledger.serde import MARKER, SCHEMA_DIR, registry, schema_files

HISTORY = schema_files(SCHEMA_DIR / "history")


def sample(schema: Any, named: dict[str, Any]) -> Any:
    """A valid value for an Avro schema (every field filled)."""
    if isinstance(schema, str):
        return (
            {
                "null": None,
                "boolean": True,
                "int": 7,
                "long": 7_000,
                "string": "text",
                "bytes": b"\x01",
            }.get(schema)
            if schema not in named
            else sample(named[schema], named)
        )
    if isinstance(schema, list):
        branch = next(b for b in schema if b != "null")
        return sample(branch, named)
    kind = schema["type"]
    if kind == "record":
        named[schema["name"]] = schema
        return {f["name"]: sample(f["type"], named) for f in schema["fields"]}
    if kind == "enum":
        named[schema["name"]] = schema
        return schema["symbols"][0]
    if kind == "array":
        return [sample(schema["items"], named)]
    return sample(kind, named)


def test_every_current_schema_is_released() -> None:
    released = {json.loads(p.read_text())["name"] for p in HISTORY}
    current = {json.loads(p.read_text())["name"] for p in schema_files()}
    assert current <= released, f"release these schemas into schemas/history: {current - released}"


@pytest.mark.parametrize("path", HISTORY, ids=[p.stem for p in HISTORY])
def test_released_versions_decode_under_the_current_schema(path: Traversable) -> None:
    old = json.loads(path.read_text())
    current = registry().schema(old["name"])
    assert current.version >= old["version"]
    record = sample(old, {})
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(old), record)
    buf.seek(0)
    resolved = schemaless_reader(buf, parse_schema(old), current.parsed)
    for field in old["fields"]:
        if any(f["name"] == field["name"] for f in current.raw["fields"]):
            assert resolved[field["name"]] == record[field["name"]]
    # And through the ledger's own decoder, by the old writer's fingerprint.
    old_fp = next(s.fingerprint for s in registry().by_fingerprint.values() if s.raw == old)
    name, decoded = registry().decode(MARKER + old_fp + buf.getvalue())
    assert name == old["name"] and decoded.keys() == resolved.keys()


def test_released_version_equal_to_current_is_unchanged() -> None:
    for path in HISTORY:
        old = json.loads(path.read_text())
        current = registry().schema(old["name"])
        if current.version == old["version"]:
            assert current.raw == old, f"{path.name} was edited after release; add a new version"


@pytest.mark.parametrize("path", HISTORY, ids=[p.stem for p in HISTORY])
def test_released_versions_build_the_model_pydantic_builds(path: Traversable) -> None:
    # decode_event builds events without a second validation pass; a record
    # of every released version must come out as pydantic would build it from
    # the resolved record (defaults of later fields included), or be refused
    # by both (a value the schema admits and the model does not).
    old = json.loads(path.read_text())
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(old), sample(old, {}))
    old_fp = next(s.fingerprint for s in registry().by_fingerprint.values() if s.raw == old)
    data = MARKER + old_fp + buf.getvalue()
    name, record = registry().decode(data)
    try:
        validated = EVENT_TYPES[name].model_validate(record)
    except ValidationError:
        with pytest.raises(DecodeError):
            decode_event(data)
        return
    built = decode_event(data)
    assert built == validated and built.model_dump() == validated.model_dump()
    assert {k: type(v) for k, v in built.__dict__.items()} == {
        k: type(v) for k, v in validated.__dict__.items()
    }
