"""Durable store of one reference sink: a SQLite file in WAL mode.

One file per sink. It holds everything the sink must remember across a
restart of its server process:

* ``effects`` -- one row per effect the sink performed (a refund credited to
  an account), with the idempotency key, the parameter digest and the fencing
  token the request carried;
* ``fences`` -- per operation, the highest fencing token seen so far;
* ``faults`` -- armed one-shot faults, consumed by the operation's next submits;
* ``counters`` -- named request counters (``stale_rejections`` ...).

Every request runs in exactly one transaction (:meth:`SinkStore.transaction`),
so a crash leaves either all of a request's mutations or none. Commits are
durable before the HTTP answer is written (``synchronous=FULL``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

from testbed.errors import SinkStoreError

#: Fault modes a sink can be armed with (``sink_fault`` in SCENARIOS.md).
FaultMode = Literal[
    "commit_then_drop_response",
    "timeout_before_commit",
    "timeout_after_commit",
    "reject",
    "unavailable",
]

#: The fault modes as a tuple, for validation.
FAULT_MODES: Final[tuple[str, ...]] = get_args(FaultMode)

#: Counters every sink reports, even while still zero.
COUNTERS: Final[tuple[str, ...]] = (
    "requests",
    "submits",
    "readbacks",
    "effects_created",
    "replays",
    "stale_rejections",
    "drift_rejections",
    "faults_fired",
    "rejected",
    "unavailable",
    "timeouts",
    "refusals",
    "reservations",
    "reservations_confirmed",
    "reservations_released",
)

SCHEMA_VERSION: Final = 1

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    effect_id TEXT NOT NULL UNIQUE,
    operation_id TEXT NOT NULL,
    idempotency_key TEXT,
    attempt_id TEXT NOT NULL,
    parameter_digest TEXT NOT NULL,
    params_json TEXT NOT NULL,
    account TEXT,
    amount_minor INTEGER,
    fencing_token INTEGER,
    first_seen_ms INTEGER NOT NULL,
    committed_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_by_operation ON effects (operation_id, seq);
CREATE INDEX IF NOT EXISTS effects_by_key ON effects (idempotency_key, seq);
CREATE INDEX IF NOT EXISTS effects_by_account ON effects (account, seq);
CREATE TABLE IF NOT EXISTS fences (
    operation_id TEXT PRIMARY KEY,
    highest_token INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS faults (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id TEXT NOT NULL,
    mode TEXT NOT NULL,
    remaining INTEGER NOT NULL CHECK (remaining >= 0),
    armed_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS faults_by_operation ON faults (operation_id, id);
CREATE TABLE IF NOT EXISTS reservations (
    operation_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    parameter_digest TEXT NOT NULL,
    submit_json TEXT NOT NULL,
    held_at_ms INTEGER NOT NULL,
    released_why TEXT,
    effect_id TEXT,
    reserves INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


#: Former name of :class:`testbed.errors.SinkStoreError`, kept for importers.
StoreError = SinkStoreError


@dataclass(frozen=True)
class EffectRecord:
    """One effect the sink performed.

    Attributes:
        seq: insertion order (1, 2, ...), unique within the sink.
        effect_id: the sink's own ID of the effect, ``{sink}-{seq}``.
        operation_id: the operation the request named.
        idempotency_key: the key the effect is stored under, or ``None`` when
            the request had none or the sink is not idempotent.
        attempt_id: the caller's attempt identity that created the effect.
        parameter_digest: digest of the operation's semantic parameters.
        params: the parameters as sent.
        account: the account credited (``params["account"]``), if any.
        amount_minor: the amount credited in minor units, if any.
        fencing_token: the token the request carried, if any.
        first_seen_ms: ledger time (ms) the key was first seen; the key is
            retained until ``first_seen_ms + key_retention_s * 1000``.
        committed_ms: ledger time (ms) the effect committed.
    """

    seq: int
    effect_id: str
    operation_id: str
    idempotency_key: str | None
    attempt_id: str
    parameter_digest: str
    params: Mapping[str, Any]
    account: str | None
    amount_minor: int | None
    fencing_token: int | None
    first_seen_ms: int
    committed_ms: int


@dataclass(frozen=True)
class FenceCheck:
    """Outcome of presenting a fencing token for an operation.

    Attributes:
        accepted: ``False`` when the token is lower than the highest seen.
        highest: the highest token recorded after the check.
    """

    accepted: bool
    highest: int


_EFFECT_COLUMNS: Final = (
    "seq, effect_id, operation_id, idempotency_key, attempt_id, parameter_digest, "
    "params_json, account, amount_minor, fencing_token, first_seen_ms, committed_ms"
)


def _effect(row: sqlite3.Row) -> EffectRecord:
    return EffectRecord(
        seq=row["seq"],
        effect_id=row["effect_id"],
        operation_id=row["operation_id"],
        idempotency_key=row["idempotency_key"],
        attempt_id=row["attempt_id"],
        parameter_digest=row["parameter_digest"],
        params=json.loads(row["params_json"]),
        account=row["account"],
        amount_minor=row["amount_minor"],
        fencing_token=row["fencing_token"],
        first_seen_ms=row["first_seen_ms"],
        committed_ms=row["committed_ms"],
    )


@dataclass(frozen=True)
class ReservationRecord:
    """One operation's hold at a reservation sink (try-confirm-cancel).

    Attributes:
        operation_id: the operation (also the hold's key).
        status: ``held``, ``confirmed`` or ``released``.
        parameter_digest: digest of the reserved effect.
        submit_json: the reserve request (the effect made on confirm).
        held_at_ms: ledger time the current hold was taken (ms).
        released_why: ``cancelled`` or ``expired`` once released.
        effect_id: the effect made by the confirmation.
        reserves: how many holds were taken under this key.
    """

    operation_id: str
    status: str
    parameter_digest: str
    submit_json: str
    held_at_ms: int
    released_why: str | None = None
    effect_id: str | None = None
    reserves: int = 1


class StoreTxn:
    """The operations available inside one transaction.

    Obtained only from :meth:`SinkStore.transaction`; do not keep it after the
    ``with`` block ends.
    """

    def __init__(self, conn: sqlite3.Connection, sink_name: str) -> None:
        self._conn = conn
        self._sink_name = sink_name

    def bump(self, counter: str, by: int = 1) -> None:
        """Add ``by`` to a named counter (created at 0 when absent).

        Args:
            counter: the counter's name, e.g. ``stale_rejections``.
            by: how much to add.
        """
        self._conn.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            (counter, by),
        )

    def counters(self) -> dict[str, int]:
        """Return every counter; the names in :data:`COUNTERS` are always present."""
        values = dict.fromkeys(COUNTERS, 0)
        for row in self._conn.execute("SELECT name, value FROM counters"):
            values[row["name"]] = row["value"]
        return values

    def highest_token(self, operation_id: str) -> int | None:
        """Return the highest fencing token seen for an operation.

        Args:
            operation_id: the operation.

        Returns:
            The highest token, or ``None`` when the sink has seen none.
        """
        row = self._conn.execute(
            "SELECT highest_token FROM fences WHERE operation_id = ?", (operation_id,)
        ).fetchone()
        return None if row is None else int(row["highest_token"])

    def observe_token(self, operation_id: str, token: int, now_ms: int) -> FenceCheck:
        """Check a fencing token and raise the recorded highest to it.

        Args:
            operation_id: the operation the request names.
            token: the fencing token the request carries.
            now_ms: ledger time of the request (ms), kept for inspection.

        Returns:
            ``accepted=False`` (and the recorded highest unchanged) when
            ``token`` is lower than the highest seen; otherwise
            ``accepted=True`` and the highest is ``max(highest, token)``.
        """
        highest = self.highest_token(operation_id)
        if highest is not None and token < highest:
            return FenceCheck(accepted=False, highest=highest)
        if highest is None or token > highest:
            self._conn.execute(
                "INSERT INTO fences (operation_id, highest_token, updated_ms) VALUES (?, ?, ?) "
                "ON CONFLICT (operation_id) DO UPDATE SET "
                "highest_token = excluded.highest_token, updated_ms = excluded.updated_ms",
                (operation_id, token, now_ms),
            )
        return FenceCheck(accepted=True, highest=max(token, highest or token))

    def arm_fault(self, operation_id: str, mode: FaultMode, times: int, now_ms: int) -> None:
        """Arm a fault for the operation's next ``times`` submits.

        Faults armed earlier for the same operation fire first.

        Args:
            operation_id: the operation whose submits the fault hits.
            mode: the fault, one of :data:`FAULT_MODES`.
            times: how many submits it hits (at least 1).
            now_ms: ledger time of arming (ms), kept for inspection.

        Raises:
            ValueError: for an unknown mode or ``times < 1`` (the gateway
                validates both first; this guards direct callers).
        """
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; use one of {', '.join(FAULT_MODES)}")
        if times < 1:
            raise ValueError(f"times must be at least 1, got {times}")
        self._conn.execute(
            "INSERT INTO faults (operation_id, mode, remaining, armed_ms) VALUES (?, ?, ?, ?)",
            (operation_id, mode, times, now_ms),
        )

    def take_fault(self, operation_id: str) -> FaultMode | None:
        """Consume one firing of the oldest armed fault of an operation.

        Args:
            operation_id: the operation a submit names.

        Returns:
            The fault mode to apply to this request, or ``None``.
        """
        row = self._conn.execute(
            "SELECT id, mode FROM faults WHERE operation_id = ? AND remaining > 0 "
            "ORDER BY id LIMIT 1",
            (operation_id,),
        ).fetchone()
        if row is None:
            return None
        self._conn.execute("UPDATE faults SET remaining = remaining - 1 WHERE id = ?", (row["id"],))
        mode: FaultMode = row["mode"]
        return mode

    def latest_effect_for_key(self, idempotency_key: str) -> EffectRecord | None:
        """Return the most recent effect stored under an idempotency key.

        Args:
            idempotency_key: the key a submit carried.

        Returns:
            The effect, or ``None`` when no effect has the key.
        """
        row = self._conn.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE idempotency_key = ? "
            "ORDER BY seq DESC LIMIT 1",
            (idempotency_key,),
        ).fetchone()
        return None if row is None else _effect(row)

    def insert_effect(
        self,
        *,
        operation_id: str,
        idempotency_key: str | None,
        attempt_id: str,
        parameter_digest: str,
        params: Mapping[str, Any],
        account: str | None,
        amount_minor: int | None,
        fencing_token: int | None,
        now_ms: int,
    ) -> EffectRecord:
        """Record a new effect committed at ``now_ms`` and return it.

        The effect ID is ``{sink}-{seq}``; ``first_seen_ms`` and
        ``committed_ms`` are both ``now_ms``.

        Args:
            operation_id: the operation the submit names.
            idempotency_key: the ``Idempotency-Key`` sent, or ``None``.
            attempt_id: the submitting attempt's identity.
            parameter_digest: digest of the semantic parameters.
            params: the parameters, stored as canonical JSON.
            account: the account credited, if any (postcondition queries).
            amount_minor: the amount credited in minor units, if any.
            fencing_token: the token the submit carried, or ``None``.
            now_ms: ledger time of the commit (ms).

        Returns:
            The stored effect.

        Raises:
            SinkStoreError: if SQLite returns no row ID (it always does).
        """
        cursor = self._conn.execute(
            "INSERT INTO effects (effect_id, operation_id, idempotency_key, attempt_id, "
            "parameter_digest, params_json, account, amount_minor, fencing_token, "
            "first_seen_ms, committed_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                f"pending:{attempt_id}",
                operation_id,
                idempotency_key,
                attempt_id,
                parameter_digest,
                json.dumps(dict(params), sort_keys=True, separators=(",", ":")),
                account,
                amount_minor,
                fencing_token,
                now_ms,
                now_ms,
            ),
        )
        seq = cursor.lastrowid
        if seq is None:  # pragma: no cover - sqlite always sets it after INSERT
            raise SinkStoreError(
                "SQLite returned no row id for the new effect", sink=self._sink_name
            )
        self._conn.execute(
            "UPDATE effects SET effect_id = ? WHERE seq = ?", (f"{self._sink_name}-{seq}", seq)
        )
        row = self._conn.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE seq = ?", (seq,)
        ).fetchone()
        return _effect(row)

    def effects_for_operation(self, operation_id: str) -> list[EffectRecord]:
        """Return the operation's effects, oldest first.

        Args:
            operation_id: the operation.
        """
        rows = self._conn.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE operation_id = ? ORDER BY seq",
            (operation_id,),
        ).fetchall()
        return [_effect(row) for row in rows]

    def effects_for_account(self, account: str) -> list[EffectRecord]:
        """Return the effects that credited an account, oldest first.

        Args:
            account: the account.
        """
        rows = self._conn.execute(
            f"SELECT {_EFFECT_COLUMNS} FROM effects WHERE account = ? ORDER BY seq", (account,)
        ).fetchall()
        return [_effect(row) for row in rows]

    def reservation(self, operation_id: str) -> ReservationRecord | None:
        """Return the operation's hold (reservation sinks), or ``None`` when never reserved.

        Args:
            operation_id: the operation.
        """
        row = self._conn.execute(
            "SELECT operation_id, status, parameter_digest, submit_json, held_at_ms, "
            "released_why, effect_id, reserves FROM reservations WHERE operation_id = ?",
            (operation_id,),
        ).fetchone()
        if row is None:
            return None
        return ReservationRecord(
            operation_id=row["operation_id"],
            status=row["status"],
            parameter_digest=row["parameter_digest"],
            submit_json=row["submit_json"],
            held_at_ms=int(row["held_at_ms"]),
            released_why=row["released_why"],
            effect_id=row["effect_id"],
            reserves=int(row["reserves"]),
        )

    def put_reservation(self, hold: ReservationRecord) -> None:
        """Insert or replace the operation's hold.

        Args:
            hold: the hold as it now stands.
        """
        self._conn.execute(
            "INSERT OR REPLACE INTO reservations (operation_id, status, parameter_digest, "
            "submit_json, held_at_ms, released_why, effect_id, reserves) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                hold.operation_id,
                hold.status,
                hold.parameter_digest,
                hold.submit_json,
                hold.held_at_ms,
                hold.released_why,
                hold.effect_id,
                hold.reserves,
            ),
        )

    def effect_counts(self) -> dict[str, int]:
        """Return ``{operation_id: number of effects}`` over every operation."""
        rows = self._conn.execute(
            "SELECT operation_id, COUNT(*) AS n FROM effects GROUP BY operation_id "
            "ORDER BY operation_id"
        )
        return {row["operation_id"]: int(row["n"]) for row in rows}


class SinkStore:
    """The SQLite file of one sink.

    Safe to share between threads: transactions are serialised by a lock, and
    SQLite's own locking protects the file against other processes.

    Args:
        path: the database file; created (with its folder) when absent.
        sink_name: the sink the file belongs to; used in effect IDs.

    Raises:
        SinkStoreError: if the file belongs to another sink or has a newer schema.
        sqlite3.Error: if the file cannot be opened.
    """

    def __init__(self, path: Path, sink_name: str) -> None:
        self.path = path
        self.sink_name = sink_name
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._init_schema()

    def _init_schema(self) -> None:
        version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise SinkStoreError(
                f"{self.path} has sink schema version {version}, newer than {SCHEMA_VERSION}; "
                "run a newer sink or use another --db",
                sink=self.sink_name,
                path=str(self.path),
            )
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('sink_name', ?)",
                    (self.sink_name,),
                )
                owner = self._conn.execute(
                    "SELECT value FROM meta WHERE key = 'sink_name'"
                ).fetchone()["value"]
                if owner != self.sink_name:
                    raise SinkStoreError(
                        f"{self.path} belongs to sink {owner!r}, not {self.sink_name!r}; "
                        "give each sink its own --db",
                        sink=self.sink_name,
                        path=str(self.path),
                    )
                self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[StoreTxn]:
        """Run a block in one write transaction (``BEGIN IMMEDIATE``).

        The transaction commits when the block ends normally and rolls back
        when it raises. Do not await or sleep inside the block: it holds the
        database's write lock.

        Yields:
            The :class:`StoreTxn` for this transaction.
        """
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield StoreTxn(self._conn, self.sink_name)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        """Close the database connection (idempotent)."""
        with self._lock:
            self._conn.close()
