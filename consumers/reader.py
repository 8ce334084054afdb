"""Reading whole ledger topics (operators, the demo, the auditor)."""

from __future__ import annotations

import time

from confluent_kafka import Message

from consumers.runtime.reader import read_partition
from consumers.runtime.records import Record, decode_record, key_text
from consumers.tables import TableFollower
from ledger.authn import Keyring
from ledger.authority import takes_over
from ledger.credentials import load_keyring
from ledger.events import JournalEntry, OperationState, PolicyChange
from ledger.settings import LedgerSettings
from ledger.topology import Topic


def _keyring(settings: LedgerSettings, authentic: bool) -> Keyring | None:
    # A reader writes nothing: no key is created here (the stages create them).
    return load_keyring(settings, missing_ok=True) if authentic else None


def read_topic(
    settings: LedgerSettings, topic: str, timeout_s: float = 60.0, *, authentic: bool = True
) -> list[Record]:
    """Every decodable, authentic record of a ledger topic, per partition in offset order.

    Args:
        settings: ledger settings.
        topic: short topic name.
        timeout_s: how long the read may take (seconds).
        authentic: leave out records whose seal is missing or wrong (as every
            stage does, :mod:`ledger.authn`); ``False`` returns them too.

    Raises:
        LedgerError: if the end is not reached in time.
        LocalFileError: a key file is unreadable.
    """
    records: list[Record] = []

    def keep(rec: Record | None, msg: Message) -> None:
        if rec is not None:
            records.append(rec)

    read_partition(settings, topic, None, keep, timeout_s, keyring=_keyring(settings, authentic))
    return records


def latest_by_key(records: list[Record]) -> dict[str, Record]:
    """The latest record per key (what compaction keeps)."""
    latest: dict[str, Record] = {}
    for rec in records:
        latest[rec.key] = rec
    return latest


def read_latest(
    settings: LedgerSettings, topic: str, timeout_s: float = 60.0, *, authentic: bool = True
) -> dict[str, Record]:
    """What compaction keeps of a topic: the latest authentic record per key, tombstones applied.

    A key whose latest value is an authentic tombstone (or does not decode)
    is absent; records and tombstones whose seal is missing or wrong are
    left out unless ``authentic`` is false. Only the latest value of each
    key is decoded.

    Raises:
        LedgerError: if the end is not reached in time.
        LocalFileError: a key file is unreadable.
    """
    latest: dict[str, Message] = {}

    def keep(_: Record | None, msg: Message) -> None:
        key = key_text(msg)
        if msg.value() is None:
            latest.pop(key, None)
        else:
            latest[key] = msg

    read_partition(
        settings, topic, None, keep, timeout_s, decode=False, keyring=_keyring(settings, authentic)
    )
    out: dict[str, Record] = {}
    for key, msg in latest.items():
        rec = decode_record(topic, msg)
        if rec is not None:
            out[key] = rec
    return out


def current_states(settings: LedgerSettings) -> dict[str, OperationState]:
    """The latest ``OperationState`` of every operation in ``ledger.state``."""
    return {
        key: rec.event
        for key, rec in read_latest(settings, Topic.STATE).items()
        if isinstance(rec.event, OperationState)
    }


def wait_for_decision(
    settings: LedgerSettings, topic: str, partition: int, offset: int, timeout_s: float = 30.0
) -> JournalEntry | None:
    """Wait until the processor has journaled its decision on one input.

    The journal is co-partitioned with the processor's inputs, so the entry
    lands on the same partition number as the input.

    Args:
        settings: ledger settings.
        topic: short name of the input topic (``intents``, ``claims`` ...).
        partition: the input's partition.
        offset: the input's offset.
        timeout_s: how long to wait (seconds).

    Returns:
        The journal entry, or ``None`` if the processor did not decide in time
        (is it running?).
    """
    found: list[JournalEntry] = []

    def look(key: str, rec: Record | None) -> None:
        e = rec.event if rec is not None else None
        if isinstance(e, JournalEntry) and (e.input_topic, e.input_partition, e.input_offset) == (
            topic,
            partition,
            offset,
        ):
            found.append(e)

    follower = TableFollower(settings, Topic.JOURNAL, look)
    try:
        follower.follow({partition})
        deadline = time.monotonic() + timeout_s
        while not found and time.monotonic() < deadline:
            time.sleep(0.1)
            follower.catch_up()
    finally:
        follower.close()
    return found[0] if found else None


def policy_in_force(settings: LedgerSettings, timeout_s: float = 60.0) -> PolicyChange | None:
    """The authentic policy change in force, as the authority kernel holds it.

    Reads the ``policy`` topic and keeps, of its authentic records, the
    latest by effective time that takes over (:func:`ledger.authority.takes_over`);
    ``None`` when no change was ever published (the configured version is
    in force).

    Raises:
        LedgerError: if the end is not reached in time.
    """
    in_force: PolicyChange | None = None
    for rec in read_topic(settings, Topic.POLICY, timeout_s):
        if isinstance(rec.event, PolicyChange) and takes_over(rec.key, rec.event, in_force):
            in_force = rec.event
    return in_force


def policy_effective_at(settings: LedgerSettings, now_ms: int) -> tuple[int, PolicyChange | None]:
    """When a policy change published now takes effect, and the change in force.

    ``now_ms``, or one millisecond after the change in force when that is
    not earlier (a clock behind the one that set it): stages order changes
    by effective time (:func:`ledger.authority.supersedes`), so a new change
    must be later than the one it replaces.

    Returns:
        ``(effective_at_ms, in_force)``.

    Raises:
        LedgerError: if the policy topic's end is not reached in time.
    """
    in_force = policy_in_force(settings)
    if in_force is not None and in_force.effective_at_ms >= now_ms:
        return in_force.effective_at_ms + 1, in_force
    return now_ms, in_force
