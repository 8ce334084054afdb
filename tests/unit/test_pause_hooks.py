"""Pause hooks: the named process stops itself (SIGSTOP) at the seam, once, and goes on.

A real child process reaches the seam; the test reads its state from
``/proc`` (stopped, then running) and the firing log, never a timer.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testbed import faults
from testbed.harness import _stopped

SEAM = "after_dispatch_before_send"
OP = "refund:p1:v1"

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from testbed.faults import ArmedFaults
    hooks = ArmedFaults(Path(sys.argv[1]), sys.argv[2])
    hooks.seam("after_dispatch_before_send", "refund:p1:v1")  # may stop here
    hooks.seam("after_dispatch_before_send", "refund:p1:v1")  # fired once: goes on
    print("sent", flush=True)
    """
)


def _until(condition: object, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def _child(run_dir: Path, process: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(run_dir), process],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_named_process_stops_at_the_seam_until_continued(tmp_path: Path) -> None:
    faults.arm_pause(tmp_path, "relay-0", SEAM, OP)
    child = _child(tmp_path, "relay-0")
    try:
        assert _until(lambda: _stopped(child.pid)), "the process did not stop at the seam"
        (firing,) = faults.fired(tmp_path)
        assert (firing["action"], firing["pid"], firing["seam"]) == ("pause", child.pid, SEAM)
        assert child.poll() is None  # alive, holding what it held
        child.send_signal(signal.SIGCONT)
        out, _ = child.communicate(timeout=20)
    finally:
        if child.poll() is None:
            child.kill()
    assert out.strip() == "sent" and child.returncode == 0
    assert faults.armed(tmp_path) == []  # it fires once


def test_another_process_passes_the_seam(tmp_path: Path) -> None:
    faults.arm_pause(tmp_path, "relay-0", SEAM, OP)
    child = _child(tmp_path, "relay-1")
    out, _ = child.communicate(timeout=20)
    assert out.strip() == "sent" and child.returncode == 0
    assert faults.fired(tmp_path) == []
    assert len(faults.armed(tmp_path)) == 1  # still armed for relay-0


def test_an_unknown_seam_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown seam"):
        faults.arm_pause(tmp_path, "relay-0", "somewhere", OP)
