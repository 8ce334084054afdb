"""The reference sink: one HTTP gateway whose behaviour the contract switches.

Routes (JSON in and out):

=========================================  =====================================================
``POST /operations``                       submit an effect. 201 new effect, 200 idempotent
                                           replay, 409 ``stale_fencing_token`` or
                                           ``idempotency_key_reused``, 422 rejected (fault),
                                           503 unavailable (fault), 504 timeout (fault),
                                           400 malformed request.
``GET /operations/{operation_id}``         readback (``?fencing_token=N``). 200 committed,
                                           404 absent, 409 ``stale_fencing_token``,
                                           501 when the contract has no readback.
``GET /accounts/{account}``                postcondition: credits of an account. 200, or 501
                                           when the contract has no postcondition.
``POST /admin/faults``                     arm a fault (tests and demos only).
``GET /admin/effects``                     ``{"effects": {operation_id: n}, "total": n}``.
``GET /admin/stats``                       the counters (``stale_rejections`` ...).
``GET /health``                            liveness, sink name, pid and contract.
=========================================  =====================================================

Rules, in the order a submit applies them:

1. Fencing (``contract.fencing``): a token lower than the highest seen for the
   operation is refused (409) and counted; otherwise the highest is raised to
   it. A request without a token is not fenced. Readbacks carry tokens too.
2. An armed fault for the operation fires (one firing per submit).
3. Idempotency (``contract.idempotent`` and an ``Idempotency-Key`` header):
   while the key is retained (``now - first_seen < key_retention_s``) the same
   digest replays the first effect (200) and another digest is refused (409,
   counted as drift). Otherwise the request is a new effect (201).

Each request's mutations are one SQLite transaction; a fault's hang happens
after that transaction has ended, on the event loop (``asyncio.sleep``), so it
blocks neither other requests nor the database.

Run it with ``python -m testbed.sinks.gateway --help``.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ledger.clock import Clock, clock_for
from ledger.contracts import EffectContract
from testbed.sinks.store import EffectRecord, FaultMode, SinkStore, StoreTxn

#: The only interface the gateway listens on.
HOST: Final = "127.0.0.1"

#: Exit status of ``python -m testbed.sinks.gateway`` when the port cannot be bound.
EXIT_ADDRESS_IN_USE: Final = 98

#: Header that carries the idempotency key (the operation ID).
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"


class OperationParams(BaseModel):
    """Semantic parameters of an operation; extra fields are kept as sent.

    Attributes:
        account: the account the effect credits (used by the postcondition).
        amount_minor: the amount in minor units (pence, cents).
        currency: ISO currency code.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    account: StrictStr | None = None
    amount_minor: StrictInt | None = None
    currency: StrictStr | None = None


class SubmitBody(BaseModel):
    """Body of ``POST /operations``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: str = Field(min_length=1)
    parameter_digest: str = Field(min_length=1)
    params: OperationParams
    fencing_token: StrictInt | None = None
    attempt_id: str = Field(min_length=1)


class FaultBody(BaseModel):
    """Body of ``POST /admin/faults``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: str = Field(min_length=1)
    mode: FaultMode
    times: int = Field(default=1, ge=1)


@dataclass(frozen=True)
class Reply:
    """What a request handler answers.

    Attributes:
        status_code: HTTP status.
        body: JSON body.
        hang: wait ``hang_s`` seconds before answering (a fault's timeout).
    """

    status_code: int
    body: dict[str, Any] = field(default_factory=dict)
    hang: bool = False


def _effect_body(effect: EffectRecord, *, replayed: bool) -> dict[str, Any]:
    return {
        "operation_id": effect.operation_id,
        "effect_id": effect.effect_id,
        "status": "committed",
        "committed_ms": effect.committed_ms,
        "replayed": replayed,
        "parameter_digest": effect.parameter_digest,
        "fencing_token": effect.fencing_token,
    }


