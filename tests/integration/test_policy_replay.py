"""A replayed policy change, on the real broker.

An attacker who can write the ``policy`` topic (no ACLs) but holds no
operator key appends a copy of an old, authentic change (its bytes and its
seal as they were) after the change that superseded it, hoping to bring
back the old version and, with it, the approvals granted under it. The
kernel orders changes by their signed effective time, not by offset: the
copy changes nothing, is reported as ``BAD_INPUT``, and an intent under an
approval of the old version still needs reauthorisation, before and after a
restart of every stage. Each change has its own key, so compaction cannot
let the copy displace the newer change either.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from consumers.reader import current_states, policy_in_force, read_topic
from consumers.stage import Record, read_partition
from ledger.authority import policy_key
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import OperatingEvent, PolicyChange
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from testbed.people import can_sign
from tests.helpers import replay
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration

BEFORE = "refund:policy-before:v1"
AFTER = "refund:policy-after:v1"


def _changes(settings: LedgerSettings) -> list[tuple[PolicyChange, Message]]:
    """Every policy change with the message it came in (key, value and headers as read)."""
    found: list[tuple[PolicyChange, Message]] = []

    def keep(rec: Record | None, msg: Message) -> None:
        if rec is not None and isinstance(rec.event, PolicyChange):
            found.append((rec.event, msg))

    read_partition(settings, "policy", None, keep)
    return found


def test_a_replayed_old_policy_change_does_not_bring_its_approvals_back(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY)
    pub = LedgerPublisher(settings)
    try:
        can_sign(pub, settings, "ops")
        pub.publish_policy(1, "ops", 1_000)
        approve(pub, "ap-policy-1")  # granted under policy 1
        pub.publish_policy(2, "ops", 2_000)
        harness.start_all()
        publish(pub, BEFORE, approval="ap-policy-1")
        harness.wait_quiescent(90)
        assert current_states(settings)[BEFORE].state == S.NEEDS_REAUTHORISATION

        changes = _changes(settings)
        first, message = next((c, m) for c, m in changes if c.version == 1)
        assert message.key() == policy_key(first).encode()
        assert policy_key(first) != policy_key(changes[-1][0])  # compaction keeps both
        at = replay(settings, "policy", message)

        # The copy is authentic but older than the change in force: refused.
        publish(pub, AFTER, approval="ap-policy-1")
        harness.wait_quiescent(90)
        states = current_states(settings)
        assert states[AFTER].state == S.NEEDS_REAUTHORISATION, states[AFTER]
        assert "policy version changed" in states[AFTER].reason
        in_force = policy_in_force(settings)
        assert in_force is not None and in_force.version == 2
        refused = [
            r.event
            for r in read_topic(settings, "operating-events")
            if isinstance(r.event, OperatingEvent)
            and (r.event.source_topic, r.event.source_partition, r.event.source_offset)
            == ("policy", *at)
        ]
        assert refused and "not later than version 2" in refused[0].reason, refused

        # A restart reads the topic again, copy included: still policy 2.
        for component in ("authority", "relay", "processor"):
            harness.kill(component)
        harness.restart()
        harness.wait_quiescent(90)
        assert harness.effects("payments", AFTER) == 0
        assert harness.effects("payments", BEFORE) == 0
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()
