"""The reference sink: one HTTP gateway whose behaviour the contract switches.

The sink protocol's routes (``POST /operations``, ``GET /operations/{id}``,
``GET /accounts/{account}``, the ``/reservations`` routes and ``GET
/health``; the document is ``sinks/openapi.json``) are served by the
toolkit (:func:`sinks.toolkit.create_sink_app`); this module is its backend
(:class:`SinkService`, on a SQLite store, with faults the testbed arms) plus
the testbed's own admin routes:

=========================================  =====================================================
``POST /operations`` ...                   the protocol, as the document says; an armed fault
                                           makes a submit answer 422 (rejected), 503
                                           (unavailable) or, after ``hang_s``, 504 (outcome
                                           unknown, before or after the commit). A hold not
                                           confirmed within ``reservation_hold_s`` (ledger
                                           clock) is released by the sink itself, before
                                           every answer that looks at it.
``POST /admin/faults``                     arm a fault; only when the testbed started the
                                           gateway with ``--fault-injection`` (else 404).
``GET /admin/effects``                     ``{"effects": {operation_id: n}, "total": n}``.
``GET /admin/stats``                       the counters (``stale_rejections`` ...).
``GET /admin/traces``                      ``{"requests": [{"method", "path", "traceparent"}]}``:
                                           the W3C ``traceparent`` each of the last
                                           :data:`TRACES_KEPT` sink requests carried (or null).
``GET /health``                            liveness, sink name, pid and contract (the only
                                           route that needs no token).
=========================================  =====================================================

Authentication: every route but ``/health`` needs ``Authorization: Bearer
TOKEN``, the token the gateway was started with (environment variable
``LEDGER_SINK_TOKEN``; the testbed generates a random one and registers it
with the sink in ``sinks.json``). Without it, or with another, the answer is
401 with a JSON body whose ``error`` is ``unauthenticated`` or
``invalid_token``; the token is compared in constant time.

Refusals (each a JSON body ``{"error": ..., "detail": ...}``, never an
effect) are the toolkit's, as the document lists them: 413
``body_too_large`` (over :data:`MAX_BODY_BYTES`), 400 ``invalid_request``
(not UTF-8 JSON, nested deeper than :data:`MAX_JSON_DEPTH`, a missing or
mistyped field -- ``params`` as :class:`OperationParams` -- or an ID or key
outside :func:`ledger.identity.operation_id_problem`),
``idempotency_key_required`` / ``fencing_token_required`` (what the contract
promises is missing), ``parameter_digest_mismatch`` (the digest recomputed
for this sink's name differs: 400, not 409, as the request contradicts
itself) and ``fencing_token_out_of_range`` (more than :data:`MAX_TOKEN_STEP`
above the highest token seen, which only an error can send, and which would
otherwise make every later request of the operation stale).

Rules, in the order a submit applies them (after the refusals above):

1. Fencing (``contract.fencing``): a token lower than the highest seen for the
   operation is refused (409) and counted; otherwise the highest is raised to
   it (:func:`sinks.toolkit.fence`). Readbacks carry tokens too (a readback
   without one is not fenced).
2. An armed fault for the operation fires (one firing per submit).
3. Idempotency (``contract.idempotent`` and an ``Idempotency-Key`` header):
   while the key is retained (``now - first_seen < key_retention_s``) the same
   digest replays the first effect (200) and another digest is refused (409,
   counted as drift; :func:`sinks.toolkit.replay`). Otherwise the request is a
   new effect (201). A sink whose contract is not idempotent ignores the header.

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
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, Literal, cast

import click
import uvicorn
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ledger.clock import Clock, clock_for
from ledger.contracts import EffectContract
from sinks.client import Credit
from sinks.toolkit import (
    IDEMPOTENCY_HEADER,
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    MAX_TOKEN,
    MAX_TOKEN_STEP,
    MIN_TOKEN_LEN,
    Absent,
    AccountOutcome,
    Committed,
    HoldOutcome,
    HoldState,
    KeyReused,
    OperationFound,
    OutcomeUnknown,
    ReadbackOutcome,
    Rejected,
    ReserveOutcome,
    StaleToken,
    SubmitOutcome,
    SubmitRequest,
    TokenOutOfRange,
    Unavailable,
    authorised,
    create_sink_app,
    fence,
    read_json_object,
    replay,
)
from sinks.toolkit.wire import check_token, invalid
from testbed.sinks.store import EffectRecord, FaultMode, ReservationRecord, SinkStore, StoreTxn

__all__ = [  # the protocol's limits, re-exported from the toolkit for the testbed's callers
    "IDEMPOTENCY_HEADER",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_TOKEN",
    "MAX_TOKEN_STEP",
    "MIN_TOKEN_LEN",
    "SinkService",
    "create_app",
    "serve",
]

#: The only interface the gateway listens on.
HOST: Final = "127.0.0.1"

#: Exit status of ``python -m testbed.sinks.gateway`` when the port cannot be bound.
EXIT_ADDRESS_IN_USE: Final = 98

#: Environment variable that carries the gateway's bearer token to its process
#: (not a command-line option: other users can read a process's arguments).
TOKEN_ENV: Final = "LEDGER_SINK_TOKEN"

#: How many requests' ``traceparent`` headers ``/admin/traces`` keeps (the latest).
TRACES_KEPT: Final = 1000


class OperationParams(BaseModel):
    """Semantic parameters of an operation; extra fields are kept as sent.

    Attributes:
        account: the account the effect credits (used by the postcondition).
        amount_minor: the amount in minor units (pence, cents).
        currency: ISO currency code.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    account: StrictStr | None = Field(default=None, max_length=1000)
    amount_minor: StrictInt | None = Field(default=None, ge=0, le=MAX_TOKEN)
    currency: StrictStr | None = Field(default=None, max_length=100)


