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
  (:mod:`ledger.cli.triage`; ``/operations`` lists problems first too);
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

The data come through :class:`ConsoleData` (:class:`LedgerData` reads the
ledger), so the routes can be tested without a broker.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

import click

from consumers.liveness import SILENT_S
from consumers.twins import local_presences
from ledger.cli.common import current_settings
from ledger.cli.render import render
from ledger.cli.triage import NavCounts, problems_first
from ledger.errors import LedgerError
from ledger.events import OperationState
from ledger.extras import require_extra
from ledger.history import journal_move
from ledger.instants import readable_fields
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.stranded import Stranded

if TYPE_CHECKING:  # Starlette is imported when the console runs, not by every command
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = [
    "DECISIONS",
    "ConsoleData",
    "LedgerData",
    "StageHealth",
    "console_cmd",
    "create_app",
    "operation_age_s",
]

#: Disposition decisions, as the form offers them (``ledger reconcile dispose --decision``).
DECISIONS: dict[str, str] = {
    "committed": "committed: the effect happened",
    "absent": "absent: it did not (execute the same operation again)",
    "abandon": "abandon: give the operation up",
}

#: States an operator has to act on (the audit's open items).
OPEN_STATES: tuple[S, ...] = (S.UNKNOWN_OUTCOME, S.NEEDS_REAUTHORISATION, S.ABANDONED)

#: Longest evidence text a disposition form accepts (characters).
MAX_EVIDENCE = 2000

#: Most operations one page lists.
MAX_ROWS = 500


@dataclass(frozen=True)
class StageHealth:
    """What the console knows of one stage instance or group.

    Attributes:
        name: ``component-instance`` or a consumer group / endpoint name.
        source: where it was read: ``status file``, ``consumer group`` or ``metrics``.
        ok: healthy (``None``: unknown).
        ready: ready (assigned and restored; ``None``: unknown).
        detail: one line for the operator.
    """

    name: str
    source: str
    ok: bool | None
    ready: bool | None
    detail: str


@dataclass
class AuditRun:
    """The latest audit run by this console (``report`` is ``AuditReport.to_dict()``)."""

    ran_at_ms: int
    read_sinks: bool
    report: dict[str, Any] = field(default_factory=dict)


class ConsoleData(Protocol):
    """What the console reads and writes (a port; :class:`LedgerData` is the ledger's)."""

    def now_ms(self) -> int:
        """The ledger clock, milliseconds."""

    def operations(self) -> list[OperationState]:
        """Every operation's current state."""

    def queue(self) -> list[OperationState]:
        """Operations held in UNKNOWN_OUTCOME and queued for reconciliation, oldest first."""

    def history(self, operation_id: str) -> dict[str, Any] | None:
        """One operation's history as plain data, or ``None`` when none can be read."""

    def operators(self) -> list[str]:
        """Operators whose signing key is on this host (sorted)."""

    def dispose(self, operation_id: str, decision: str, by: str, evidence: str) -> str:
        """Publish a disposition signed by ``by``; return one line saying the outcome.

        Raises:
            LedgerError: it could not be signed or published.
        """

    def audit(self, read_sinks: bool) -> dict[str, Any]:
        """Run the auditor; its report as ``AuditReport.to_dict()``."""

    def stages(self) -> list[StageHealth]:
        """Health of the ledger's stages."""

    def stranded(self) -> list[Stranded]:
        """Operations stranded short of where they should rest, oldest first."""

    def read_back(self, operation_id: str) -> str:
        """Read back one operation now (a verification or an effect readback; never the
        effect's request) and record it; return one line saying what was observed.

        Raises:
            LedgerError: it could not be read back or recorded.
        """


def operation_age_s(state: OperationState, now_ms: int) -> float | None:
    """Seconds on the ledger clock since the operation's latest observation, else
    its admission (``None``: neither happened); never negative."""
    from ledger.clock import age_s

    since = state.observed_at_ms if state.observed_at_ms is not None else state.admitted_at_ms
    return age_s(now_ms, since)


