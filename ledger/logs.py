"""How a ledger process logs: text (the default) or one JSON object a line.

``LEDGER_LOG_FORMAT=json`` makes every line a JSON object (python-json-logger)
with ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``message`` and,
on every line, ``operation_id``, ``stage``, ``instance``, ``trace_id`` and
``span_id`` (``null`` when there is none). The text format keeps the classic
``time level logger: message`` line.

Where the fields come from:

* ``stage`` and ``instance``: :func:`configure_logging` (the process's
  stage), or :func:`bind` in the running thread (tests that run several
  stages in one process);
* ``operation_id``: :func:`bind` / :func:`bound_each`, which the stages call
  around the work on each record, so every line logged meanwhile (the
  processor's refusals, the relay's sends) names its operation;
* ``trace_id`` / ``span_id``: the OpenTelemetry span current when the line is
  logged, if its span context is valid (32 and 16 hex digits).

The context lives in :mod:`contextvars`, so it follows the thread (or task)
that set it and never leaks into another stage's lines.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import IO, Literal, TypeVar

from opentelemetry import trace
from pythonjsonlogger.json import JsonFormatter

from ledger.settings import LedgerSettings

LogFormat = Literal["text", "json"]

#: The line of the text format.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The fields every JSON line carries besides the message (``null`` when unset).
CONTEXT_FIELDS = ("operation_id", "stage", "instance", "trace_id", "span_id")

#: Fields bound in the current context (thread or task): name -> value.
_bound: contextvars.ContextVar[Mapping[str, str | None]] = contextvars.ContextVar(
    "ledger_log_context", default=MappingProxyType({})
)

#: Process-wide values, set by :func:`configure_logging` (a stage process's own).
_process: dict[str, str | None] = {}

#: The handler :func:`configure_logging` put on the root logger, if any.
_installed: logging.Handler | None = None

T = TypeVar("T")


class ContextFilter(logging.Filter):
    """Adds ``operation_id``, ``stage``, ``instance``, ``trace_id`` and ``span_id`` to a record.

    A value bound in the current context wins over the process-wide one; a
    field with neither is ``None``. Never filters a record out.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Set the context fields on ``record``; always True."""
        bound = _bound.get()
        for name in ("operation_id", "stage", "instance"):
            setattr(record, name, bound.get(name, _process.get(name)))
        trace_id, span_id = current_trace()
        record.trace_id = trace_id
        record.span_id = span_id
        return True


def current_trace() -> tuple[str | None, str | None]:
    """The current OpenTelemetry span's trace and span IDs in hex, or ``(None, None)``.

    Returns:
        ``(trace_id, span_id)``: 32 and 16 lower-case hex digits, when a span
        with a valid span context is current; else ``(None, None)``.
    """
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def json_formatter() -> logging.Formatter:
    """The JSON formatter: one object a line with the message and the context fields."""
    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s " + " ".join(f"%({f})s" for f in CONTEXT_FIELDS),
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
    )


def make_handler(fmt: LogFormat, stream: IO[str] | None = None) -> logging.Handler:
    """A stream handler writing ``fmt`` lines, with a :class:`ContextFilter` on it.

    Args:
        fmt: ``text`` or ``json``.
        stream: where lines go (default: standard error).

    Raises:
        ValueError: the format is neither ``text`` nor ``json``.
    """
    if fmt not in ("text", "json"):
        raise ValueError(f"log format {fmt!r} is neither text nor json (LEDGER_LOG_FORMAT)")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(json_formatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(ContextFilter())
    return handler


def configure_logging(
    settings_or_format: LedgerSettings | LogFormat,
    stage: str | None = None,
    instance: str | None = None,
    *,
    level: int = logging.INFO,
    stream: IO[str] | None = None,
    force: bool = False,
) -> logging.Handler | None:
    """Send the process's log lines to standard error, as text or JSON.

    Puts a :func:`make_handler` handler on the root logger (so lines of every
    logger carry the context fields), replacing the one an earlier call put
    there, and records ``stage`` and ``instance`` for every line. Like
    :func:`logging.basicConfig`, it leaves alone a root logger that something
    else has configured already (a test runner, an application embedding a
    stage), unless ``force``.

    Args:
        settings_or_format: the settings (their ``log_format``,
            ``LEDGER_LOG_FORMAT``) or ``"text"`` / ``"json"`` itself.
        stage: the stage this process runs (``processor`` ...), if any.
        instance: its instance name, if any.
        level: the root logger's level.
        stream: where lines go (default: standard error).
        force: replace whatever handlers the root logger has.

    Returns:
        The handler installed, or ``None`` when the root logger was left alone.

    Raises:
        ValueError: the format is neither ``text`` nor ``json``.
    """
    global _installed
    fmt = (
        settings_or_format.log_format
        if isinstance(settings_or_format, LedgerSettings)
        else settings_or_format
    )
    handler = make_handler(fmt, stream)
    _process.clear()
    _process.update(stage=stage, instance=instance)
    root = logging.getLogger()
    foreign = [h for h in root.handlers if h is not _installed]
    if foreign and not force:
        return None
    for old in list(root.handlers):
        root.removeHandler(old)
        if old is _installed:
            old.close()
    root.addHandler(handler)
    root.setLevel(level)
    _installed = handler
    return handler


@contextmanager
def bind(**fields: str | None) -> Iterator[None]:
    """Add fields (``operation_id``, ``stage``, ``instance``) to every line logged inside.

    Nested binds add to the outer ones; leaving restores what was bound before.

    Example:
        ``with bind(operation_id=rec.key): decide(rec)``
    """
    token = _bound.set({**_bound.get(), **fields})
    try:
        yield
    finally:
        _bound.reset(token)


def bind_here(**fields: str | None) -> None:
    """Bind fields for the rest of the current context (a thread's run, a task).

    For a stage's own thread: its ``stage`` and ``instance`` stay bound for
    every line it logs. Use :func:`bind` for anything narrower.
    """
    _bound.set({**_bound.get(), **fields})


def bound_each(items: Iterable[T], operation_id: Callable[[T], str | None]) -> Iterator[T]:
    """Iterate ``items`` with each item's operation ID bound while the loop body runs.

    ``for rec in bound_each(records, lambda r: r.key):`` -- every line logged
    in the body names the record's operation; after the loop (or when it is
    left by ``break`` or an exception) the ID bound before is back.

    Args:
        items: what the loop goes through.
        operation_id: the operation ID of an item (``None``: none).
    """
    outer = _bound.get()
    try:
        for item in items:
            _bound.set({**outer, "operation_id": operation_id(item)})
            yield item
    finally:
        _bound.set(outer)


def bound_fields() -> dict[str, str | None]:
    """The fields bound in the current context (a copy), for tests and diagnostics."""
    return dict(_bound.get())
