"""The one launcher of a local Kafka node: its java command, storage format, process and PID.

A node is one ``java kafka.Kafka`` process (broker and KRaft controller in
one, combined mode) run from the Maven jars in ``libs``. The single-node
broker (:mod:`testbed.broker`) and every node of a local cluster
(:mod:`testbed.cluster`) are started, formatted, found and stopped here, so
the command line, the detached session, the PID file and the reaping of
children are written once:

* :func:`java_command` and :func:`format_command` -- the java argument lists;
* :func:`launch` -- start ``kafka.Kafka`` detached, record its PID;
* :func:`read_pid_file`, :func:`cmdline`, :func:`alive`, :func:`terminate`,
  :func:`wait_gone` -- find and stop a node's process;
* :func:`tail` -- the end of a log, for error messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ledger.errors import BrokerError
from ledger.settings import LedgerSettings

#: Fixed KRaft cluster ID (the official image's default); one cluster per data dir.
CLUSTER_ID = "5L6g3nShT-eMCtK--X86sw"
#: Java heap of the single-node broker (a cluster's nodes take their own).
JVM_HEAP = ("-Xms256m", "-Xmx512m")

#: Popen handles of nodes started by this process, so that they are reaped
#: (no zombies, no ResourceWarning) when this process also stops them.
children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class KafkaPaths:
    """The files and folders of one node (all absolute).

    Attributes:
        home: the node's folder (the single broker's is ``kafka_home``).
        libs: the broker jars.
        config_dir: ``server.properties`` and ``log4j2.properties``.
        server_properties: the node's configuration file.
        log4j_config: its logging configuration.
        data: the KRaft metadata log and topic data.
        logs: its logs folder.
        log_file: the node's own log (``logs/server.log``).
        stdout_file: stdout/stderr of its java process (``logs/broker.out``).
        pid_file: the PID of the process this testbed started.
        lock_file: the folder's lock (start and stop hold it).
    """

    home: Path
    libs: Path
    config_dir: Path
    server_properties: Path
    log4j_config: Path
    data: Path
    logs: Path
    log_file: Path
    stdout_file: Path
    pid_file: Path
    lock_file: Path

    @classmethod
    def of(cls, settings: LedgerSettings) -> KafkaPaths:
        """The single-node broker's paths under ``settings.kafka_home``."""
        home = Path(settings.kafka_home).resolve()
        logs = home / "logs"
        config_dir = home / "config"
        return cls(
            home=home,
            libs=home / "libs",
            config_dir=config_dir,
            server_properties=config_dir / "server.properties",
            log4j_config=config_dir / "log4j2.properties",
            data=home / "data",
            logs=logs,
            log_file=logs / "server.log",
            stdout_file=logs / "broker.out",
            pid_file=home / "broker.pid",
            lock_file=home / "broker.lock",
        )


def require_tool(name: str, remedy: str) -> str:
    """The path of program ``name`` on ``PATH``.

    Raises:
        BrokerError: it is not there; the message names ``remedy`` and the
            alternative of a broker that already runs.
    """
    path = shutil.which(name)
    if path is None:
        raise BrokerError(
            f"`{name}` is not on PATH: {remedy}, or point KAFKA_BOOTSTRAP_SERVERS at a running "
            "broker (e.g. `docker compose up -d`, then KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092)",
            expected=name,
            observed="missing",
        )
    return path


def java_command(paths: KafkaPaths, heap: Sequence[str] = JVM_HEAP) -> list[str]:
    """``java``, its heap and logging options and the jars' class path, for one node.

    Args:
        paths: the node's folders.
        heap: the ``-Xms``/``-Xmx`` options (the broker's by default).

    Raises:
        BrokerError: no ``java`` on ``PATH``.
    """
    return [
        require_tool("java", "install a Java 17+ runtime"),
        *heap,
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={paths.logs}",
        f"-Dlog4j2.configurationFile={paths.log4j_config}",
        "-cp",
        f"{paths.libs}/*",
    ]


def format_command(paths: KafkaPaths, *extra: str) -> list[str]:
    """The java command that formats a node's KRaft storage (``-g``: a formatted dir is kept).

    Args:
        paths: the node's folders (its ``server.properties`` and jars).
        extra: more ``StorageTool format`` arguments (``--add-scram ...``).

    Returns:
        The argument list, C1-compiled with one GC thread (a short-lived tool
        starts faster so on a busy machine).
    """
    java = java_command(paths)
    java[1:1] = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
    return [
        *java,
        "kafka.tools.StorageTool",
        "format",
        "-t",
        CLUSTER_ID,
        "-c",
        str(paths.server_properties),
        "-g",
        *extra,
    ]


def launch(
    paths: KafkaPaths,
    *,
    banner: str,
    heap: Sequence[str] = JVM_HEAP,
    prefix: Sequence[str] = (),
) -> int:
    """Start the node's ``java kafka.Kafka`` detached, in a session of its own.

    It outlives the process that started it (and its terminal's signals);
    its stdout and stderr are appended to ``paths.stdout_file`` after a
    ``=== banner ===`` line, and its PID is written to ``paths.pid_file``
    (atomically) and kept in :data:`children` for reaping.

    Args:
        paths: the node's folders; its ``server.properties`` must be written.
        banner: the line that marks this start in ``stdout_file``.
        heap: the node's ``-Xms``/``-Xmx`` options.
        prefix: a command the java process runs under (e.g. ``ip netns exec``).

    Returns:
        The PID of the started process (of ``prefix`` when one is given).

    Raises:
        BrokerError: no ``java`` on ``PATH``.
    """
    cmd = [*prefix, *java_command(paths, heap), "kafka.Kafka", str(paths.server_properties)]
    with paths.stdout_file.open("ab") as out:
        out.write(f"\n=== {banner} ===\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=paths.home,
            start_new_session=True,
            close_fds=True,
        )
    children[proc.pid] = proc
    tmp = paths.pid_file.with_suffix(".tmp")
    tmp.write_text(f"{proc.pid}\n")
    os.replace(tmp, paths.pid_file)
    return proc.pid


def read_pid_file(paths: KafkaPaths) -> int | None:
    """The PID recorded in ``paths.pid_file``; ``None`` when absent or unreadable."""
    try:
        return int(paths.pid_file.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def cmdline(pid: int) -> str | None:
    """Process ``pid``'s command line, arguments joined by spaces; ``None`` when unknown."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not; a child is reaped when it ended)."""
    proc = children.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            children.pop(pid, None)
            return False
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def terminate(pid: int, timeout_s: float) -> str:
    """SIGTERM, wait up to ``timeout_s`` seconds, then SIGKILL. Returns how it ended.

    Raises:
        BrokerError: the process survived SIGKILL (10 s).
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_gone(pid, timeout_s):
        return "SIGTERM"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if wait_gone(pid, 10):
        return f"SIGKILL after {timeout_s:g} s"
    raise BrokerError(
        f"broker pid {pid} survived SIGKILL; inspect it with `ps -p {pid}`",
        expected="process gone",
        observed="still alive",
    )


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Poll (every 0.1 s) until ``pid`` is gone; ``False`` if it still runs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    children.pop(pid, None)
    return True


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log, or a sentence saying it does not exist."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(text[-lines:])
