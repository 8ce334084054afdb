"""The sink protocol as a Starlette application around a backend.

:func:`create_sink_app` serves the routes of the protocol
(``sinks/openapi.json``): it checks the bearer token, bounds and validates
bodies, refuses what the protocol refuses (with its ``error`` codes),
recomputes the parameter digest, answers 501 for the parts the contract does
not declare, and renders the backend's outcomes (:mod:`sinks.toolkit.backend`)
as the protocol's responses. A backend that raises gets a 500 answer, which
the ledger treats as "may have acted" (it reads the operation back).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, cast

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from ledger.contracts import EffectContract
from sinks.client import Credit
from sinks.toolkit.backend import (
    MAX_TOKEN_STEP,
    Absent,
    Committed,
    HoldState,
    KeyReused,
    OperationFound,
    OutcomeUnknown,
    PostconditionBackend,
    ReadbackBackend,
    Rejected,
    ReservationBackend,
    SinkBackend,
    StaleToken,
    SubmitRequest,
    TokenOutOfRange,
    Unavailable,
)
from sinks.toolkit.wire import (
    IDEMPOTENCY_HEADER,
    HoldBody,
    SubmitBody,
    authorised,
    check_token,
    invalid,
    read_json_object,
    submit_problem,
    token_query,
)

_LOG = logging.getLogger(__name__)

#: A route's handler.
Handler = Callable[[Request], Awaitable[JSONResponse]]

#: Which request an outcome answers (it decides some statuses).
_Route = str


async def _ask(method: Callable[..., Any], *args: Any) -> Any:
    """Call a backend method, plain or coroutine, and return its outcome."""
    answer = method(*args)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer


def _hold_status(route: _Route, hold: HoldState) -> int:
    if route == "reserve":
        return 201 if hold.new else 200
    if (route, hold.status) in (("confirm", "released"), ("cancel", "confirmed")):
        return 409
    return 200


def render(
    route: _Route, operation_id: str, outcome: Any, token: int | None = None
) -> JSONResponse:
    """The protocol's response to a backend's outcome.

    Args:
        route: ``submit``, ``readback``, ``reserve``, ``confirm``, ``cancel``,
            ``hold`` or ``account``.
        operation_id: the operation the request named (unused for ``account``).
        outcome: what the backend answered.
        token: the request's fencing token (named in an out-of-range refusal).

    Returns:
        The response; a 500 ``internal_error`` for an outcome the route cannot give.
    """
    op = {} if route == "account" else {"operation_id": operation_id}
    match outcome:
        case Committed() if route == "submit":
            body = {
                **outcome.extra,
                **op,
                "status": "committed",
                "effect_id": outcome.effect_id,
                "committed_ms": outcome.committed_ms,
                "replayed": outcome.replayed,
                "parameter_digest": outcome.parameter_digest,
                "fencing_token": outcome.fencing_token,
            }
            return JSONResponse(body, status_code=200 if outcome.replayed else 201)
        case OperationFound() if route == "readback":
            body = {
                **outcome.extra,
                **op,
                "status": "committed",
                "effect_id": outcome.effect_id,
                "committed_ms": outcome.committed_ms,
                "parameter_digest": outcome.parameter_digest,
                "effects": outcome.effects,
            }
            return JSONResponse(body)
        case HoldState() if route in ("reserve", "confirm", "cancel", "hold"):
            body = {
                **outcome.extra,
                **op,
                "status": outcome.status,
                "held_at_ms": outcome.held_at_ms,
                "expires_at_ms": outcome.expires_at_ms,
                "released_why": outcome.released_why,
                "effect_id": outcome.effect_id,
                "reserves": outcome.reserves,
                "parameter_digest": outcome.parameter_digest,
            }
            return JSONResponse(body, status_code=_hold_status(route, outcome))
        case Absent() if route in ("readback", "confirm", "cancel", "hold"):
            return JSONResponse({"status": "absent", **op}, status_code=404)
        case StaleToken():
            body = {"error": "stale_fencing_token", **op, "highest": outcome.highest}
            return JSONResponse(body, status_code=409)
        case TokenOutOfRange():
            detail = (
                f"fencing token {token} is more than {MAX_TOKEN_STEP} above the highest this "
                f"sink has seen for the operation (at most {outcome.ceiling})"
            )
            body = {"error": "fencing_token_out_of_range", **op, "detail": detail}
            return JSONResponse(body, status_code=400)
        case KeyReused() if route in ("submit", "reserve"):
            body = {"error": "idempotency_key_reused", **op, "detail": outcome.detail}
            if outcome.effect_id is not None:
                body["effect_id"] = outcome.effect_id
            return JSONResponse(body, status_code=409)
        case Rejected() if route in ("submit", "reserve"):
            body = {"status": "rejected", "error": outcome.error, **op, "detail": outcome.detail}
            return JSONResponse(body, status_code=422)
        case Unavailable():
            body = {
                "status": "unavailable",
                "error": "sink_unavailable",
                **op,
                "detail": outcome.detail,
            }
            return JSONResponse(body, status_code=503)
        case OutcomeUnknown():
            body = {"error": "outcome_unknown", **op, "detail": outcome.detail}
            return JSONResponse(body, status_code=504)
    _LOG.error("sink backend answered %s with %r, which that route cannot give", route, outcome)
    return _internal(operation_id)


def _internal(operation_id: str | None = None) -> JSONResponse:
    detail = "the sink failed while handling the request; it may have acted: read it back"
    body: dict[str, Any] = {"error": "internal_error", "detail": detail}
    if operation_id is not None:
        body["operation_id"] = operation_id
    return JSONResponse(body, status_code=500)


def _credits(account: str, credits: Sequence[Credit]) -> JSONResponse:
    rows = [
        {"operation_id": c.operation_id, "amount_minor": c.amount_minor, "effect_id": c.effect_id}
        for c in credits
    ]
    total = sum(c.amount_minor for c in credits)
    return JSONResponse({"account": account, "credited_minor": total, "credits": rows})


def _check_parts(backend: SinkBackend, contract: EffectContract) -> None:
    """Refuse a backend that lacks a part its contract declares.

    Raises:
        ValueError: naming the missing methods and the remedy.
    """
    parts: list[tuple[bool, type, str, str]] = [
        (True, SinkBackend, "submit", "every sink makes effects"),
        (contract.readback, ReadbackBackend, "readback", "readback: true"),
        (
            contract.postcondition_query() is not None,
            PostconditionBackend,
            "account",
            "a postcondition",
        ),
        (
            contract.reservation,
            ReservationBackend,
            "reserve, confirm, cancel and read_hold",
            "reservation: true",
        ),
    ]
    for declared, protocol, methods, claim in parts:
        if declared and not isinstance(backend, protocol):
            raise ValueError(
                f"the sink backend {type(backend).__name__} has no {methods} method(s), but "
                f"its contract declares {claim}: implement {protocol.__name__}, or declare "
                "less in the contract"
            )


def create_sink_app(
    backend: SinkBackend,
    *,
    name: str,
    token: str,
    contract: EffectContract,
    params_model: type[BaseModel] | None = None,
    routes: Sequence[BaseRoute] = (),
    lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]] | None = None,
    on_request: Callable[[Request], None] | None = None,
    on_refusal: Callable[[str, str], None] | None = None,
    realm: str = "sink",
) -> Starlette:
    """Build the application that serves the sink protocol in front of ``backend``.

    Args:
        backend: the business half (:mod:`sinks.toolkit.backend`); it must
            offer every part ``contract`` declares.
        name: the sink's registered name (an input of the parameter digest,
            and reported by ``/health``).
        token: the bearer token every route but ``/health`` requires (at
            least 16 printable ASCII characters).
        contract: what the sink declares; it decides which headers and body
            fields are required and which routes answer 501.
        params_model: a pydantic model the ``params`` object must satisfy
            (else 400 ``invalid_request``); the backend still gets the params
            as received.
        routes: more routes of the sink's own (served after the protocol's;
            guard them with :func:`sinks.toolkit.wire.authorised`).
        lifespan: the application's lifespan (e.g. to close the backend's store).
        on_request: called with every request that passed the token check
            (e.g. to record trace headers).
        on_refusal: called with ``(route, error)`` for every submit or reserve
            the toolkit refuses after parsing it (e.g. to count refusals).
        realm: the realm of the 401 challenge.

    Returns:
        The Starlette application.

    Raises:
        ValueError: if the token is too short, or the backend lacks a part the
            contract declares.
    """
    check_token(token)
    _check_parts(backend, contract)
    fencing, idempotent = contract.fencing, contract.idempotent

    def fenced(value: int | None) -> int | None:
        return value if fencing else None

    def guarded(handler: Handler) -> Handler:
        async def checked(request: Request) -> JSONResponse:
            refused = authorised(request, token, realm)
            if refused is not None:
                return refused
            if on_request is not None:
                on_request(request)
            try:
                return await handler(request)
            except Exception:  # the backend may have acted: the caller must read back
                _LOG.exception("sink %s failed on %s %s", name, request.method, request.url.path)
                return _internal()

        return checked

    def unsupported(part: str) -> JSONResponse:
        return JSONResponse({"error": f"{part}_not_supported", "sink": name}, status_code=501)

    async def parsed_submit(request: Request, route: str) -> SubmitRequest | JSONResponse:
        raw = await read_json_object(request)
        if isinstance(raw, JSONResponse):
            return raw
        try:
            body = SubmitBody.model_validate(raw)
            if params_model is not None:
                params_model.model_validate(raw["params"])
        except ValidationError as exc:
            return invalid(exc)
        key = request.headers.get(IDEMPOTENCY_HEADER)
        problem = submit_problem(body, raw["params"], key, sink=name, contract=contract)
        if problem is not None:
            if on_refusal is not None:
                on_refusal(route, problem[0])
            error, detail = problem
            answer = {"error": error, "operation_id": body.operation_id, "detail": detail}
            return JSONResponse(answer, status_code=400)
        return SubmitRequest(
            operation_id=body.operation_id,
            parameter_digest=body.parameter_digest,
            params=raw["params"],
            fencing_token=fenced(body.fencing_token),
            attempt_id=body.attempt_id,
            action=body.action,
            subject=body.subject,
            purpose=body.purpose,
            decision_version=body.decision_version,
            idempotency_key=key if idempotent else None,
        )

    async def submit(request: Request) -> JSONResponse:
        parsed = await parsed_submit(request, "submit")
        if isinstance(parsed, JSONResponse):
            return parsed
        outcome = await _ask(backend.submit, parsed)
        return render("submit", parsed.operation_id, outcome, parsed.fencing_token)

    async def readback(request: Request) -> JSONResponse:
        if not isinstance(backend, ReadbackBackend) or not contract.readback:
            return unsupported("readback")
        query = token_query(request)
        if isinstance(query, JSONResponse):
            return query
        op = request.path_params["operation_id"]
        outcome = await _ask(backend.readback, op, fenced(query))
        return render("readback", op, outcome, query)

    async def account(request: Request) -> JSONResponse:
        if not isinstance(backend, PostconditionBackend) or not contract.postcondition_query():
            return unsupported("postcondition")
        subject = request.path_params["account"]
        outcome = await _ask(backend.account, subject)
        if isinstance(outcome, Unavailable | OutcomeUnknown):
            return render("account", subject, outcome)
        return _credits(subject, cast(Sequence[Credit], outcome))

    async def reserve(request: Request) -> JSONResponse:
        if not isinstance(backend, ReservationBackend) or not contract.reservation:
            return unsupported("reservation")
        parsed = await parsed_submit(request, "reserve")
        if isinstance(parsed, JSONResponse):
            return parsed
        outcome = await _ask(backend.reserve, parsed)
        return render("reserve", parsed.operation_id, outcome, parsed.fencing_token)

    def settle(route: str) -> Handler:
        async def handler(request: Request) -> JSONResponse:
            if not isinstance(backend, ReservationBackend) or not contract.reservation:
                return unsupported("reservation")
            raw = await read_json_object(request)
            if isinstance(raw, JSONResponse):
                return raw
            try:
                body = HoldBody.model_validate(raw)
            except ValidationError as exc:
                return invalid(exc)
            method = backend.confirm if route == "confirm" else backend.cancel
            outcome = await _ask(method, body.operation_id, fenced(body.fencing_token))
            return render(route, body.operation_id, outcome, body.fencing_token)

        return handler

    async def hold(request: Request) -> JSONResponse:
        if not isinstance(backend, ReservationBackend) or not contract.reservation:
            return unsupported("reservation")
        query = token_query(request)
        if isinstance(query, JSONResponse):
            return query
        op = request.path_params["operation_id"]
        outcome = await _ask(backend.read_hold, op, fenced(query))
        return render("hold", op, outcome, query)

    async def health(request: Request) -> JSONResponse:
        about: Callable[[], Any] | None = getattr(backend, "health_info", None)
        try:
            info = {} if about is None else await _ask(about)
        except Exception:
            _LOG.exception("sink %s failed to report its health", name)
            info = None
        if info is None:
            return JSONResponse({"status": "unavailable", "name": name}, status_code=503)
        body = {**info, "status": "ok", "name": name, "contract": contract.model_dump()}
        return JSONResponse(body)

    protocol = [
        Route("/operations", guarded(submit), methods=["POST"]),
        Route("/operations/{operation_id:path}", guarded(readback), methods=["GET"]),
        Route("/accounts/{account:path}", guarded(account), methods=["GET"]),
        Route("/reservations", guarded(reserve), methods=["POST"]),
        Route("/reservations/confirm", guarded(settle("confirm")), methods=["POST"]),
        Route("/reservations/cancel", guarded(settle("cancel")), methods=["POST"]),
        Route("/reservations/{operation_id:path}", guarded(hold), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=[*protocol, *routes], lifespan=lifespan)
