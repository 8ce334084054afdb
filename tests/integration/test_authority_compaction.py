"""Forged tombstones and replayed grants, then compaction, on the real broker.

An attacker who can write every topic (no ACLs) but holds no key cannot make
a reader believe a forged tombstone or a replayed grant: each is refused. On
a compacted topic, though, Kafka's cleaner does not check seals: it would
delete the authentic record under such a record (attacker trial, stop 25:
the use of an approval, so the approval paid twice; the revocation, so a
revoked approval paid; the policy change in force, so the policy rolled
back). The tables of authority are therefore never compacted: after forced
compaction and a restart of every stage, the use, the revocation and the
policy in force all still stand.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from consumers.reader import current_states, latest_by_key, policy_in_force, read_topic
from consumers.stage import read_partition
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Approval
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.compaction import force_compaction
from testbed.forge import forge
from testbed.harness import Harness
from testbed.people import can_sign
from tests.helpers import replay
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration


def _messages(settings: LedgerSettings, topic: str, key: str) -> list[Message]:
    found: list[Message] = []
    read_partition(
        settings,
        topic,
        None,
        lambda rec, msg: found.append(msg) if msg.key() == key.encode() else None,
    )
    return found


def test_forged_tombstones_and_replayed_grants_erase_nothing_through_compaction(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY)
    pub = LedgerPublisher(settings)
    try:
        can_sign(pub, settings, "ops")
        pub.publish_policy(1, "ops", 1_000)
        approve(pub, "ap-used")
        approve(pub, "ap-revoked")
        harness.start_all()
        publish(pub, "refund:first:v1", approval="ap-used")
        harness.wait_quiescent(90)
        assert harness.effects("payments", "refund:first:v1") == 1

        grant = _messages(settings, "approvals", "ap-revoked")[0]
        granted = latest_by_key(read_topic(settings, "approvals"))["ap-revoked"].event
        assert isinstance(granted, Approval)
        pub.publish_approval(granted.model_copy(update={"status": "REVOKED", "revoked_by": "ops"}))
        pub.publish_policy(2, "ops", 2_000)
        harness.wait_quiescent(90)

        # The attack: the grant replayed after its revocation, forged tombstones on the use
        # and on the policy change in force; then compaction, and a restart of every stage.
        replay(settings, "approvals", grant)
        forge(settings, "tombstone", topic="approval-uses", approval_id="ap-used")
        forge(settings, "tombstone", topic="policy", approval_id="v2@2000")
        harness.wait_quiescent(90)
        force_compaction(settings)
        for component in ("authority", "relay", "processor"):
            harness.kill(component)
        harness.restart()
        harness.wait_quiescent(90)

        assert any(m.value() is not None for m in _messages(settings, "approval-uses", "ap-used"))
        in_force = policy_in_force(settings)
        assert in_force is not None and in_force.version == 2
        publish(pub, "refund:second:v1", approval="ap-used")
        publish(pub, "refund:revoked:v1", approval="ap-revoked")
        harness.wait_quiescent(90)
        states = current_states(settings)
        for op in ("refund:second:v1", "refund:revoked:v1"):
            assert states[op].state == S.NEEDS_REAUTHORISATION, states[op]
            assert harness.effects("payments", op) == 0
        assert harness.effects("payments", "refund:first:v1") == 1
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()
