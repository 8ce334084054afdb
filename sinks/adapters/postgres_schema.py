"""The ``postgres`` adapter's tables and statements (see :mod:`sinks.adapters.postgres`).

Tables (``<ops>`` is ``operations_table``, default ``ledger_operations``)::

    <ops>          idempotency_key PK, operation_id, parameter_digest,
                   effect_id UNIQUE, attempt_id, fencing_token, committed_ms
                   -- one row per effect, written in the effect's transaction
    <ops>_fences   operation_id PK, highest_token
                   -- one row per operation: its lock and its fence
    ledger_credits seq, effect_id UNIQUE, operation_id, account, amount_minor,
                   currency -- the default effect's table

``committed_ms`` is the database's clock (``now()`` of the transaction, ms
since the epoch). Rows are never deleted: keys are retained for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ledger.errors import SinkConfigError

if TYPE_CHECKING:
    import psycopg

#: The default effect: one credit row per operation's effect.
DEFAULT_EFFECT_SQL = (
    "INSERT INTO ledger_credits (operation_id, account, amount_minor, currency, effect_id) "
    "VALUES (%(operation_id)s, %(account)s, %(amount_minor)s, %(currency)s, %(effect_id)s)"
)
#: The default ``account-credits`` query: the credits of one account, oldest first.
DEFAULT_POSTCONDITION_SQL = (
    "SELECT operation_id, amount_minor, effect_id FROM ledger_credits "
    "WHERE account = %(subject)s ORDER BY seq"
)
#: What the default effect made, per operation: ``(operation_id, count)`` rows (how
#: a test or an operator counts effects in the database itself, not via the adapter).
DEFAULT_EFFECT_COUNT_SQL = "SELECT operation_id, count(*) FROM ledger_credits GROUP BY operation_id"
_CREDITS_DDL = (
    "CREATE TABLE IF NOT EXISTS ledger_credits ("
    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " effect_id text NOT NULL UNIQUE,"
    " operation_id text NOT NULL,"
    " account text NOT NULL,"
    " amount_minor bigint NOT NULL,"
    " currency text NOT NULL)",
    "CREATE INDEX IF NOT EXISTS ledger_credits_account ON ledger_credits (account)",
)
_KEYS = {"operations_table", "effect_sql", "postcondition_sql", "create_schema"}


@dataclass(frozen=True)
class Settings:
    """The adapter's config (``endpoint.config``), checked.

    Attributes:
        operations_table: the operations table, maybe schema-qualified.
        effect_sql: the effect statement.
        postcondition_sql: the ``account-credits`` query.
        create_schema: create the tables on first use.
    """

    operations_table: str = "ledger_operations"
    effect_sql: str = DEFAULT_EFFECT_SQL
    postcondition_sql: str = DEFAULT_POSTCONDITION_SQL
    create_schema: bool = True

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Settings:
        """Check ``endpoint.config``.

        Raises:
            SinkConfigError: an unknown key, or a value of the wrong type.
        """
        unknown = sorted(set(config) - _KEYS)
        if unknown:
            raise SinkConfigError(
                f"postgres sink config has unknown keys {unknown} (known: {sorted(_KEYS)}); "
                "fix its config in the sink registry"
            )
        settings = cls(**config)
        for name in ("operations_table", "effect_sql", "postcondition_sql"):
            value = getattr(settings, name)
            if not isinstance(value, str) or not value.strip():
                raise SinkConfigError(
                    f"postgres sink config {name!r} must be a non-empty string, not {value!r}"
                )
        if not isinstance(settings.create_schema, bool):
            raise SinkConfigError(
                f"postgres sink config 'create_schema' must be true or false, not "
                f"{settings.create_schema!r}"
            )
        parts = settings.operations_table.split(".")
        if len(parts) > 2 or not all(parts):
            raise SinkConfigError(
                f"postgres sink config 'operations_table' {settings.operations_table!r} must be "
                "'table' or 'schema.table'"
            )
        return settings

    def ops(self) -> Any:
        """The operations table as an SQL identifier."""
        from psycopg import sql

        return sql.Identifier(*self.operations_table.split("."))

    def fences(self) -> Any:
        """The fence table as an SQL identifier (``<operations_table>_fences``)."""
        from psycopg import sql

        *schema, table = self.operations_table.split(".")
        return sql.Identifier(*schema, f"{table}_fences")

    def _index(self) -> Any:
        from psycopg import sql

        return sql.Identifier(f"{self.operations_table.split('.')[-1]}_operation_id")


def create(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """Create the tables that do not exist yet, in one transaction (serialised across callers).

    Raises:
        psycopg.Error: as the server answers (the caller translates it).
    """
    from psycopg import sql

    statements: list[Any] = [
        sql.SQL("SELECT pg_advisory_xact_lock(hashtext('ledger sink schema'))"),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " idempotency_key text PRIMARY KEY,"
            " operation_id text NOT NULL,"
            " parameter_digest text NOT NULL,"
            " effect_id text NOT NULL UNIQUE,"
            " attempt_id text,"
            " fencing_token bigint,"
            " committed_ms bigint NOT NULL)"
        ).format(settings.ops()),
        sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (operation_id)").format(
            settings._index(), settings.ops()
        ),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (operation_id text PRIMARY KEY, highest_token bigint)"
        ).format(settings.fences()),
    ]
    defaults = (DEFAULT_EFFECT_SQL, DEFAULT_POSTCONDITION_SQL)
    if settings.effect_sql in defaults or settings.postcondition_sql in defaults:
        statements += [sql.SQL(ddl) for ddl in _CREDITS_DDL]
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
    conn.commit()


def fence(
    cur: psycopg.Cursor[Any], settings: Settings, operation_id: str, token: int | None
) -> int | None:
    """Lock the operation's fence row and raise its highest token to ``token``.

    One conditional upsert: the row is created, or raised when ``token`` is
    not lower than its highest (``None`` raises nothing); either way it stays
    locked until the transaction ends.

    Returns:
        ``None`` when the token may act, else the (higher) highest token.
    """
    from psycopg import sql

    cur.execute(
        sql.SQL(
            "INSERT INTO {f} AS f (operation_id, highest_token) VALUES (%(op)s, %(token)s) "
            "ON CONFLICT (operation_id) DO UPDATE "
            "SET highest_token = GREATEST(f.highest_token, EXCLUDED.highest_token) "
            "WHERE EXCLUDED.highest_token IS NULL OR f.highest_token IS NULL "
            "OR f.highest_token <= EXCLUDED.highest_token "
            "RETURNING highest_token"
        ).format(f=settings.fences()),
        {"op": operation_id, "token": token},
    )
    if cur.fetchone() is not None:
        return None
    cur.execute(
        sql.SQL("SELECT highest_token FROM {} WHERE operation_id = %s").format(settings.fences()),
        (operation_id,),
    )
    row = cur.fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None


@dataclass(frozen=True)
class Effect:
    """One operations row: an effect the database holds.

    Attributes:
        operation_id: the operation that made it.
        parameter_digest: the digest it was made with.
        effect_id: its ID.
        committed_ms: the database's clock at its commit (ms since the epoch).
    """

    operation_id: str
    parameter_digest: str
    effect_id: str
    committed_ms: int


_COLUMNS = "operation_id, parameter_digest, effect_id, committed_ms"


def by_key(cur: psycopg.Cursor[Any], settings: Settings, key: str) -> Effect | None:
    """The effect an idempotency key names, if any."""
    from psycopg import sql

    cur.execute(
        sql.SQL(f"SELECT {_COLUMNS} FROM {{}} WHERE idempotency_key = %s").format(settings.ops()),
        (key,),
    )
    row = cur.fetchone()
    return None if row is None else Effect(row[0], row[1], row[2], int(row[3]))


def by_operation(cur: psycopg.Cursor[Any], settings: Settings, operation_id: str) -> list[Effect]:
    """Every effect of an operation, oldest first."""
    from psycopg import sql

    cur.execute(
        sql.SQL(
            f"SELECT {_COLUMNS} FROM {{}} WHERE operation_id = %s ORDER BY committed_ms, effect_id"
        ).format(settings.ops()),
        (operation_id,),
    )
    return [Effect(r[0], r[1], r[2], int(r[3])) for r in cur.fetchall()]


def record(
    cur: psycopg.Cursor[Any],
    settings: Settings,
    *,
    key: str,
    operation_id: str,
    parameter_digest: str,
    effect_id: str,
    attempt_id: str,
    fencing_token: int | None,
) -> int:
    """Write an effect's operations row; its ``committed_ms`` (the database's clock)."""
    from psycopg import sql

    cur.execute(
        sql.SQL(
            "INSERT INTO {} (idempotency_key, operation_id, parameter_digest, effect_id, "
            "attempt_id, fencing_token, committed_ms) VALUES (%s, %s, %s, %s, %s, %s, "
            "(extract(epoch FROM now()) * 1000)::bigint) RETURNING committed_ms"
        ).format(settings.ops()),
        (key, operation_id, parameter_digest, effect_id, attempt_id, fencing_token),
    )
    row = cur.fetchone()
    assert row is not None
    return int(row[0])
