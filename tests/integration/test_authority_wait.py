"""The authority kernel does not call an approval "not found" while a
transaction holds its partition back.

A kernel instance killed or paused mid-transaction leaves the approvals
partition's last stable offset behind; an approval published after that
point is invisible to ``read_committed`` readers until the transaction is
resolved. The kernel waits for it (bounded) instead of refusing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from consumers.authority import AuthorityKernel
from consumers.reader import read_topic
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import AdmissionDecision, AdmissionRequest, OperatingEvent
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from sinks.registry import SinkEndpoint, save_sinks
from tests.helpers import stage_seal
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration


def _decisions_within(settings: LedgerSettings, seconds: float) -> list[AdmissionDecision]:
    """Admission decisions, read until one appears or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    decisions: list[AdmissionDecision] = []
    while time.monotonic() < deadline and not decisions:
        decisions = [
            r.event
            for r in read_topic(settings, "admissions")
            if isinstance(r.event, AdmissionDecision)
        ]
    return decisions


@contextlib.contextmanager
def _kernel_after_request(
    settings: LedgerSettings, approval_id: str, op: str
) -> Iterator[AuthorityKernel]:
    """Publish an admission request relying on ``approval_id``, then run a kernel (a thread).

    The request is for 100 minor units at sink ``payments``, registered (the
    kernel reads the amount where its contract says); nothing answers there.
    """
    save_sinks(
        settings.sinks_path(),
        {"payments": SinkEndpoint(url="http://127.0.0.1:9", contract=PAYMENT_GATEWAY)},
    )
    request = AdmissionRequest(
        operation_id=op,
        approval_id=approval_id,
        parameter_digest="0" * 64,
        subject="customer-1",
        amount_minor=100,
        state_version=1,
        sink="payments",
        action="refund",
        purpose="fee-remediation",
        params_json='{"account":"acct-1","amount_minor":100,"currency":"GBP"}',
    )
    raw = Producer(producer_config(settings))
    value = request.to_bytes()
    raw.produce(
        settings.topic("admission-requests"),
        key=approval_id.encode(),
        value=value,
        headers=stage_seal(settings, "admission-requests", approval_id, value),
    )
    raw.flush(10)
    kernel = AuthorityKernel(settings)
    thread = threading.Thread(target=kernel.run, daemon=True)
    thread.start()
    try:
        yield kernel
    finally:
        kernel.stopping = True
        thread.join(30)


def test_kernel_waits_for_an_approval_behind_an_open_transaction(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    approval_id = "ap-behind"
    # A stalled transaction on the approval's partition (same key, same partition).
    stalled = Producer(producer_config(settings, **{"transactional.id": "stalled-kernel"}))
    stalled.init_transactions(30)
    stalled.begin_transaction()
    stalled.produce(settings.topic("approvals"), key=approval_id.encode(), value=b"\x00")
    stalled.flush(10)
    pub = LedgerPublisher(settings)
    approve(pub, approval_id)  # lands after the open transaction
    try:
        with _kernel_after_request(settings, approval_id, "refund:behind:v1") as kernel:
            deadline = time.monotonic() + 60
            while not kernel.assigned and time.monotonic() < deadline:
                time.sleep(0.05)  # polling for a condition, not synchronising on time
            assert kernel.assigned
            # While the transaction is open, the kernel must not decide.
            assert _decisions_within(settings, 3.0) == []
            stalled.abort_transaction(30)
            decisions = _decisions_within(settings, 60.0)
            assert [(d.admitted, d.reason) for d in decisions] == [(True, "admitted")]
    finally:
        pub.close()


def test_an_approval_that_does_not_decode_is_refused_and_reported(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    approval_id = "ap-garbled"
    garbage = b"\xc3\x01not an avro approval"
    raw = Producer(producer_config(settings))
    raw.produce(settings.topic("approvals"), key=approval_id.encode(), value=garbage)
    raw.flush(10)
    with _kernel_after_request(settings, approval_id, "refund:garbled:v1"):
        decisions = _decisions_within(settings, 60.0)
        assert [(d.admitted, d.reason) for d in decisions] == [(False, "approval not found")]
        reported = [
            r.event
            for r in read_topic(settings, "operating-events")
            if isinstance(r.event, OperatingEvent) and r.event.source_topic == "approvals"
        ]
        assert [(e.kind, e.original_bytes) for e in reported] == [("BAD_INPUT", garbage)]
        assert approval_id in reported[0].reason
