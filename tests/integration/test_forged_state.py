"""A forged state record that displaced a settled operation's state, on the real broker.

An attacker who can write ``ledger.state`` (no ACLs) but holds no key writes
an unsealed OperationState under the key of a verified refund; compaction
then removes every authentic state record of it. The restarted processor
refuses the forged record and rebuilds the refund from its journal entries
instead of forgetting it, so the same intent published again is a duplicate:
no second admission request (the authority kernel is never asked to readmit
under the consumed approval), no second EXECUTE, nothing more at the sink.
The operating events and the audit name the displacing record. A replay of
the authentic admission request shows where the guard is: the kernel's
redelivery rule readmits it (the kernel does not know the operation
settled), and the processor, which does, ignores the admission.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Message, Producer

from consumers.auditor import run_audit
from consumers.reader import current_states
from consumers.stage import Record, read_partition
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import (
    AdmissionDecision,
    AdmissionRequest,
    Dispatch,
    JournalEntry,
    OperatingEvent,
    OperationState,
)
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.compaction import force_compaction
from testbed.harness import Harness
from tests.integration.test_stages import approve, of_operation, publish

pytestmark = pytest.mark.integration

OP = "refund:displaced:v1"


def _unsealed(settings: LedgerSettings, topic: str, key: str, value: bytes) -> tuple[int, int]:
    """Write a record as an outsider (no seal); returns its (partition, offset)."""
    producer = Producer(client_config(settings, partitioner="murmur2_random"))
    landed: list[tuple[int, int]] = []
    producer.produce(
        settings.topic(topic),
        key=key.encode(),
        value=value,
        on_delivery=lambda err, msg: landed.append((msg.partition(), msg.offset())),
    )
    assert producer.flush(10) == 0 and landed
    return landed[0]


def _replay_admission_request(settings: LedgerSettings) -> None:
    """Write the operation's authentic admission request again, bytes and seal as read."""
    found: list[tuple[bytes | None, bytes | None, list | None]] = []

    def keep(rec: Record | None, msg: Message) -> None:
        if rec is not None and getattr(rec.event, "operation_id", None) == OP:
            found.append((msg.key(), msg.value(), msg.headers()))

    read_partition(settings, "admission-requests", None, keep)
    [(key, value, headers)] = found
    producer = Producer(client_config(settings, partitioner="murmur2_random"))
    producer.produce(settings.topic("admission-requests"), key=key, value=value, headers=headers)
    assert producer.flush(10) == 0


def test_a_forged_state_that_displaced_a_verified_refund_does_not_readmit_it(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    sink = harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-1")
        publish(pub, OP, approval="ap-1")
        harness.start_all()
        harness.wait_quiescent(90)
        verified = current_states(settings)[OP]
        assert verified.state == S.OUTCOME_VERIFIED
        assert harness.effects("payments", OP) == 1
        with sink.client() as client:
            submits = client.stats()["submits"]
        executes = [
            d for d in of_operation(settings, OP, "dispatches", Dispatch) if d.kind == "EXECUTE"
        ]
        requests = of_operation(settings, OP, "admission-requests", AdmissionRequest)
        admissions = of_operation(settings, OP, "admissions", AdmissionDecision)
        assert len(executes) == 1 and len(requests) == 1 and len(admissions) == 1

        # The attacker: an unsealed in-flight state under the refund's key,
        # made the only record of the key by compaction.
        harness.kill("processor")
        forged = verified.model_copy(
            update={"state": S.NOT_ADMITTED, "version": verified.version + 1, "reason": "x"}
        )
        partition, offset = _unsealed(settings, "state", OP, forged.to_bytes())
        where = f"state:{partition}:{offset}"
        force_compaction(settings, names=["state"])
        assert OP not in current_states(settings)  # no authentic state of it is left

        # The audit names the displacing record.
        displaced = run_audit(settings, read_sinks=False)
        [finding] = [v.evidence for v in displaced.violations if v.operation_id == OP]
        assert finding.startswith("ledger.state holds nothing but replaying the journal gives")
        assert f"at {where}, displaced its authentic state (not authentic: no ledger-auth" in (
            finding
        )

        # The processor restarts, and the same intent is published again.
        harness.restart("processor")
        harness.wait_quiescent(90)
        publish(pub, OP, approval="ap-1")
        harness.wait_quiescent(90)

        # Nothing was readmitted or sent again.
        assert harness.effects("payments", OP) == 1
        with sink.client() as client:
            assert client.stats()["submits"] == submits
        assert [
            d for d in of_operation(settings, OP, "dispatches", Dispatch) if d.kind == "EXECUTE"
        ] == executes
        assert of_operation(settings, OP, "admission-requests", AdmissionRequest) == requests
        assert of_operation(settings, OP, "admissions", AdmissionDecision) == admissions
        last = of_operation(settings, OP, "journal", JournalEntry)[-1]
        assert (last.kind, last.outcome) == ("Intent", "NOOP"), last

        # The settled state is back on ledger.state, rebuilt from the journal.
        now = current_states(settings)[OP]
        assert isinstance(now, OperationState) and now == verified

        # An operating event names the forged record.
        events = of_operation(settings, OP, "operating-events", OperatingEvent)
        rebuilt = [e for e in events if e.kind == "STATE_REBUILT"]
        assert rebuilt, [(e.kind, e.reason) for e in events]
        assert {(e.source_topic, e.source_partition, e.source_offset) for e in rebuilt} == {
            ("state", partition, offset)
        }
        assert all(where in e.reason for e in rebuilt)
        refused = [e for e in events if e.kind == "UNAUTHENTICATED"]
        assert ("state", partition, offset) in {
            (e.source_topic, e.source_partition, e.source_offset) for e in refused
        }

        # The ledger audits clean again; the forged record is listed, not believed.
        healed = run_audit(settings, read_sinks=False)
        assert healed.violations == [], healed.violations
        listed = {(r["topic"], r["partition"], r["offset"]) for r in healed.unauthenticated_records}
        assert listed == {("state", partition, offset)}

        # The kernel alone does not know the operation settled: a replay of the
        # authentic admission request (seals do not stop replays) is readmitted
        # under its redelivery rule, and the processor, which knows, ignores it.
        _replay_admission_request(settings)
        harness.wait_quiescent(90)
        readmitted = of_operation(settings, OP, "admissions", AdmissionDecision)
        assert len(readmitted) == 2 and readmitted[-1].admitted
        last = of_operation(settings, OP, "journal", JournalEntry)[-1]
        assert (last.kind, last.outcome) == ("AdmissionDecision", "NOOP"), last
        assert [
            d for d in of_operation(settings, OP, "dispatches", Dispatch) if d.kind == "EXECUTE"
        ] == executes
        assert harness.effects("payments", OP) == 1
        assert current_states(settings)[OP] == verified
    finally:
        pub.close()
        harness.stop()