class FaultBody(BaseModel):
    """Body of ``POST /admin/faults``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: StrictStr = Field(min_length=1, max_length=1000)
    mode: FaultMode
    times: StrictInt = Field(default=1, ge=1, le=1000)


#: A route's handler.
Handler = Callable[[Request], Awaitable[JSONResponse]]


def _committed(effect: EffectRecord) -> Committed:
    return Committed(
        effect.effect_id,
        effect.committed_ms,
        parameter_digest=effect.parameter_digest,
        fencing_token=effect.fencing_token,
    )


def _submitted(request: SubmitRequest) -> str:
    """A request as the reservation table keeps it (the effect its confirmation makes)."""
    body = {
        "operation_id": request.operation_id,
        "parameter_digest": request.parameter_digest,
        "params": OperationParams.model_validate(request.params).model_dump(),
        "fencing_token": request.fencing_token,
        "attempt_id": request.attempt_id,
        "action": request.action,
        "subject": request.subject,
        "purpose": request.purpose,
        "decision_version": request.decision_version,
    }
    return json.dumps(body, sort_keys=True)


class SinkService:
    """The contract logic of one sink, independent of HTTP: a toolkit backend.

    Its methods answer the toolkit's outcomes (:mod:`sinks.toolkit.backend`)
    and count what they do in the store's counters. ``submit`` answers
    :class:`~sinks.toolkit.OutcomeUnknown` only for a timeout fault, which
    the app delays by ``hang_s`` before answering (see :func:`create_app`).

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

    def _fence(
        self, tx: StoreTxn, operation_id: str, token: int | None, now_ms: int
    ) -> StaleToken | TokenOutOfRange | None:
        """Apply the fencing rule; return the refusal, or ``None`` when the request may go on.

        A token more than :data:`MAX_TOKEN_STEP` above the highest seen (0 when
        none) is refused and changes nothing; a token below the highest is
        stale (counted). The toolkit passes ``None`` when the contract does not fence.
        """
        if token is None:
            return None
        verdict = fence(token, tx.highest_token(operation_id))
        if isinstance(verdict.refusal, TokenOutOfRange):
            tx.bump("refusals")
        elif isinstance(verdict.refusal, StaleToken):
            tx.bump("stale_rejections")
        else:
            tx.observe_token(operation_id, token, now_ms)
        return verdict.refusal

    def refused(self, route: str, error: str) -> None:
        """Count a request the toolkit refused before asking the service (``on_refusal``)."""
        with self.store.transaction() as tx:
            tx.bump("requests")
            if route == "submit":
                tx.bump("submits")
            tx.bump("refusals")

    def submit(self, request: SubmitRequest) -> SubmitOutcome:
        """Handle one submit in one transaction (see the module docstring).

        Args:
            request: the submit, checked by the toolkit.

        Returns:
            The outcome (a fault may answer rejected, unavailable or unknown).
        """
        now_ms = self.clock.now_ms()
        op = request.operation_id
        with self.store.transaction() as tx:
            tx.bump("requests")
            tx.bump("submits")
            fenced = self._fence(tx, op, request.fencing_token, now_ms)
            if fenced is not None:
                return fenced
            fault = tx.take_fault(op)
            if fault is not None:
                tx.bump("faults_fired")
            if fault == "reject":
                tx.bump("rejected")
                return Rejected(detail="an armed reject fault")
            if fault == "unavailable":
                tx.bump("unavailable")
                return Unavailable("an armed unavailable fault")
            if fault == "timeout_before_commit":
                tx.bump("timeouts")
                return OutcomeUnknown("a timeout fault (before the commit)")
            outcome = self._apply(tx, request, now_ms)
            if fault in ("commit_then_drop_response", "timeout_after_commit"):
                tx.bump("timeouts")
                return OutcomeUnknown("a timeout fault (after the commit)")
            return outcome

    def _apply(self, tx: StoreTxn, request: SubmitRequest, now_ms: int) -> SubmitOutcome:
        key = request.idempotency_key
        if key is not None:
            prior = tx.latest_effect_for_key(key)
            verdict = replay(
                None if prior is None else _committed(prior),
                first_seen_ms=0 if prior is None else prior.first_seen_ms,
                parameter_digest=request.parameter_digest,
                now_ms=now_ms,
                retention_s=self.contract.key_retention_s,
            )
            if verdict is not None:
                tx.bump("replays" if isinstance(verdict, Committed) else "drift_rejections")
                return verdict
        params = OperationParams.model_validate(request.params)
        effect = tx.insert_effect(
            operation_id=request.operation_id,
            idempotency_key=key,
            attempt_id=request.attempt_id,
            parameter_digest=request.parameter_digest,
            params=params.model_dump(),
            account=params.account,
            amount_minor=params.amount_minor,
            fencing_token=request.fencing_token,
            now_ms=now_ms,
        )
        tx.bump("effects_created")
        return _committed(effect)

    # ------------------------------------------------------------------ reservations

    def _expired(self, tx: StoreTxn, hold: ReservationRecord, now_ms: int) -> ReservationRecord:
        """Release a hold whose ``reservation_hold_s`` has passed (ledger clock).

        The sink releases an unconfirmed hold by itself: every request that
        looks at a hold applies the expiry first, so no observation can see a
        hold held past its time (the release is dated at its expiry).
        """
        if hold.status != "held":
            return hold
        if now_ms < hold.held_at_ms + self.contract.reservation_hold_s * 1000:
            return hold
        released = replace(hold, status="released", released_why="expired")
        tx.put_reservation(released)
        tx.bump("reservations_released")
        return released

    def _hold_state(self, hold: ReservationRecord, *, new: bool = False) -> HoldState:
        return HoldState(
            status=cast(Literal["held", "confirmed", "released"], hold.status),
            held_at_ms=hold.held_at_ms,
            expires_at_ms=hold.held_at_ms + self.contract.reservation_hold_s * 1000,
            parameter_digest=hold.parameter_digest,
            reserves=hold.reserves,
            effect_id=hold.effect_id,
            released_why=cast(Literal["cancelled", "expired"] | None, hold.released_why),
            new=new,
        )

    def reserve(self, request: SubmitRequest) -> ReserveOutcome:
        """Take a bounded hold for an effect (try-confirm-cancel: the "try").

        The hold's key is the operation ID. Reserving again an operation
        that is held or confirmed answers the hold as it stands (idempotent);
        one whose hold was released (cancelled, or expired after
        ``reservation_hold_s``) takes a new hold under the same key. A hold
        for other parameters is refused (:class:`~sinks.toolkit.KeyReused`).

        Returns:
            The hold (``held``/``confirmed``; ``new`` when this request took
            it), or a refusal as :meth:`submit` answers them.
        """
        now_ms = self.clock.now_ms()
        op = request.operation_id
        with self.store.transaction() as tx:
            tx.bump("requests")
            fenced = self._fence(tx, op, request.fencing_token, now_ms)
            if fenced is not None:
                return fenced
            hold = tx.reservation(op)
            if hold is not None:
                hold = self._expired(tx, hold, now_ms)
                if hold.parameter_digest != request.parameter_digest:
                    tx.bump("drift_rejections")
                    return KeyReused(detail="this operation is reserved with other parameters")
                if hold.status != "released":
                    return self._hold_state(hold)
            new = ReservationRecord(
                operation_id=op,
                status="held",
                parameter_digest=request.parameter_digest,
                submit_json=_submitted(request),
                held_at_ms=now_ms,
                reserves=(hold.reserves if hold is not None else 0) + 1,
            )
            tx.put_reservation(new)
            tx.bump("reservations")
            return self._hold_state(new, new=True)

    def confirm(self, operation_id: str, fencing_token: int | None) -> HoldOutcome:
        """Confirm a held reservation: the effect is made now (once).

        Returns:
            ``confirmed`` with the effect ID (again for a confirmed hold); a
            released hold stays released (the toolkit answers 409); an
            unknown one is :class:`~sinks.toolkit.Absent`.
        """

        def step(tx: StoreTxn, hold: ReservationRecord, now_ms: int) -> HoldOutcome:
            if hold.status == "held":
                held = json.loads(hold.submit_json)
                params = OperationParams.model_validate(held["params"])
                effect = tx.insert_effect(
                    operation_id=operation_id,
                    idempotency_key=operation_id,
                    attempt_id=held["attempt_id"],
                    parameter_digest=held["parameter_digest"],
                    params=params.model_dump(),
                    account=params.account,
                    amount_minor=params.amount_minor,
                    fencing_token=fencing_token,
                    now_ms=now_ms,
                )
                tx.bump("effects_created")
                tx.bump("reservations_confirmed")
                hold = replace(hold, status="confirmed", effect_id=effect.effect_id)
                tx.put_reservation(hold)
            return self._hold_state(hold)

        return self._on_hold(operation_id, fencing_token, step)

    def cancel(self, operation_id: str, fencing_token: int | None) -> HoldOutcome:
        """Cancel a held reservation: it is released, and no effect is made.

        Returns:
            ``released`` (again for a released hold); a confirmed hold stays
            confirmed (the toolkit answers 409); an unknown one is
            :class:`~sinks.toolkit.Absent`.
        """

        def step(tx: StoreTxn, hold: ReservationRecord, now_ms: int) -> HoldOutcome:
            if hold.status == "held":
                hold = replace(hold, status="released", released_why="cancelled")
                tx.put_reservation(hold)
                tx.bump("reservations_released")
            return self._hold_state(hold)

        return self._on_hold(operation_id, fencing_token, step)

    def _on_hold(
        self,
        operation_id: str,
        fencing_token: int | None,
        step: Callable[[StoreTxn, ReservationRecord, int], HoldOutcome],
    ) -> HoldOutcome:
        """What confirm, cancel and read_hold share: the request is counted and
        fenced, the hold exists and is released if its time has passed; then
        ``step(tx, hold, now_ms)`` answers, in the same store transaction."""
        now_ms = self.clock.now_ms()
        with self.store.transaction() as tx:
            tx.bump("requests")
            fenced = self._fence(tx, operation_id, fencing_token, now_ms)
            if fenced is not None:
                return fenced
            hold = tx.reservation(operation_id)
            if hold is None:
                return Absent()
            return step(tx, self._expired(tx, hold, now_ms), now_ms)

    def read_hold(self, operation_id: str, fencing_token: int | None) -> HoldOutcome:
        """Read a reservation back: ``held``, ``confirmed``, ``released`` or absent."""
        return self._on_hold(
            operation_id, fencing_token, lambda tx, hold, now: self._hold_state(hold)
        )

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackOutcome:
        """Answer whether an operation committed, whatever the key retention."""
        now_ms = self.clock.now_ms()
        with self.store.transaction() as tx:
            tx.bump("requests")
            tx.bump("readbacks")
            fenced = self._fence(tx, operation_id, fencing_token, now_ms)
            if fenced is not None:
                return fenced
            effects = tx.effects_for_operation(operation_id)
        if not effects:
            return Absent()
        first = effects[0]
        return OperationFound(
            effect_id=first.effect_id,
            committed_ms=first.committed_ms,
            parameter_digest=first.parameter_digest,
            effects=len(effects),
            extra={
                "account": first.account,
                "amount_minor": first.amount_minor,
                "effect_ids": [effect.effect_id for effect in effects],
            },
        )

    def account(self, account: str) -> AccountOutcome:
        """Postcondition: every credit the sink made to an account, oldest first."""
        with self.store.transaction() as tx:
            tx.bump("requests")
            effects = tx.effects_for_account(account)
        return [Credit(e.operation_id, e.amount_minor or 0, e.effect_id) for e in effects]

    def health_info(self) -> dict[str, Any]:
        """What ``/health`` adds to the toolkit's answer: the server's process ID."""
        return {"pid": os.getpid()}


