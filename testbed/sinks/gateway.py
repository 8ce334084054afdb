"""The reference sink: one HTTP gateway whose behaviour the contract switches.

Routes (JSON in and out):

=========================================  =====================================================
``POST /operations``                       submit an effect. 201 new effect, 200 idempotent
                                           replay, 409 ``stale_fencing_token`` or
                                           ``idempotency_key_reused``, 422 rejected (fault),
                                           503 unavailable (fault), 504 timeout (fault),
                                           400 malformed request (see "Refusals").
``GET /operations/{operation_id}``         readback (``?fencing_token=N``). 200 committed,
                                           404 absent, 409 ``stale_fencing_token``,
                                           501 when the contract has no readback.
``GET /accounts/{account}``                postcondition: credits of an account. 200, or 501
                                           when the contract has no postcondition.
``POST /reservations``                     try-confirm-cancel (``reservation: true``; else 501):
                                           take a hold (a submit's body). 201 new hold, 200
                                           the hold as it stands (held or confirmed); a
                                           released hold is taken again under the same key.
``POST /reservations/confirm``             ``{"operation_id", "fencing_token"}``: make the
                                           held effect (200 ``confirmed``, again for a
                                           confirmed one), 409 ``released``, 404 ``absent``.
``POST /reservations/cancel``              release a hold (200 ``released``), 409 when it is
                                           already ``confirmed``, 404 ``absent``.
``GET /reservations/{operation_id}``       the hold: ``held``, ``confirmed``, ``released``
                                           (``released_why``: ``cancelled`` or ``expired``),
                                           or 404 ``absent``. A hold not confirmed within
                                           ``reservation_hold_s`` (ledger clock) is released
                                           by the sink itself (applied before every answer).
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

Refusals (each a JSON body ``{"error": ..., "detail": ...}``, never an effect):

* 413 ``body_too_large``: a body over :data:`MAX_BODY_BYTES` (1 MiB).
* 400 ``invalid_request``: bytes that are not UTF-8 JSON, JSON nested deeper
  than :data:`MAX_JSON_DEPTH`, a body that is not an object, a missing field or
  a field of the wrong type, an operation ID or idempotency key outside the
  ledger's grammar (:func:`ledger.identity.operation_id_problem`).
* 400 ``idempotency_key_required`` / ``fencing_token_required``: a submit
  without the ``Idempotency-Key`` header or the fencing token that the
  contract promises to honour (``contract.idempotent``, ``contract.fencing``).
* 400 ``parameter_digest_mismatch``: the ``parameter_digest`` is not the
  digest of the submitted ``params``, ``action``, ``subject``, ``purpose``,
  ``decision_version`` and this sink's name, recomputed with
  :func:`ledger.identity.parameter_digest` in the version the digest names
  (version 1, from releases before the sink was bound, omits the sink). 400,
  not 409: the request contradicts itself; 409 is kept for conflicts with
  what the sink already holds.
* 400 ``fencing_token_out_of_range``: a negative token, one over ``2**63 - 1``,
  or one more than :data:`MAX_TOKEN_STEP` above the highest seen for the
  operation (0 when none); the ledger raises an operation's token by one per
  resume, so such a token can only be an error, and accepting it would make
  every later request of the operation stale (held in EFFECT_PENDING for ever).

Rules, in the order a submit applies them (after the refusals above):

1. Fencing (``contract.fencing``): a token lower than the highest seen for the
   operation is refused (409) and counted; otherwise the highest is raised to
   it. Readbacks carry tokens too (a readback without one is not fenced).
2. An armed fault for the operation fires (one firing per submit).
3. Idempotency (``contract.idempotent`` and an ``Idempotency-Key`` header):
   while the key is retained (``now - first_seen < key_retention_s``) the same
   digest replays the first effect (200) and another digest is refused (409,
   counted as drift). Otherwise the request is a new effect (201). A sink
   whose contract is not idempotent ignores the header.

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
import secrets
import socket
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
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
from ledger.errors import LedgerError
from ledger.identity import digest_version, operation_id_problem, parameter_digest
from testbed.sinks.store import EffectRecord, FaultMode, ReservationRecord, SinkStore, StoreTxn

#: The only interface the gateway listens on.
HOST: Final = "127.0.0.1"

#: Exit status of ``python -m testbed.sinks.gateway`` when the port cannot be bound.
EXIT_ADDRESS_IN_USE: Final = 98

#: Header that carries the idempotency key (the operation ID).
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"

#: Environment variable that carries the gateway's bearer token to its process
#: (not a command-line option: other users can read a process's arguments).
TOKEN_ENV: Final = "LEDGER_SINK_TOKEN"

#: Shortest bearer token the gateway accepts to start with (characters).
MIN_TOKEN_LEN: Final = 16

#: Largest request body the gateway reads (bytes); a larger one is answered 413.
MAX_BODY_BYTES: Final = 1024 * 1024

#: Deepest nesting of JSON objects and arrays accepted in a body (the body
#: itself is depth 1).
MAX_JSON_DEPTH: Final = 32

#: How far above the highest fencing token seen for an operation (0 when none)
#: a request's token may be.
MAX_TOKEN_STEP: Final = 1000

#: Largest fencing token (SQLite's signed 64-bit integer).
MAX_TOKEN: Final = 2**63 - 1

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


class SubmitBody(BaseModel):
    """Body of ``POST /operations``.

    Attributes:
        operation_id: the operation (the ledger's ID grammar).
        parameter_digest: the digest the operation is bound to.
        params: its parameters.
        fencing_token: the operation's fencing token (required by a fencing
            contract), 0 to ``2**63 - 1``.
        attempt_id: the caller's attempt identity (kept for inspection).
        action: the action (an input of the digest).
        subject: the represented subject (an input of the digest).
        purpose: the declared purpose (an input of the digest).
        decision_version: the business decision's version (an input of the digest).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: StrictStr = Field(min_length=1)
    parameter_digest: StrictStr = Field(min_length=1, max_length=200)
    params: OperationParams
    fencing_token: StrictInt | None = Field(default=None, ge=0, le=MAX_TOKEN)
    attempt_id: StrictStr = Field(min_length=1, max_length=500)
    action: StrictStr = Field(min_length=1, max_length=200)
    subject: StrictStr = Field(max_length=1000)
    purpose: StrictStr = Field(max_length=1000)
    decision_version: StrictInt = Field(ge=0, le=MAX_TOKEN)


