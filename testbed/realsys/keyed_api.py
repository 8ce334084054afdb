"""A real refunds API that follows the ``Idempotency-Key`` header draft.

Not the ledger's reference gateway: it knows nothing of fencing tokens,
parameter digests or the ledger's protocol, only the draft
(draft-ietf-httpapi-idempotency-key-header). Run it as ``python -m
testbed.realsys.keyed_api --port N --store FILE`` (or through
:class:`KeyedApiServer`). Routes:

* ``POST /refunds`` with ``Idempotency-Key`` and a JSON body ``{operation_id,
  account, amount_minor, ...}``: ``400`` without the key (a problem document
  naming the header) or with a malformed body; a key it has kept for less than
  ``--retention-s`` seconds with another payload (its SHA-256 of the canonical
  JSON) → ``422``; with the same payload while the first request is still
  processing → ``409``; once done → the stored answer again (same refund ID);
  a new key → the refund is made (after ``--process-delay-ms``) and ``201``.
  An account named ``fail-NNN`` is answered ``NNN`` and nothing is made (the
  test switch for an API's own failures).
* ``GET /refunds/by-operation/{operation_id}`` → ``200`` with the first refund
  and ``effects`` (how many refunds it holds for the operation), or ``404``.
* ``GET /accounts/{account}`` → ``{account, credited_minor, credits: [{id,
  operation_id, amount_minor}]}``.
* ``GET /health`` → ``{"status": "ok"}``.

When the environment holds ``REALSYS_TOKEN``, every route but ``/health``
wants ``Authorization: Bearer <that>`` (``401`` otherwise). The refunds it
made are in the SQLite file ``--store``; :class:`RefundStore` counts them per
operation (the effects the system holds, for tests and game days). A key
left ``processing`` by a killed process is dropped at start (its refund, made
in the same transaction that completes the key, was not made).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

import click
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from testbed.realsys.served import RealSystemProcess, bind_local, write_port_file

#: The environment variable holding the bearer token the API wants.
TOKEN_ENV = "REALSYS_TOKEN"

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS keys (
        key TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        state TEXT NOT NULL,
        status_code INTEGER,
        response TEXT,
        created_ms INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS refunds (
        id TEXT PRIMARY KEY,
        operation_id TEXT,
        account TEXT NOT NULL,
        amount_minor INTEGER NOT NULL,
        idempotency_key TEXT NOT NULL,
        created_ms INTEGER NOT NULL
    )""",
)


