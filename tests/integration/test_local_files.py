"""A running stage survives a corrupted local file (issue 11, item 8).

The authority kernel reads the trusted reviewer keys, the sink registry and
the manual clock. Corrupted while it runs, it keeps deciding with what it last
read well and says so once, as a ``LOCAL_FILE`` operating event; corrupted
before it starts, it waits for a readable file instead of crash-looping.
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
from ledger.events import AdmissionDecision, OperatingEvent
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from sinks.registry import SinkEndpoint, save_sinks
from tests import helpers
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration


def _request(settings: LedgerSettings, approval_id: str, op: str) -> None:
    """Publish the processor's admission request for ``op`` (100 minor units at payments)."""
    request = helpers.admission_request(op=op, amount=100, approval_id=approval_id)
    raw = Producer(producer_config(settings))
    value = request.to_bytes()
    raw.produce(
        settings.topic("admission-requests"),
        key=approval_id.encode(),
        value=value,
        headers=helpers.stage_seal(settings, "admission-requests", approval_id, value),
    )
    raw.flush(10)


def _decisions(settings: LedgerSettings, want: int, seconds: float) -> dict[str, AdmissionDecision]:
    """Admission decisions by operation, read until ``want`` are there or ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    found: dict[str, AdmissionDecision] = {}
    while time.monotonic() < deadline and len(found) < want:
        found = {
            r.event.operation_id: r.event
            # The test's own reader must not need the files it corrupts.
            for r in read_topic(settings, "admissions", authentic=False)
            if isinstance(r.event, AdmissionDecision)
        }
    return found


@contextlib.contextmanager
def _kernel(settings: LedgerSettings) -> Iterator[tuple[AuthorityKernel, threading.Thread]]:
    kernel = AuthorityKernel(settings)
    thread = threading.Thread(target=kernel.run, daemon=True)
    thread.start()
    try:
        yield kernel, thread
    finally:
        kernel.stopping = True
        thread.join(30)


def _register_payments(settings: LedgerSettings) -> None:
    save_sinks(
        settings.sinks_path(),
        {"payments": SinkEndpoint(url="http://127.0.0.1:9", contract=PAYMENT_GATEWAY)},
    )


def test_the_kernel_keeps_deciding_when_its_files_are_corrupted(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    _register_payments(settings)
    (settings.run_dir / "clock").write_text("1000")
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-before")
        approve(pub, "ap-after")
        with _kernel(settings) as (_, thread):
            _request(settings, "ap-before", "refund:before:v1")
            first = _decisions(settings, 1, 60.0)
            assert first["refund:before:v1"].admitted, first
            for name in ("trusted_keys.json", "sinks.json", "clock"):
                (settings.run_dir / name).write_text("{corrupted")
            _request(settings, "ap-after", "refund:after:v1")
            decided = _decisions(settings, 2, 60.0)
            after = decided["refund:after:v1"]
            assert (after.admitted, after.reason) == (True, "admitted")
            assert after.evaluated_at_ms == 1000  # the clock's last good time
            assert thread.is_alive()
        reported = [
            r.event
            for r in read_topic(settings, "operating-events", authentic=False)
            if isinstance(r.event, OperatingEvent) and r.event.kind == "LOCAL_FILE"
        ]
        named = " ".join(e.reason for e in reported)
        for what in ("trusted-keys file", "sink registry", "ledger clock"):
            assert named.count(what) == 1, named
    finally:
        pub.close()


def test_the_kernel_waits_at_start_for_a_readable_registry(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    registry = settings.sinks_path()
    registry.parent.mkdir(parents=True, exist_ok=True)
    registry.write_text('{"payments": 7}')
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-start")
        _request(settings, "ap-start", "refund:start:v1")
        with _kernel(settings) as (kernel, thread):
            # While the registry is corrupted the kernel neither decides nor dies.
            assert _decisions(settings, 1, 4.0) == {}
            assert thread.is_alive() and not kernel.assigned
            _register_payments(settings)
            decided = _decisions(settings, 1, 60.0)
            assert decided["refund:start:v1"].admitted, decided
    finally:
        pub.close()
