"""The one launcher of a local Kafka node (testbed.launcher), run with a stand-in ``java``.

The stand-in prints the arguments it was given and exits, so the test sees
the command line the single broker and a cluster's nodes would run, the
banner in the node's stdout file and the PID file, without a JVM.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from testbed import broker, launcher
from testbed.launcher import KafkaPaths


def _paths(home: Path) -> KafkaPaths:
    logs, config = home / "logs", home / "config"
    for folder in (logs, config):
        folder.mkdir(parents=True)
    return KafkaPaths(
        home=home,
        libs=home / "libs",
        config_dir=config,
        server_properties=config / "server.properties",
        log4j_config=config / "log4j2.properties",
        data=home / "data",
        logs=logs,
        log_file=logs / "server.log",
        stdout_file=logs / "broker.out",
        pid_file=home / "node.pid",
        lock_file=home / "node.lock",
    )


@pytest.fixture
def fake_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``java`` first on ``PATH`` that prints its arguments, one line, and exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text('#!/bin/sh\necho "ARGS $*"\n')
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_launch_runs_kafka_with_the_heap_and_prefix_and_records_the_pid(
    tmp_path: Path, fake_java: None
) -> None:
    paths = _paths(tmp_path / "node-2")
    pid = launcher.launch(
        paths, banner="node 2 start", heap=("-Xms64m", "-Xmx96m"), prefix=("env", "A=1")
    )

    assert launcher.wait_gone(pid, timeout_s=30), "the stand-in java exits at once"
    assert paths.pid_file.read_text() == f"{pid}\n"
    out = paths.stdout_file.read_text().splitlines()
    assert out[1] == "=== node 2 start ==="
    args = out[2].split()
    assert args[0] == "ARGS" and args[1:3] == ["-Xms64m", "-Xmx96m"]
    assert args[-2:] == ["kafka.Kafka", str(paths.server_properties)]
    assert f"{paths.libs}/*" in args and f"-Dkafka.logs.dir={paths.logs}" in args


def test_the_single_broker_launches_through_the_launcher_with_its_heap(
    tmp_path: Path, fake_java: None
) -> None:
    paths = _paths(tmp_path / "kafka")
    pid = broker._launch(paths)

    assert launcher.wait_gone(pid, timeout_s=30)
    assert launcher.read_pid_file(paths) == pid
    (args,) = [line for line in paths.stdout_file.read_text().splitlines() if "ARGS" in line]
    assert args.split()[1:3] == list(launcher.JVM_HEAP)
    assert "=== testbed.broker start " in paths.stdout_file.read_text()


def test_format_command_formats_with_the_fixed_cluster_id_and_extra_arguments(
    tmp_path: Path, fake_java: None
) -> None:
    paths = _paths(tmp_path / "node-1")
    cmd = launcher.format_command(paths, "--add-scram", "SCRAM-SHA-512=[name=a,password=b]")

    i = cmd.index("kafka.tools.StorageTool")
    assert cmd[i + 1 : i + 4] == ["format", "-t", launcher.CLUSTER_ID]
    assert cmd[-3:] == ["-g", "--add-scram", "SCRAM-SHA-512=[name=a,password=b]"]
