"""Two compensations of one original, decided at once by two processors, pay once (real broker).

Both full reversals of a settled credit are published while the two
processor instances, which own their partitions, are stopped; then both
continue together, so each decides its compensation with no sight of the
other on ``ledger.state``. The original's owner decides their claims on
its effect (``compensation-tally``): one is admitted and paid, the other is
abandoned with a reason naming the first, its approval unused; the
original's tally names the one it granted, and the audit finds nothing.
"""

from __future__ import annotations

import pytest

from consumers.auditor import run_audit
from consumers.history import read_history
from consumers.reader import current_states
from ledger.events import CompensationTally
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.topology import partition_for
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_compensation_once import CREDITS, credit, grant
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration

ORIGINAL = "credit:comp-tally:v1"
AMOUNT = 3000


def on_partition(partition: int, partitions: int) -> str:
    """A reversal's operation ID whose key lands on ``partition``."""
    return next(
        op
        for n in range(1, 10_000)
        if partition_for(op := f"credit-reversal:comp-tally:v{n}", partitions) == partition
    )


def test_two_compensations_decided_unseen_by_two_processors_pay_once(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    assert settings.partitions >= 2, "two processor instances need two partitions"
    # Range assignment: the first and the last partition go to different instances.
    first, second = (
        on_partition(0, settings.partitions),
        on_partition(settings.partitions - 1, settings.partitions),
    )
    harness = Harness(settings, create=False)
    harness.start_sink("credits", CREDITS, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-original")
        credit(pub, ORIGINAL, "ap-original", AMOUNT)
        harness.start_all({"processor": 2})
        harness.wait_quiescent(90)
        assert current_states(settings)[ORIGINAL].state == S.OUTCOME_VERIFIED
        # Both instances hold their partitions; stopped, they read nothing
        # until both compensations are in, then decide them at the same time.
        assert all(harness.pause("processor", i) for i in ("0", "1"))
        for op in (first, second):
            grant(pub, f"ap-{op}")
            credit(pub, op, f"ap-{op}", AMOUNT, compensates=ORIGINAL)
        harness.resume("processor", "0")
        harness.resume("processor", "1")
        harness.wait_quiescent(120)

        states = current_states(settings)
        ends = {op: states[op].state for op in (first, second)}
        assert sorted(ends.values()) == [S.ABANDONED, S.OUTCOME_VERIFIED], ends
        paid = next(op for op, end in ends.items() if end == S.OUTCOME_VERIFIED)
        refused = states[second if paid == first else first]
        assert f"already compensated by {paid}" in refused.reason, refused.reason
        assert refused.dispatches == 0 and refused.admitted_approval_id is None
        assert harness.effects("credits", paid) == 1
        assert harness.effects("credits", refused.operation_id) == 0
        assert states[paid].tally == "GRANTED"
        assert states[ORIGINAL].compensations_granted == f'[["{paid}",{AMOUNT}]]'
        history = read_history(settings, ORIGINAL, links=True)
        assert history.compensated_by == (paid,)
        tallies = [e.record.event for e in history.entries]
        kinds = sorted(t.kind for t in tallies if isinstance(t, CompensationTally))
        assert "REQUEST" in kinds, kinds  # the original's owner decided the claims
        assert run_audit(settings, read_sinks=False).violations == []
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()
