"""Reading whole ledger topics (operators, the demo, the auditor)."""

from __future__ import annotations

from confluent_kafka import Message

from consumers.stage import Record, read_partition
from ledger.config import LedgerSettings
from ledger.events import OperationState


def read_topic(settings: LedgerSettings, topic: str, timeout_s: float = 60.0) -> list[Record]:
    """Every decodable record of a ledger topic, partition by partition, in offset order.

    Args:
        settings: ledger settings.
        topic: short topic name.
        timeout_s: how long the read may take (seconds).

    Raises:
        LedgerError: if the end is not reached in time.
    """
    records: list[Record] = []

    def keep(rec: Record | None, msg: Message) -> None:
        if rec is not None:
            records.append(rec)

    read_partition(settings, topic, None, keep, timeout_s)
    return records


def latest_by_key(records: list[Record]) -> dict[str, Record]:
    """The latest record per key (what compaction keeps)."""
    latest: dict[str, Record] = {}
    for rec in records:
        latest[rec.key] = rec
    return latest


def current_states(settings: LedgerSettings) -> dict[str, OperationState]:
    """The latest ``OperationState`` of every operation in ``ledger.state``."""
    out: dict[str, OperationState] = {}
    for key, rec in latest_by_key(read_topic(settings, "state")).items():
        if isinstance(rec.event, OperationState):
            out[key] = rec.event
    return out
