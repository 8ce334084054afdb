"""Run a reference sink as a subprocess (for tests, demos and game days).

The child is ``python -m testbed.sinks.gateway`` bound to ``127.0.0.1``. Each
:class:`SinkProcess` generates a random bearer token (``secrets``), hands it to
the child in its environment (``LEDGER_SINK_TOKEN``, not its arguments) and
keeps it across restarts; whoever registers the sink writes
:attr:`SinkProcess.token` into the sink registry. Fault injection
(``/admin/faults``) exists only when asked for (``fault_injection=True``). It writes the
port it bound to a port file; :class:`SinkProcess` waits for that file and then
polls ``/health`` until the child (identified by its pid) answers -- no fixed
sleeps. Its output goes to ``RUN_DIR/sinks/NAME.log``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Literal

from ledger.contracts import EffectContract
from testbed.errors import SinkStartError as SinkStartError  # re-exported: its old home
from testbed.sinks.admin import ReferenceSinkClient
from testbed.sinks.gateway import EXIT_ADDRESS_IN_USE, TOKEN_ENV

#: Folder that holds the ``sinks`` package (put on the child's PYTHONPATH).
#: The folder holding the ``testbed`` package (the checkout, or site-packages).
_PACKAGES_ROOT = Path(__file__).resolve().parents[2]

#: Interval between readiness polls (seconds).
_POLL_S = 0.02


class SinkProcess:
    """A reference sink running in a child process.

    Args:
        name: the sink's name, e.g. ``payments``.
        contract: the behaviour it offers.
        run_dir: run folder; the manual clock is ``run_dir/clock`` and the
            sink's files go to ``run_dir/sinks/``.
        db_path: the SQLite file; default ``run_dir/sinks/NAME.sqlite``.
        clock: ``manual`` (the ledger clock) or ``system``.
        port: port to bind; 0 picks a free one.
        hang_s: how long timeout faults hang (seconds).
        startup_timeout_s: how long :meth:`start` waits for ``/health``
            (seconds).
        log_level: uvicorn log level of the child.
        fault_injection: start the child with ``--fault-injection`` so that
            ``POST /admin/faults`` exists (tests, game days, missions); off by
            default.
        token: the bearer token to require; default a new random one
            (``secrets.token_urlsafe(32)``).

    Attributes:
        token: the bearer token the child requires (register it with the sink).
    """

    def __init__(
        self,
        name: str,
        contract: EffectContract,
        run_dir: Path,
        *,
        db_path: Path | None = None,
        clock: Literal["manual", "system"] = "manual",
        port: int = 0,
        hang_s: float = 5.0,
        startup_timeout_s: float = 20.0,
        log_level: str = "info",
        fault_injection: bool = False,
        token: str | None = None,
    ) -> None:
        self.name = name
        self.fault_injection = fault_injection
        self.token = token or secrets.token_urlsafe(32)
        self.contract = contract
        self.run_dir = run_dir
        self.db_path = db_path or run_dir / "sinks" / f"{name}.sqlite"
        self.clock = clock
        self.hang_s = hang_s
        self.startup_timeout_s = startup_timeout_s
        self.log_level = log_level
        self.port_file = run_dir / "sinks" / f"{name}.port"
        self.log_path = run_dir / "sinks" / f"{name}.log"
        self._requested_port = port
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        """The bound port.

        Raises:
            SinkStartError: if the sink was never started.
        """
        if self._port is None:
            raise SinkStartError(f"sink {self.name} has not been started", sink=self.name)
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8123``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs, else ``None``."""
        return self._proc.pid if self.is_running() and self._proc is not None else None

    def is_running(self) -> bool:
        """Return ``True`` while the child process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def client(self, timeout_s: float = 2.0) -> ReferenceSinkClient:
        """Return a new :class:`ReferenceSinkClient` for this sink (the caller closes it).

        Args:
            timeout_s: the client's timeout per call (seconds).

        Raises:
            SinkStartError: if the sink was never started.
        """
        return ReferenceSinkClient(self.url, timeout_s=timeout_s, token=self.token)

    def start(self) -> SinkProcess:
        """Start the child and wait until it answers ``/health``.

        Returns:
            ``self``.

        Raises:
            SinkStartError: if it is already running, exits early, or does not
                answer within ``startup_timeout_s``.
        """
        if self.is_running():
            raise SinkStartError(
                f"sink {self.name} is already running (pid {self.pid})", sink=self.name
            )
        code = self._launch(self._requested_port)
        if code is not None:
            raise SinkStartError(
                self._failure(f"exited with status {code} during startup"),
                sink=self.name,
                observed=f"exit status {code}",
            )
        return self

    def restart(self) -> SinkProcess:
        """Stop the child if it runs, then start it on the same database.

        The same port is used when it is still free, else a new one (see
        :attr:`url`).

        Returns:
            ``self``.

        Raises:
            SinkStartError: if the new child does not come up.
        """
        if self.is_running():
            self.stop()
        code = self._launch(self._port or self._requested_port)
        if code == EXIT_ADDRESS_IN_USE:
            code = self._launch(0)
        if code is not None:
            raise SinkStartError(
                self._failure(f"exited with status {code} during restart"),
                sink=self.name,
                observed=f"exit status {code}",
            )
        return self

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Terminate the child (SIGTERM, then SIGKILL after ``timeout_s`` seconds).

        Args:
            timeout_s: how long to wait after SIGTERM (seconds).

        Returns:
            The exit status, or ``None`` if it was not running.
        """
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def kill(self) -> None:
        """Kill the child with SIGKILL (a crash: no shutdown code runs)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def __enter__(self) -> SinkProcess:
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

    def _command(self, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "testbed.sinks.gateway",
            "--name",
            self.name,
            "--port",
            str(port),
            "--db",
            str(self.db_path),
            "--contract-json",
            self.contract.model_dump_json(),
            "--clock",
            self.clock,
            "--run-dir",
            str(self.run_dir),
            "--port-file",
            str(self.port_file),
            "--hang-s",
            str(self.hang_s),
            "--log-level",
            self.log_level,
            *(["--fault-injection"] if self.fault_injection else []),
        ]

    def _launch(self, port: int) -> int | None:
        """Start a child on ``port``; return ``None`` once it is healthy, else its exit status.

        Raises:
            SinkStartError: if it neither answers nor exits within the timeout.
        """
        self.port_file.parent.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        env = dict(os.environ)
        env[TOKEN_ENV] = self.token
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PACKAGES_ROOT), env.get("PYTHONPATH", "")) if p
        )
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                self._command(port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self._proc = proc
        deadline = time.monotonic() + self.startup_timeout_s
        client: ReferenceSinkClient | None = None
        try:
            while True:
                code = proc.poll()
                if code is not None:
                    return code
                if client is None and self.port_file.exists():
                    text = self.port_file.read_text().strip()
                    if text:
                        self._port = int(text)
                        client = ReferenceSinkClient(self.url, timeout_s=1.0, token=self.token)
                if client is not None:
                    info = client.health_info()
                    if info is not None and info.get("pid") == proc.pid:
                        return None
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    raise SinkStartError(
                        self._failure(f"did not answer /health within {self.startup_timeout_s} s"),
                        sink=self.name,
                        observed="no answer",
                    )
                time.sleep(_POLL_S)
        finally:
            if client is not None:
                client.close()

    def _failure(self, what: str) -> str:
        try:
            tail = self.log_path.read_text(errors="replace")[-2000:]
        except FileNotFoundError:
            tail = ""
        return f"sink {self.name} {what}; log {self.log_path} ends with:\n{tail}"
