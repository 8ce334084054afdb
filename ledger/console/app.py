"""The operator console: ``ledger console`` serves a small web application.

Pages (all server-rendered from Jinja2 templates ``console_*.html.j2``, plain
HTML forms, no JavaScript):

* ``/operations`` -- every operation in ``ledger.state``, searchable by an
  operation ID substring and filterable by state, sink and age;
* ``/operation?id=OP`` -- one operation: its current state and its history
  (timeline);
* ``/queue`` -- stranded operations, then the unknown-outcome queue (what
  ``ledger reconcile list`` shows), each with "read back now" where a
  readback can move it and a disposition form for an unknown outcome
  (:mod:`ledger.console.triage`; ``/operations`` lists problems first too);
* ``/audit`` -- the latest audit this console ran, with the open items
  (held, abandoned and reauthorisation-pending operations);
* ``/stages`` -- stage health: status files, consumer-group members and, when
  configured, each stage's ``/healthz`` and ``/readyz``.

A disposition is published exactly as ``ledger reconcile dispose`` does: it
names an operator, and is signed with that operator's key from this host
(``ledger operator add NAME``); the form offers only operators whose key is
here. Forms that change something (dispose, run the audit) carry a random
per-process token and are refused (403) without it or from another origin;
the ``Host`` header must name the address served (no DNS rebinding). The
console binds to the loopback interface unless told otherwise.

The data come through :class:`~ledger.console.data.ConsoleData`
(:class:`~ledger.console.data.LedgerData` reads the ledger), so the routes
can be tested without a broker.

Needs the ``[console]`` extra (Starlette): load it through
:func:`ledger.console.create_app`, which names the install command when it
is missing.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from ledger.console.data import (
    DECISIONS,
    MAX_EVIDENCE,
    MAX_ROWS,
    OPEN_STATES,
    AuditRun,
    ConsoleData,
    operation_age_s,
)
from ledger.console.triage import NavCounts, problems_first
from ledger.errors import LedgerError
from ledger.instants import readable_fields
from ledger.reports.render import render
from ledger.states import RecoveryState as S


def _page(template: str, status_code: int = 200, **context: Any) -> Response:
    return HTMLResponse(render(template, **context), status_code=status_code)


def _same_origin(request: Request) -> bool:
    """The request's Origin (or else Referer), when sent, names this host and port."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed or claimed == "null":
        return claimed is None
    parts = urlsplit(claimed)
    return parts.netloc == request.headers.get("host") and parts.scheme == request.url.scheme


