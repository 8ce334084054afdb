"""The ``http-idempotency-key`` adapter.

An HTTP API that follows the ``Idempotency-Key`` header draft (draft-ietf-httpapi-idempotency-key-
header).

The API is not the ledger's sink protocol: each sink says in its registry
entry (:class:`~sinks.registry.SinkEndpoint`) how to ask it. ``url`` is the
API's base URL (``http://`` or ``https://``), ``token`` its bearer token (sent
as ``Authorization: Bearer``), and ``config`` holds (defaults in brackets):

* ``submit`` (required) -- ``{"method": "POST", "path": "/refunds", "body": {...}}``:
  the request that makes the effect. ``path`` is a template; ``body`` [the
  operation's parameters plus ``operation_id``] is a JSON object whose string
  values may be templates: a value that is exactly ``"{name}"`` becomes the
  named value as it is (a number stays a number), any other string is
  ``str.format``-ed. Templates of the submit may name the parameters,
  ``operation_id``, ``parameter_digest``, ``attempt_id``, ``action``,
  ``subject``, ``purpose`` and ``decision_version``. The request carries
  ``Idempotency-Key: <operation_id>`` (or the key the relay gives).
* ``readback_path`` [none] -- e.g. ``/refunds/by-operation/{operation_id}``:
  ``200`` is the effect (``committed``; a JSON list is one effect per item, an
  empty list ``absent``), ``404`` is ``absent``. Point it at a route that
  answers 404 only for an effect it does not hold.
* ``effects_field`` [``effects``] -- the field of a readback's object that
  counts the effects the API holds for the operation (1 when absent).
* ``postcondition_path`` [none] -- e.g. ``/accounts/{subject}`` (``{subject}``
  is the subject queried): the ``account-credits`` query. Its JSON object has
  ``credited_field`` [``credited_minor``], the credited sum in minor units,
  and ``credits_field`` [``credits``], a list of objects with
  ``credit_operation_field`` [``operation_id``], ``credit_amount_field``
  [``amount_minor``] and ``effect_id_field``.
* ``effect_id_field`` [``id``] -- the field of a submit's, a readback's or a
  credit's object that holds the effect's ID.
* ``committed_ms_field`` [none] -- a field holding the commit time in ms;
  without it the commit time is the local wall clock when the answer came.
* ``health_path`` [``/health``] -- answered 200 while the API is up.
* ``max_response_bytes`` [1 MiB] -- a longer answer is abandoned (a submit is
  then ``ambiguous``; a readback or query has no observation).
* ``status_map`` [none] -- ``{"429": "unavailable", ...}``: an HTTP status to
  the submit outcome it means for this API, overriding the defaults below.

Submit outcomes by default: ``2xx`` → ``committed``; ``409`` → ``ambiguous``
(the draft: a request with this key is still being processed -- the effect
may yet be made, so the relay reads back later; never a rejection); ``422``
→ ``key_reused`` (the key was used with another payload); ``400`` to a
request that carried no key, or whose answer names the ``Idempotency-Key``
→ ``unavailable`` with ``sent=False`` (see below); ``401``/``403`` raise
:class:`~ledger.errors.SinkAuthError`; ``429`` → ``unavailable`` (the API
did not process it); any other ``4xx`` → ``rejected``; ``503``, a refused or
failed connection → ``unavailable`` (``sent=False`` when nothing left);
any other ``5xx``, ``1xx``/``3xx``, a timeout or a dropped connection after
the request left, an answer past the size cap or the deadline →
``ambiguous``.

Why a missing key is ``unavailable``, ``sent=False``: the draft has the API
refuse a keyless request before processing it, so no effect was made
(``sent=False`` is the truth the relay needs: the dispatch is parked and
tried again, then held for a person once the retry budget is spent, and
goes through once the registry is fixed). ``rejected`` would close a sound
operation for a fault of our configuration; raising would make the relay
record the send as ambiguous ("may have reached") though it certainly made
nothing. The relay sends no key to a sink whose contract does not declare
``idempotent: true``, so the detail names that remedy.

Every call ends within ``timeout_s`` seconds in all (a new connection per
call, whose socket :class:`~sinks.adapters.deadline.Deadline` shuts down at
the deadline; the body is read as a stream and abandoned past the cap).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ledger.contracts import PostconditionQuery
from ledger.errors import SinkAuthError, SinkConfigError, SinkProtocolError
from ledger.tracing import trace_headers
from sinks.adapters.deadline import Deadline
from sinks.client import (
    AccountCredits,
    Credit,
    ReadbackResult,
    SubmitResult,
    SubmitStatus,
)
from sinks.port import AdapterCapabilities, UnsupportedParts

#: Submit outcomes a ``status_map`` may name.
Mapped = Literal["committed", "rejected", "key_reused", "unavailable", "ambiguous"]

#: The default cap on an answer's body (bytes).
MAX_RESPONSE_BYTES = 1024 * 1024

_WHOLE = re.compile(r"\{(\w+)\}")


class SubmitRequest(BaseModel):
    """The request that makes the effect (``config.submit``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["POST", "PUT", "PATCH"] = "POST"
    path: str = Field(min_length=1)
    body: dict[str, Any] | None = None


class KeyedApiConfig(BaseModel):
    """The ``config`` of an ``http-idempotency-key`` sink (keys: the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    submit: SubmitRequest
    readback_path: str | None = Field(default=None, min_length=1)
    effects_field: str = "effects"
    postcondition_path: str | None = Field(default=None, min_length=1)
    credited_field: str = "credited_minor"
    credits_field: str = "credits"
    credit_operation_field: str = "operation_id"
    credit_amount_field: str = "amount_minor"
    effect_id_field: str = "id"
    committed_ms_field: str | None = None
    health_path: str = "/health"
    max_response_bytes: int = Field(default=MAX_RESPONSE_BYTES, ge=1024)
    status_map: dict[int, Mapped] = Field(default_factory=dict)

    @field_validator("status_map")
    @classmethod
    def _statuses(cls, value: dict[int, Mapped]) -> dict[int, Mapped]:
        wrong = [code for code in value if not 100 <= code <= 599]
        if wrong:
            raise ValueError(f"HTTP statuses are 100-599, not {wrong}")
        return value


@dataclass(frozen=True)
class _Answer:
    code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        try:
            return httpx.Response(200, content=self.body).json()
        except ValueError:
            return None


@dataclass(frozen=True)
class _NoAnswer:
    sent: bool
    detail: str


def _fill(template: str, values: dict[str, Any], *, quoted: bool) -> str:
    shown = {k: quote(str(v), safe=":") if quoted else v for k, v in values.items()}
    return template.format_map(shown)


def _render(node: Any, values: dict[str, Any]) -> Any:
    """A body template filled: ``"{name}"`` alone keeps the value's type."""
    if isinstance(node, dict):
        return {key: _render(value, values) for key, value in node.items()}
    if isinstance(node, list):
        return [_render(value, values) for value in node]
    if isinstance(node, str):
        whole = _WHOLE.fullmatch(node)
        return values[whole.group(1)] if whole else node.format_map(values)
    return node


class KeyedApiAdapter(UnsupportedParts):
    """One ``Idempotency-Key`` API as a sink (see the module docstring).

    Reservations answer ``unsupported`` (the draft has none).

    Args:
        base_url: the API's base URL.
        config: the sink's settings.
        timeout_s: the overall deadline of every call, in seconds.
        token: the bearer token, or ``None``.
        transport: an httpx transport instead of the network (tests of callers).
    """

    def __init__(
        self,
        base_url: str,
        config: KeyedApiConfig,
        *,
        timeout_s: float,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = config
        self.timeout_s = timeout_s
        self.token = token
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            transport=transport,
            # A new connection per call: the deadline watches the call's own socket.
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def _call(
        self,
        method: str,
        path: str,
        *,
        operation_id: str | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
    ) -> _Answer | _NoAnswer:
        """One request within the deadline and the size cap; transport failures translated.

        Raises:
            SinkAuthError: when the API answers 401 or 403.
        """
        with Deadline(self.timeout_s) as deadline:
            answer = self._exchange(method, path, deadline, json, headers)
        if isinstance(answer, _Answer) and answer.code in (401, 403):
            raise SinkAuthError(
                method,
                path,
                answer.code,
                answer.text,
                sink=self.base_url,
                operation_id=operation_id,
            )
        return answer

    def _exchange(
        self,
        method: str,
        path: str,
        deadline: Deadline,
        json: Any,
        headers: dict[str, str] | None,
    ) -> _Answer | _NoAnswer:
        def late(exc: Exception) -> str:
            if deadline.passed():
                return f"the deadline of {self.timeout_s:g} s passed ({type(exc).__name__})"
            return f"{type(exc).__name__}: {exc}"

        request = self._http.build_request(
            method,
            path,
            json=json,
            headers={**(headers or {}), **trace_headers()},
            timeout=httpx.Timeout(max(deadline.remaining_s(), 0.001)),
            extensions={"trace": deadline.httpx_trace},
        )
        try:
            response = self._http.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return _NoAnswer(sent=False, detail=f"not sent: {late(exc)}")
        except httpx.TransportError as exc:
            return _NoAnswer(sent=True, detail=f"no answer: {late(exc)}")
        cap = self.config.max_response_bytes
        body = bytearray()
        try:
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > cap:
                    return _NoAnswer(
                        sent=True,
                        detail=f"HTTP {response.status_code} with an answer longer than {cap} "
                        "bytes (max_response_bytes): abandoned",
                    )
        except httpx.TransportError as exc:
            return _NoAnswer(
                sent=True, detail=f"HTTP {response.status_code}, body cut: {late(exc)}"
            )
        finally:
            response.close()
        return _Answer(response.status_code, bytes(body))

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
        """Ask the API to make the effect (arguments as :class:`sinks.port.SinkPort`).

        The fencing token is not sent: the draft has none.

        Returns:
            The outcome; see the module docstring.

        Raises:
            SinkAuthError: when the API refuses the token (401/403).
            SinkConfigError: when a template names a value there is not (nothing sent).
        """
        values: dict[str, Any] = {
            **params,
            "operation_id": operation_id,
            "parameter_digest": parameter_digest,
            "attempt_id": attempt_id,
            "action": action,
            "subject": subject,
            "purpose": purpose,
            "decision_version": decision_version,
        }
        spec = self.config.submit
        try:
            path = _fill(spec.path, values, quoted=True)
            body = (
                {**params, "operation_id": operation_id}
                if spec.body is None
                else _render(spec.body, values)
            )
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise SinkConfigError(
                f"the submit template of the sink at {self.base_url} cannot be filled for "
                f"{operation_id} ({type(exc).__name__}: {exc}); nothing was sent. Fix "
                f"config.submit (it may name {sorted(values)})",
                sink=self.base_url,
                operation_id=operation_id,
            ) from exc
        headers = {"Idempotency-Key": idempotency_key or operation_id} if use_key else {}
        answer = self._call(
            spec.method, path, operation_id=operation_id, json=body, headers=headers
        )
        if isinstance(answer, _NoAnswer):
            status: SubmitStatus = "ambiguous" if answer.sent else "unavailable"
            return SubmitResult(status, operation_id, detail=answer.detail, sent=answer.sent)
        return self._outcome(operation_id, answer, keyed=use_key)

    def _outcome(self, operation_id: str, answer: _Answer, *, keyed: bool) -> SubmitResult:
        code, text = answer.code, answer.text[:300]
        mapped = self.config.status_map.get(code)
        if mapped is None and 200 <= code < 300:
            mapped = "committed"
        if mapped == "committed":
            return self._committed(operation_id, answer)
        if mapped is not None:
            return SubmitResult(mapped, operation_id, http_status=code, detail=text)
        if code == 400 and (not keyed or "idempotency-key" in text.lower()):
            return SubmitResult(
                "unavailable",
                operation_id,
                http_status=code,
                sent=False,
                detail=f"the API at {self.base_url} refused the request for want of an "
                f"Idempotency-Key (HTTP 400: {text!r}); it made nothing. The relay sends the "
                "key only to a sink whose contract declares idempotent: true: register the "
                "sink again with it, or make sure nothing between strips the header",
            )
        if code == 409:
            text = f"a request with this key is still in flight (HTTP 409): {text}"
            return SubmitResult("ambiguous", operation_id, http_status=code, detail=text)
        if code == 422:
            return SubmitResult("key_reused", operation_id, http_status=code, detail=text)
        if code in (429, 503):
            return SubmitResult("unavailable", operation_id, http_status=code, detail=text)
        if 400 <= code < 500:
            return SubmitResult("rejected", operation_id, http_status=code, detail=text)
        return SubmitResult(
            "ambiguous", operation_id, http_status=code, detail=f"HTTP {code}: {text}"
        )

    def _committed(self, operation_id: str, answer: _Answer) -> SubmitResult:
        body = answer.json()
        body = body if isinstance(body, dict) else {}
        effect_id = body.get(self.config.effect_id_field)
        field = self.config.committed_ms_field
        stamp = body.get(field) if field is not None else None
        return SubmitResult(
            "committed",
            operation_id,
            effect_id=None if effect_id is None else str(effect_id),
            committed_ms=stamp if isinstance(stamp, int) else int(time.time() * 1000),
            http_status=answer.code,
            detail=""
            if effect_id is not None
            else f"the answer has no {self.config.effect_id_field!r} (effect_id_field)",
        )

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        """Whether the API holds the operation's effect (``readback_path``).

        Returns:
            ``committed`` (with ``effects``), ``absent``, ``ambiguous`` (no
            observation) or ``unsupported`` without a ``readback_path``.

        Raises:
            SinkAuthError: when the API refuses the token (401/403).
            SinkProtocolError: when the API answers outside 200/404/5xx.
        """
        if self.config.readback_path is None:
            return super().readback(operation_id, fencing_token)
        path = _fill(self.config.readback_path, {"operation_id": operation_id}, quoted=True)
        answer = self._call("GET", path, operation_id=operation_id)
        if isinstance(answer, _NoAnswer):
            return ReadbackResult("ambiguous", operation_id, detail=answer.detail, sent=answer.sent)
        code, body = answer.code, answer.json()
        if code == 404 or (code == 200 and body == []):
            return ReadbackResult("absent", operation_id, http_status=code, detail="absent")
        if code == 200 and isinstance(body, dict | list):
            items = body if isinstance(body, list) else [body]
            first = items[0] if isinstance(items[0], dict) else {}
            counted = first.get(self.config.effects_field) if isinstance(body, dict) else None
            field = self.config.committed_ms_field
            stamp = first.get(field) if field is not None else None
            effect_id = first.get(self.config.effect_id_field)
            return ReadbackResult(
                "committed",
                operation_id,
                effect_id=None if effect_id is None else str(effect_id),
                committed_ms=stamp if isinstance(stamp, int) else None,
                effects=counted if isinstance(counted, int) else len(items),
                http_status=code,
            )
        if code >= 500:
            return ReadbackResult("ambiguous", operation_id, http_status=code, detail=answer.text)
        raise SinkProtocolError(
            "GET", path, code, answer.text, sink=self.base_url, operation_id=operation_id
        )

    def postcondition(self, query: PostconditionQuery, subject: str) -> AccountCredits:
        """The ``account-credits`` query of ``subject`` (``postcondition_path``).

        Returns:
            ``observed``, ``ambiguous`` (no observation) or ``unsupported``
            without a ``postcondition_path``.

        Raises:
            SinkAuthError: when the API refuses the token (401/403).
            SinkProtocolError: when the answer is not 200/5xx or lacks the configured fields.
        """
        cfg = self.config
        if cfg.postcondition_path is None:
            return super().postcondition(query, subject)
        path = _fill(cfg.postcondition_path, {"subject": subject}, quoted=True)
        answer = self._call("GET", path)
        if isinstance(answer, _NoAnswer):
            return AccountCredits("ambiguous", subject, detail=answer.detail, sent=answer.sent)
        if answer.code >= 500:
            return AccountCredits("ambiguous", subject, http_status=answer.code, detail=answer.text)
        body = answer.json()
        try:
            if answer.code != 200 or not isinstance(body, dict):
                raise ValueError("not a 200 with a JSON object")
            credits = tuple(
                Credit(
                    str(c[cfg.credit_operation_field]),
                    int(c[cfg.credit_amount_field]),
                    str(c[cfg.effect_id_field]),
                )
                for c in body.get(cfg.credits_field, [])
            )
            credited = int(body[cfg.credited_field])
        except (KeyError, TypeError, ValueError) as exc:
            raise SinkProtocolError(
                "GET",
                path,
                answer.code,
                f"{answer.text[:200]} (expected the fields of config {cfg.credited_field!r}, "
                f"{cfg.credits_field!r}: {type(exc).__name__} {exc})",
                sink=self.base_url,
            ) from exc
        return AccountCredits(
            "observed", subject, credited_minor=credited, credits=credits, http_status=answer.code
        )

    def health_info(self) -> dict[str, Any] | None:
        """The ``health_path`` answer when 200 (its JSON object, or ``{"status": "ok"}``).

        Raises:
            SinkAuthError: when the API refuses the token (401/403).
        """
        answer = self._call("GET", self.config.health_path)
        if isinstance(answer, _NoAnswer) or answer.code != 200:
            return None
        body = answer.json()
        return body if isinstance(body, dict) else {"status": "ok"}

    def health(self) -> bool:
        """``True`` when the API answers ``health_path`` with 200."""
        return self.health_info() is not None

    def close(self) -> None:
        """Close the HTTP client."""
        self._http.close()


def open_adapter(endpoint: Any, *, timeout_s: float) -> KeyedApiAdapter:
    """The ``http-idempotency-key`` adapter of a registry entry (see the module docstring).

    Args:
        endpoint: the sink's :class:`~sinks.registry.SinkEndpoint`.
        timeout_s: the overall deadline of every call, in seconds.

    Raises:
        SinkConfigError: when the URL is not http(s), the config is missing
            ``submit`` or has unknown or invalid keys, or the contract claims
            readback or a postcondition without ``readback_path`` or
            ``postcondition_path`` (or fencing or reservations, which the draft lacks).
    """
    url = urlsplit(endpoint.url)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise SinkConfigError(
            f"the url {endpoint.url!r} of an http-idempotency-key sink is not http(s)://HOST; "
            "register the sink again with the API's base URL"
        )
    try:
        config = KeyedApiConfig.model_validate(endpoint.config)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SinkConfigError(
            f"the config of the http-idempotency-key sink at {endpoint.url} is invalid: "
            f"{first['msg']} at {'.'.join(map(str, first['loc']))}; see the keys of "
            "sinks.adapters.idempotency_key (submit is required)"
        ) from exc
    contract = endpoint.contract
    missing = capabilities.overclaims(contract)
    if contract.readback and config.readback_path is None:
        missing.append("readback (without config readback_path)")
    if contract.postcondition_query() is not None and config.postcondition_path is None:
        missing.append("postcondition (without config postcondition_path)")
    if missing:
        raise SinkConfigError(
            f"the contract of the http-idempotency-key sink at {endpoint.url} claims "
            f"{', '.join(missing)}; set the config path that answers it, or register the "
            "contract without the claim"
        )
    return KeyedApiAdapter(endpoint.url, config, timeout_s=timeout_s, token=endpoint.token)


#: The most the kind can do: the key, readback and the query (each when configured).
capabilities = AdapterCapabilities(idempotent=True, readback=True, postcondition=True)
open_adapter.capabilities = capabilities  # type: ignore[attr-defined]  # the sink registry reads this function attribute (sinks.adapters)
