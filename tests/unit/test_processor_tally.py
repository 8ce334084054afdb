"""Two processors, two compensations of one original, neither seen by the other.

Each compensation is on a partition another processor instance owns, and
each processor's read of ``ledger.state`` shows the original settled and no
compensation of it (the other's decision is not committed yet). The
processor that owns the original decides both claims: one is admitted, the
other is abandoned naming it, and no approval of the second is used.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from consumers.processor import Processor
from consumers.stage import Record
from ledger.contracts import EffectContract
from ledger.events import AdmissionRequest, CompensationTally, Event, Intent, OperationState
from ledger.fold import CompensationFacts, decide
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from sinks.registry import SinkEndpoint, save_sinks
from tests.helpers import admission, intent, keyed, receipt
from tests.unit.test_processor_restore import FakeTopics
from tests.unit.test_processor_verify import Captured

ORIGINAL = "credit:pt:v1"
FIRST, SECOND = "credit-reversal:pt:v1", "credit-reversal:pt:v2"
CREDITS = EffectContract(
    idempotent=True,
    readback=True,
    postcondition=True,
    fencing=True,
    key_retention_s=604_800,
    compensable=True,
    consequence="reversible-internal",
)


def reversal(op: str) -> Intent:
    i = intent(op, amount=3000, sink="credits", approval=f"ap-{op}")
    return i.model_copy(update={"compensates": ORIGINAL})


def feed(p: Processor, event: Event, offset: int) -> Captured:
    out = Captured()
    op = event.operation_id  # type: ignore[attr-defined]
    p.handle([Record("in", 0, offset, op, event.to_bytes(), event)], out)  # type: ignore[arg-type]
    p.after_commit()
    return out


def written(out: Captured, kind: type[Any]) -> list[Any]:
    return [e for _, _, e in out.written if isinstance(e, kind)]


@pytest.fixture
def settings(tmp_path: Path) -> LedgerSettings:
    s = keyed(LedgerSettings(run_dir=tmp_path))
    save_sinks(s.sinks_path(), {"credits": SinkEndpoint(url="http://c.test", contract=CREDITS)})
    return s


def test_the_originals_owner_admits_one_of_two_compensations_decided_unseen(
    settings: LedgerSettings,
) -> None:
    owner = Processor(settings, instance="0")  # owns the original's partition
    o = intent(ORIGINAL, amount=3000, sink="credits")
    for n, event in enumerate((o, admission(o), receipt(ORIGINAL, f"{ORIGINAL}#1.1"))):
        feed(owner, event, n)
    settled = owner.current(ORIGINAL)
    assert settled is not None and settled.state == S.EFFECT_COMMITTED

    def ledger_state(*_: Any, **__: Any) -> int:
        """ledger.state as both processors read it: the original, no compensation."""
        load: Callable[..., None] = _[3]
        load(Record("state", 0, 0, ORIGINAL, settled.to_bytes(), settled), None)
        return 1

    one = Processor(settings, instance="1", reader=ledger_state)
    two = Processor(settings, instance="2", reader=ledger_state)
    asked = {FIRST: feed(one, reversal(FIRST), 0), SECOND: feed(two, reversal(SECOND), 0)}
    for out in asked.values():  # neither saw the other, neither used its approval yet
        assert written(out, AdmissionRequest) == []
    requests = [r for out in asked.values() for r in written(out, CompensationTally)]
    assert [(r.kind, r.operation_id) for r in requests] == [("REQUEST", ORIGINAL)] * 2

    verdicts = [
        written(feed(owner, r, 10 + n), CompensationTally)[0] for n, r in enumerate(requests)
    ]
    assert [(v.kind, v.operation_id) for v in verdicts] == [("GRANTED", FIRST), ("REFUSED", SECOND)]

    admitted = written(feed(one, verdicts[0], 1), AdmissionRequest)
    refused = feed(two, verdicts[1], 1)
    assert [a.operation_id for a in admitted] == [FIRST]
    assert written(refused, AdmissionRequest) == []
    second = two.current(SECOND)
    assert isinstance(second, OperationState) and second.state == S.ABANDONED
    assert f"already compensated by {FIRST}" in second.reason, second.reason


def test_a_restored_compensation_waiting_for_the_tally_is_no_admission_resume(
    settings: LedgerSettings,
) -> None:
    topics = FakeTopics(settings)
    # Both keys name partition 1 of 3, where the fake state topic's records are.
    waiting = decide(
        None, reversal("credit-reversal:pt:v3"), "intents:1:1", compensation=_observed()
    )
    plain = decide(None, intent("refund:pt:v2"), "intents:1:2")
    for d in (waiting, plain):
        assert d.state is not None and d.state.state == S.NOT_ADMITTED
        topics.append("state", d.state.operation_id, d.state.to_bytes())
    assert waiting.state is not None and waiting.state.tally == "REQUESTED"
    p = Processor(settings, reader=topics.read_partition, settle=topics.settle)
    p.on_assign({1})
    # The plain one waits for the kernel (its decision resumes it); the
    # compensation waits for its original's tally and asks for admission later.
    assert set(p.admission_resumes.committed) == {"refund:pt:v2"}


def _observed() -> CompensationFacts:
    return CompensationFacts(
        original_state="OUTCOME_VERIFIED",
        original_sink="credits",
        consequence="reversible-internal",
        compensable=True,
        observed_scope=True,
        original_subject="customer-1",
        original_account='"acct-1"',
        original_amount_minor=3000,
        amount_field="amount_minor",
        tally=True,
    )