class HoldBody(BaseModel):
    """Body of ``POST /reservations/confirm`` and ``POST /reservations/cancel``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: StrictStr = Field(min_length=1)
    fencing_token: StrictInt | None = Field(default=None, ge=0, le=MAX_TOKEN)


class FaultBody(BaseModel):
    """Body of ``POST /admin/faults``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: StrictStr = Field(min_length=1, max_length=1000)
    mode: FaultMode
    times: StrictInt = Field(default=1, ge=1, le=1000)


#: A route's handler.
Handler = Callable[[Request], Awaitable[JSONResponse]]


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
        detail: Any = json.loads(exc.json(include_url=False, include_input=False))
    else:
        detail = str(exc)
    return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=400)


def _refusal(status_code: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status_code)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether JSON ``value`` nests objects and arrays deeper than ``limit`` (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def read_json_object(request: Request) -> dict[str, Any] | JSONResponse:
    """Read a request body as one bounded JSON object.

    Args:
        request: the request; at most :data:`MAX_BODY_BYTES` of its body are read.

    Returns:
        The object, or the refusal to answer: 413 ``body_too_large``, or 400
        ``invalid_request`` for bytes that are not UTF-8 JSON (``NaN`` and
        ``Infinity`` included), text with lone surrogates, nesting deeper
        than :data:`MAX_JSON_DEPTH`, or a value that is not an object.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return _refusal(
            413, "body_too_large", f"the body has {declared} bytes; at most {MAX_BODY_BYTES}"
        )
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            return _refusal(
                413, "body_too_large", f"the body exceeds {MAX_BODY_BYTES} bytes; send less"
            )
    try:
        value = json.loads(bytes(raw).decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        return _invalid(ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError too
        return _invalid(ValueError(f"the body is not UTF-8 JSON: {str(exc)[:200]}"))
    if _too_deep(value, MAX_JSON_DEPTH):
        return _invalid(ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels"))
    try:  # a lone surrogate (\\ud800) decodes but cannot be stored or hashed
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return _invalid(ValueError(f"the JSON holds text that is not Unicode: {exc.reason}"))
    if not isinstance(value, dict):
        return _invalid(ValueError(f"the body must be a JSON object, not {type(value).__name__}"))
    return value


def authorised(request: Request, token: str) -> JSONResponse | None:
    """Check a request's bearer token in constant time.

    Args:
        request: the request.
        token: the gateway's token.

    Returns:
        ``None`` when ``Authorization: Bearer <token>`` matches, else the 401
        answer (``unauthenticated`` when no bearer token was sent,
        ``invalid_token`` when another was).
    """
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="reference-sink"'}
    if scheme.lower() != "bearer" or not given.strip():
        return JSONResponse(
            {
                "error": "unauthenticated",
                "detail": "send Authorization: Bearer <token>, the sink's token from the sink "
                "registry (sinks.json)",
            },
            status_code=401,
            headers=challenge,
        )
    # Header text is Latin-1 decoded, so it encodes back losslessly.
    if not secrets.compare_digest(given.strip().encode("latin-1"), token.encode("latin-1")):
        return JSONResponse(
            {
                "error": "invalid_token",
                "detail": "the bearer token is not this sink's; use the token registered "
                "for it in the sink registry (sinks.json)",
            },
            status_code=401,
            headers=challenge,
        )
    return None


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

    def _fence(
        self, tx: StoreTxn, operation_id: str, token: int | None, now_ms: int
    ) -> Reply | None:
        """Apply the fencing rule; return the refusal, or ``None`` when the request may go on.

        A token more than :data:`MAX_TOKEN_STEP` above the highest seen (0 when
        none) is refused with 400 and changes nothing; a token below the
        highest is stale (409, counted).
        """
        if not self.contract.fencing or token is None:
            return None
        ceiling = (tx.highest_token(operation_id) or 0) + MAX_TOKEN_STEP
        if token > ceiling:
            tx.bump("refusals")
            return Reply(
                400,
                {
                    "error": "fencing_token_out_of_range",
                    "operation_id": operation_id,
                    "detail": f"fencing token {token} is more than {MAX_TOKEN_STEP} above the "
                    f"highest this sink has seen for the operation (at most {ceiling})",
                },
            )
        check = tx.observe_token(operation_id, token, now_ms)
        if check.accepted:
            return None
        tx.bump("stale_rejections")
        return _stale(operation_id, check.highest)

    def refusal(
        self, body: SubmitBody, params: dict[str, Any], idempotency_key: str | None
    ) -> Reply | None:
        """Why a submit must be refused before it touches anything (see "Refusals").

        Args:
            body: the validated submit.
            params: the parameters exactly as received (the digest's input).
            idempotency_key: the ``Idempotency-Key`` header, if sent.

        Returns:
            The 400 answer, or ``None`` when the submit may go on.
        """
        op = body.operation_id

        def refuse(error: str, detail: str) -> Reply:
            return Reply(400, {"error": error, "operation_id": op, "detail": detail})

        problem = operation_id_problem(op)
        if problem is not None:
            return refuse("invalid_request", problem)
        if self.contract.idempotent:
            if idempotency_key is None:
                return refuse(
                    "idempotency_key_required",
                    f"sink {self.name} is idempotent: send the {IDEMPOTENCY_HEADER} header",
                )
            key_problem = operation_id_problem(idempotency_key)
            if key_problem is not None:
                return refuse("invalid_request", f"{IDEMPOTENCY_HEADER}: {key_problem}")
        if self.contract.fencing and body.fencing_token is None:
            return refuse(
                "fencing_token_required",
                f"sink {self.name} fences: send the operation's fencing_token",
            )
        try:
            expected = parameter_digest(
                action=body.action,
                params=params,
                subject=body.subject,
                purpose=body.purpose,
                decision_version=body.decision_version,
                sink=self.name,
                version=digest_version(body.parameter_digest),
            )
        except (LedgerError, ValueError) as exc:
            return refuse("invalid_request", f"params are not JSON values: {exc}")
        if expected != body.parameter_digest:
            return refuse(
                "parameter_digest_mismatch",
                f"parameter_digest {body.parameter_digest[:20]} is not the digest of these "
                f"params, action, subject, purpose and decision version for sink {self.name} "
                f"({expected[:20]})",
            )
        return None

    def submit(
        self, body: SubmitBody, idempotency_key: str | None, params: dict[str, Any] | None = None
    ) -> Reply:
        """Handle one submit in one transaction (see the module docstring).

        Args:
            body: the validated submit.
            idempotency_key: the ``Idempotency-Key`` header, if sent.
            params: the parameters as received; default ``body.params``
                without its unset fields.

        Returns:
            The answer.
        """
        received = params if params is not None else body.params.model_dump(exclude_unset=True)
        refused = self.refusal(body, received, idempotency_key)
        now_ms = self.clock.now_ms()
        op = body.operation_id
        with self.store.transaction() as tx:
            tx.bump("requests")
            tx.bump("submits")
            if refused is not None:
                tx.bump("refusals")
                return refused
            fenced = self._fence(tx, op, body.fencing_token, now_ms)
            if fenced is not None:
                return fenced
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

    # ------------------------------------------------------------------ reservations

    def _no_reservation(self) -> Reply | None:
        if self.contract.reservation:
            return None
        return Reply(501, {"error": "reservation_not_supported", "sink": self.name})

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

    def _hold_body(self, hold: ReservationRecord | None, operation_id: str) -> Reply:
        if hold is None:
            return Reply(404, {"status": "absent", "operation_id": operation_id})
        return Reply(
            200,
            {
                "status": hold.status,
                "operation_id": hold.operation_id,
                "held_at_ms": hold.held_at_ms,
                "expires_at_ms": hold.held_at_ms + self.contract.reservation_hold_s * 1000,
                "released_why": hold.released_why,
                "effect_id": hold.effect_id,
                "reserves": hold.reserves,
                "parameter_digest": hold.parameter_digest,
            },
        )

    def reserve(
        self, body: SubmitBody, idempotency_key: str | None, params: dict[str, Any] | None = None
    ) -> Reply:
        """Take a bounded hold for an effect (try-confirm-cancel: the "try").

        The hold's key is the operation ID. Reserving again an operation
        that is held or confirmed answers the hold as it stands (idempotent);
        one whose hold was released (cancelled, or expired after
        ``reservation_hold_s``) takes a new hold under the same key. A hold
        for other parameters is refused (409 ``idempotency_key_reused``).

        Returns:
            The hold (``status`` ``held``/``confirmed``), or a refusal as
            :meth:`submit` answers them.
        """
        unsupported = self._no_reservation()
        if unsupported is not None:
            return unsupported
        received = params if params is not None else body.params.model_dump(exclude_unset=True)
        refused = self.refusal(body, received, idempotency_key)
        now_ms = self.clock.now_ms()
        op = body.operation_id
        with self.store.transaction() as tx:
            tx.bump("requests")
            if refused is not None:
                tx.bump("refusals")
                return refused
            fenced = self._fence(tx, op, body.fencing_token, now_ms)
            if fenced is not None:
                return fenced
            hold = tx.reservation(op)
            if hold is not None:
                hold = self._expired(tx, hold, now_ms)
                if hold.parameter_digest != body.parameter_digest:
                    tx.bump("drift_rejections")
                    return Reply(
                        409,
                        {
                            "error": "idempotency_key_reused",
                            "operation_id": op,
                            "detail": "this operation is reserved with other parameters",
                        },
                    )
                if hold.status != "released":
                    return self._hold_body(hold, op)
            new = ReservationRecord(
                operation_id=op,
                status="held",
                parameter_digest=body.parameter_digest,
                submit_json=json.dumps(body.model_dump(), sort_keys=True),
                held_at_ms=now_ms,
                reserves=(hold.reserves if hold is not None else 0) + 1,
            )
            tx.put_reservation(new)
            tx.bump("reservations")
            reply = self._hold_body(new, op)
            return Reply(201, reply.body)

    def confirm(self, operation_id: str, fencing_token: int | None) -> Reply:
        """Confirm a held reservation: the effect is made now (once).

        Returns:
            ``confirmed`` with the effect ID (again for a confirmed hold); a
            released hold is not confirmed (409, ``status: released``); an
            unknown one is ``absent`` (404).
        """

        def step(tx: StoreTxn, hold: ReservationRecord, now_ms: int) -> Reply:
            if hold.status == "released":
                return Reply(409, self._hold_body(hold, operation_id).body)
            if hold.status == "held":
                body = SubmitBody.model_validate(json.loads(hold.submit_json))
                effect = tx.insert_effect(
                    operation_id=operation_id,
                    idempotency_key=operation_id,
                    attempt_id=body.attempt_id,
                    parameter_digest=body.parameter_digest,
                    params=body.params.model_dump(),
                    account=body.params.account,
                    amount_minor=body.params.amount_minor,
                    fencing_token=fencing_token,
                    now_ms=now_ms,
                )
                tx.bump("effects_created")
                tx.bump("reservations_confirmed")
                hold = replace(hold, status="confirmed", effect_id=effect.effect_id)
                tx.put_reservation(hold)
            return self._hold_body(hold, operation_id)

        return self._on_hold(operation_id, fencing_token, step)

    def cancel(self, operation_id: str, fencing_token: int | None) -> Reply:
        """Cancel a held reservation: it is released, and no effect is made.

        Returns:
            ``released`` (again for a released hold); a confirmed hold cannot
            be cancelled (409, ``status: confirmed``); an unknown one is
            ``absent`` (404).
        """

        def step(tx: StoreTxn, hold: ReservationRecord, now_ms: int) -> Reply:
            if hold.status == "confirmed":
                return Reply(409, self._hold_body(hold, operation_id).body)
            if hold.status == "held":
                hold = replace(hold, status="released", released_why="cancelled")
                tx.put_reservation(hold)
                tx.bump("reservations_released")
            return self._hold_body(hold, operation_id)

        return self._on_hold(operation_id, fencing_token, step)

    def _on_hold(
        self,
        operation_id: str,
        fencing_token: int | None,
        step: Callable[[StoreTxn, ReservationRecord, int], Reply],
    ) -> Reply:
        """What confirm and cancel share: the contract offers reservations, the
        request is counted and fenced, the hold exists and is released if its
        time has passed; then ``step(tx, hold, now_ms)`` answers, in the same
        store transaction."""
        unsupported = self._no_reservation()
        if unsupported is not None:
            return unsupported
        now_ms = self.clock.now_ms()
        with self.store.transaction() as tx:
            tx.bump("requests")
            fenced = self._fence(tx, operation_id, fencing_token, now_ms)
            if fenced is not None:
                return fenced
            hold = tx.reservation(operation_id)
            if hold is None:
                return self._hold_body(None, operation_id)
            return step(tx, self._expired(tx, hold, now_ms), now_ms)

    def hold(self, operation_id: str, fencing_token: int | None) -> Reply:
        """Read a reservation back: ``held``, ``confirmed``, ``released`` or ``absent``."""
        unsupported = self._no_reservation()
        if unsupported is not None:
            return unsupported
        now_ms = self.clock.now_ms()
        with self.store.transaction() as tx:
            tx.bump("requests")
            fenced = self._fence(tx, operation_id, fencing_token, now_ms)
            if fenced is not None:
                return fenced
            hold = tx.reservation(operation_id)
            if hold is not None:
                hold = self._expired(tx, hold, now_ms)
            return self._hold_body(hold, operation_id)

    def readback(self, operation_id: str, fencing_token: int | None) -> Reply:
        """Answer whether an operation committed, whatever the key retention."""
        if not self.contract.readback:
            return Reply(501, {"error": "readback_not_supported", "sink": self.name})
        now_ms = self.clock.now_ms()
        with self.store.transaction() as tx:
            tx.bump("requests")
            tx.bump("readbacks")
            fenced = self._fence(tx, operation_id, fencing_token, now_ms)
            if fenced is not None:
                return fenced
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
        ledger.errors.SinkStoreError: if ``db_path`` belongs to another sink.
    """
    if len(token) < MIN_TOKEN_LEN or not all("!" <= c <= "~" for c in token):
        raise ValueError(
            f"the sink's bearer token must be at least {MIN_TOKEN_LEN} printable ASCII "
            "characters; generate one with secrets.token_urlsafe(32)"
        )
    store = SinkStore(db_path, name)
    service = SinkService(name, contract, store, clock)
    #: the trace context of the latest sink requests (advisory: it decides nothing).
    seen: deque[dict[str, str | None]] = deque(maxlen=TRACES_KEPT)

    async def respond(reply: Reply) -> JSONResponse:
        if reply.hang:
            await asyncio.sleep(hang_s)
        return JSONResponse(reply.body, status_code=reply.status_code)

    async def submit(request: Request) -> JSONResponse:
        raw = await read_json_object(request)
        if isinstance(raw, JSONResponse):
            return raw
        try:
            body = SubmitBody.model_validate(raw)
        except ValidationError as exc:
            return _invalid(exc)
        return await respond(
            service.submit(body, request.headers.get(IDEMPOTENCY_HEADER), raw["params"])
        )

    async def readback(request: Request) -> JSONResponse:
        raw = request.query_params.get("fencing_token")
        try:
            fencing = None if raw in (None, "") else int(raw)
        except ValueError:
            return _invalid(ValueError(f"fencing_token must be an integer, got {raw!r}"[:300]))
        if fencing is not None and not 0 <= fencing <= MAX_TOKEN:
            return _invalid(ValueError(f"fencing_token must be 0 to {MAX_TOKEN}"))
        return await respond(service.readback(request.path_params["operation_id"], fencing))

    async def account(request: Request) -> JSONResponse:
        return await respond(service.account(request.path_params["account"]))

    async def reserve(request: Request) -> JSONResponse:
        raw = await read_json_object(request)
        if isinstance(raw, JSONResponse):
            return raw
        try:
            body = SubmitBody.model_validate(raw)
        except ValidationError as exc:
            return _invalid(exc)
        return await respond(
            service.reserve(body, request.headers.get(IDEMPOTENCY_HEADER), raw["params"])
        )

    def settle_hold(
        decide: Callable[[str, int | None], Reply],
    ) -> Handler:
        async def handler(request: Request) -> JSONResponse:
            raw = await read_json_object(request)
            if isinstance(raw, JSONResponse):
                return raw
            try:
                body = HoldBody.model_validate(raw)
            except ValidationError as exc:
                return _invalid(exc)
            return await respond(decide(body.operation_id, body.fencing_token))

        return handler

    async def hold(request: Request) -> JSONResponse:
        raw = request.query_params.get("fencing_token")
        try:
            fencing = None if raw in (None, "") else int(raw)
        except ValueError:
            return _invalid(ValueError(f"fencing_token must be an integer, got {raw!r}"[:300]))
        if fencing is not None and not 0 <= fencing <= MAX_TOKEN:
            return _invalid(ValueError(f"fencing_token must be 0 to {MAX_TOKEN}"))
        return await respond(service.hold(request.path_params["operation_id"], fencing))

    async def arm_fault(request: Request) -> JSONResponse:
        raw = await read_json_object(request)
        if isinstance(raw, JSONResponse):
            return raw
        try:
            body = FaultBody.model_validate(raw)
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

    async def traces(request: Request) -> JSONResponse:
        return JSONResponse({"requests": list(seen)})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {"status": "ok", "name": name, "pid": os.getpid(), "contract": contract.model_dump()}
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        store.close()

    def guarded(handler: Handler) -> Handler:
        async def checked(request: Request) -> JSONResponse:
            refused = authorised(request, token)
            if refused is not None:
                return refused
            if not request.url.path.startswith("/admin/"):
                seen.append(
                    {
                        "method": request.method,
                        "path": request.url.path,
                        "traceparent": request.headers.get("traceparent"),
                    }
                )
            return await handler(request)

        return checked

    routes = [
        Route("/operations", guarded(submit), methods=["POST"]),
        Route("/operations/{operation_id:path}", guarded(readback), methods=["GET"]),
        Route("/accounts/{account:path}", guarded(account), methods=["GET"]),
        Route("/reservations", guarded(reserve), methods=["POST"]),
        Route("/reservations/confirm", guarded(settle_hold(service.confirm)), methods=["POST"]),
        Route("/reservations/cancel", guarded(settle_hold(service.cancel)), methods=["POST"]),
        Route("/reservations/{operation_id:path}", guarded(hold), methods=["GET"]),
        Route("/admin/effects", guarded(effects), methods=["GET"]),
        Route("/admin/stats", guarded(stats), methods=["GET"]),
        Route("/admin/traces", guarded(traces), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    if fault_injection:
        routes.append(Route("/admin/faults", guarded(arm_fault), methods=["POST"]))
    app = Starlette(routes=routes, lifespan=lifespan)
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
        ledger.errors.SinkStoreError: if ``db_path`` belongs to another sink.
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
