"""A throwaway PostgreSQL server from the distribution's binaries, for tests and the testbed.

:class:`PostgresServer` runs ``initdb`` and ``pg_ctl`` (found on ``PATH``, then
under ``/usr/lib/postgresql/<version>/bin``, where Debian's ``postgresql``
package puts them) in a scratch folder::

    <folder>/data/          the cluster (initdb; fsync off: a test cluster)
    <folder>/server.log     the server's log
    <folder>/.s.PGSQL.<port>   its unix socket (the folder is private: mode 0700)

The server listens on ``127.0.0.1`` only, on a free port, and one role
(``ledger``) logs in over TCP with a password generated per server
(``scram-sha-256``); the unix socket trusts local users, but its folder is
private to the server's OS user. :attr:`PostgresServer.dsn` is
``postgresql://ledger:<password>@127.0.0.1:<port>/<database>``.

PostgreSQL refuses to run as root. When this process is root, the binaries
run as the OS user ``postgres`` (``runuser -u postgres --``; Debian's package
creates that user) and the scratch folder is made over to it; otherwise they
run as the current user.

The first server of a process runs ``initdb`` once into a template folder
(a few seconds); every server copies that template and sets its own
password, so starting one costs about a second after the first (copy,
``pg_ctl start``, ``psql``). ``fsync`` is off: a crash of the server process loses nothing
(the WAL is written to the OS before a commit returns), a crash of the
machine may -- which a test cluster can afford.

Example::

    with PostgresServer() as pg:
        dsn = pg.dsn            # start, use, then stop and remove the folder
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from testbed.errors import SinkStartError

#: The role the servers create; it owns the database.
ROLE = "ledger"
#: The OS user the binaries run as when this process is root.
OS_USER = "postgres"
#: How long ``pg_ctl start`` may take (seconds).
START_TIMEOUT_S = 30
#: The remedy named when the binaries are missing.
INSTALL_HINT = "install Debian's PostgreSQL server: apt-get install postgresql"


def find_bin(name: str) -> Path:
    """The path of PostgreSQL program ``name`` (``initdb``, ``pg_ctl``, ``psql`` ...).

    Looks on ``PATH`` first, then in ``/usr/lib/postgresql/*/bin`` (newest
    version first).

    Raises:
        SinkStartError: when the program is nowhere (the message says to
            install ``postgresql``).
    """
    found = shutil.which(name)
    if found:
        return Path(found)
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
        reverse=True,
    )
    for folder in versions:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise SinkStartError(
        f"PostgreSQL program {name!r} not found on PATH or under /usr/lib/postgresql/*/bin; "
        f"{INSTALL_HINT}"
    )