def _stale(operation_id: str, highest: int) -> Reply:
    return Reply(
        409, {"error": "stale_fencing_token", "operation_id": operation_id, "highest": highest}
    )


def _invalid(exc: ValidationError | ValueError) -> JSONResponse:
    if isinstance(exc, ValidationError):
        detail: Any = json.loads(exc.json(include_url=False))
    else:
        detail = str(exc)
    return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=400)


class SinkService:
    """The contract logic of one sink, independent of HTTP.

    Args:
        name: the sink's name (``payments``); prefixes effect IDs.
        contract: what the sink offers.
        store: its durable store.
        clock: the ledger clock (key retention and timestamps).
    """

    def __init__(self, name: str, contract: EffectContract, store: SinkStore, clock: Clock):
        self.name = name
        self.contract = contract
        self.store = store
        self.clock = clock

    def _fence(self, tx: StoreTxn, operation_id: str, token: int | None, now_ms: int) -> int | None:
        """Apply the fencing rule; return the highest token when the request is stale."""
        if not self.contract.fencing or token is None:
            return None
        check = tx.observe_token(operation_id, token, now_ms)
        if check.accepted:
            return None
        tx.bump("stale_rejections")
        return check.highest

    def submit(self, body: SubmitBody, idempotency_key: str | None) -> Reply:
        """Handle one submit in one transaction (see the module docstring)."""
        now_ms = self.clock.now_ms()
        op = body.operation_id
        with self.store.transaction() as tx:
            tx.bump("requests")
            tx.bump("submits")
            highest = self._fence(tx, op, body.fencing_token, now_ms)
            if highest is not None:
                return _stale(op, highest)
            fault = tx.take_fault(op)
            if fault is not None:
                tx.bump("faults_fired")
            if fault == "reject":
                tx.bump("rejected")
                return Reply(
                    422, {"status": "rejected", "error": "rejected_by_sink", "operation_id": op}
                )
            if fault == "unavailable":
                tx.bump("unavailable")
                return Reply(
                    503, {"status": "unavailable", "error": "sink_unavailable", "operation_id": op}
                )
            if fault == "timeout_before_commit":
                tx.bump("timeouts")
                return Reply(504, {"error": "gateway_timeout", "operation_id": op}, hang=True)
            reply = self._apply(tx, body, idempotency_key, now_ms)
            if fault in ("commit_then_drop_response", "timeout_after_commit"):
                tx.bump("timeouts")
                return Reply(504, {"error": "gateway_timeout", "operation_id": op}, hang=True)
            return reply

    def _apply(
        self, tx: StoreTxn, body: SubmitBody, idempotency_key: str | None, now_ms: int
    ) -> Reply:
        key = idempotency_key if self.contract.idempotent else None
        if key is not None:
            prior = tx.latest_effect_for_key(key)
            retention_ms = self.contract.key_retention_s * 1000
            if prior is not None and now_ms - prior.first_seen_ms < retention_ms:
                if prior.parameter_digest == body.parameter_digest:
                    tx.bump("replays")
                    return Reply(200, _effect_body(prior, replayed=True))
                tx.bump("drift_rejections")
                return Reply(
                    409,
                    {
                        "error": "idempotency_key_reused",
                        "operation_id": body.operation_id,
                        "effect_id": prior.effect_id,
                    },
                )
        effect = tx.insert_effect(
            operation_id=body.operation_id,
            idempotency_key=key,
            attempt_id=body.attempt_id,
            parameter_digest=body.parameter_digest,
            params=body.params.model_dump(),
            account=body.params.account,
            amount_minor=body.params.amount_minor,
            fencing_token=body.fencing_token,
            now_ms=now_ms,
        )
        tx.bump("effects_created")
        return Reply(201, _effect_body(effect, replayed=False))

    def readback(self, operation_id: str, fencing_token: int | None) -> Reply:
        """Answer whether an operation committed, whatever the key retention."""
        if not self.contract.readback:
            return Reply(501, {"error": "readback_not_supported", "sink": self.name})
        now_ms = self.clock.now_ms()
        with self.store.transaction() as tx:
            tx.bump("requests")
            tx.bump("readbacks")
            highest = self._fence(tx, operation_id, fencing_token, now_ms)
            if highest is not None:
                return _stale(operation_id, highest)
            effects = tx.effects_for_operation(operation_id)
        if not effects:
            return Reply(404, {"status": "absent", "operation_id": operation_id})
        first = effects[0]
        return Reply(
            200,
            {
                "status": "committed",
                "operation_id": operation_id,
                "effect_id": first.effect_id,
                "committed_ms": first.committed_ms,
                "parameter_digest": first.parameter_digest,
                "account": first.account,
                "amount_minor": first.amount_minor,
                "effects": len(effects),
                "effect_ids": [effect.effect_id for effect in effects],
            },
        )

    def account(self, account: str) -> Reply:
        """Postcondition: every credit the sink made to an account."""
        if self.contract.postcondition_query() is None:
            return Reply(501, {"error": "postcondition_not_supported", "sink": self.name})
        with self.store.transaction() as tx:
            tx.bump("requests")
            effects = tx.effects_for_account(account)
        credits = [
            {
                "operation_id": effect.operation_id,
                "amount_minor": effect.amount_minor or 0,
                "effect_id": effect.effect_id,
            }
            for effect in effects
        ]
        return Reply(
            200,
            {
                "account": account,
                "credited_minor": sum(credit["amount_minor"] for credit in credits),
                "credits": credits,
            },
        )


