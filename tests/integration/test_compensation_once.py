"""A compensation is of its original's effect, and at most once, on the real broker.

The real stages run against a reversible-internal credit sink. Once a
credit settled:

* a second full reversal, under its own valid approval, is refused before
  admission with a reason naming the first, and the sink pays nothing;
* a reversal under an approval for another subject, or on another account,
  is refused, and the original's history names neither as compensating it;
* two partial reversals within the credit both settle, and a third that
  would exceed it is refused naming them;
* a state record of an over-compensation sealed with the processor's key
  (an earlier release, or anyone holding that key) is an audit violation.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from consumers.auditor import run_audit
from consumers.history import read_history
from consumers.reader import current_states
from ledger.authn import AUTH_HEADER
from ledger.contracts import EffectContract
from ledger.credentials import stage_sealer
from ledger.events import Approval
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.topology import partition_for
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import REVIEWER, approve

pytestmark = pytest.mark.integration

CREDITS = EffectContract(
    idempotent=True,
    readback=True,
    postcondition=True,
    fencing=True,
    key_retention_s=604_800,
    compensable=True,
    consequence="reversible-internal",
)
ORIGINAL = "credit:comp-once:v1"
AMOUNT = 3000


def grant(pub: LedgerPublisher, approval_id: str, subject: str = "customer-1") -> None:
    """A reviewer's grant for ``subject`` (signed by the test reviewer, trusted by ``approve``)."""
    pub.publish_approval(
        REVIEWER.sign(
            Approval(
                approval_id=approval_id,
                reviewer="rev",
                policy_version=1,
                expires_at_ms=1_000_000,
                scope_subject=subject,
                scope_max_amount_minor=9000,
                granted_at_ms=0,
            ),
            ledger_id=pub.settings.ledger_identity,
        )
    )


def credit(
    pub: LedgerPublisher,
    op: str,
    approval_id: str,
    amount: int = AMOUNT,
    *,
    compensates: str | None = None,
    subject: str = "customer-1",
    account: str = "acct-1",
) -> None:
    """Publish a credit (or, with ``compensates``, its reversal) of ``amount`` minor units."""
    pub.publish(
        operation_id=op,
        sink="credits",
        action="reverse_credit" if compensates else "apply_credit",
        params={"account": account, "amount_minor": amount, "currency": "GBP"},
        actor="svc",
        subject=subject,
        purpose="fee-remediation",
        decision_version=1,
        approval_id=approval_id,
        compensates=compensates,
    )


@pytest.fixture
def settled(ledger_settings: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher]]:
    """The stages running, and the original credit of 3000 verified."""
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("credits", CREDITS, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    try:
        approve(pub, "ap-original")
        credit(pub, ORIGINAL, "ap-original")
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(ledger_settings)[ORIGINAL].state == S.OUTCOME_VERIFIED
        yield harness, pub
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()


def reverse(
    harness: Harness, pub: LedgerPublisher, op: str, amount: int = AMOUNT, **kwargs: str
) -> str:
    """Publish a reversal of the original under its own fresh approval; its resting state."""
    approval_id = f"ap-{op}"
    grant(pub, approval_id, kwargs.get("subject", "customer-1"))
    credit(pub, op, approval_id, amount, compensates=ORIGINAL, **kwargs)
    harness.wait_quiescent(90)
    return str(current_states(pub.settings)[op].state)


def test_a_second_full_compensation_is_refused_naming_the_first_and_pays_nothing(
    settled: tuple[Harness, LedgerPublisher],
) -> None:
    harness, pub = settled
    first, second = "credit-reversal:comp-once:v1", "credit-reversal:comp-once:v2"
    assert reverse(harness, pub, first) == S.OUTCOME_VERIFIED
    assert reverse(harness, pub, second) == S.ABANDONED
    refused = current_states(pub.settings)[second]
    assert f"already compensated by {first}" in refused.reason, refused.reason
    assert refused.dispatches == 0 and refused.admitted_approval_id is None
    assert harness.effects("credits", second) == 0
    assert harness.effects("credits", first) == 1
    assert read_history(pub.settings, ORIGINAL, links=True).compensated_by == (first,)


def test_a_compensation_for_another_subject_or_account_is_refused_and_not_linked(
    settled: tuple[Harness, LedgerPublisher],
) -> None:
    harness, pub = settled
    other, moved = "credit-reversal:comp-once:other", "credit-reversal:comp-once:moved"
    assert reverse(harness, pub, other, subject="customer-2") == S.ABANDONED
    assert reverse(harness, pub, moved, account="acct-2") == S.ABANDONED
    states = current_states(pub.settings)
    assert "subject customer-2" in states[other].reason, states[other].reason
    assert 'account "acct-2"' in states[moved].reason, states[moved].reason
    assert harness.effects("credits", other) == harness.effects("credits", moved) == 0
    assert read_history(pub.settings, ORIGINAL, links=True).compensated_by == ()


def test_partial_compensations_within_the_original_pass_and_one_beyond_is_refused(
    settled: tuple[Harness, LedgerPublisher],
) -> None:
    harness, pub = settled
    a, b, c = (f"credit-reversal:comp-once:part-{n}" for n in "abc")
    assert reverse(harness, pub, a, 1000) == S.OUTCOME_VERIFIED
    assert reverse(harness, pub, b, 2000) == S.OUTCOME_VERIFIED
    assert reverse(harness, pub, c, 1) == S.ABANDONED
    reason = current_states(pub.settings)[c].reason
    assert a in reason and b in reason and "3000 of its 3000" in reason, reason
    assert harness.effects("credits", c) == 0
    assert read_history(pub.settings, ORIGINAL, links=True).compensated_by == (a, b)
    assert run_audit(pub.settings, read_sinks=False).violations == []


def test_the_auditor_flags_an_over_compensation_written_with_the_processors_key(
    settled: tuple[Harness, LedgerPublisher],
) -> None:
    harness, pub = settled
    first, forged = "credit-reversal:comp-once:v1", "credit-reversal:comp-once:forged"
    assert reverse(harness, pub, first) == S.OUTCOME_VERIFIED
    assert run_audit(pub.settings, read_sinks=False).violations == []
    # A second full reversal, verified, as an earlier release could have admitted it.
    settings = pub.settings
    model = current_states(settings)[first]
    state = model.model_copy(update={"operation_id": forged, "admitted_at_ms": 10**9})
    key, value = forged.encode(), state.to_bytes()
    seal = stage_sealer(settings, "processor")("state")
    producer = Producer(client_config(settings))
    producer.produce(
        settings.topic("state"),
        key=key,
        value=value,
        partition=partition_for(key, settings.partitions),
        headers=[(AUTH_HEADER, seal.seal("state", key, value))],
    )
    assert producer.flush(10) == 0
    report = run_audit(settings, read_sinks=False)
    bounds = [v for v in report.violations if v.invariant == "compensation-bounds"]
    assert [v.operation_id for v in bounds] == [forged], report.violations
    assert f"{first} (the first)" in bounds[0].evidence
    assert f"6000 minor units are compensated of {ORIGINAL}'s 3000" in bounds[0].evidence
