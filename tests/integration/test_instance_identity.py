"""Two live processes with one identity: Kafka fences one, nothing is paid twice.

Two pods that get the same instance name (a Deployment where a StatefulSet
belongs, or a forgotten ``LEDGER_INSTANCE``) share a transactional ID and a
static group member ID. The second one's ``init_transactions`` fences the
first one's producer, so the first one's next transaction is refused
(``FENCED_MARKER`` in its log); whichever holds the partitions then, every
operation still has one effect at the gateway and the audit is clean.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import pytest
from click.testing import CliRunner

from consumers.auditor import run_audit
from consumers.reader import current_states
from consumers.stage import FENCED_MARKER
from ledger.cli import main
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Approval
from ledger.settings import LedgerSettings
from ledger.signing import trust
from producers.publisher import LedgerPublisher
from testbed.harness import Harness, settings_env
from tests.integration.test_stages import REVIEWER, publish

pytestmark = pytest.mark.integration


def _approve_and_publish(pub: LedgerPublisher, ops: list[str]) -> None:
    for op in ops:
        pub.publish_approval(
            REVIEWER.sign(
                Approval(
                    approval_id=f"ap-{op}",
                    reviewer="rev",
                    policy_version=1,
                    expires_at_ms=1_000_000,
                    scope_subject="customer-1",
                    scope_max_amount_minor=9000,
                    scope_operation_id=op,
                    granted_at_ms=0,
                ),
                ledger_id=pub.settings.ledger_identity,
            )
        )
        publish(pub, op, approval=f"ap-{op}")


def _status_pid(settings: LedgerSettings, name: str) -> int:
    try:
        return int(json.loads((settings.run_dir / "status" / f"{name}.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return -1


def _wait_verified(settings: LedgerSettings, ops: list[str], timeout_s: float) -> Counter[str]:
    """Poll the state table until every op is verified (or the deadline); returns the tally."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = current_states(settings)
        tally = Counter(str(states[op].state) if op in states else "-" for op in ops)
        if tally == {"OUTCOME_VERIFIED": len(ops)} or time.monotonic() > deadline:
            return tally
        time.sleep(0.5)  # polling for a condition


def test_a_second_relay_with_the_same_identity_fences_the_first_and_nothing_is_paid_twice(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    trust(settings.trusted_keys_path(), REVIEWER)
    first_ops = [f"refund:ident-a{n}:v1" for n in range(10)]
    later_ops = [f"refund:ident-b{n}:v1" for n in range(20)]
    second_log_path = settings.run_dir / "logs" / "relay-0-second.log"
    second: subprocess.Popen[bytes] | None = None
    try:
        harness.start_all()  # relay instance 0, given as --instance 0
        _approve_and_publish(pub, first_ops)
        harness.wait_quiescent(90)
        first_log = settings.run_dir / "logs" / "relay-0.log"
        fenced_before = first_log.read_text(errors="replace").count(FENCED_MARKER)

        # The same identity again, this time from the environment.
        env = {**settings_env(settings), "LEDGER_INSTANCE": "0"}
        with second_log_path.open("ab") as second_log:
            second = subprocess.Popen(
                [sys.executable, "-m", "testbed.stage", "relay"],
                env=env,
                stdout=second_log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 90
        while _status_pid(settings, "relay-0") != second.pid:
            assert second.poll() is None, second_log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "the second relay never said it was ready"
            time.sleep(0.2)  # polling for a condition

        # `ledger status` names both processes (issue 29: it showed one instance).
        twins: dict[str, object] = {}
        deadline = time.monotonic() + 90
        while not twins:
            assert time.monotonic() < deadline, "status never named the two relay processes"
            status = CliRunner().invoke(main, ["status", "--json"], env=settings_env(settings))
            relay = next(
                st for st in json.loads(status.output)["stages"] if st["component"] == "relay"
            )
            twins = relay["twins"]
        assert status.exit_code == 1
        assert list(twins) == ["relay-0"]
        held_by = " ".join(twins["relay-0"])  # type: ignore[arg-type]
        assert f"pid {second.pid} on this host" in held_by
        assert f"pid {harness.procs['relay-0'].pid} on this host" in held_by
        text = CliRunner().invoke(main, ["status"], env=settings_env(settings))
        assert "TWO LIVE PROCESSES named relay-0" in text.output, text.output
        # The summary line above it says so too (it said "relay: live, 1 instance(s)").
        assert "relay: 2 live processes named relay-0, fencing each other" in text.output
        assert text.exit_code == 1

        _approve_and_publish(pub, later_ops)
        tally = _wait_verified(settings, first_ops + later_ops, 180)
        assert tally == {"OUTCOME_VERIFIED": len(first_ops) + len(later_ops)}, (
            f"{tally}\n{harness.log_tail()}\n{second_log_path.read_text(errors='replace')[-4000:]}"
        )

        with harness.sinks["payments"].client() as client:
            effects = client.effects()
        assert [effects.get(op, 0) for op in first_ops + later_ops] == [1] * (
            len(first_ops) + len(later_ops)
        )
        first_text = first_log.read_text(errors="replace")
        second_text = second_log_path.read_text(errors="replace")
        assert "relay instance 0 (from LEDGER_INSTANCE)" in second_text
        # Kafka refused the first process's transaction once the second one
        # had initialised the shared transactional ID.
        assert first_text.count(FENCED_MARKER) > fenced_before, first_text[-4000:]
        # Neither died of it: both ride it out (no error exit).
        assert harness.failed() == {} and second.poll() is None
        report = run_audit(settings)
        assert report.violations == []
    finally:
        if second is not None and second.poll() is None:
            second.terminate()
            try:
                second.wait(15)
            except subprocess.TimeoutExpired:
                second.kill()
                second.wait()
        pub.close()
        harness.stop()


def test_a_stopped_relay_is_not_responding_not_down(ledger_settings: LedgerSettings) -> None:
    """SIGSTOP: the broker drops the relay from its group, its process still runs here;
    `ledger status` must not say DOWN (whose remedy would start a second relay-0)."""
    settings = ledger_settings
    harness = Harness(settings, create=False)
    try:
        harness.start("relay")
        deadline = time.monotonic() + 60
        while _status_pid(settings, "relay-0") != harness.procs["relay-0"].pid:
            assert time.monotonic() < deadline, "the relay never said it was ready"
            time.sleep(0.2)  # polling for a condition
        assert harness.pause("relay")
        pid = harness.procs["relay-0"].pid
        deadline = time.monotonic() + 60
        while True:
            text = CliRunner().invoke(main, ["status"], env=settings_env(settings))
            relay = next(ln for ln in text.output.splitlines() if ln.startswith("relay: "))
            if "NOT RESPONDING" in relay:
                break
            assert time.monotonic() < deadline, text.output
            time.sleep(1.0)  # polling for a condition (the group drops it within 10 s)
        assert f"relay-0 NOT RESPONDING (pid {pid} alive, silent for " in relay
        assert "do not start another" in relay and "DOWN" not in relay
        assert text.exit_code == 1
    finally:
        harness.stop()
