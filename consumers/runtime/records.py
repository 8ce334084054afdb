"""Input records as a stage and a reader see them: decoded, positioned, timestamped.

:class:`Record` is what every reader of a ledger topic hands on; :func:`decode_record`
makes one from a consumed message (``None`` for what is not a record: a tombstone, a
reserved compaction record, a value that does not decode).
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from ledger.events import Event, decode_event
from ledger.topology import is_reserved_key


@dataclass(frozen=True)
class Record:
    """One decoded input record.

    Attributes:
        topic: short topic name (without the prefix).
        partition: partition.
        offset: offset.
        key: record key (text).
        raw: the value bytes as read.
        event: the decoded event.
        headers: the record's headers as read (the seal, the W3C trace
            context: see :mod:`ledger.tracing`); empty when not kept.
        timestamp_ms: its Kafka timestamp (Unix ms: the producer's or the
            broker's clock), ``None`` when it has none; a witness of the time
            for the stage's clock (:class:`consumers.localfiles.LastGoodClock`).
    """

    topic: str
    partition: int
    offset: int
    key: str
    raw: bytes
    event: Event
    headers: tuple[tuple[str, str | bytes | None], ...] = ()
    timestamp_ms: int | None = None


def kafka_timestamp_ms(msg: Message) -> int | None:
    """A message's Kafka timestamp in ms, ``None`` when it has none (or a test double lacks it)."""
    timestamp = getattr(msg, "timestamp", None)
    if timestamp is None:
        return None
    kind, stamp = timestamp()
    return int(stamp) if kind != TIMESTAMP_NOT_AVAILABLE and stamp > 0 else None


def key_text(msg: Message) -> str:
    """A message's key as text (``""`` when it has none)."""
    key = msg.key()
    return key.decode("utf-8", "replace") if key is not None else ""


def decode_record(topic: str, msg: Message) -> Record | None:
    """Decode a message read from a ledger topic.

    Returns:
        The record, or ``None`` for tombstones, :func:`force_compaction`'s
        reserved records and values that do not decode.
    """
    key = key_text(msg)
    value = msg.value()
    if value is None or is_reserved_key(key):
        return None
    try:
        event = decode_event(value)
    except Exception:
        return None
    return Record(
        topic,
        msg.partition() or 0,
        msg.offset() or 0,
        key,
        value,
        event,
        timestamp_ms=kafka_timestamp_ms(msg),
    )
