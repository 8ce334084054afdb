"""The ``postgres`` adapter's one connection: opened on demand, checked, replaced on failure."""

from __future__ import annotations

import contextlib
import select
from typing import TYPE_CHECKING, Any

from ledger.errors import SinkConfigError, SinkUnavailableError
from sinks.adapters import postgres_schema as schema
from sinks.adapters.postgres_call import Deadline, Watchdog, session_options

if TYPE_CHECKING:
    import psycopg

#: Texts of a connection refused for its credentials or database (libpq gives no SQLSTATE).
_REFUSALS = ("authentication failed", "does not exist", "no pg_hba")


class Session:
    """One database connection of an adapter.

    Args:
        pg: the psycopg module.
        dsn: the database's DSN.
        settings: the adapter's settings (the schema to create on first use).
        timeout_s: the adapter's deadline (the session's server-side timeouts).

    Attributes:
        name: ``user@host:port/database`` (no password), for messages.
    """

    def __init__(self, pg: Any, dsn: str, settings: schema.Settings, *, timeout_s: float) -> None:
        self._pg = pg
        self._dsn = dsn
        self._settings = settings
        try:
            params = pg.conninfo.conninfo_to_dict(dsn)
        except pg.ProgrammingError as exc:
            raise SinkConfigError(
                "the postgres sink's url is not a PostgreSQL DSN "
                "(postgresql://user:password@host:port/database); fix its url in the sink "
                f"registry: {exc}"
            ) from None
        self._options = session_options(timeout_s, params.get("options"))
        self.name = (
            f"{params.get('user', '')}@{params.get('host', '')}:{params.get('port', 5432)}"
            f"/{params.get('dbname', '')}"
        )
        self._conn: psycopg.Connection[Any] | None = None
        self._schema_ready = not settings.create_schema

    def _sound(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether an idle connection still looks alive, without a round trip.

        An idle connection has nothing to read; a readable socket means the
        server closed it (or said something unasked, e.g. that it is shutting
        down), so a fresh connection is made instead -- and a server that is
        gone is then told apart as ``sent=False``.
        """
        if conn.closed or conn.broken:
            return False
        try:
            readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def connect(self, deadline: Deadline) -> psycopg.Connection[Any]:
        """The open connection, or a new one (the schema made on first use).

        Raises:
            SinkUnavailableError: the connection could not be made (nothing was sent).
            SinkConfigError: the server refused the credentials or the database,
                or the tables cannot be created.
        """
        if self._conn is not None and self._sound(self._conn):
            return self._conn
        self.drop()
        pg = self._pg
        try:
            conn: psycopg.Connection[Any] = pg.connect(
                self._dsn,
                autocommit=False,
                connect_timeout=deadline.connect_timeout_s(),
                options=self._options,
                application_name="kafka-recovery-ledger",
            )
        except pg.Error as exc:
            text = str(exc).strip()
            if any(refusal in text for refusal in _REFUSALS):
                raise SinkConfigError(
                    f"postgres sink {self.name} refused the connection: {text}; fix the user, "
                    "password or database in its url in the sink registry"
                ) from None
            raise SinkUnavailableError(
                f"cannot connect to {self.name}: {text}", sink=self.name
            ) from None
        self._conn = conn
        if not self._schema_ready:
            self._create(conn, deadline)
        return conn

    def _create(self, conn: psycopg.Connection[Any], deadline: Deadline) -> None:
        try:
            with Watchdog(conn, deadline):
                schema.create(conn, self._settings)
        except self._pg.Error as exc:
            self.drop()
            state = getattr(exc, "sqlstate", None) or ""
            if state[:2] in ("42", "28"):
                raise SinkConfigError(
                    f"postgres sink {self.name} could not create its tables ({exc}); grant "
                    "the user CREATE, or create them and set create_schema false"
                ) from None
            raise SinkUnavailableError(
                f"creating the tables at {self.name}: {exc}", sink=self.name
            ) from None
        self._schema_ready = True

    def settle(self, conn: psycopg.Connection[Any], dog: Watchdog) -> None:
        """After a failure: roll back, or drop the connection when it is no longer sound."""
        if dog.fired or conn.closed or conn.broken:
            self.drop()
            return
        try:
            conn.rollback()
        except self._pg.Error:
            self.drop()

    def drop(self) -> None:
        """Close the connection (if any); the next call opens a new one."""
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._conn.close()
        self._conn = None
