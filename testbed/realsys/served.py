"""Start a real system of :mod:`testbed.realsys` as a child process, stop or kill it.

The child is ``python -m MODULE --port N --port-file FILE ...``: it binds
``127.0.0.1:N`` (0: a free port), listens, and only then writes the port to
the port file, so :meth:`RealSystemProcess.start` waits for that file (and
for the child to be alive) -- no fixed sleeps. The child's output goes to a
log file beside the port file.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from testbed.errors import SinkStartError

#: The folder holding the ``testbed`` package (the checkout, or site-packages).
_PACKAGES_ROOT = Path(__file__).resolve().parents[2]

#: Interval between polls of the port file (seconds).
_POLL_S = 0.02


def bind_local(port: int) -> socket.socket:
    """Bind and listen on ``127.0.0.1:port`` (0: a free port; ``SO_REUSEADDR`` set, so a
    restarted system takes its port back while old connections are in TIME_WAIT).

    Raises:
        OSError: if the port cannot be bound.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def write_port_file(path: Path, port: int) -> None:
    """Write ``port`` to ``path`` atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


class RealSystemProcess:
    """A real system running in a child process.

    Args:
        module: the child's module, e.g. ``testbed.realsys.smtp``.
        name: a name for its files, e.g. ``mail``.
        run_dir: where the port file and the log go (``run_dir/NAME.port``, ``.log``).
        args: the child's own arguments (after ``--port`` and ``--port-file``).
        env: extra environment of the child (e.g. a token).
        startup_timeout_s: how long :meth:`start` waits for the port file (seconds).
    """

    def __init__(
        self,
        module: str,
        name: str,
        run_dir: Path,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 20.0,
    ) -> None:
        self.module = module
        self.name = name
        self.args = args
        self.env = env or {}
        self.startup_timeout_s = startup_timeout_s
        self.port_file = run_dir / f"{name}.port"
        self.log_path = run_dir / f"{name}.log"
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        """The bound port.

        Raises:
            SinkStartError: if the system was never started.
        """
        if self._port is None:
            raise SinkStartError(f"{self.name} has not been started", sink=self.name)
        return self._port

    def is_running(self) -> bool:
        """``True`` while the child is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, port: int | None = None) -> Self:
        """Start the child and wait until it listens.

        Args:
            port: the port to bind; default the one it had (a restart), else a free one.

        Returns:
            ``self``.

        Raises:
            SinkStartError: if it is already running, exits during startup or
                does not listen within ``startup_timeout_s``.
        """
        if self.is_running():
            raise SinkStartError(f"{self.name} is already running", sink=self.name)
        chosen = port if port is not None else (self._port or 0)
        self.port_file.parent.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PACKAGES_ROOT), env.get("PYTHONPATH", "")) if p
        )
        command = [sys.executable, "-m", self.module, "--port", str(chosen)]
        command += ["--port-file", str(self.port_file), *self.args]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.port_file.exists():
            code = self._proc.poll()
            if code is not None or time.monotonic() > deadline:
                if code is None:
                    self.kill()
                raise SinkStartError(
                    f"{self.name} ({self.module}) did not start (exit status {code}); see "
                    f"{self.log_path}",
                    sink=self.name,
                    observed=f"exit status {code}",
                )
            time.sleep(_POLL_S)
        self._port = int(self.port_file.read_text())
        return self

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Terminate the child (SIGTERM, then SIGKILL after ``timeout_s`` seconds).

        Returns:
            The exit status, or ``None`` if it was never started.
        """
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """Kill the child with SIGKILL (a crash: no shutdown code runs)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def __enter__(self) -> Self:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
