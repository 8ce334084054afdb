"""One HTTP exchange with a sink: deadline, size cap, span and transport failures.

:class:`HttpExchange` is the part of :class:`sinks.client.SinkClient` that
talks HTTP: it sends one request and reads its answer within an overall
deadline and a size cap (:mod:`sinks.limits`), in a client span carrying the
W3C ``traceparent`` (:mod:`ledger.tracing`), and translates every httpx
transport failure, once, into a :class:`NoAnswer` that says whether the
request left. The sink protocol's verbs read the :class:`Answer` it returns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry.trace import SpanKind, Status, StatusCode

from ledger.errors import SinkAuthError
from ledger.tracing import trace_headers, tracer
from sinks.limits import (
    DEFAULT_MAX_RESPONSE_BYTES,
    Deadline,
    bounded_transport,
    deadline_detail,
    read_capped,
    within,
)

#: Spans of sink requests (the global tracer provider's, see :mod:`ledger.tracing`).
_TRACER = tracer()


@dataclass(frozen=True)
class NoAnswer:
    """No (whole) answer: a transport failure, the deadline or the size cap.

    ``sent`` is ``False`` when the request never left.
    """

    sent: bool
    detail: str
    cause: Exception | None = None


@dataclass(frozen=True)
class Answer:
    """A whole answer of at most the size cap: its status and body."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        """The body as text (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")


def json_body(answer: Answer) -> dict[str, Any]:
    """The answer's body as a JSON object (``{}`` when it is not one)."""
    try:
        body = json.loads(answer.body)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class HttpExchange:
    """The HTTP side of a sink client: a connection pool, a deadline and a size cap.

    Args:
        base_url: the sink's URL, e.g. ``http://127.0.0.1:8123``.
        timeout_s: the overall deadline of every call, from its start to the
            last byte of its answer (seconds; not per read).
        token: the sink's bearer token, sent as ``Authorization: Bearer
            <token>`` on every call; ``None`` sends none.
        transport: an httpx transport to send through instead of the network.
        max_response_bytes: the most bytes of one answer read.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        *,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s),
            transport=transport if transport is not None else bounded_transport(),
            headers=headers,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def send(
        self, method: str, path: str, *, operation_id: str | None = None, **kwargs: Any
    ) -> Answer | NoAnswer:
        """Send one request and read its answer, within the deadline and the size cap.

        The whole call -- connecting, sending, the answer's headers and body
        -- ends within ``timeout_s`` of its start (an overall deadline, not
        one per read: :mod:`sinks.limits`), and at most ``max_response_bytes``
        of the answer are read. An answer cut short by either is no answer
        (``sent=True``: the sink may have acted). Every httpx transport
        failure is translated here, once.

        The request is sent in a client span (a child of the current span:
        the relay's span of the dispatch) and carries its W3C
        ``traceparent`` header (:mod:`ledger.tracing`), so the sink's own
        traces can continue the operation's.

        Raises:
            SinkAuthError: if the sink answers 401 or 403 (its token is not ours).
        """
        parts = path.strip("/").split("/", 1)
        route = f"/{parts[0]}" + ("/{id}" if len(parts) > 1 else "")
        attributes: dict[str, str] = {
            "http.request.method": method,
            "url.full": f"{self.base_url}{path}",
            "http.route": route,
        }
        if operation_id is not None:
            attributes["ledger.operation_id"] = operation_id
        with _TRACER.start_as_current_span(
            f"{method} {route}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            kwargs["headers"] = {**kwargs.get("headers", {}), **trace_headers()}
            answer = self._exchange(method, path, **kwargs)
            if isinstance(answer, NoAnswer):
                why = "not sent" if not answer.sent else "no answer"
                span.set_status(Status(StatusCode.ERROR, f"{why}: {answer.detail}"[:200]))
                return answer
            span.set_attribute("http.response.status_code", answer.status_code)
            if answer.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR, f"HTTP {answer.status_code}"))
        if answer.status_code in (401, 403):
            raise SinkAuthError(
                method,
                path,
                answer.status_code,
                answer.text,
                sink=self.base_url,
                operation_id=operation_id,
            )
        return answer

    def _exchange(self, method: str, path: str, **kwargs: Any) -> Answer | NoAnswer:
        """One request and its capped answer, all within one deadline (see :meth:`send`)."""
        deadline = Deadline.start(self.timeout_s)
        with within(deadline):
            try:
                request = self._http.build_request(method, path, **kwargs)
                response = self._http.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                return NoAnswer(sent=False, detail=f"{type(exc).__name__}: {exc}", cause=exc)
            except httpx.TransportError as exc:
                late = deadline.passed()
                detail = deadline_detail(deadline) if late else f"{type(exc).__name__}: {exc}"
                return NoAnswer(sent=True, detail=detail, cause=exc)
            try:
                announced = response.headers.get("content-length", "")
                if announced.isdigit() and int(announced) > self.max_response_bytes:
                    return NoAnswer(
                        sent=True,
                        detail=f"HTTP {response.status_code} announcing {announced} bytes, more "
                        f"than the cap of {self.max_response_bytes} bytes "
                        "(LEDGER_SINK_MAX_RESPONSE_BYTES); it was not read",
                    )
                read = read_capped(response.iter_bytes(), deadline, self.max_response_bytes)
            except (httpx.TransportError, httpx.DecodingError) as exc:
                late = deadline.passed()
                detail = deadline_detail(deadline) if late else f"{type(exc).__name__}: {exc}"
                return NoAnswer(
                    sent=True, detail=f"HTTP {response.status_code}, {detail}", cause=exc
                )
            finally:
                response.close()
        if read.stopped is not None:
            return NoAnswer(sent=True, detail=f"HTTP {response.status_code}, {read.stopped}")
        return Answer(response.status_code, read.body)