def create_app(
    data: ConsoleData,
    *,
    title: str = "ledger",
    token: str | None = None,
    hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1", "[::1]"),
) -> Starlette:
    """The console as an ASGI application.

    Args:
        data: where the pages read from and dispositions go.
        title: the ledger's name in page titles (its topic prefix).
        token: the form token (default: a random one for this process).
        hosts: accepted ``Host`` header values (see :func:`allowed_hosts`).

    Returns:
        A Starlette application; see the module docstring for its routes.
    """
    form_token = token or secrets.token_urlsafe(32)
    last_audit: list[AuditRun] = []
    nav = NavCounts(data.stranded, data.queue)
    common: dict[str, Any] = {"ledger": title, "token": form_token, "nav_counts": nav}

    def refused(request: Request) -> Response | None:
        if not _same_origin(request):
            return _page(
                "console_error.html.j2",
                403,
                title="refused",
                message="refused: the form was not sent from this console (origin mismatch)",
                **common,
            )
        return None

    async def token_ok(request: Request) -> tuple[bool, dict[str, str]]:
        values = await _form(request)
        sent = values.get("token", "")
        return hmac.compare_digest(sent.encode(), form_token.encode()), values

    def bad_token() -> Response:
        return _page(
            "console_error.html.j2",
            403,
            title="refused",
            message="refused: the form token is missing or stale; reload the page and try again",
            **common,
        )

    async def posted(request: Request) -> tuple[Response | None, dict[str, str]]:
        """A posted form's values, or the refusal to answer instead.

        A posted form's values, or the refusal to answer instead (another
        origin, a missing or stale form token) -- every action's first step.
        """
        no = refused(request)
        if no is not None:
            return no, {}
        ok, form = await token_ok(request)
        return (None, form) if ok else (bad_token(), {})

    def home(request: Request) -> Response:
        return RedirectResponse("/operations", status_code=303)

    def operations(request: Request) -> Response:
        q = request.query_params.get("q", "").strip()
        state = request.query_params.get("state", "")
        sink = request.query_params.get("sink", "")
        min_age_text = request.query_params.get("min_age_s", "").strip()
        error = ""
        min_age: float | None = None
        if min_age_text:
            try:
                min_age = float(min_age_text)
                if not min_age >= 0:
                    raise ValueError
            except ValueError:
                error = f"age must be a number of seconds, 0 or more (not {min_age_text!r})"
                min_age = None
        if state and state not in S.__members__:
            error = f"unknown state {state!r}"
            state = ""
        everything = data.operations()
        now = data.now_ms()
        sinks = sorted({st.sink for st in everything})
        rows = []
        for st in everything:
            age = operation_age_s(st, now)
            if q and q not in st.operation_id:
                continue
            if state and st.state != state:
                continue
            if sink and st.sink != sink:
                continue
            if min_age is not None and (age is None or age < min_age):
                continue
            rows.append({"state": st, "age_s": age})
        rows = problems_first(rows, {s.operation_id: s for s in data.stranded()})
        return _page(
            "console_operations.html.j2",
            400 if error else 200,
            title=f"operations · {title}",
            page="operations",
            rows=rows[:MAX_ROWS],
            matched=len(rows),
            total=len(everything),
            states=[s.value for s in S],
            sinks=sinks,
            filters={"q": q, "state": state, "sink": sink, "min_age_s": min_age_text},
            error=error,
            **common,
        )

    def operation(request: Request) -> Response:
        op = request.query_params.get("id", "")
        current = next((st for st in data.operations() if st.operation_id == op), None)
        if current is None:
            return _page(
                "console_error.html.j2",
                404,
                title="not found",
                message=f"no operation {op!r} in the ledger",
                **common,
            )
        history = data.history(op)
        return _page(
            "console_operation.html.j2",
            title=f"{op} · {title}",
            page="operations",
            st=current,
            state_rows=readable_fields(current.model_dump(mode="json")),
            age_s=operation_age_s(current, data.now_ms()),
            history=history,
            timeline=_timeline(history),
            held=current.state == S.UNKNOWN_OUTCOME,
            decisions=DECISIONS,
            operators=data.operators(),
            **common,
        )

    def queue_page(status_code: int = 200, error: str = "", done: str = "") -> Response:
        items = data.queue()
        now = data.now_ms()
        return _page(
            "console_queue.html.j2",
            status_code,
            title=f"queue · {title}",
            page="queue",
            stranded=data.stranded(),
            items=[{"state": st, "age_s": operation_age_s(st, now)} for st in items],
            decisions=DECISIONS,
            operators=data.operators(),
            error=error,
            done=done,
            **common,
        )

    def queue(request: Request) -> Response:
        return queue_page(done=request.query_params.get("done", ""))

    async def dispose(request: Request) -> Response:
        no, form = await posted(request)
        if no is not None:
            return no
        op = form.get("operation_id", "")
        decision = form.get("decision", "")
        by = form.get("by", "")
        evidence = form.get("evidence", "").strip()
        problem = ""
        if decision not in DECISIONS:
            problem = f"choose a decision: {', '.join(DECISIONS)}"
        elif by not in data.operators():
            problem = (
                f"{by!r} has no operator key on this host; choose one the form offers, or "
                "create one with `ledger operator add NAME`"
                if by
                else "choose the operator who decides"
            )
        elif not evidence:
            problem = "say what the decision rests on (evidence)"
        elif len(evidence) > MAX_EVIDENCE:
            problem = f"evidence is longer than {MAX_EVIDENCE} characters"
        if problem:
            return await run_in_threadpool(queue_page, 400, f"not disposed: {problem}")
        return await run_in_threadpool(dispose_held, op, decision, by, evidence)

    def dispose_held(op: str, decision: str, by: str, evidence: str) -> Response:
        if op not in {st.operation_id for st in data.queue()}:
            return queue_page(400, error=f"not disposed: {op!r} is not held in the queue")
        try:
            said = data.dispose(op, decision, by, evidence)
        except LedgerError as exc:
            return queue_page(503, error=f"not disposed: {exc.message}")
        nav.forget()
        return RedirectResponse("/queue?" + urlencode({"done": said}), status_code=303)

    async def read_back(request: Request) -> Response:
        no, form = await posted(request)
        if no is not None:
            return no
        return await run_in_threadpool(read_back_one, form.get("operation_id", ""))

    def read_back_one(op: str) -> Response:
        offered = {s.operation_id for s in data.stranded() if s.read_back}
        if op not in offered | {st.operation_id for st in data.queue()}:
            return queue_page(400, error=f"not read back: {op!r} is not in the queue")
        try:
            said = data.read_back(op)
        except LedgerError as exc:
            return queue_page(503, error=f"not read back: {exc.message}")
        nav.forget()
        return RedirectResponse("/queue?" + urlencode({"done": said}), status_code=303)

    def audit(request: Request) -> Response:
        states = data.operations()
        now = data.now_ms()
        stranded = {s.operation_id: s for s in data.stranded()}
        open_items = problems_first(
            (
                {"state": st, "age_s": operation_age_s(st, now)}
                for st in states
                if st.state in OPEN_STATES or st.operation_id in stranded
            ),
            stranded,
        )
        run = last_audit[-1] if last_audit else None
        return _page(
            "console_audit.html.j2",
            title=f"audit · {title}",
            page="audit",
            run=run,
            open_items=open_items,
            **common,
        )

    async def run_audit(request: Request) -> Response:
        no, form = await posted(request)
        if no is not None:
            return no
        read_sinks = form.get("read_sinks") == "on"
        try:
            report = await run_in_threadpool(data.audit, read_sinks)
        except LedgerError as exc:
            return _page(
                "console_error.html.j2",
                503,
                title="audit failed",
                message=f"the audit did not run: {exc.message}",
                **common,
            )
        last_audit[:] = [AuditRun(await run_in_threadpool(data.now_ms), read_sinks, report)]
        return RedirectResponse("/audit", status_code=303)

    def stages(request: Request) -> Response:
        rows = data.stages()
        return _page(
            "console_stages.html.j2",
            title=f"stages · {title}",
            page="stages",
            rows=rows,
            has_metrics=any(r.source == "metrics" for r in rows),
            **common,
        )

    routes = [
        Route("/", home),
        Route("/operations", operations),
        Route("/operation", operation),
        Route("/queue", queue),
        Route("/dispose", dispose, methods=["POST"]),
        Route("/read-back", read_back, methods=["POST"]),
        Route("/audit", audit),
        Route("/audit", run_audit, methods=["POST"]),
        Route("/stages", stages),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))],
        exception_handlers={LedgerError: _ledger_error(common)},
    )


#: Largest form body the console reads (bytes).
MAX_FORM_BYTES = 64 * 1024


async def _form(request: Request) -> dict[str, str]:
    """The fields of a plain HTML form (``application/x-www-form-urlencoded``), first value of each.

    Anything else, or a body over :data:`MAX_FORM_BYTES`, is no fields.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return {}
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=100)
    except (UnicodeDecodeError, ValueError):
        return {}
    values: dict[str, str] = {}
    for key, value in pairs:
        values.setdefault(key, value)
    return values


def _ledger_error(common: dict[str, Any]) -> Callable[[Request, Exception], Response]:
    def handle(request: Request, exc: Exception) -> Response:
        message = exc.message if isinstance(exc, LedgerError) else str(exc)
        return _page(
            "console_error.html.j2", 503, title="ledger unavailable", message=message, **common
        )

    return handle


def _timeline(history: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The history's records in causal order (``HistoryEntry.to_dict()`` each)."""
    records = history.get("records") if history else None
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []
