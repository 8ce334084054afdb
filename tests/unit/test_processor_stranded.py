"""A restored processor claims a committed effect stranded without its verification.

Kafka is replaced by records handed to the restore in offset order (as in
``test_processor_restore``), each with a Kafka timestamp: the time its state
was written, from which the operation's age is counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

from consumers.processor import Processor
from ledger.events import Claim, Dispatch, Event, OperationState
from ledger.fold import decide
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from tests.helpers import admission, intent, keyed, receipt
from tests.unit.test_processor_restore import OP, PARTITION, FakeTopics, Msg

BOUND_S = 60.0


@dataclass
class StampedMsg(Msg):
    """A consumed message with its Kafka timestamp (ms)."""

    written_ms: int = 0

    def timestamp(self) -> tuple[int, int]:
        return TIMESTAMP_CREATE_TIME, self.written_ms


def _committed(topics: FakeTopics, written_ms: int) -> OperationState:
    """Record a refund to EFFECT_COMMITTED (its VERIFY dispatched, never answered)."""
    i = intent(OP)
    state: OperationState | None = None
    events: list[Event] = [i, admission(i)]
    for n in range(3):
        decision = decide(state, events[n], f"in:{PARTITION}:{n}")
        assert decision.state is not None
        state = decision.state
        msg = topics.append("state", OP, state.to_bytes())
        topics.logs["state"][-1] = StampedMsg(**msg.__dict__, written_ms=written_ms)
        if n == 1:
            [execute] = [o.event for o in decision.outputs if isinstance(o.event, Dispatch)]
            events.append(receipt(OP, execute.dispatch_id))
    assert state is not None and state.state == S.EFFECT_COMMITTED, state
    return state


@pytest.fixture
def restore(tmp_path: Path) -> tuple[Processor, FakeTopics]:
    settings = keyed(LedgerSettings(run_dir=tmp_path, stranded_committed_s=BOUND_S))
    topics = FakeTopics(settings)
    return Processor(settings, reader=topics.read_partition, settle=topics.settle), topics


@pytest.mark.parametrize(("age_s", "claimed"), [(BOUND_S * 10, True), (BOUND_S / 2, False)])
def test_a_restart_claims_a_committed_effect_only_once_its_verification_is_overdue(
    restore: tuple[Processor, FakeTopics], age_s: float, claimed: bool
) -> None:
    processor, topics = restore
    state = _committed(topics, int((time.time() - age_s) * 1000))

    processor.on_assign({PARTITION})

    assert processor.resume_queue == ([(OP, state.version)] if claimed else [])
    # The claim re-dispatches the verification (a query), never the effect.
    claim = Claim(
        claim_id="c", operation_id=OP, worker="processor-0", expected_version=state.version
    )
    resumed = decide(state, claim, "claims:1:0")
    [verify] = [o.event for o in resumed.outputs if isinstance(o.event, Dispatch)]
    assert (verify.kind, verify.on_resume) == ("VERIFY", True)