class _Backend:
    """The service as the app's backend: a timeout fault's answer waits ``hang_s`` first."""

    def __init__(self, service: SinkService, hang_s: float) -> None:
        self.service = service
        self.hang_s = hang_s
        self.readback = service.readback
        self.account = service.account
        self.reserve = service.reserve
        self.confirm = service.confirm
        self.cancel = service.cancel
        self.read_hold = service.read_hold
        self.health_info = service.health_info

    async def submit(self, request: SubmitRequest) -> SubmitOutcome:
        outcome = self.service.submit(request)
        if isinstance(outcome, OutcomeUnknown):
            await asyncio.sleep(self.hang_s)
        return outcome


def create_app(
    name: str,
    contract: EffectContract,
    db_path: Path,
    clock: Clock,
    hang_s: float = 5.0,
    *,
    token: str,
    fault_injection: bool = False,
) -> Starlette:
    """Build the gateway app of one sink.

    The store opens immediately and closes at application shutdown; it is
    also available as ``app.state.store`` (and the logic as
    ``app.state.service``).

    Args:
        name: the sink's name, e.g. ``payments`` (its registered name: it is
            an input of the parameter digest the gateway checks).
        contract: the behaviour to offer.
        db_path: the sink's SQLite file (created when absent).
        clock: the ledger clock.
        hang_s: how long a timeout fault waits before answering 504 (seconds);
            make it longer than the client's timeout.
        token: the bearer token every request but ``/health`` must carry
            (at least :data:`MIN_TOKEN_LEN` characters of printable ASCII).
        fault_injection: offer ``POST /admin/faults`` (the testbed's fault
            injection); without it the route does not exist (404).

    Returns:
        The Starlette application.

    Raises:
        ValueError: if ``token`` is shorter than :data:`MIN_TOKEN_LEN` or not printable ASCII.
        testbed.errors.SinkStoreError: if ``db_path`` belongs to another sink.
    """
    check_token(token)
    store = SinkStore(db_path, name)
    service = SinkService(name, contract, store, clock)
    #: the trace context of the latest sink requests (advisory: it decides nothing).
    seen: deque[dict[str, str | None]] = deque(maxlen=TRACES_KEPT)

    def record(request: Request) -> None:
        seen.append(
            {
                "method": request.method,
                "path": request.url.path,
                "traceparent": request.headers.get("traceparent"),
            }
        )

    async def arm_fault(request: Request) -> JSONResponse:
        raw = await read_json_object(request)
        if isinstance(raw, JSONResponse):
            return raw
        try:
            body = FaultBody.model_validate(raw)
        except ValidationError as exc:
            return invalid(exc)
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

    async def traces(request: Request) -> JSONResponse:
        return JSONResponse({"requests": list(seen)})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        store.close()

    def guarded(handler: Handler) -> Handler:
        async def checked(request: Request) -> JSONResponse:
            refused = authorised(request, token, "reference-sink")
            return refused if refused is not None else await handler(request)

        return checked

    admin = [
        Route("/admin/effects", guarded(effects), methods=["GET"]),
        Route("/admin/stats", guarded(stats), methods=["GET"]),
        Route("/admin/traces", guarded(traces), methods=["GET"]),
    ]
    if fault_injection:
        admin.append(Route("/admin/faults", guarded(arm_fault), methods=["POST"]))
    app = create_sink_app(
        _Backend(service, hang_s),
        name=name,
        token=token,
        contract=contract,
        params_model=OperationParams,
        routes=admin,
        lifespan=lifespan,
        on_request=record,
        on_refusal=service.refused,
        realm="reference-sink",
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
    token: str,
    fault_injection: bool = False,
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
        token: the bearer token requests must carry (see :func:`create_app`).
        fault_injection: offer ``POST /admin/faults``.

    Raises:
        ValueError: if ``token`` is too short (see :func:`create_app`).
        OSError: if the port cannot be bound.
        testbed.errors.SinkStoreError: if ``db_path`` belongs to another sink.
    """
    app = create_app(
        name, contract, db_path, clock, hang_s=hang_s, token=token, fault_injection=fault_injection
    )
    sock = bind_socket(port)
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
@click.option(
    "--fault-injection",
    is_flag=True,
    default=False,
    help="Offer POST /admin/faults (the testbed's fault injection; still needs the token).",
)
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
    fault_injection: bool,
) -> None:
    """Run one reference sink on 127.0.0.1.

    Its bearer token comes from the environment variable LEDGER_SINK_TOKEN
    (required; the testbed generates one and registers it in sinks.json).
    """
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < MIN_TOKEN_LEN:
        raise click.UsageError(
            f"set {TOKEN_ENV} to the sink's bearer token (at least {MIN_TOKEN_LEN} characters, "
            "e.g. from secrets.token_urlsafe(32)); the testbed does this when it starts a sink"
        )
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
            token=token,
            fault_injection=fault_injection,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            click.echo(f"sink {name}: cannot bind {HOST}:{port}: {exc}", err=True)
            sys.exit(EXIT_ADDRESS_IN_USE)
        raise


if __name__ == "__main__":
    main()
