"""The protocol's checks that need no stored state: token, body, types, digest.

Every function here answers a refusal as a value (a ``JSONResponse`` whose
body is ``{"error": ..., "detail": ...}``), never by raising, so a route can
return it as it is. The bodies of a sink's own extra routes (an admin API)
can use :func:`authorised` and :func:`read_json_object` too.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from ledger.contracts import EffectContract
from ledger.errors import LedgerError
from ledger.identity import digest_version, operation_id_problem, parameter_digest
from sinks.toolkit.backend import MAX_TOKEN

#: Header that carries the idempotency key (the operation ID, unless the
#: ledger starts a fresh attempt identity).
IDEMPOTENCY_HEADER: Final = "Idempotency-Key"

#: Shortest bearer token a sink accepts to start with (characters).
MIN_TOKEN_LEN: Final = 16

#: Largest request body read (bytes); a larger one is answered 413.
MAX_BODY_BYTES: Final = 1024 * 1024

#: Deepest nesting of JSON objects and arrays accepted in a body (the body
#: itself is depth 1).
MAX_JSON_DEPTH: Final = 32


class SubmitBody(BaseModel):
    """Body of ``POST /operations`` and ``POST /reservations``.

    Attributes:
        operation_id: the operation (the ledger's ID grammar).
        parameter_digest: the digest the operation is bound to.
        params: its parameters (a JSON object).
        fencing_token: the operation's fencing token, 0 to ``2**63 - 1``.
        attempt_id: the caller's attempt identity.
        action: the action (an input of the digest).
        subject: the represented subject (an input of the digest).
        purpose: the declared purpose (an input of the digest).
        decision_version: the business decision's version (an input of the digest).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    operation_id: StrictStr = Field(min_length=1)
    parameter_digest: StrictStr = Field(min_length=1, max_length=200)
    params: dict[str, Any]
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


def refusal(status_code: int, error: str, detail: Any, **more: Any) -> JSONResponse:
    """A refusal: ``{"error": error, "detail": detail, **more}`` with ``status_code``."""
    return JSONResponse({"error": error, "detail": detail, **more}, status_code=status_code)


def invalid(exc: ValidationError | ValueError) -> JSONResponse:
    """The 400 ``invalid_request`` answer to a validation error (inputs not echoed)."""
    if isinstance(exc, ValidationError):
        detail: Any = json.loads(exc.json(include_url=False, include_input=False))
    else:
        detail = str(exc)
    return refusal(400, "invalid_request", detail)


def check_token(token: str) -> None:
    """Check a sink's bearer token before serving with it.

    Raises:
        ValueError: if it is shorter than :data:`MIN_TOKEN_LEN` or not printable ASCII.
    """
    if len(token) < MIN_TOKEN_LEN or not all("!" <= c <= "~" for c in token):
        raise ValueError(
            f"the sink's bearer token must be at least {MIN_TOKEN_LEN} printable ASCII "
            "characters; generate one with secrets.token_urlsafe(32)"
        )


def authorised(request: Request, token: str, realm: str = "sink") -> JSONResponse | None:
    """Check a request's bearer token in constant time.

    Args:
        request: the request.
        token: the sink's token.
        realm: the realm named in the ``WWW-Authenticate`` challenge.

    Returns:
        ``None`` when ``Authorization: Bearer <token>`` matches, else the 401
        answer (``unauthenticated`` when no bearer token was sent,
        ``invalid_token`` when another was).
    """
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    challenge = {"WWW-Authenticate": f'Bearer realm="{realm}"'}
    if scheme.lower() != "bearer" or not given.strip():
        detail = (
            "send Authorization: Bearer <token>, the sink's token from the sink registry "
            "(sinks.json)"
        )
        return JSONResponse(
            {"error": "unauthenticated", "detail": detail}, status_code=401, headers=challenge
        )
    # Header text is Latin-1 decoded, so it encodes back losslessly.
    if not secrets.compare_digest(given.strip().encode("latin-1"), token.encode("latin-1")):
        detail = (
            "the bearer token is not this sink's; use the token registered for it in the "
            "sink registry (sinks.json)"
        )
        return JSONResponse(
            {"error": "invalid_token", "detail": detail}, status_code=401, headers=challenge
        )
    return None


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
        return refusal(
            413, "body_too_large", f"the body has {declared} bytes; at most {MAX_BODY_BYTES}"
        )
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            return refusal(
                413, "body_too_large", f"the body exceeds {MAX_BODY_BYTES} bytes; send less"
            )
    try:
        value = json.loads(bytes(raw).decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        return invalid(ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError too
        return invalid(ValueError(f"the body is not UTF-8 JSON: {str(exc)[:200]}"))
    if _too_deep(value, MAX_JSON_DEPTH):
        return invalid(ValueError(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels"))
    try:  # a lone surrogate (\\ud800) decodes but cannot be stored or hashed
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return invalid(ValueError(f"the JSON holds text that is not Unicode: {exc.reason}"))
    if not isinstance(value, dict):
        return invalid(ValueError(f"the body must be a JSON object, not {type(value).__name__}"))
    return value


def token_query(request: Request) -> int | None | JSONResponse:
    """The ``fencing_token`` query parameter: ``None`` when absent, or a 400 refusal."""
    raw = request.query_params.get("fencing_token")
    if raw in (None, ""):
        return None
    try:
        token = int(raw)
    except ValueError:
        return invalid(ValueError(f"fencing_token must be an integer, got {raw!r}"[:300]))
    if not 0 <= token <= MAX_TOKEN:
        return invalid(ValueError(f"fencing_token must be 0 to {MAX_TOKEN}"))
    return token


def submit_problem(
    body: SubmitBody,
    params: Mapping[str, Any],
    idempotency_key: str | None,
    *,
    sink: str,
    contract: EffectContract,
) -> tuple[str, str] | None:
    """Why a well-formed submit must be refused before it reaches the backend.

    Args:
        body: the validated submit.
        params: the parameters exactly as received (the digest's input).
        idempotency_key: the ``Idempotency-Key`` header, if sent.
        sink: the sink's registered name (an input of the digest).
        contract: what the sink promises (a key and a token may be required).

    Returns:
        ``(error, detail)`` of the 400 answer -- ``invalid_request`` (an ID or
        key outside the grammar, params that are not JSON values),
        ``idempotency_key_required``, ``fencing_token_required`` or
        ``parameter_digest_mismatch`` -- or ``None`` when the submit may go on.
    """
    problem = operation_id_problem(body.operation_id)
    if problem is not None:
        return "invalid_request", problem
    if contract.idempotent:
        if idempotency_key is None:
            return (
                "idempotency_key_required",
                f"sink {sink} is idempotent: send the {IDEMPOTENCY_HEADER} header",
            )
        key_problem = operation_id_problem(idempotency_key)
        if key_problem is not None:
            return "invalid_request", f"{IDEMPOTENCY_HEADER}: {key_problem}"
    if contract.fencing and body.fencing_token is None:
        return "fencing_token_required", f"sink {sink} fences: send the operation's fencing_token"
    try:
        expected = parameter_digest(
            action=body.action,
            params=params,
            subject=body.subject,
            purpose=body.purpose,
            decision_version=body.decision_version,
            sink=sink,
            version=digest_version(body.parameter_digest),
        )
    except (LedgerError, ValueError) as exc:
        return "invalid_request", f"params are not JSON values: {exc}"
    if expected != body.parameter_digest:
        return (
            "parameter_digest_mismatch",
            f"parameter_digest {body.parameter_digest[:20]} is not the digest of these params, "
            f"action, subject, purpose and decision version for sink {sink} ({expected[:20]})",
        )
    return None
