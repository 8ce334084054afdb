"""The mission on a three-node cluster under broker chaos, at a size that fits ``make test``.

``ledger mission run --cases 300 --brokers 3 --broker-chaos`` runs as a user
runs it, in a process of its own: it makes its network namespaces (one per
node, one for its clients; as root - without, the cut is skipped and the
report says why), starts its own cluster in a scratch folder on ports of this
session's range, and while stages are SIGKILLed at every seam it SIGKILLs the
leader of the busiest partition, then the active controller, restarts the
nodes one by one, restarts the whole cluster and cuts one node off the
network. Its report must show no duplicate effect, no lost transition, no
stage death by error, every fault with its start and end, and readback
latencies during the failovers; nothing of it may be left behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from testbed.mission.chaos import STEPS
from testbed.netns import NetworkSpec, unavailable_reason
from tests.conftest import LOCAL_KAFKA_HOME

pytestmark = pytest.mark.integration

CASES = 300
SEED = 7
#: The cluster's first port: within this session's range, clear of the session broker.
PORT = int(os.environ.get("LEDGER_KAFKA_PORT", "19092")) + 20


def _measure(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["measures"] if m["name"] == name)


def _why(stderr: str) -> str:
    """A failed mission's own lines (its progress and its error, stage log tails left
    out), then the end of everything it printed."""
    own = [
        line
        for line in stderr.splitlines()
        if line and not re.match(r"(\[?\d{4}-\d\d-\d\d |--- \S+\.log$)", line)
    ]
    return "\n".join(own[-60:])[-6000:] + "\n--- end of stderr\n" + stderr[-2500:]


@pytest.fixture(scope="module")
def chaos_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("chaos")
    home = root / "kafka"
    home.mkdir()
    (home / "libs").symlink_to(LOCAL_KAFKA_HOME / "libs", target_is_directory=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KAFKA_BOOTSTRAP_SERVERS", "LEDGER_BOOTSTRAP_SERVERS")
        and not k.startswith("LEDGER_KAFKA_")
    }
    env.update(
        LEDGER_KAFKA_PORT=str(PORT),
        LEDGER_KAFKA_HOME=str(home),
        LEDGER_RUN_DIR=str(root / "run"),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ledger.cli import main; main()",
            "mission",
            "run",
            "--cases",
            str(CASES),
            "--crash-rate",
            "0.05",
            "--seed",
            str(SEED),
            "--brokers",
            "3",
            "--broker-chaos",
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    (root / "mission.err").write_text(done.stderr)
    path = root / "run" / "missions" / f"ledger-seed{SEED}-{CASES}c-1i" / "report.json"
    assert path.exists(), f"no report (exit {done.returncode}):\n{_why(done.stderr)}"
    report: dict[str, Any] = json.loads(path.read_text())
    report["_exit"] = done.returncode
    report["_home"] = str(home)
    report["_stderr"] = "\n".join(
        line for line in done.stderr.splitlines() if not line.startswith("[20")
    )[-3000:]  # the mission's own lines (no broker log tails), for a failure's message
    return report


def test_the_chaos_mission_passes_its_checks(chaos_report: dict[str, Any]) -> None:
    report = chaos_report
    assert report["checks"] == {"passed": True, "failures": []}, report["_stderr"]
    assert report["_exit"] == 0, report["_stderr"]
    assert report["mission"]["brokers"] == 3 and report["mission"]["broker_chaos"]
    assert sum(report["cases"]["by_outcome"].values()) == CASES
    dup = _measure(report, "duplicate effects")
    assert dup["count"] == 0 and dup["of"] > CASES
    lost = _measure(report, "lost transitions")
    assert lost["count"] == 0 and lost["of"] == dup["of"]
    deaths = _measure(report, "stage deaths by error")
    assert deaths["count"] == 0 and deaths["of"] >= 3
    assert sum(report["faults"]["kills_by_seam"].values()) > 0  # stages crashed at seams too
    for key in ("before_compaction", "after_compaction"):
        assert report["audit"][key]["violations"] == 0, report["audit"][key]["details"]


def test_every_broker_fault_hit_and_healed_on_the_timeline(chaos_report: dict[str, Any]) -> None:
    windows = chaos_report["failovers"]
    assert [w["kind"] for w in windows] == list(STEPS)
    reason = unavailable_reason()
    for w in windows:
        assert w["error"] is None, w
        if w["kind"] == "partition" and reason is not None:
            assert w["note"].startswith("skipped") and w["start"] == 0.0
            continue
        assert 0 < w["start"] < w["end"] and w["duration_s"] > 0, w
        assert w["target"]
    starts = [w["start"] for w in windows if w["start"]]
    assert starts == sorted(starts)  # in turn, one at a time
    ends = [w["end"] for w in windows if w["end"]]
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False))
    # each fault that hit is marked on the timeline, on the same clock as its window
    marks = [m for m in chaos_report["timeline_events"] if m["kind"] == "broker fault"]
    assert [(m["t_s"], m["end_s"]) for m in marks] == [
        (w["start_s"], w["end_s"]) for w in windows if w["start"]
    ]
    latency = chaos_report["readback_latency_ms"]
    during = latency["during_failover"]
    assert during["count"] > 0 and 0 <= during["p50"] <= during["p99"]
    assert during["count"] + latency["outside_failover"]["count"] == latency["count"]


def test_nothing_is_left_behind(chaos_report: dict[str, Any]) -> None:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    assert NetworkSpec(PORT, 3).prefix + "-" not in names.stdout
    home = chaos_report["_home"]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert not [line for line in ps.stdout.splitlines() if home in line and "java" in line]