class RefundStore:
    """The API's SQLite file: idempotency keys and the refunds made.

    Args:
        path: the file (created with its tables when missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            for statement in _SCHEMA:
                db.execute(statement)

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=5.0)

    def effects(self, operation_id: str) -> int:
        """How many refunds the API made for an operation."""
        with self._db() as db:
            (n,) = db.execute(
                "SELECT COUNT(*) FROM refunds WHERE operation_id = ?", (operation_id,)
            ).fetchone()
        return int(n)

    def refunds(
        self, *, operation_id: str | None = None, account: str | None = None
    ) -> list[dict[str, Any]]:
        """The refunds made, oldest first, of an operation or an account when given."""
        query, args = "SELECT id, operation_id, account, amount_minor, created_ms FROM refunds", []
        if operation_id is not None:
            query, args = query + " WHERE operation_id = ?", [operation_id]
        elif account is not None:
            query, args = query + " WHERE account = ?", [account]
        with self._db() as db:
            rows = db.execute(query + " ORDER BY created_ms, rowid", args).fetchall()
        keys = ("id", "operation_id", "account", "amount_minor", "created_ms")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def key_state(self, key: str) -> str | None:
        """``processing``, ``done`` or ``None`` for a key the API does not hold."""
        with self._db() as db:
            row = db.execute("SELECT state FROM keys WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def drop_processing(self) -> None:
        """Forget keys whose request died with an earlier process."""
        with self._db() as db:
            db.execute("DELETE FROM keys WHERE state = 'processing'")

    def expire(self, before_ms: int) -> None:
        """Forget keys first seen before ``before_ms`` (the retention)."""
        with self._db() as db:
            db.execute("DELETE FROM keys WHERE created_ms < ?", (before_ms,))

    def key(self, key: str) -> tuple[str, str, int | None, str | None] | None:
        """``(fingerprint, state, status_code, response)`` of a kept key, else ``None``."""
        with self._db() as db:
            row = db.execute(
                "SELECT fingerprint, state, status_code, response FROM keys WHERE key = ?", (key,)
            ).fetchone()
        return None if row is None else (row[0], row[1], row[2], row[3])

    def begin(self, key: str, fingerprint: str, now_ms: int) -> None:
        """Keep a new key as ``processing``."""
        with self._db() as db:
            db.execute(
                "INSERT INTO keys (key, fingerprint, state, created_ms) "
                "VALUES (?, ?, 'processing', ?)",
                (key, fingerprint, now_ms),
            )

    def forget(self, key: str) -> None:
        """Drop a key whose request failed (it may be sent again)."""
        with self._db() as db:
            db.execute("DELETE FROM keys WHERE key = ?", (key,))

    def complete(self, key: str, refund: dict[str, Any]) -> None:
        """Make the refund and keep its answer under the key, in one transaction."""
        with self._db() as db:
            db.execute(
                "INSERT INTO refunds (id, operation_id, account, amount_minor, idempotency_key,"
                " created_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    refund["id"],
                    refund["operation_id"],
                    refund["account"],
                    refund["amount_minor"],
                    key,
                    refund["created_ms"],
                ),
            )
            db.execute(
                "UPDATE keys SET state = 'done', status_code = 201, response = ? WHERE key = ?",
                (json.dumps(refund), key),
            )


def _problem(status: int, title: str, detail: str) -> JSONResponse:
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status,
        media_type="application/problem+json",
    )


def _invalid(body: Any) -> str | None:
    """Why a refund request's body cannot be taken, or ``None``."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    if not isinstance(body.get("account"), str) or not body["account"]:
        return "account must be a non-empty string"
    amount = body.get("amount_minor")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        return "amount_minor must be a positive integer"
    if body.get("operation_id") is not None and not isinstance(body["operation_id"], str):
        return "operation_id must be a string"
    return None