def _as_server_user() -> list[str]:
    """The command prefix that runs a program as the server's OS user."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        raise SinkStartError(
            "running as root, and PostgreSQL refuses root: 'runuser' (util-linux) is needed "
            f"to run it as user {OS_USER!r}; install util-linux or run as a non-root user"
        )
    try:
        import pwd

        pwd.getpwnam(OS_USER)
    except KeyError:
        raise SinkStartError(
            f"running as root, and PostgreSQL refuses root: OS user {OS_USER!r} does not "
            f"exist; {INSTALL_HINT} (it creates the user) or run as a non-root user"
        ) from None
    return [runuser, "-u", OS_USER, "--"]


def _give_to_server_user(path: Path) -> None:
    """Make ``path`` (recursively) the server's OS user's when this process is root."""
    if os.geteuid() != 0:
        return
    import pwd

    entry = pwd.getpwnam(OS_USER)
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


def _run(argv: list[str], what: str, log: Path | None = None, stdin: str | None = None) -> None:
    """Run a PostgreSQL program as the server's user; raise with its output on failure."""
    done = subprocess.run(
        _as_server_user() + argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        tail = ""
        if log is not None and log.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SinkStartError(
            f"{what} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
            + (f"\nserver log:\n{tail}" if tail else "")
        )


class _Template:
    """One initdb per process: a cluster folder that servers copy."""

    _lock = threading.Lock()
    _path: Path | None = None

    @classmethod
    def path(cls) -> Path:
        with cls._lock:
            if cls._path is None or not cls._path.exists():
                cls._path = cls._make()
            return cls._path

    @classmethod
    def _make(cls) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="ledger-pg-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _give_to_server_user(folder)
        _run(
            [
                str(find_bin("initdb")),
                "-D",
                str(folder / "data"),
                "-U",
                ROLE,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
                "--no-instructions",
            ],
            "initdb",
        )
        return folder / "data"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class PostgresServer:
    """One PostgreSQL server in a scratch folder (see the module docstring).

    Args:
        database: the database to create (owned by role ``ledger``; lower-case
            letters, digits and ``_``).
        port: the TCP port on 127.0.0.1; default a free one.

    Raises:
        SinkStartError: when ``database`` is not such a name.

    Attributes:
        database: as given.
        port: the server's port (known once started).
        folder: the scratch folder (``None`` until started).
        password: role ``ledger``'s generated password.
    """

    def __init__(self, database: str = "ledger", *, port: int | None = None) -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", database):
            raise SinkStartError(
                f"database name {database!r}: use lower-case letters, digits and '_' "
                "(it is written into the SQL that creates it)"
            )
        self.database = database
        self.port = port or 0
        self.folder: Path | None = None
        self.password = secrets.token_urlsafe(18)
        self._running = False

    @property
    def dsn(self) -> str:
        """``postgresql://ledger:<password>@127.0.0.1:<port>/<database>``."""
        return f"postgresql://{ROLE}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    @property
    def running(self) -> bool:
        """``True`` between :meth:`start` and :meth:`halt` (or :meth:`stop`)."""
        return self._running

    def start(self) -> Self:
        """Create the cluster (first call) and start the server; idempotent.

        Returns:
            This server, running.

        Raises:
            SinkStartError: the binaries are missing, or the cluster or
                the server could not be made (the message quotes the server log).
        """
        if self._running:
            return self
        first = self.folder is None
        if first:
            self.folder = Path(tempfile.mkdtemp(prefix="ledger-pg-"))
            shutil.copytree(_Template.path(), self.folder / "data", symlinks=True)
            _give_to_server_user(self.folder)
        for attempt in range(3):
            port = self.port or free_port()
            try:
                self._pg_ctl_start(port)
            except SinkStartError:
                # Another process may have taken a port chosen for us between
                # the probe and the bind; a port given by the caller is not retried.
                if self.port or attempt == 2:
                    raise
                continue
            self.port = port
            break
        self._running = True
        if first:
            self._create()
        return self

    def _pg_ctl_start(self, port: int) -> None:
        assert self.folder is not None
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {self.folder} -c fsync=off "
            "-c full_page_writes=off -c max_connections=50 -c shared_buffers=16MB"
        )
        log = self.folder / "server.log"
        _run(
            [
                str(find_bin("pg_ctl")),
                "start",
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-D",
                str(self.folder / "data"),
                "-l",
                str(log),
                "-o",
                options,
            ],
            f"pg_ctl start on 127.0.0.1:{port}",
            log,
        )

    def _create(self) -> None:
        """Set this server's password and create its database, over the private socket."""
        assert self.folder is not None
        # On stdin, not the command line: the password stays out of the process list.
        script = (
            f"ALTER ROLE {ROLE} PASSWORD '{self.password}';\n"
            f'CREATE DATABASE "{self.database}" OWNER {ROLE};\n'
        )
        argv = [str(find_bin("psql")), "-X", "-q", "-v", "ON_ERROR_STOP=1"]
        argv += ["-h", str(self.folder), "-p", str(self.port), "-U", ROLE, "-d", "postgres"]
        _run(argv, "setting the role's password and creating the database", None, script)

    def halt(self) -> None:
        """Stop the server at once (``pg_ctl stop -m immediate``), keeping its folder.

        :meth:`start` starts it again on the same port with the same data: a
        crash and restart of the system, as an outage test needs.
        """
        if not self._running or self.folder is None:
            return
        _run(
            [str(find_bin("pg_ctl")), "stop", "-m", "immediate", "-D", str(self.folder / "data")],
            "pg_ctl stop",
        )
        self._running = False

    def stop(self) -> None:
        """Stop the server and remove its folder; idempotent."""
        try:
            with contextlib.suppress(SinkStartError):
                self.halt()
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
            self._running = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_time_s() -> float:
    """Seconds one start takes now (copy, start, password, database), for reports."""
    began = time.monotonic()
    with PostgresServer():
        return time.monotonic() - began
