"""Avro single-object encoding of ledger events (fastavro).

Layout (Avro 1.11 specification, "Single-object encoding"): the two marker
bytes ``C3 01``, the 8-byte little-endian CRC-64-AVRO fingerprint of the
writer schema's Parsing Canonical Form, then the Avro binary body. Any reader
resolves the writer schema from the fingerprint against ``schemas/``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form
from fastavro.validation import validate

from ledger.errors import DecodeError, SchemaValidationError, UnknownSchemaError

MARKER = b"\xc3\x01"
HEADER_LEN = 10
#: The ranges of an Avro ``int`` and ``long`` (32- and 64-bit signed).
INT_RANGE = (-(2**31), 2**31 - 1)
LONG_RANGE = (-(2**63), 2**63 - 1)
#: The ``schemas`` package: ``.avsc`` files shipped inside the wheel.
SCHEMA_DIR: Traversable = files("schemas")


def schema_files(folder: Traversable = SCHEMA_DIR) -> list[Traversable]:
    """The ``.avsc`` files directly in ``folder``, sorted by name."""
    return sorted(
        (f for f in folder.iterdir() if f.is_file() and f.name.endswith(".avsc")),
        key=lambda f: f.name,
    )


@dataclass(frozen=True)
class EventSchema:
    """One event kind's writer schema.

    Attributes:
        name: short record name, e.g. ``Intent``.
        full_name: namespaced name.
        version: the schema's ``version`` attribute.
        fingerprint: 8 bytes, little-endian CRC-64-AVRO of the canonical form.
        parsed: fastavro's parsed schema.
        raw: the schema as loaded from its ``.avsc`` file.
        scalars: the top-level ``int``, ``long`` and ``boolean`` fields
            (nullable or not) as ``(name, range or None for a boolean,
            nullable)``: fastavro's writer writes a bool or a float into a
            number, anything into a boolean, and any integer as a varint,
            so :meth:`SchemaRegistry.encode` checks these itself when it
            skips fastavro's validation.
    """

    name: str
    full_name: str
    version: int
    fingerprint: bytes
    parsed: Any
    raw: Mapping[str, Any]
    scalars: tuple[tuple[str, tuple[int, int] | None, bool], ...] = ()


class SchemaRegistry:
    """Local registry of the ledger's schemas, by name and by fingerprint.

    Args:
        schema_dir: folder of ``.avsc`` files, with older versions in its
            ``history/`` (default: the ``schemas`` package shipped in the wheel).
    """

    def __init__(self, schema_dir: Traversable = SCHEMA_DIR) -> None:
        self.by_name: dict[str, EventSchema] = {}
        self.by_fingerprint: dict[bytes, EventSchema] = {}
        for path in schema_files(schema_dir):
            self.add(json.loads(path.read_text()))
        # Every released version stays readable: events written with it resolve
        # to the current schema (Avro schema resolution).
        for path in schema_files(schema_dir / "history"):
            self.add(json.loads(path.read_text()))

    def add(self, raw: Mapping[str, Any]) -> EventSchema:
        """Register a schema (also older versions kept for reading)."""
        parsed = parse_schema(dict(raw))
        fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
        schema = EventSchema(
            name=str(raw["name"]),
            full_name=f"{raw.get('namespace', '')}.{raw['name']}".lstrip("."),
            version=int(raw.get("version", 1)),
            fingerprint=fp,
            parsed=parsed,
            raw=raw,
            scalars=_scalar_fields(raw),
        )
        current = self.by_name.get(schema.name)
        if current is None or current.version <= schema.version:
            self.by_name[schema.name] = schema
        self.by_fingerprint[fp] = schema
        return schema

    def schema(self, name: str) -> EventSchema:
        """The current schema of an event kind.

        Raises:
            UnknownSchemaError: if no schema has that name.
        """
        try:
            return self.by_name[name]
        except KeyError:
            raise UnknownSchemaError(
                f"no schema named {name!r} in {SCHEMA_DIR}", observed=name
            ) from None

    def encode(self, name: str, record: Mapping[str, Any], *, typed: bool = False) -> bytes:
        """Validate and encode a record as a single object.

        Args:
            name: event kind (record name), e.g. ``"Intent"``.
            record: field values (Python types: str, int, bool, bytes, None).
            typed: the values were typed when the record was built (a
                :class:`~ledger.events.Event` the code constructed or decoded
                with this schema), so fastavro's validation pass before
                writing is skipped. The writer still refuses a value it
                cannot write (a wrong type, ``None`` for a required field, an
                unknown enum symbol); such a record is then validated to say
                why, and the error is the same as without ``typed``.

        Returns:
            ``C3 01`` + fingerprint + Avro body.

        Raises:
            SchemaValidationError: when the record does not match the schema.
        """
        schema = self.schema(name)
        datum = record if isinstance(record, dict) else dict(record)
        if typed:
            # What the writer would let through unchecked is checked first.
            if _scalars_hold(datum, schema.scalars):
                try:
                    return self._write(schema, datum)
                except Exception as exc:
                    self._refuse(name, schema, datum)
                    raise SchemaValidationError(f"{name} could not be written: {exc}") from exc
            self._refuse(name, schema, datum)
        # The quick check answers yes or no; only a record that fails it is
        # validated again to say why (fastavro builds an error object for
        # every union branch that does not match, which costs more than the
        # encoding itself).
        if not validate(datum, schema.parsed, raise_errors=False):
            self._refuse(name, schema, datum)
        return self._write(schema, datum)

    @staticmethod
    def _write(schema: EventSchema, datum: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(MARKER)
        buf.write(schema.fingerprint)
        schemaless_writer(buf, schema.parsed, datum)
        return buf.getvalue()

    @staticmethod
    def _refuse(name: str, schema: EventSchema, datum: dict[str, Any]) -> None:
        """Raise :class:`SchemaValidationError` saying why ``datum`` does not match (if so)."""
        try:
            ok = validate(datum, schema.parsed, raise_errors=True)
        except Exception as exc:  # fastavro raises ValidationError (a ValueError)
            raise SchemaValidationError(f"{name} does not match its schema: {exc}") from exc
        if not ok:
            raise SchemaValidationError(f"{name} does not match its schema")

    def decode(self, data: bytes | None) -> tuple[str, dict[str, Any]]:
        """Decode a single-object-encoded event, resolving to the current schema.

        Returns:
            ``(name, record)``; the record follows the *current* schema of that
            kind (Avro schema resolution fills defaults for added fields).

        Raises:
            DecodeError: missing value, wrong marker, truncated or malformed body.
            UnknownSchemaError: fingerprint not in the registry.
        """
        if data is None:
            raise DecodeError("record has no value (tombstone or missing payload)")
        if len(data) < HEADER_LEN or data[:2] != MARKER:
            raise DecodeError(
                "not an Avro single-object encoding (expected marker C3 01 and a fingerprint)",
                observed=data[:HEADER_LEN].hex(),
            )
        writer = self.by_fingerprint.get(data[2:HEADER_LEN])
        if writer is None:
            raise UnknownSchemaError(
                f"unknown writer schema fingerprint {data[2:HEADER_LEN].hex()}: "
                "the event was written with a schema this ledger does not know; "
                "upgrade the reader or add the schema to schemas/",
                observed=data[2:HEADER_LEN].hex(),
            )
        reader = self.by_name[writer.name]
        try:
            body = io.BytesIO(data[HEADER_LEN:])
            record = schemaless_reader(body, writer.parsed, reader.parsed)
            if body.tell() != len(data) - HEADER_LEN:
                raise ValueError("trailing bytes after the Avro body")
        except Exception as exc:
            raise DecodeError(f"malformed {writer.name} body: {exc}") from exc
        if not isinstance(record, dict):
            raise DecodeError(f"{writer.name} body is not a record")
        return writer.name, record


def _scalar_fields(raw: Mapping[str, Any]) -> tuple[tuple[str, tuple[int, int] | None, bool], ...]:
    """The ``scalars`` of :class:`EventSchema` for a record schema."""
    out: list[tuple[str, tuple[int, int] | None, bool]] = []
    for f in raw.get("fields", ()):
        members = f["type"] if isinstance(f["type"], list) else [f["type"]]
        nullable = "null" in members
        for kind, limits in (("int", INT_RANGE), ("long", LONG_RANGE), ("boolean", None)):
            if kind in members:
                out.append((str(f["name"]), limits, nullable))
    return tuple(out)


def _scalars_hold(
    datum: Mapping[str, Any], fields: tuple[tuple[str, tuple[int, int] | None, bool], ...]
) -> bool:
    """Whether every such field holds an int within its range, a bool, or an allowed ``None``."""
    for name, limits, nullable in fields:
        value = datum.get(name)
        if value is None:
            if not nullable:
                return False
        elif limits is None:
            if value.__class__ is not bool:
                return False
        elif value.__class__ is not int or not limits[0] <= value <= limits[1]:
            return False
    return True


_DEFAULT: SchemaRegistry | None = None


def registry() -> SchemaRegistry:
    """The process-wide registry of the project's schemas (loaded once)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = SchemaRegistry()
    return _DEFAULT
