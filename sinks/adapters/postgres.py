"""The ``postgres`` sink adapter: the effect and its idempotency record in one transaction.

The effect owner is a PostgreSQL database. A submit is one transaction::

    BEGIN
    upsert the operation's fence row, raising its highest token      (locks it)
      -- a lower token than the highest: stale_token, ROLLBACK
    look the idempotency key up in the operations table
      -- same operation and digest: committed, replayed (the first effect_id)
      -- anything else: key_reused
    run effect_sql                       (the database may refuse: rejected)
    insert the operations row (key, operation, digest, effect_id, token, committed_ms)
    COMMIT

so the database itself keeps the effect and the record of it together: a
submit that is lost and sent again finds the row and replays, and a
readback (by operation ID) finds exactly the effects that committed.
Operations rows are kept for ever: an idempotency key never expires, whatever
``key_retention_s`` a contract declares.

``endpoint.url`` is the DSN (``postgresql://user:password@host:port/db``;
libpq's parameters, e.g. ``sslmode``, ride in its query string).
``endpoint.config`` keys, all optional:

``operations_table`` (default ``ledger_operations``)
    the idempotency records, one row per effect; the operations' fence rows
    are in ``<operations_table>_fences``. May be schema-qualified (``s.t``).
``effect_sql`` (default :data:`DEFAULT_EFFECT_SQL`: a credit row into
``ledger_credits``)
    one SQL statement that makes the effect, with psycopg's named
    placeholders (``%(name)s``) taken from the operation's params plus
    ``operation_id``, ``effect_id``, ``attempt_id``, ``parameter_digest``,
    ``fencing_token`` and ``params_json`` (the params as JSON text). It must
    not end the transaction. A param it names that the operation lacks, or an
    error the database raises for it (a constraint, a trigger), is
    ``rejected``: nothing committed.
``postcondition_sql`` (default :data:`DEFAULT_POSTCONDITION_SQL`)
    the ``account-credits`` query: rows of ``(operation_id, amount_minor,
    effect_id)``, oldest first, for the placeholder ``%(subject)s`` (also
    ``%(account)s``); the credited sum is theirs.
``create_schema`` (default ``true``)
    on first use, create the operations and fence tables, and
    ``ledger_credits`` when ``effect_sql`` or ``postcondition_sql`` is the
    default, if they do not exist (``CREATE TABLE IF NOT EXISTS``). With
    ``false`` they must exist.

Transport, as the port's rules ask (:mod:`sinks.port`):

* the connection cannot be made: ``unavailable``, ``sent=False``;
* any failure before ``COMMIT`` is sent (a lost connection, the deadline,
  a timeout, a serialization failure): ``unavailable`` with ``sent=True``
  -- the server received the request but cannot have committed it;
* the connection is lost, or the deadline passes, after ``COMMIT`` was
  sent: ``ambiguous`` (read it back);
* every call ends within ``timeout_s``: see :mod:`sinks.adapters.postgres_call`.

A call takes the adapter's one connection (opened on first use, opened
again after a failure); calls from several threads take turns.
Reservations are not offered. The password in the DSN never appears in a
result or an error.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.contracts import PostconditionQuery
from ledger.errors import LedgerError, SinkConfigError, SinkUnavailableError
from ledger.identity import digest_version
from ledger.identity import parameter_digest as compute_digest
from sinks.adapters import postgres_schema as schema
from sinks.adapters.postgres_call import Deadline, Phase, Watchdog, classify
from sinks.adapters.postgres_session import Session
from sinks.client import AccountCredits, Credit, ReadbackResult, SubmitResult
from sinks.port import AdapterCapabilities, UnsupportedParts

if TYPE_CHECKING:
    import psycopg

DEFAULT_EFFECT_SQL = schema.DEFAULT_EFFECT_SQL
DEFAULT_POSTCONDITION_SQL = schema.DEFAULT_POSTCONDITION_SQL

#: What the adapter offers: idempotent submit, readback, postcondition, fencing.
CAPABILITIES = AdapterCapabilities(idempotent=True, readback=True, postcondition=True, fencing=True)

_INSTALL = "pip install 'kafka-recovery-ledger[postgres]'"

T = TypeVar("T")


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise SinkConfigError(
            f"the postgres sink adapter needs psycopg 3: {_INSTALL}", observed=str(exc)
        ) from exc
    return psycopg


class PostgresAdapter(UnsupportedParts):
    """A sink whose effects are rows of a PostgreSQL database (see the module docstring).

    Args:
        dsn: the database's DSN.
        config: ``endpoint.config`` (keys in the module docstring).
        timeout_s: the overall deadline of every call (seconds).

    Raises:
        SinkConfigError: psycopg is missing, or a config key is unknown or invalid.
    """

    def __init__(
        self, dsn: str, config: dict[str, Any], *, timeout_s: float, sink: str = ""
    ) -> None:
        self._pg = _psycopg()
        self.sink = sink
        self.timeout_s = timeout_s
        self.settings = schema.Settings.from_config(config)
        self._session = Session(self._pg, dsn, self.settings, timeout_s=timeout_s)
        self.name = self._session.name
        self._lock = threading.Lock()

    def _config_error(self, what: str, exc: BaseException) -> SinkConfigError:
        return SinkConfigError(
            f"postgres sink {self.name}: {what} failed: {exc}; check the tables and the "
            "operations_table / effect_sql / postcondition_sql of its config in the sink registry"
        )

    # ------------------------------------------------------------------ submit

    def _digest_mismatch(
        self,
        digest: str,
        params: dict[str, Any],
        action: str | None,
        subject: str | None,
        purpose: str | None,
        decision_version: int | None,
    ) -> str | None:
        """Why ``digest`` is not these parameters' digest, or ``None``.

        Also when the sink's name or an input is unknown: nothing to recompute with.
        """
        if not self.sink or decision_version is None or None in (action, subject, purpose):
            return None
        try:
            expected = compute_digest(
                action=str(action),
                params=params,
                subject=str(subject),
                purpose=str(purpose),
                decision_version=decision_version,
                sink=self.sink,
                version=digest_version(digest),
            )
        except (LedgerError, ValueError) as exc:
            return f"parameter_digest_mismatch: the params are not JSON values ({exc})"
        if expected == digest:
            return None
        return (
            f"parameter_digest_mismatch: {digest[:20]} is not the digest of these params, "
            f"action, subject, purpose and decision version for sink {self.sink} "
            f"({expected[:20]}): nothing was written"
        )

    def submit(
        self,
        operation_id: str,
        parameter_digest: str,
        params: dict[str, Any],
        fencing_token: int | None,
        attempt_id: str,
        use_key: bool,
        *,
        action: str | None = None,
        subject: str | None = None,
        purpose: str | None = None,
        decision_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitResult:
        """Make the effect and its operations row in one transaction (see the module docstring).

        Args:
            operation_id: the stable operation ID.
            parameter_digest: digest of the semantic parameters, stored; when
                the adapter knows its sink's name and every digest input is
                given, it recomputes it first and refuses a mismatch
                (``rejected``, nothing written): parameters that are not the
                ones admitted never reach the database.
            params: the parameters, the effect statement's placeholders.
            fencing_token: the operation's current token, or ``None`` (not fenced).
            attempt_id: this attempt's identity (stored).
            use_key: deduplicate by the key; ``False`` makes a new effect each call.
            action: a digest input.
            subject: a digest input.
            purpose: a digest input.
            decision_version: a digest input.
            idempotency_key: the key when ``use_key``; default the operation ID.

        Returns:
            ``committed`` (``replayed`` when the key already held this
            operation's effect), ``stale_token``, ``key_reused``, ``rejected``,
            ``unavailable`` or ``ambiguous``.

        Raises:
            SinkConfigError: the DSN's credentials, the tables or the
                adapter's own statements do not work (a configuration problem).
        """
        mismatch = self._digest_mismatch(
            parameter_digest, params, action, subject, purpose, decision_version
        )
        if mismatch is not None:
            return SubmitResult("rejected", operation_id, detail=mismatch, sent=False)
        effect_id = f"pg-{uuid.uuid4().hex}"
        key = (idempotency_key or operation_id) if use_key else effect_id
        values = {
            **params,
            "operation_id": operation_id,
            "effect_id": effect_id,
            "attempt_id": attempt_id,
            "parameter_digest": parameter_digest,
            "fencing_token": fencing_token,
            "params_json": json.dumps(params, sort_keys=True, default=str),
        }
        with self._lock:
            deadline = Deadline(self.timeout_s)
            try:
                conn = self._session.connect(deadline)
            except SinkUnavailableError as exc:
                return SubmitResult("unavailable", operation_id, detail=str(exc), sent=False)
            phase: Phase = "book"
            with Watchdog(conn, deadline) as dog:
                try:
                    with conn.cursor() as cur:
                        highest = schema.fence(cur, self.settings, operation_id, fencing_token)
                        if highest is not None:
                            conn.rollback()
                            return SubmitResult(
                                "stale_token",
                                operation_id,
                                highest_token=highest,
                                detail=f"stale_fencing_token: {fencing_token} < {highest}",
                            )
                        prior = schema.by_key(cur, self.settings, key)
                        if prior is not None:
                            return self._prior(conn, operation_id, parameter_digest, prior)
                        phase = "effect"
                        cur.execute(self.settings.effect_sql, values)
                        phase = "record"
                        committed_ms = schema.record(
                            cur,
                            self.settings,
                            key=key,
                            operation_id=operation_id,
                            parameter_digest=parameter_digest,
                            effect_id=effect_id,
                            attempt_id=attempt_id,
                            fencing_token=fencing_token,
                        )
                    phase = "commit"
                    conn.commit()
                except self._pg.Error as exc:
                    failure = classify(phase, exc, fired=dog.fired, timeout_s=self.timeout_s)
                    self._session.settle(conn, dog)
                    if failure.verdict == "config":
                        raise self._config_error("the operations bookkeeping", exc) from None
                    return SubmitResult(failure.verdict, operation_id, detail=failure.detail)
        return SubmitResult(
            "committed", operation_id, effect_id=effect_id, committed_ms=committed_ms
        )

    def _prior(
        self,
        conn: psycopg.Connection[Any],
        operation_id: str,
        parameter_digest: str,
        prior: schema.Effect,
    ) -> SubmitResult:
        """The answer for a key that already names an effect (the fence raise is kept)."""
        try:
            conn.commit()  # keeps the fence raised; the answer does not depend on it
        except self._pg.Error:
            self._session.drop()
        if prior.operation_id == operation_id and prior.parameter_digest == parameter_digest:
            return SubmitResult(
                "committed",
                operation_id,
                effect_id=prior.effect_id,
                committed_ms=prior.committed_ms,
                replayed=True,
            )
        return SubmitResult(
            "key_reused",
            operation_id,
            detail=f"idempotency_key_reused: the key names effect {prior.effect_id} "
            f"of {prior.operation_id} with digest {prior.parameter_digest[:20]}",
        )

    # ------------------------------------------------------------------ reads

    def _read(self, what: str, run: Callable[[psycopg.Connection[Any]], T]) -> T | str:
        """Run a read-only exchange in its own transaction; an error's text when it fails.

        Returns:
            ``run``'s value, or the failure's detail (a ``str``; prefixed
            ``not sent:`` when the connection could not be made).

        Raises:
            SinkConfigError: the server reports a missing table or privilege.
        """
        with self._lock:
            deadline = Deadline(self.timeout_s)
            try:
                conn = self._session.connect(deadline)
            except SinkUnavailableError as exc:
                return f"not sent: {exc}"
            with Watchdog(conn, deadline) as dog:
                try:
                    value = run(conn)
                    conn.commit()
                    return value
                except self._pg.Error as exc:
                    self._session.settle(conn, dog)
                    state = None if dog.fired else getattr(exc, "sqlstate", None)
                    if state is not None and state[:2] in ("42", "28"):
                        raise self._config_error(what, exc) from None
                    if dog.fired:
                        return f"no answer within {self.timeout_s:g} s: {exc}"
                    return f"{type(exc).__name__}: {str(exc).strip()}"[:1000]

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        """Read the operation's effects back by operation ID (fenced when a token is given).

        Returns:
            ``committed`` (the first effect, ``effects`` = operations rows of
            the operation), ``absent``, ``stale_token`` (``highest_token``
            set) or ``ambiguous`` (no observation; ``sent=False`` when the
            connection could not be made).

        Raises:
            SinkConfigError: the tables are missing or not readable.
        """

        def run(conn: psycopg.Connection[Any]) -> ReadbackResult:
            with conn.cursor() as cur:
                if fencing_token is not None:
                    highest = schema.fence(cur, self.settings, operation_id, fencing_token)
                    if highest is not None:
                        return ReadbackResult(
                            "stale_token",
                            operation_id,
                            highest_token=highest,
                            detail=f"stale_fencing_token: {fencing_token} < {highest}",
                        )
                effects = schema.by_operation(cur, self.settings, operation_id)
            if not effects:
                return ReadbackResult("absent", operation_id, detail="absent")
            first = effects[0]
            return ReadbackResult(
                "committed",
                operation_id,
                effect_id=first.effect_id,
                committed_ms=first.committed_ms,
                parameter_digest=first.parameter_digest,
                effects=len(effects),
            )

        answer = self._read("the readback", run)
        if isinstance(answer, str):
            sent = not answer.startswith("not sent:")
            return ReadbackResult("ambiguous", operation_id, detail=answer, sent=sent)
        return answer

    def postcondition(self, query: PostconditionQuery, subject: str) -> AccountCredits:
        """Ask ``postcondition_sql`` for the subject's credits (``account-credits``).

        Returns:
            ``observed`` (credits oldest first, their sum), or ``ambiguous``.

        Raises:
            SinkConfigError: the query's table or columns are missing.
        """

        def run(conn: psycopg.Connection[Any]) -> AccountCredits:
            with conn.cursor() as cur:
                names = {"subject": subject, "account": subject}
                cur.execute(self.settings.postcondition_sql, names)
                rows = cur.fetchall()
            credits = tuple(Credit(str(op), int(amount), str(eid)) for op, amount, eid in rows)
            return AccountCredits(
                "observed",
                subject,
                credited_minor=sum(c.amount_minor for c in credits),
                credits=credits,
            )

        match query.query:
            case "account-credits":
                answer = self._read("the postcondition query", run)
        if isinstance(answer, str):
            sent = not answer.startswith("not sent:")
            return AccountCredits("ambiguous", subject, detail=answer, sent=sent)
        return answer

    def health_info(self) -> dict[str, Any] | None:
        """The server's health when ``SELECT 1`` answers, else ``None``.

        ``{"status": "ok", "name", "adapter": "postgres", "server_version"}`` when ``SELECT 1``
        answers, else ``None``.
        """

        def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            conn.execute("SELECT 1").fetchone()
            return {
                "status": "ok",
                "name": self.name,
                "adapter": "postgres",
                "server_version": conn.info.server_version,
            }

        try:
            answer = self._read("SELECT 1", run)
        except SinkConfigError:
            return None
        return None if isinstance(answer, str) else answer

    def health(self) -> bool:
        """``True`` when the database answers."""
        return self.health_info() is not None

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._session.drop()


def open_adapter(endpoint: Any, *, timeout_s: float, name: str = "") -> PostgresAdapter:
    """The ``postgres`` adapter (:mod:`sinks.port`) for a sink registry entry.

    Args:
        endpoint: the sink's :class:`~sinks.registry.SinkEndpoint` (``url`` is the DSN).
        timeout_s: the deadline of every call, in seconds.
        name: the sink's registered name (the adapter recomputes parameter
            digests with it; empty: it does not).

    Raises:
        SinkConfigError: psycopg is missing, or the url or config is invalid.
    """
    return PostgresAdapter(endpoint.url, dict(endpoint.config), timeout_s=timeout_s, sink=name)


open_adapter.capabilities = CAPABILITIES  # type: ignore[attr-defined]  # the sink registry reads this function attribute (sinks.adapters)
