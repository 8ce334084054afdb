"""A service learns its outcomes from the signed outcome channel (real broker, issue 28).

The service side holds no secret and no keys folder: only the outcome key's
public half, exported from the stages' host as a user would
(``ledger keys export --outcome-public``). It gets ``Verified`` for a
refund, ``Refused(UNKNOWN_SINK)`` for a typo'd sink within seconds, the
same outcome (and still one effect) when it performs a settled operation
again, and a wait reads what came after its publish, not the history.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from ledger.authn import seal_headers
from ledger.cli import main
from ledger.contracts import PAYMENT_GATEWAY
from ledger.credentials import outcome_key
from ledger.events import Dispatch, Outcome
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from ledger.topology import partition_for
from producers.outcomes import OutcomeReader
from producers.publisher import LedgerPublisher
from producers.sdk import LedgerService, NeedsReauthorisation, Refused, Verified
from testbed.harness import Harness
from tests.integration.test_stages import PARAMS, approve, of_operation

pytestmark = pytest.mark.integration


def service_settings(stages: LedgerSettings, tmp_path: Path) -> LedgerSettings:
    """A service host's settings: the exported outcome public key, nothing else."""
    exported = CliRunner().invoke(
        main,
        ["keys", "export", "--outcome-public"],
        env={"LEDGER_RUN_DIR": str(stages.run_dir), "LEDGER_TOPIC_PREFIX": stages.topic_prefix},
    )
    assert exported.exit_code == 0, exported.output
    public = tmp_path / "service-host" / "outcome.pub"
    public.parent.mkdir()
    public.write_text(exported.output)
    return stages.model_copy(
        update={
            "run_dir": tmp_path / "service-host" / "run",
            "keys_dir": None,
            "outcome_public_key_file": public,
        }
    )


def refund(operation_id: str, sink: str = "payments") -> dict[str, object]:
    return {
        "operation_id": operation_id,
        "sink": sink,
        "action": "refund",
        "params": PARAMS,
        "subject": "customer-1",
        "purpose": "fee-remediation",
        "approval_id": "ap-1",
    }


def test_a_service_holding_only_the_public_key_gets_typed_outcomes(
    ledger_settings: LedgerSettings, tmp_path: Path
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    reviewer = LedgerPublisher(settings)
    service = LedgerService(service_settings(settings, tmp_path), actor="svc")
    try:
        approve(reviewer, "ap-1")
        harness.start_all()
        op = "refund:sdk:v1"
        result = service.perform(**refund(op), wait_s=60.0)  # type: ignore[arg-type]
        assert isinstance(result, Verified), result
        assert result.effect_id and result.postcondition and "VERIFIED" in result.postcondition
        assert harness.effects("payments", op) == 1

        # A typo'd sink: refused by the processor in seconds, not a timeout.
        started = time.monotonic()
        typo = service.perform(**refund("refund:typo:v1", sink="paymnets"), wait_s=30.0)  # type: ignore[arg-type]
        took = time.monotonic() - started
        assert isinstance(typo, Refused) and typo.kind == "UNKNOWN_SINK", typo
        assert "paymnets" in typo.reason and typo.remedy
        assert took < 10.0, f"the refusal took {took:.1f} s of a 30 s wait"

        # Performed again (a restarted caller): the same outcome, still one effect.
        again = LedgerService(service_settings_again(settings, tmp_path), actor="svc")
        try:
            repeat = again.perform(**refund(op), wait_s=30.0)  # type: ignore[arg-type]
        finally:
            again.close()
        assert repeat == result
        # Its answer was committed with the processor's decision on the
        # re-published intent: nothing was dispatched again.
        dispatched = of_operation(settings, op, "dispatches", Dispatch)
        assert [d.kind for d in dispatched] == ["EXECUTE"], dispatched
        assert harness.effects("payments", op) == 1
        assert not (tmp_path / "service-host" / "run").exists()  # the service made no keys
        assert not harness.crashed() and not harness.failed()
    finally:
        service.close()
        reviewer.close()
        harness.stop()


def service_settings_again(stages: LedgerSettings, tmp_path: Path) -> LedgerSettings:
    """The same service host's settings, read again as a restarted process would."""
    return stages.model_copy(
        update={
            "run_dir": tmp_path / "service-host" / "run",
            "keys_dir": None,
            "outcome_public_key_file": tmp_path / "service-host" / "outcome.pub",
        }
    )


#: Settled operations written before the wait, on the waited operation's partition alone.
HISTORY = 1500


def test_a_wait_reads_what_came_after_its_publish_not_the_history(
    ledger_settings: LedgerSettings, tmp_path: Path
) -> None:
    settings = ledger_settings
    op = "refund:after-history:v1"
    home = partition_for(op, settings.partitions)
    history = [
        other
        for n in range(20 * HISTORY)
        if partition_for(other := f"refund:old-{n}:v1", settings.partitions) == home
    ][:HISTORY]
    signer = outcome_key(settings)
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    hour_ago_ms = int(time.time() * 1000) - 3_600_000
    for n, other in enumerate(history):
        record = Outcome(
            outcome_id=f"processor:receipts:{home}:{n}",
            operation_id=other,
            kind="VERIFIED",
            state="OUTCOME_VERIFIED",
            state_version=5,
            reason="settled long ago",
            parameter_digest="v2:" + "0" * 64,
            at_ms=hour_ago_ms,
        )
        key, value = other.encode(), record.to_bytes()
        producer.produce(
            settings.topic("outcomes"),
            key=key,
            value=value,
            headers=seal_headers(signer, "outcomes", key, value),
            timestamp=hour_ago_ms,
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    harness = Harness(settings, create=False)
    service = LedgerService(service_settings(settings, tmp_path), actor="svc")
    try:
        harness.start("processor")
        published_ms = int(time.time() * 1000)
        # No approval: the processor alone settles it (NEEDS_REAUTHORISATION).
        result = service.perform(**{**refund(op), "approval_id": None}, wait_s=60.0)  # type: ignore[arg-type]
        assert isinstance(result, NeedsReauthorisation), result
        assert result.approval_id is None and "no approval" in result.reason
        assert service.last_records_read < 20, service.last_records_read
        # A waiter that starts from a time (its publish) skips the hour-old history too.
        with OutcomeReader(service.settings).since(op, published_ms) as watch:
            found = watch.wait(30.0)
        assert found.final and found.outcome is not None
        assert found.outcome.kind == "NEEDS_REAUTHORISATION"
        assert found.records_read < 20, found.records_read
    finally:
        service.close()
        harness.stop()