def create_app(
    store: RefundStore, *, retention_s: int, process_delay_ms: int, token: str | None
) -> Starlette:
    """The API (routes: the module docstring).

    Args:
        store: where keys and refunds are kept.
        retention_s: how long a key is kept after it was first seen (seconds).
        process_delay_ms: how long making a refund takes (ms).
        token: the bearer token every route but ``/health`` wants, or ``None``.
    """
    store.drop_processing()

    def authorised(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return token is None or secrets.compare_digest(given, f"Bearer {token}")

    async def create_refund(request: Request) -> Response:
        if not authorised(request):
            return _problem(401, "Unauthorized", "a valid bearer token is required")
        key = request.headers.get("idempotency-key")
        if not key:
            return _problem(
                400, "Idempotency-Key is missing", "this API requires an Idempotency-Key header"
            )
        try:
            body = json.loads(await request.body())
        except ValueError:
            body = None
        why = _invalid(body)
        if why is not None:
            return _problem(400, "Invalid refund", why)
        account = str(body["account"])
        if account.startswith("fail-") and account[5:].isdigit():
            return _problem(int(account[5:]), "Failure on request", "the test switch")
        fingerprint = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
        now_ms = int(time.time() * 1000)
        store.expire(now_ms - retention_s * 1000)
        kept = store.key(key)  # no await from here to begin(): one request at a time
        if kept is not None:
            first_fingerprint, state, code, response = kept
            if first_fingerprint != fingerprint:
                return _problem(
                    422, "Idempotency-Key reused", "the key was used with another payload"
                )
            if state == "processing":
                return _problem(
                    409, "Request in flight", "a request with this key is still being processed"
                )
            return JSONResponse(json.loads(response or "{}"), status_code=code or 201)
        store.begin(key, fingerprint, now_ms)
        try:
            if process_delay_ms:
                await asyncio.sleep(process_delay_ms / 1000)
            refund = {
                "id": f"rf_{secrets.token_hex(8)}",
                "operation_id": body.get("operation_id"),
                "account": account,
                "amount_minor": body["amount_minor"],
                "status": "succeeded",
                "created_ms": int(time.time() * 1000),
            }
            store.complete(key, refund)
        except BaseException:
            store.forget(key)
            raise
        return JSONResponse(refund, status_code=201)

    async def by_operation(request: Request) -> Response:
        if not authorised(request):
            return _problem(401, "Unauthorized", "a valid bearer token is required")
        found = store.refunds(operation_id=request.path_params["operation_id"])
        if not found:
            return _problem(404, "Not found", "no refund for this operation")
        return JSONResponse({**found[0], "effects": len(found)})

    async def account(request: Request) -> Response:
        if not authorised(request):
            return _problem(401, "Unauthorized", "a valid bearer token is required")
        name = request.path_params["account"]
        credits = store.refunds(account=name)
        return JSONResponse(
            {
                "account": name,
                "credited_minor": sum(c["amount_minor"] for c in credits),
                "credits": [
                    {k: c[k] for k in ("id", "operation_id", "amount_minor")} for c in credits
                ],
            }
        )

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "pid": os.getpid()})

    return Starlette(
        routes=[
            Route("/refunds", create_refund, methods=["POST"]),
            Route("/refunds/by-operation/{operation_id:path}", by_operation, methods=["GET"]),
            Route("/accounts/{account:path}", account, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


class KeyedApiServer(RealSystemProcess):
    """This module's API in a child process, with its store.

    Args:
        run_dir: where its store, port file and log go (``NAME.sqlite`` ...).
        name: a name for its files (default ``keyed-api``).
        retention_s: key retention (seconds).
        process_delay_ms: how long making a refund takes (ms).
        token: the bearer token to want; default a new random one.

    Attributes:
        token: the bearer token (register it with the sink).
        store: the API's store, to count effects.
    """

    def __init__(
        self,
        run_dir: Path,
        name: str = "keyed-api",
        *,
        retention_s: int = 86_400,
        process_delay_ms: int = 0,
        token: str | None = None,
    ) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.store_path = run_dir / f"{name}.sqlite"
        args = ["--store", str(self.store_path), "--retention-s", str(retention_s)]
        args += ["--process-delay-ms", str(process_delay_ms)]
        super().__init__(
            "testbed.realsys.keyed_api", name, run_dir, args, env={TOKEN_ENV: self.token}
        )
        self.store = RefundStore(self.store_path)

    @property
    def url(self) -> str:
        """The API's base URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"


@click.command(context_settings={"show_default": True})
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Port; 0 = a free one.")
@click.option("--port-file", type=click.Path(path_type=Path), help="Write the bound port here.")
@click.option("--store", type=click.Path(path_type=Path), required=True, help="SQLite file.")
@click.option("--retention-s", type=click.IntRange(1), default=86_400, help="Key retention.")
@click.option("--process-delay-ms", type=click.IntRange(0), default=0, help="Time per refund.")
@click.option("--log-level", default="warning", help="uvicorn log level.")
def main(
    port: int,
    port_file: Path | None,
    store: Path,
    retention_s: int,
    process_delay_ms: int,
    log_level: str,
) -> None:
    """Serve the refunds API on 127.0.0.1 (bearer token from REALSYS_TOKEN, if set)."""
    app = create_app(
        RefundStore(store),
        retention_s=retention_s,
        process_delay_ms=process_delay_ms,
        token=os.environ.get(TOKEN_ENV) or None,
    )
    sock = bind_local(port)
    if port_file is not None:
        write_port_file(port_file, sock.getsockname()[1])
    config = uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
