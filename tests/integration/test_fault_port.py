"""Fault injection is a port that is off in production.

A production stage started as an operator starts it (``ledger processor``)
gets hooks that never fire: a fault file armed in its run folder for every
operation must not kill it. The same file does kill a testbed stage
(``python -m testbed.stage``), which is what game days rely on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from consumers.reader import current_states
from ledger.contracts import PAYMENT_GATEWAY
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed import faults
from testbed.harness import Harness, settings_env
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration

SEAM = "after_admission_before_dispatch"  # the processor's seam


def _remaining(hook: Path) -> int:
    return int(json.loads(hook.read_text())["times"])


def _wait_for_state(settings: LedgerSettings, op: str, want: S, timeout_s: float) -> S | None:
    deadline = time.monotonic() + timeout_s
    seen: S | None = None
    while time.monotonic() < deadline:
        state = current_states(settings).get(op)
        seen = S(state.state) if state is not None else None
        if seen == want:
            break
        time.sleep(0.2)
    return seen


def test_production_processor_ignores_an_armed_fault_file(ledger_settings: LedgerSettings) -> None:
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    hook = faults.arm(ledger_settings.run_dir, SEAM, faults.ANY, times=3)
    armed = _remaining(hook)
    log_path = ledger_settings.run_dir / "logs" / "operator-processor.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    ledger_cmd = Path(sys.executable).with_name("ledger")
    with log_path.open("ab") as log:
        processor = subprocess.Popen(
            [str(ledger_cmd), "processor"],
            env=settings_env(ledger_settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        harness.start("authority")
        harness.start("relay")
        approve(pub)
        op = "refund:port:v1"
        publish(pub, op)
        reached = _wait_for_state(ledger_settings, op, S.OUTCOME_VERIFIED, 90)
        assert reached == S.OUTCOME_VERIFIED, log_path.read_text()[-2000:]
        # The processor passed its seam with the hook armed and is still running.
        assert processor.poll() is None, log_path.read_text()[-2000:]
        assert _remaining(hook) == armed
        assert harness.effects("payments", op) == 1
    finally:
        processor.terminate()
        processor.wait(30)
        pub.close()
        harness.stop()


def test_testbed_processor_fires_the_same_fault_file(ledger_settings: LedgerSettings) -> None:
    """The control: the hook that the production stage ignored kills a testbed stage."""
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    hook = faults.arm(ledger_settings.run_dir, SEAM, faults.ANY, times=1)
    try:
        harness.start_all()
        approve(pub)
        op = "refund:port:v2"
        publish(pub, op)
        proc = harness.procs["processor-0"]
        assert proc.wait(90) == -9  # SIGKILLed at the seam
        assert not hook.exists() or _remaining(hook) == 0
    finally:
        pub.close()
        harness.stop()
