"""Input records checked at a stage's door: bounds, placement, seal, decoding.

:func:`decode_input` turns one consumed message into a :class:`~consumers.runtime.records.Record`
or a :class:`Refusal` (the operating event of a dead letter, DESIGN.md "Trust
boundary": inputs are bounded, placed, sealed and decodable, or refused with
their evidence kept); the stage counts and writes what it returns.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Message

from consumers.runtime.records import Record, kafka_timestamp_ms, key_text
from ledger.authn import Keyring, unverifiable
from ledger.errors import LedgerError
from ledger.events import OperatingEvent, RecordHeader, decode_event
from ledger.identity import MAX_INPUT_BYTES, MAX_KEY_BYTES
from ledger.settings import LedgerSettings
from ledger.topology import is_reserved_key, misplaced

log = logging.getLogger(__name__)


def seal_refusal_kind(problem: str) -> str:
    """``UNVERIFIABLE`` for a seal by a key not held here, else ``UNAUTHENTICATED``."""
    return "UNVERIFIABLE" if unverifiable(problem) else "UNAUTHENTICATED"


def refusal_verdict(problem: str) -> str:
    """How a refused input is described: it cannot be verified here, or it is not authentic."""
    return "cannot be verified here" if unverifiable(problem) else "not authentic"


def record_event(
    component: str,
    rec: Record,
    kind: str,
    reason: str,
    *,
    operation_id: str | None = None,
    id_suffix: str | None = None,
    keep_bytes: bool = True,
) -> OperatingEvent:
    """An operating event about one input record (a dead letter when it keeps the bytes).

    The event ID, ``{component}:{topic}:{partition}:{offset}:{id_suffix or kind}``,
    is derived from the input's position, so reprocessing writes the same ID.
    """
    return OperatingEvent(
        event_id=f"{component}:{rec.topic}:{rec.partition}:{rec.offset}:{id_suffix or kind}",
        operation_id=operation_id,
        component=component,
        kind=kind,
        reason=reason,
        source_topic=rec.topic,
        source_partition=rec.partition,
        source_offset=rec.offset,
        original_bytes=rec.raw if keep_bytes else None,
    )


def oversized(msg: Message) -> str | None:
    """Why a record is too large to copy into a dead letter, or ``None`` when it is within bounds.

    A value over :data:`ledger.identity.MAX_INPUT_BYTES` or a key over
    :data:`ledger.identity.MAX_KEY_BYTES` is refused before it is decoded: a
    copy could exceed the producer's limit and make the stage fail the same
    batch for ever (DESIGN.md "Trust boundary": inputs are bounded).
    """
    raw, raw_key = msg.value() or b"", msg.key() or b""
    if len(raw_key) > MAX_KEY_BYTES:
        return f"a key of {len(raw_key)} bytes (over {MAX_KEY_BYTES})"
    if len(raw) > MAX_INPUT_BYTES:
        return f"a value of {len(raw)} bytes (over {MAX_INPUT_BYTES})"
    return None


def dead_letter(
    component: str,
    topic: str,
    msg: Message,
    reason: str,
    *,
    keyed_by_operation: bool = True,
    kind: str = "BAD_INPUT",
) -> tuple[str, OperatingEvent]:
    """The operating event of a record a stage refuses (a dead letter), and its key.

    The record's value, key bytes and headers are kept while they are within
    the input bounds; a larger value or key is named by SHA-256, size and
    position instead (and headers over 16 KiB are dropped, with a note), so
    the dead letter always fits under the producer's limit.

    Args:
        component: the stage writing it.
        topic: the record's short topic name.
        msg: the record as consumed.
        reason: why it is refused.
        keyed_by_operation: the record's key is an operation ID (else the
            event names no operation).
        kind: ``BAD_INPUT`` (does not decode, over the bounds) or
            ``UNAUTHENTICATED`` (its seal is missing or wrong).

    Returns:
        ``(key, OperatingEvent)``: the record's key, or ``sha256:<hex>`` of a
        key over the bound.
    """
    raw, raw_key = msg.value() or b"", msg.key() or b""
    if len(raw_key) > MAX_KEY_BYTES:
        key = f"sha256:{hashlib.sha256(raw_key).hexdigest()}"
        reason = f"{reason}; key {key}"
        operation_id = None
    else:
        key = key_text(msg)
        operation_id = (key or None) if keyed_by_operation else None
    copied = len(raw) <= MAX_INPUT_BYTES
    headers = [
        RecordHeader(name=str(h[0]), value=h[1].encode() if isinstance(h[1], str) else h[1])
        for h in msg.headers() or []
    ]
    if sum(len(h.name) + len(h.value or b"") for h in headers) > MAX_KEY_BYTES * 16:
        reason = f"{reason}; {len(headers)} headers not copied (over {MAX_KEY_BYTES * 16} bytes)"
        headers = []
    if not copied:
        digest = hashlib.sha256(raw).hexdigest()
        reason = f"{reason}; value sha256 {digest}, {len(raw)} bytes, not copied"
    position = f"{topic}:{msg.partition()}:{msg.offset()}"
    return key, OperatingEvent(
        event_id=f"{component}:{position}:{kind}",
        operation_id=operation_id,
        component=component,
        kind=kind,
        reason=reason,
        source_topic=topic,
        source_partition=msg.partition(),
        source_offset=msg.offset(),
        original_bytes=msg.value() if copied else None,
        original_key=msg.key() if len(raw_key) <= MAX_KEY_BYTES else None,
        original_headers=headers or None,
    )


@dataclass(frozen=True)
class Refusal:
    """An input a stage refuses: the dead letter to write, and how it is counted.

    Attributes:
        key: the dead letter's key (:func:`dead_letter`).
        event: the operating event.
        forgery: counted as a forgery refused (misplaced: not authentic).
        bad: counted as a dead letter (over the bounds, no key, does not decode).
    """

    key: str
    event: OperatingEvent
    forgery: bool = False
    bad: bool = False


#: ``(msg, short topic, problem) -> refused`` for a seal that is missing or wrong.
Unauthenticated = Callable[[Message, str, str], bool]


def decode_input(
    msg: Message,
    topic: str,
    *,
    component: str,
    settings: LedgerSettings,
    keyring: Keyring,
    unauthenticated: Unauthenticated,
) -> Record | Refusal | None:
    """Decode one consumed message at a stage's door.

    Args:
        msg: the message as consumed.
        topic: its short topic name.
        component: the stage, named in the dead letter.
        settings: ledger settings (partition count, for placement).
        keyring: checks its seal.
        unauthenticated: told of a seal missing or wrong; returns whether it
            is refused (``require_authenticated_records``).

    Returns:
        The record; a :class:`Refusal` for a dead letter; ``None`` to skip
        (reserved keys, never meaningful).
    """
    raw = msg.value()
    key = key_text(msg)
    if is_reserved_key(key):
        return None
    try:
        too_large = oversized(msg)
        if too_large is not None:
            raise LedgerError(f"record at {topic}:{msg.partition()}:{msg.offset()} has {too_large}")
        if not key:
            raise LedgerError("record has no key; ledger records are keyed by ID")
        # Refused whatever the authentication setting: a stage that does
        # not own a key's partition must never decide about it.
        where = misplaced(topic, msg.key() or b"", msg.partition(), settings.partitions)
        if where is not None:
            log.error(
                "%s: MISPLACED record at %s:%s:%s refused: %s",
                component,
                topic,
                msg.partition(),
                msg.offset(),
                where,
            )
            letter = dead_letter(
                component, topic, msg, f"not authentic: {where}", kind="UNAUTHENTICATED"
            )
            return Refusal(*letter, forgery=True)
        if raw is None:
            # A tombstone is never a stage's input; one that no trusted
            # writer sealed is a forgery first (docs/trust-model.md).
            problem = keyring.check(
                topic, msg.key() or b"", None, msg.headers(), timestamp=msg.timestamp()
            )
            if problem is not None and unauthenticated(msg, topic, problem):
                return Refusal(
                    *dead_letter(
                        component,
                        topic,
                        msg,
                        f"{refusal_verdict(problem)} (tombstone): {problem}",
                        kind=seal_refusal_kind(problem),
                    )
                )
        event = decode_event(raw)
        problem = keyring.check(
            topic, msg.key() or b"", raw, msg.headers(), event, timestamp=msg.timestamp()
        )
        if problem is not None and unauthenticated(msg, topic, problem):
            return Refusal(
                *dead_letter(
                    component,
                    topic,
                    msg,
                    f"{refusal_verdict(problem)}: {problem}",
                    kind=seal_refusal_kind(problem),
                )
            )
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        log.error(
            "%s: dead letter at %s:%s:%s: %s",
            component,
            topic,
            msg.partition(),
            msg.offset(),
            reason,
        )
        return Refusal(*dead_letter(component, topic, msg, reason), bad=True)
    headers = tuple((str(h[0]), h[1]) for h in msg.headers() or ())
    return Record(
        topic,
        msg.partition() or 0,
        msg.offset() or 0,
        key,
        raw or b"",
        event,
        headers,
        timestamp_ms=kafka_timestamp_ms(msg),
    )


def seal_refused(
    settings: LedgerSettings, component: str, msg: Message, topic: str, problem: str
) -> bool:
    """Log a record whose seal is missing or wrong; whether it is refused.

    Args:
        settings: ``require_authenticated_records`` says whether it is refused.
        component: the stage, for the log line.
        msg: the record as consumed.
        topic: its short topic name.
        problem: what is wrong with its seal.

    Returns:
        True when it is refused (the default); False when the setting is off
        and it is only reported.
    """
    refused = settings.require_authenticated_records
    log.error(
        "%s: UNAUTHENTICATED record at %s:%s:%s %s: %s",
        component,
        topic,
        msg.partition(),
        msg.offset(),
        "refused" if refused else "accepted (LEDGER_REQUIRE_AUTHENTICATED_RECORDS=false)",
        problem,
    )
    return refused


def table_refusal_event(
    settings: LedgerSettings,
    component: str,
    msg: Message,
    reason: str,
    kind: str,
    *,
    keyed_by_operation: bool,
) -> tuple[str, OperatingEvent]:
    """The operating event of a record a stage's table refused, and its key.

    For a :class:`consumers.tables.TableFollower`'s ``on_bad``: the record
    does not decode (``BAD_INPUT``), is not authentic (``UNAUTHENTICATED``,
    tombstones included) or is sealed by a key not held here
    (``UNVERIFIABLE``); the table treats it as absent. The event keeps the
    record's bytes while they are within the input bounds (:func:`dead_letter`).

    Args:
        settings: for the topic prefix.
        component: the stage writing it.
        msg: the refused record as consumed.
        reason: why the table refused it.
        kind: ``BAD_INPUT``, ``UNAUTHENTICATED`` or ``UNVERIFIABLE``.
        keyed_by_operation: the table's keys are operation IDs.

    Returns:
        ``(key, OperatingEvent)`` to write to ``operating-events``.
    """
    topic = (msg.topic() or "").removeprefix(settings.topic_prefix + ".")
    if kind in ("UNAUTHENTICATED", "UNVERIFIABLE"):
        what = f"{topic} record {key_text(msg)[:200]!r} refused, {reason}"
    else:
        what = f"{topic} record {key_text(msg)[:200]!r} does not decode: {reason}"
    key, event = dead_letter(
        component, topic, msg, what, keyed_by_operation=keyed_by_operation, kind=kind
    )
    return key or "(no key)", event
