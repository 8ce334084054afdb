"""The restore read (:func:`consumers.stage.read_partition`) on the real broker.

A stage restores its tables by reading a compacted topic to its end with the
keyring in hand: sealed records are handed on, unsealed ones refused and
reported. ``force_compaction`` leaves one unsealed tombstone per partition
under the reserved key ``__compaction__``; it carries no meaning, so a
restore passes over it without calling it a forgery (else every restart
after a compaction would raise one UNAUTHENTICATED operating event per
partition). A sealed record found on a partition its key does not name is
refused too: the seal does not cover the partition.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Message, Producer

from consumers.stage import Record, read_partition
from ledger.authn import AUTH_HEADER
from ledger.credentials import load_keyring, stage_sealer
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.topology import COMPACTION_KEY, partition_for

pytestmark = pytest.mark.integration


def test_a_restore_read_skips_compaction_tombstones_and_refuses_forgeries(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    topic = settings.topic("state")
    seal = stage_sealer(settings, "processor")("state")
    producer = Producer(client_config(settings))
    value = b"not decoded here"
    home = partition_for(b"op:sealed", settings.partitions)
    sealed = [(AUTH_HEADER, seal.seal("state", b"op:sealed", value))]
    producer.produce(topic, key=b"op:sealed", value=value, partition=home, headers=sealed)
    # The same sealed record, copied to a partition its key does not name.
    elsewhere = (home + 1) % settings.partitions
    producer.produce(topic, key=b"op:sealed", value=value, partition=elsewhere, headers=sealed)
    producer.produce(
        topic,
        key=b"op:forged",
        value=value,
        partition=partition_for(b"op:forged", settings.partitions),
    )
    producer.produce(topic, key=COMPACTION_KEY, value=None, partition=0)
    producer.produce(topic, key=COMPACTION_KEY, value=None, partition=1)
    assert producer.flush(10) == 0

    handed: list[bytes] = []
    refused: list[tuple[bytes, str]] = []

    def handle(_: Record | None, msg: Message) -> None:
        handed.append(msg.key() or b"")

    def on_refused(msg: Message, problem: str) -> None:
        refused.append((msg.key() or b"", problem))

    keyring = load_keyring(settings, missing_ok=True)
    count = read_partition(
        settings, "state", None, handle, decode=False, keyring=keyring, on_refused=on_refused
    )
    assert handed == [b"op:sealed"]
    assert sorted(key for key, _ in refused) == [b"op:forged", b"op:sealed"], refused
    [misplaced] = [problem for key, problem in refused if key == b"op:sealed"]
    assert misplaced.startswith(f"misplaced: its key belongs on partition {home}"), misplaced
    assert count == 1

    # Without the keyring (a raw reader) the tombstones are read like any record.
    raw: list[bytes] = []
    read_partition(settings, "state", None, lambda _, m: raw.append(m.key() or b""), decode=False)
    assert sorted(raw) == sorted(
        [b"op:sealed", b"op:sealed", b"op:forged", b"__compaction__", b"__compaction__"]
    )