# ---------------------------------------------------------------------- the ledger's data


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LedgerData:
    """The console's data from a real ledger (Kafka, the run folder, the stages).

    Args:
        settings: the ledger's settings.
        metrics: stage name -> base URL of its metrics server (``/healthz``,
            ``/readyz``), in addition to any a stage's status file names.
        wait_s: how long a disposition waits for the processor's decision (seconds).
    """

    def __init__(
        self, settings: LedgerSettings, metrics: Mapping[str, str] | None = None, wait_s: float = 15
    ) -> None:
        self.settings = settings
        self.metrics = dict(metrics or {})
        self.wait_s = wait_s

    def now_ms(self) -> int:
        """The ledger clock (system, or the testbed's manual one), milliseconds."""
        from ledger.clock import clock_for

        return clock_for(self.settings.clock, self.settings.run_dir).now_ms()

    def operations(self) -> list[OperationState]:
        """Every operation in ``ledger.state`` (as ``ledger state`` reads them)."""
        from consumers.reader import current_states

        return sorted(current_states(self.settings).values(), key=lambda st: st.operation_id)

    def queue(self) -> list[OperationState]:
        """The reconciliation queue (as ``ledger reconcile list`` reads it)."""
        from consumers.reconciler import open_items

        return open_items(self.settings)

    def history(self, operation_id: str) -> dict[str, Any] | None:
        """The operation's history (``History.to_dict()``, as ``ledger history --json``),
        ``None`` when no record is about it."""
        from consumers.history import UnknownOperationError, read_history

        try:
            return read_history(self.settings, operation_id).to_dict()
        except UnknownOperationError:
            return None

    def operators(self) -> list[str]:
        """Names of ``LEDGER_RUN_DIR/operators/*.key`` (``ledger operator add``)."""
        folder = self.settings.run_dir / "operators"
        return sorted(p.stem for p in folder.glob("*.key")) if folder.is_dir() else []

    def dispose(self, operation_id: str, decision: str, by: str, evidence: str) -> str:
        """Publish a disposition signed with ``by``'s operator key and wait for the decision."""
        from consumers.reader import current_states, wait_for_decision
        from ledger.credentials import person_key
        from producers.publisher import LedgerPublisher, build_disposition

        state = current_states(self.settings).get(operation_id)
        if state is None:
            return f"not disposed: no operation {operation_id!r} in the ledger"
        pub = LedgerPublisher(self.settings, client_id="ledger-console")
        try:
            pub.credentials.add(person_key(self.settings, "operator", by))
            pub.publish_disposition(
                build_disposition(
                    operation_id,
                    decision,
                    by,
                    evidence,
                    self.now_ms(),
                    episode=state.entered_version,  # the episode it answers
                )
            )
            position = pub.last_position
        finally:
            pub.close()
        if position is None:
            return f"disposition of {operation_id} published"
        topic, partition, offset = position
        entry = wait_for_decision(self.settings, topic, partition, offset, self.wait_s)
        if entry is None:
            return (
                f"disposition of {operation_id} published; no decision within {self.wait_s:g} s "
                "(is the processor running?)"
            )
        return f"{entry.outcome}: {operation_id} {journal_move(entry)} ({entry.reason})"

    def audit(self, read_sinks: bool) -> dict[str, Any]:
        """Run the auditor (``ledger audit``) and return its report."""
        from consumers.auditor import run_audit

        return run_audit(self.settings, read_sinks=read_sinks).to_dict()

    def stranded(self) -> list[Stranded]:
        """The ledger's stranded operations (:func:`consumers.stranding.ledger_stranded`)."""
        from consumers.stranding import ledger_stranded

        return ledger_stranded(self.settings)

    def read_back(self, operation_id: str) -> str:
        """:func:`consumers.reverify.read_back_now`."""
        from consumers.reverify import read_back_now

        return read_back_now(self.settings, operation_id)

    def stages(self) -> list[StageHealth]:
        """Status files, consumer-group members and metrics endpoints, in that order."""
        rows = self._status_files()
        rows += self._groups()
        rows += self._endpoints()
        return rows

    def _status_files(self) -> list[StageHealth]:
        rows: list[StageHealth] = []
        folder = self.settings.run_dir / "status"
        # When each process of this host last went round its loop (its file's time).
        beats = {p.pid: p.beat_ms for p in local_presences(self.settings.run_dir)}
        now_ms = int(time.time() * 1000)
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                status = json.loads(path.read_text())
                pid = int(status["pid"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                rows.append(StageHealth(path.stem, "status file", None, None, f"unreadable: {exc}"))
                continue
            alive = _pid_alive(pid)
            waiting = status.get("waiting")
            detail = f"pid {pid} {'running' if alive else 'not running on this host'}"
            if waiting:
                detail += f"; waiting: {waiting}"
            ready = bool(status.get("ready")) and alive
            silent_ms = now_ms - beats[pid] if alive and pid in beats else 0
            if silent_ms > SILENT_S * 1000:  # as `ledger status` says it (consumers.liveness)
                detail += (
                    f"; NOT RESPONDING (silent for {silent_ms / 1000:.0f} s): do not start "
                    "another; inspect or kill it first"
                )
                alive = ready = False
            held = int(status.get("unverifiable_held_count") or 0)
            if held and alive:
                # docs/trust-model.md: a stage that holds work is not healthy.
                detail += (
                    f"; HOLDING {held} key(s) on evidence its keys cannot verify (restore the "
                    "keys folder, then restart it)"
                )
                ready = False
            rows.append(StageHealth(path.stem, "status file", alive and not held, ready, detail))
        return rows

    def _groups(self) -> list[StageHealth]:
        """Each stage's consumer group as ``ledger status`` sees it (members, assignment, lag)."""
        from consumers.groups import stage_status

        try:
            stages = stage_status(self.settings)
        except LedgerError as exc:
            return [StageHealth("consumer groups", "consumer group", None, None, exc.message)]
        rows: list[StageHealth] = []
        for stage in stages:
            parts = sum(len(m.partitions) for m in stage.members)
            names = (
                ", ".join(sorted(f"{m.instance}@{m.host}" for m in stage.members)) or "no members"
            )
            twins = "".join(
                f"; TWO LIVE PROCESSES named {name} ({', '.join(who)}): give each its own "
                "--instance"
                for name, who in sorted(stage.twins.items())
            )
            rows.append(
                StageHealth(
                    stage.group,
                    "consumer group",
                    stage.live and not stage.twins,
                    stage.live and parts > 0 and not stage.twins,
                    f"{stage.group_state}: {len(stage.members)} member(s), {parts} partition(s) "
                    f"assigned, lag {stage.lag}; {names}{twins}",
                )
            )
        return rows

    def _endpoints(self) -> list[StageHealth]:
        import httpx

        endpoints = dict(self.metrics)
        folder = self.settings.run_dir / "status"
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                status = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            url = status.get("metrics_url") if isinstance(status, dict) else None
            port = status.get("metrics_port") if isinstance(status, dict) else None
            if isinstance(url, str):
                endpoints.setdefault(path.stem, url)
            elif isinstance(port, int):
                endpoints.setdefault(path.stem, f"http://127.0.0.1:{port}")
        rows: list[StageHealth] = []
        for name, base in sorted(endpoints.items()):
            answers: dict[str, bool | None] = {}
            said: list[str] = []
            for probe in ("healthz", "readyz"):
                try:
                    reply = httpx.get(f"{base.rstrip('/')}/{probe}", timeout=2.0)
                    answers[probe] = reply.status_code == 200
                    said.append(f"/{probe} {reply.status_code}")
                except httpx.HTTPError as exc:
                    answers[probe] = None
                    said.append(f"/{probe} unreachable ({type(exc).__name__})")
            rows.append(
                StageHealth(
                    name,
                    "metrics",
                    answers["healthz"],
                    answers["readyz"],
                    f"{base}: " + ", ".join(said),
                )
            )
        return rows


# ---------------------------------------------------------------------- the web application


def _page(template: str, status_code: int = 200, **context: Any) -> Response:
    from starlette.responses import HTMLResponse

    return HTMLResponse(render(template, **context), status_code=status_code)


def _same_origin(request: Request) -> bool:
    """The request's Origin (or else Referer), when sent, names this host and port."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed or claimed == "null":
        return claimed is None
    parts = urlsplit(claimed)
    return parts.netloc == request.headers.get("host") and parts.scheme == request.url.scheme


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str) -> list[str]:
    """``Host`` header values the console answers when bound to ``host``.

    Loopback: the loopback names only (a page elsewhere cannot reach it
    through a rebound DNS name); a named host: that name and loopback; a
    wildcard address (``0.0.0.0``, ``::``): any.
    """
    if host in ("0.0.0.0", "::", ""):
        return ["*"]
    names = ["127.0.0.1", "localhost", "::1", "[::1]"]
    return names if host in names else [host, *names]


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
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.responses import RedirectResponse
    from starlette.routing import Route

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
        """A posted form's values, or the refusal to answer instead (another
        origin, a missing or stale form token) -- every action's first step."""
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
    """The fields of a plain HTML form (``application/x-www-form-urlencoded``), first
    value of each; anything else, or a body over :data:`MAX_FORM_BYTES`, is no fields."""
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


# ---------------------------------------------------------------------- the command


def _metrics_option(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name.strip() or not url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"takes NAME=URL, e.g. processor-0=http://127.0.0.1:9100 (not {value!r})"
            )
        out[name.strip()] = url
    return out


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8088, show_default=True, help="TCP port."
)
@click.option(
    "--metrics",
    multiple=True,
    callback=_metrics_option,
    metavar="NAME=URL",
    help="A stage's metrics server (its /healthz and /readyz), e.g. "
    "processor-0=http://127.0.0.1:9100; repeatable. Stages whose status file names "
    "their metrics port are found without it.",
)
@click.option(
    "--wait-s",
    type=click.FloatRange(min=0),
    default=15.0,
    show_default=True,
    help="How long a disposition waits for the processor's decision (seconds).",
)
def console_cmd(host: str, port: int, metrics: dict[str, str], wait_s: float) -> None:
    """Serve the operator console: operations, timelines, the unknown-outcome queue
    with dispositions, the latest audit and stage health.

    It binds to the loopback interface by default. Anyone who can reach it can
    dispose unknown outcomes with the operator keys of this host
    (LEDGER_RUN_DIR/operators/): bind elsewhere only behind an authenticating proxy.
    """
    require_extra("console", "ledger console")
    import uvicorn

    settings = current_settings()
    from ledger.topics import check_topics

    check_topics(settings)
    if not _loopback(host):
        click.echo(
            f"warning: serving on {host}, not loopback: whoever reaches it can dispose with "
            "this host's operator keys",
            err=True,
        )
    app = create_app(
        LedgerData(settings, metrics, wait_s),
        title=settings.topic_prefix,
        hosts=allowed_hosts(host),
    )
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"ledger console for {settings.topic_prefix!r} at http://{shown}:{port}/", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


#: This module's commands, in the order ``ledger --help`` lists them.
COMMANDS: tuple[click.Command, ...] = (console_cmd,)