def create_app(
    name: str, contract: EffectContract, db_path: Path, clock: Clock, hang_s: float = 5.0
) -> Starlette:
    """Build the gateway app of one sink.

    The store opens immediately and closes at application shutdown; it is
    also available as ``app.state.store`` (and the logic as
    ``app.state.service``).

    Args:
        name: the sink's name, e.g. ``payments``.
        contract: the behaviour to offer.
        db_path: the sink's SQLite file (created when absent).
        clock: the ledger clock.
        hang_s: how long a timeout fault waits before answering 504 (seconds);
            make it longer than the client's timeout.

    Returns:
        The Starlette application.

    Raises:
        ledger.errors.SinkStoreError: if ``db_path`` belongs to another sink.
    """
    store = SinkStore(db_path, name)
    service = SinkService(name, contract, store, clock)

    async def respond(reply: Reply) -> JSONResponse:
        if reply.hang:
            await asyncio.sleep(hang_s)
        return JSONResponse(reply.body, status_code=reply.status_code)

    async def submit(request: Request) -> JSONResponse:
        try:
            body = SubmitBody.model_validate_json(await request.body())
        except ValidationError as exc:
            return _invalid(exc)
        return await respond(service.submit(body, request.headers.get(IDEMPOTENCY_HEADER)))

    async def readback(request: Request) -> JSONResponse:
        raw = request.query_params.get("fencing_token")
        try:
            token = None if raw in (None, "") else int(raw)
        except ValueError:
            return _invalid(ValueError(f"fencing_token must be an integer, got {raw!r}"))
        return await respond(service.readback(request.path_params["operation_id"], token))

    async def account(request: Request) -> JSONResponse:
        return await respond(service.account(request.path_params["account"]))

    async def arm_fault(request: Request) -> JSONResponse:
        try:
            body = FaultBody.model_validate_json(await request.body())
        except ValidationError as exc:
            return _invalid(exc)
        with store.transaction() as tx:
            tx.arm_fault(body.operation_id, body.mode, body.times, clock.now_ms())
        return JSONResponse({"armed": True, **body.model_dump()})

    async def effects(request: Request) -> JSONResponse:
        with store.transaction() as tx:
            counts = tx.effect_counts()
        return JSONResponse({"effects": counts, "total": sum(counts.values())})

    async def stats(request: Request) -> JSONResponse:
        with store.transaction() as tx:
            counters = tx.counters()
        return JSONResponse(counters)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {"status": "ok", "name": name, "pid": os.getpid(), "contract": contract.model_dump()}
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        store.close()

    app = Starlette(
        routes=[
            Route("/operations", submit, methods=["POST"]),
            Route("/operations/{operation_id:path}", readback, methods=["GET"]),
            Route("/accounts/{account:path}", account, methods=["GET"]),
            Route("/admin/faults", arm_fault, methods=["POST"]),
            Route("/admin/effects", effects, methods=["GET"]),
            Route("/admin/stats", stats, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.service = service
    return app


def bind_socket(port: int) -> socket.socket:
    """Bind and listen on ``127.0.0.1:port`` (0 picks a free port).

    ``SO_REUSEADDR`` is set so that a restarted sink can take back its port
    while old connections are in TIME_WAIT. ``TCP_NODELAY`` (inherited by
    accepted connections) keeps Nagle's algorithm from holding the body of a
    response, written after its headers, until the client's delayed ACK:
    without it every request takes about 40 ms.

    Raises:
        OSError: if the port cannot be bound (e.g. ``EADDRINUSE``).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((HOST, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _write_port_file(path: Path, port: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def serve(
    name: str,
    contract: EffectContract,
    db_path: Path,
    clock: Clock,
    *,
    port: int = 0,
    port_file: Path | None = None,
    hang_s: float = 5.0,
    log_level: str = "info",
) -> None:
    """Serve a sink on ``127.0.0.1`` until SIGINT/SIGTERM.

    The port is bound (and listening) before ``port_file`` is written, so a
    reader of the file can connect at once; requests are served once the
    application has started (poll ``/health``).

    Args:
        name: the sink's name.
        contract: the behaviour to offer.
        db_path: the sink's SQLite file.
        clock: the ledger clock.
        port: TCP port; 0 binds a free one.
        port_file: where to write the bound port (atomic replace), if given.
        hang_s: how long timeout faults hang (seconds).
        log_level: uvicorn log level.

    Raises:
        OSError: if the port cannot be bound.
        ledger.errors.SinkStoreError: if ``db_path`` belongs to another sink.
    """
    sock = bind_socket(port)
    app = create_app(name, contract, db_path, clock, hang_s=hang_s)
    if port_file is not None:
        _write_port_file(port_file, sock.getsockname()[1])
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=1)
    uvicorn.Server(config).run(sockets=[sock])


@click.command(context_settings={"show_default": True})
@click.option("--name", required=True, help="Sink name, e.g. payments.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Port; 0 = a free one.")
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="SQLite file of this sink (kept across restarts).",
)
@click.option("--contract-json", required=True, help="EffectContract as JSON.")
@click.option("--clock", "clock_kind", type=click.Choice(["manual", "system"]), default="manual")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Run folder; the manual clock is RUN_DIR/clock.",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the bound port here.",
)
@click.option("--hang-s", type=click.FloatRange(min=0), default=5.0, help="Fault hang, seconds.")
@click.option("--log-level", default="info", help="uvicorn log level.")
def main(
    name: str,
    port: int,
    db_path: Path,
    contract_json: str,
    clock_kind: str,
    run_dir: Path,
    port_file: Path | None,
    hang_s: float,
    log_level: str,
) -> None:
    """Run one reference sink on 127.0.0.1."""
    try:
        contract = EffectContract.model_validate_json(contract_json)
    except ValidationError as exc:
        raise click.BadParameter(str(exc), param_hint="--contract-json") from exc
    try:
        serve(
            name,
            contract,
            db_path,
            clock_for(clock_kind, run_dir),
            port=port,
            port_file=port_file,
            hang_s=hang_s,
            log_level=log_level,
        )
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            click.echo(f"sink {name}: cannot bind {HOST}:{port}: {exc}", err=True)
            sys.exit(EXIT_ADDRESS_IN_USE)
        raise


if __name__ == "__main__":
    main()
