"""A recovery receipt for every resume (issue 14 item 4), on the real broker.

Each stage is killed at a seam by its own fault hook (SIGKILL), restarted,
and the ledger must then hold exactly one new recovery receipt for the
operation, answering the article's list.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from consumers.reader import current_states, read_topic
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import RecoveryReceipt
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(ledger_settings: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher]]:
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    try:
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def receipts(harness: Harness, op: str) -> list[RecoveryReceipt]:
    return [
        r.event
        for r in read_topic(harness.settings, "recovery-receipts")
        if isinstance(r.event, RecoveryReceipt) and r.key == op
    ]


def filled(r: RecoveryReceipt) -> None:
    """Every item of the article's list is answered."""
    assert r.checkpoint_version >= 1 and r.claimant
    assert r.observation_source and r.observation_status and r.observed_at_ms >= 0
    assert r.authority.startswith("prior admission") and r.authority_policy_version == 1
    assert r.action and r.postcondition and r.uncertainty


def kill_and_resume(harness: Harness, component: str, seam: str, op: str, pub) -> None:  # type: ignore[no-untyped-def]
    approve(pub)
    harness.arm(seam, op)
    publish(pub, op)
    harness.start_all()
    deadline = time.monotonic() + 90
    while harness.alive(component) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling a condition with a deadline, not a synchronising sleep
    assert not harness.alive(component), f"{component} did not die at {seam}"
    harness.wait_quiescent(90)
    assert receipts(harness, op) == []
    harness.restart(component)
    harness.wait_quiescent(90)
    assert current_states(harness.settings)[op].state == S.OUTCOME_VERIFIED
    assert harness.effects("payments", op) == 1


def test_relay_killed_after_the_sink_commits_resumes_with_one_receipt(ledger) -> None:
    harness, pub = ledger
    op = "refund:rr-relay:v1"
    kill_and_resume(harness, "relay", "after_sink_commit_before_receipt", op, pub)
    (r,) = receipts(harness, op)
    filled(r)
    assert r.action == "COMPLETE" and r.observation_status == "COMMITTED"
    assert r.claimant == "relay-0" and r.effect_id is not None
    assert current_states(harness.settings)[op].recovery_receipts == 1


@pytest.fixture
def two_hop_ledger(ledger_settings: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher]]:
    """The ledger with every verification through a VERIFY dispatch (no inline readback)."""
    settings = ledger_settings.model_copy(update={"relay_inline_verify": False})
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def test_relay_killed_before_verification_resumes_with_one_receipt(two_hop_ledger) -> None:
    # The committed receipt is in the ledger and its VERIFY dispatched when the relay dies.
    harness, pub = two_hop_ledger
    op = "refund:rr-verify:v1"
    kill_and_resume(harness, "relay", "after_commit_before_verification", op, pub)
    (r,) = receipts(harness, op)
    filled(r)
    assert r.action == "COMPLETE" and r.postcondition.startswith("verified")
    assert r.uncertainty == "none"


def test_relay_killed_before_its_inline_verification_resumes_with_one_receipt(ledger) -> None:
    # With the postcondition read right after the effect, the seam falls between the
    # sink's commit and the receipt: the resume reads the effect back, then verifies.
    harness, pub = ledger
    op = "refund:rr-inline:v1"
    kill_and_resume(harness, "relay", "after_commit_before_verification", op, pub)
    (r,) = receipts(harness, op)
    filled(r)
    assert r.action == "COMPLETE" and r.observation_status == "COMMITTED"
    assert r.effect_id is not None
    assert current_states(harness.settings)[op].recovery_receipts == 1


def test_processor_killed_after_admission_resumes_with_one_receipt(ledger) -> None:
    harness, pub = ledger
    op = "refund:rr-admitted:v1"
    kill_and_resume(harness, "processor", "after_admission_before_dispatch", op, pub)
    (r,) = receipts(harness, op)
    filled(r)
    assert r.action == "EXECUTE" and r.claimant == "processor-0"
    assert r.observation_status == "ABSENT" and "no dispatch" in r.observation_source
    assert r.postcondition.startswith("pending")
    assert current_states(harness.settings)[op].recovery_receipts == 1
