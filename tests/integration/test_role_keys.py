"""Per-role keys on a real broker (issue 29): a compromised relay cannot forge the processor's.

An attacker who took the relay's host holds the relay's private key and
WRITE on every topic. It seals an in-flight ``state`` record and a copy of a
``journal`` entry with that key, genuinely. The processor, restarted, refuses
both (an operating event each, never a crash) and keeps the operation where
its authentic records left it; the auditor names both records, with the
reason; every stage stays alive and a new operation still goes through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Message, Producer

from consumers.auditor import run_audit
from consumers.reader import current_states, read_topic
from consumers.stage import Record, read_partition
from ledger.authn import AUTH_HEADER, Seal, SigningKey
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import JournalEntry, OperatingEvent
from ledger.kafka import client_config
from ledger.rolekeys import role_key, rotate
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.forge import forge
from testbed.harness import Harness
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration

OP = "refund:rolekeys:v1"
LATER = "refund:rolekeys-later:v1"
RELAY_ON_PROCESSOR = "trusted as relay; this topic is written by processor"


def _journal_copy_sealed_by_relay(settings: LedgerSettings) -> tuple[int, int]:
    """Append a copy of the operation's first journal entry, sealed with the relay's key."""
    entry = next(
        r
        for r in read_topic(settings, "journal")
        if isinstance(r.event, JournalEntry) and r.key == OP
    )
    return _append_sealed(
        settings, "journal", OP, entry.event.to_bytes(), role_key(settings, "relay")
    )


def _append_sealed(
    settings: LedgerSettings, topic: str, op: str, value: bytes, key: SigningKey
) -> tuple[int, int]:
    """Append ``value`` to ``topic`` under ``op``, sealed with ``key``; where it landed."""
    landed: list[tuple[int, int]] = []
    producer = Producer(client_config(settings, partitioner="murmur2_random"))
    producer.produce(
        settings.topic(topic),
        key=op.encode(),
        value=value,
        headers=[(AUTH_HEADER, key.seal(topic, op.encode(), value))],
        on_delivery=lambda err, msg: landed.append((msg.partition() or 0, msg.offset() or 0)),
    )
    assert producer.flush(30) == 0 and landed
    return landed[0]


@contextmanager
def _one_refund_verified(settings: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher]]:
    """Every stage running against the payment gateway, refund ``OP`` verified; stopped after."""
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-1")
        publish(pub, OP, approval="ap-1")
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(settings)[OP].state == S.OUTCOME_VERIFIED
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def test_processor_records_sealed_with_the_relays_key_are_refused_and_named(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    with _one_refund_verified(settings) as (harness, pub):
        assert run_audit(settings, read_sinks=False).unauthenticated_records == []

        forged_state = forge(settings, "state", operation_id=OP, sealed_by="relay")
        journal_at = _journal_copy_sealed_by_relay(settings)
        harness.kill("processor")
        harness.restart("processor")
        harness.wait_quiescent(90)

        # The processor kept the authentic state, and said why it refused the forgery.
        assert current_states(settings)[OP].state == S.OUTCOME_VERIFIED
        refusals = [
            r.event
            for r in read_topic(settings, "operating-events")
            if isinstance(r.event, OperatingEvent)
            and r.event.component == "processor"
            and r.event.kind == "UNAUTHENTICATED"
            and r.event.source_offset == forged_state.offset
            and r.event.source_partition == forged_state.partition
        ]
        assert refusals and RELAY_ON_PROCESSOR in refusals[0].reason, refusals

        # The stages live on: a new operation goes through.
        approve(pub, "ap-2")
        publish(pub, LATER, approval="ap-2")
        harness.wait_quiescent(90)
        assert current_states(settings)[LATER].state == S.OUTCOME_VERIFIED
        assert all(harness.alive(c) for c in ("processor", "authority", "relay"))

        report = run_audit(settings, read_sinks=False)
        named = {
            (r["topic"], r["partition"], r["offset"]): str(r["reason"])
            for r in report.unauthenticated_records
        }
        state_at = ("state", forged_state.partition, forged_state.offset)
        assert RELAY_ON_PROCESSOR in named.get(state_at, ""), named
        assert RELAY_ON_PROCESSOR in named.get(("journal", *journal_at), ""), named
        assert report.violations == [], report.violations


def _state_sealers(settings: LedgerSettings, ops: set[str]) -> set[str]:
    """The key IDs named by the seals of the operations' ``state`` records."""
    found: set[str] = set()

    def keep(rec: Record | None, msg: Message) -> None:
        if rec is not None and rec.key in ops:
            found.add(Seal.parse(dict(msg.headers() or [])[AUTH_HEADER]).key_id)

    read_partition(settings, "state", None, keep)
    return found


def _copy_sealed_with(settings: LedgerSettings, key: SigningKey, op: str) -> tuple[int, int]:
    """Append a copy of the operation's latest ``state`` record, sealed with ``key``."""
    latest = [r for r in read_topic(settings, "state") if r.key == op and r.raw]
    return _append_sealed(settings, "state", op, latest[-1].raw, key)


def test_a_rotated_processor_key_verifies_through_its_overlap_and_not_after_it(
    ledger_settings: LedgerSettings,
) -> None:
    """``ledger keys rotate processor`` on a running ledger.

    With an overlap, the processor restarted on its new key goes on, and its
    readers (the kernel, the relay, the auditor) take its new seals from the
    trust file while every record sealed before still verifies. With no
    overlap, the retired key's holder can no longer add a record: a copy
    sealed with it after the rotation is named by the audit, and the records
    it sealed in service are not.
    """
    settings = ledger_settings
    with _one_refund_verified(settings) as (harness, pub):
        first = rotate(settings, "processor", overlap_s=3600)
        assert first.old_key_id != first.new_key_id
        harness.kill("processor")
        harness.restart("processor")
        approve(pub, "ap-2")
        publish(pub, LATER, approval="ap-2")
        harness.wait_quiescent(90)
        assert current_states(settings)[LATER].state == S.OUTCOME_VERIFIED
        assert all(harness.alive(c) for c in ("processor", "authority", "relay"))
        sealers = _state_sealers(settings, {OP, LATER})
        assert {first.old_key_id, first.new_key_id} <= sealers, sealers
        report = run_audit(settings, read_sinks=False)
        assert report.unauthenticated_records == [] and report.violations == []

        harness.stop()
        retired = role_key(settings, "processor")  # the second key, about to retire
        second = rotate(settings, "processor", overlap_s=0)
        assert second.old_key_id == first.new_key_id
        late = _copy_sealed_with(settings, retired, LATER)

        report = run_audit(settings, read_sinks=False)
        named = {(r["topic"], r["partition"], r["offset"]) for r in report.unauthenticated_records}
        assert named == {("state", *late)}, report.unauthenticated_records
        assert report.violations == [], report.violations
