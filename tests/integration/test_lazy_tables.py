"""The authority kernel's tables after a restart, followed lazily, on the real broker.

A restarted kernel files every approval and approval use by key and checks a
key's signatures only when a request names it, or when it is idle. The rows
must come out as an eager restore made them: a consumed approval stays
consumed, a forged use does not consume the approval it names, and the
forged record is reported (an ``UNAUTHENTICATED`` operating event naming its
position) without any request naming its approval. The relay's receipts
table, lazy as well, reports a forged receipt the same way.
"""

from __future__ import annotations

import time

import pytest

from consumers.reader import current_states, read_topic
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import OperatingEvent
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.forge import forge
from testbed.harness import Harness
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration

FIRST = "refund:lazy-first:v1"
AGAIN = "refund:lazy-again:v1"
LATER = "refund:lazy-later:v1"


def _refused_at(
    settings: LedgerSettings, topic: str, partition: int, offset: int, by: str = "authority"
) -> list[str]:
    return [
        r.event.reason
        for r in read_topic(settings, "operating-events")
        if isinstance(r.event, OperatingEvent)
        and r.event.kind == "UNAUTHENTICATED"
        and r.event.component == by
        and (r.event.source_topic, r.event.source_partition, r.event.source_offset)
        == (topic, partition, offset)
    ]


def test_a_restarted_kernel_checks_filed_approvals_and_uses_as_an_eager_one_did(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-used")
        approve(pub, "ap-spare")
        publish(pub, FIRST, approval="ap-used")
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(settings)[FIRST].state == S.OUTCOME_VERIFIED

        # An attacker without the kernel's key consumes the spare approval for
        # an operation of theirs while the kernel is down.
        harness.kill("authority")
        forged = forge(settings, "approval_use", approval_id="ap-spare", operation_id=FIRST)
        harness.restart("authority")

        # Reported without any request naming ap-spare (checked while idle).
        deadline = time.monotonic() + 60
        while not _refused_at(settings, forged.topic, forged.partition, forged.offset):
            assert time.monotonic() < deadline, "the forged use was never reported"
            harness.wait_quiescent(30)
        [reason] = _refused_at(settings, forged.topic, forged.partition, forged.offset)
        assert "not authentic" in reason, reason

        # The genuine use, filed and checked on demand, still stands; the
        # forged one consumed nothing.
        publish(pub, AGAIN, approval="ap-used")
        publish(pub, LATER, amount=6000, approval="ap-spare")
        harness.wait_quiescent(90)
        states = current_states(settings)
        assert states[AGAIN].state == S.NEEDS_REAUTHORISATION, states[AGAIN]
        assert states[LATER].state == S.OUTCOME_VERIFIED, states[LATER]
        assert harness.effects("payments", AGAIN) == 0
        assert harness.effects("payments", LATER) == 1
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()


def test_a_restarted_relay_reports_a_forged_receipt_and_sends_nothing_again(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-relay")
        publish(pub, FIRST, approval="ap-relay")
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(settings)[FIRST].state == S.OUTCOME_VERIFIED
        assert harness.effects("payments", FIRST) == 1

        # While the relay is down, an attacker deletes the operation's receipt
        # (a tombstone without the relay's seal), hoping a restarted relay
        # forgets the effect it sent.
        harness.kill("relay")
        forged = forge(settings, "tombstone", topic="receipts", operation_id=FIRST)
        harness.restart("relay")

        deadline = time.monotonic() + 60
        while not _refused_at(settings, "receipts", forged.partition, forged.offset, by="relay"):
            assert time.monotonic() < deadline, "the forged receipt was never reported"
            harness.wait_quiescent(30)
        [reason] = _refused_at(settings, "receipts", forged.partition, forged.offset, by="relay")
        assert "not authentic" in reason and FIRST in reason, reason
        assert current_states(settings)[FIRST].state == S.OUTCOME_VERIFIED
        assert harness.effects("payments", FIRST) == 1
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()
