"""Traces with OpenTelemetry: the exporter from the standard environment, W3C headers on records.

One operation is one trace, from the service that publishes its intent to
the record that verifies its outcome: the publisher starts a span and puts
its W3C ``traceparent`` (and ``tracestate``, if any) in the Kafka record's
headers; every stage handles each input record in a span that continues the
trace of the record's ``traceparent`` and writes that span's
``traceparent`` on every record it produces for it; the relay passes it to
the sink with each HTTP request (submit, readback, postcondition).

**Advisory, not authority.** The trace headers are *not* covered by the
record's seal (:mod:`ledger.authn` seals topic, key and value only): anyone
who can write a record can put any ``traceparent`` on it, and a stage copies
it onward. A trace header therefore decides nothing: no stage reads it for
anything but the parent of its span, and the audit ignores it. The worst a
forged one can do is attach spans to someone else's trace or, with its
``sampled`` flag off, keep them from being recorded (``OTEL_TRACES_SAMPLER``
chooses otherwise). Headers longer than :data:`MAX_TRACE_HEADER_BYTES` are
ignored, so a record cannot make the stages copy a large value onward.

**Exporter** (:func:`configure`, called once per process by the stages and
the ``ledger`` commands that publish), from the standard variables:

* ``OTEL_SDK_DISABLED=true``: no tracing at all.
* ``OTEL_TRACES_EXPORTER``: ``otlp`` (OTLP over HTTP/protobuf, to
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``
  + ``/v1/traces``, default ``http://localhost:4318``), ``console`` (JSON
  spans on standard output), both (``otlp,console``) or ``none``. Unset:
  ``otlp`` when an OTLP endpoint is set, else none (unlike the SDK's own
  default, a ledger nobody asked to trace sends nothing anywhere).
* ``OTEL_SERVICE_NAME``: the ``service.name`` (default ``ledger-<stage>``);
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` and ``OTEL_EXPORTER_OTLP_*``
  (headers, timeout, compression) as the SDK reads them.

Without an exporter no SDK is installed: spans come from the API's no-op
tracer, which still carries the incoming ``traceparent`` through to the
outputs, so a stage that does not export does not break the trace.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ledger.extras import require_extra

log = logging.getLogger(__name__)

#: W3C Trace Context header names, as the records and the sink requests carry them.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_HEADERS = (TRACEPARENT, TRACESTATE)

#: A trace header longer than this (bytes) is ignored (W3C caps ``tracestate`` at 32
#: members; 512 bytes is the size its authors suggest propagators keep).
MAX_TRACE_HEADER_BYTES = 512

#: The exporters this installation offers (``OTEL_TRACES_EXPORTER``).
EXPORTERS = ("otlp", "console")

#: Name of the instrumentation scope of every span the ledger starts.
SCOPE = "ledger"

_PROPAGATOR = TraceContextTextMapPropagator()

#: The SDK provider :func:`configure` installed in this process, if any.
_provider: Any = None


def exporters_from_env(environ: Mapping[str, str]) -> tuple[str, ...]:
    """Which span exporters the standard OpenTelemetry variables ask for.

    Args:
        environ: the environment (``os.environ``).

    Returns:
        A tuple of names from :data:`EXPORTERS` (empty: tracing off). An
        exporter this installation does not offer (``zipkin`` ...) is left
        out with a warning.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    names = [
        n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()
    ]
    if not names:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        return ("otlp",) if endpoint else ()
    if "none" in names:
        return ()
    chosen = tuple(dict.fromkeys(n for n in names if n in EXPORTERS))
    for name in names:
        if name not in EXPORTERS:
            log.warning(
                "OTEL_TRACES_EXPORTER names %r, which this installation does not offer "
                "(otlp, console, none); ignored",
                name,
            )
    return chosen


def configure(
    service_name: str, *, instance: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """Install the process's tracer provider as the environment says (once per process).

    Args:
        service_name: ``service.name`` unless ``OTEL_SERVICE_NAME`` is set
            (e.g. ``ledger-relay``).
        instance: ``service.instance.id`` (the stage's instance name), if any.
        environ: the environment (default ``os.environ``).

    Returns:
        The exporters in force (empty: tracing off, nothing installed, the
        API's no-op tracer serves). A second call returns the first's.

    Raises:
        MissingExtraError: ``otlp`` is asked for and the ``[otlp]`` extra is
            not installed (the message names the ``pip install``).
    """
    global _provider
    env = os.environ if environ is None else environ
    chosen = exporters_from_env(env)
    if _provider is not None:
        return tuple(getattr(_provider, "_ledger_exporters", chosen))
    if not chosen:
        return ()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    attributes: dict[str, str] = {}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service_name
    if instance is not None:
        attributes["service.instance.id"] = instance
    provider = SdkTracerProvider(resource=Resource.create(attributes))
    for name in chosen:
        if name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            continue
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        if protocol != "http/protobuf":
            log.warning(
                "OTEL_EXPORTER_OTLP_PROTOCOL=%s is not offered here; spans go over "
                "http/protobuf (port 4318 by default)",
                protocol,
            )
        require_extra("otlp", "OTEL_TRACES_EXPORTER=otlp")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    provider._ledger_exporters = chosen  # type: ignore[attr-defined]  # our mark on the provider, read back above
    trace.set_tracer_provider(provider)
    _provider = provider
    log.info("traces: exporting to %s as %s", ", ".join(chosen), service_name)
    return chosen


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still buffered (does nothing when tracing is off).

    Args:
        timeout_s: how long to wait for the exporters (seconds).
    """
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Flush and stop the exporters (a stage's last step; nothing when tracing is off)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def tracer(provider: TracerProvider | None = None) -> trace.Tracer:
    """The ledger's tracer (from ``provider``, default the global one)."""
    return trace.get_tracer(SCOPE, tracer_provider=provider)


def current_trace_id() -> str | None:
    """The current span's trace ID (32 hex digits), or ``None`` outside a valid span."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def trace_headers() -> dict[str, str]:
    """The W3C headers of the current span (``{}`` when no valid span is current)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def with_trace(
    headers: list[tuple[str, str | bytes | None]] | None,
) -> list[tuple[str, str | bytes | None]] | None:
    """A record's headers with the current span's ``traceparent`` (and ``tracestate``) added.

    Args:
        headers: the headers the record has so far (e.g. its seal), or ``None``.

    Returns:
        The headers plus the trace headers; ``headers`` unchanged when no
        valid span is current.
    """
    carrier = trace_headers()
    if not carrier:
        return headers
    return [*(headers or []), *((name, value.encode("ascii")) for name, value in carrier.items())]


#: A record's headers as the Kafka client gives them (a list of pairs, or a mapping).
Headers = Iterable[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None


def trace_headers_of(headers: Headers) -> dict[str, str]:
    """The W3C trace headers among a record's headers, as text.

    Values over :data:`MAX_TRACE_HEADER_BYTES` are left out; the last header
    of a name wins.
    """
    carrier: dict[str, str] = {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for name, value in pairs:
        key = name.lower() if isinstance(name, str) else ""
        if key not in TRACE_HEADERS or value is None or len(value) > MAX_TRACE_HEADER_BYTES:
            continue
        carrier[key] = value.decode("latin-1") if isinstance(value, bytes) else value
    return carrier


def context_of(headers: Headers) -> Context:
    """The trace context a record's headers carry (empty: no valid ``traceparent``).

    Malformed values and values over :data:`MAX_TRACE_HEADER_BYTES` are
    ignored; the last header of a name wins.
    """
    carrier = trace_headers_of(headers)
    if TRACEPARENT not in carrier:
        return Context()
    return _PROPAGATOR.extract(carrier, context=Context())


def annotate(attributes: Mapping[str, str | int | bool]) -> None:
    """Add attributes to the current span (e.g. the transition a record caused)."""
    trace.get_current_span().set_attributes(dict(attributes))


class TracedRecord(Protocol):
    """What :class:`RecordSpans` needs of a stage's input record."""

    @property
    def topic(self) -> str:
        """The short topic name."""

    @property
    def partition(self) -> int:
        """The partition."""

    @property
    def offset(self) -> int:
        """The offset."""

    @property
    def key(self) -> str:
        """The record key."""

    @property
    def headers(self) -> Sequence[tuple[str, str | bytes | None]]:
        """The Kafka headers."""

    @property
    def event(self) -> Any:
        """The decoded event."""


class RecordSpans:
    """One span per input record a stage handles, current while the stage works on it.

    A span continues the trace of its record's ``traceparent`` (a record
    without one starts a trace) and lasts from the first time the stage works
    on the record until its batch is committed or aborted (:meth:`end`). A
    record met in two loops of one batch (the relay sends in one and writes
    the receipts in another) keeps its one span. While the span is current,
    every record the stage writes carries its ``traceparent``
    (:func:`with_trace`), the relay's sink requests send it, and logs can
    read its trace ID.

    Args:
        component: the stage (``processor``, ``authority``, ``relay``): the
            span's name is ``{component} {record kind}``.
        provider: the tracer provider (default the global one).
    """

    def __init__(self, component: str, provider: TracerProvider | None = None) -> None:
        self.component = component
        self._tracer = tracer(provider)
        self._spans: dict[tuple[str, int, int], Span] = {}
        self._by_operation: dict[str, Span] = {}

    def _span(self, rec: TracedRecord) -> Span:
        at = (rec.topic, rec.partition, rec.offset)
        span = self._spans.get(at)
        if span is None:
            operation_id = getattr(rec.event, "operation_id", None)
            kind = str(getattr(rec.event, "KIND", type(rec.event).__name__))
            attributes: dict[str, str | int] = {
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": rec.topic,
                "messaging.destination.partition.id": str(rec.partition),
                "messaging.kafka.offset": rec.offset,
                "messaging.kafka.message.key": rec.key,
                "ledger.component": self.component,
                "ledger.record": kind,
            }
            if operation_id:
                attributes["ledger.operation_id"] = str(operation_id)
            span = self._tracer.start_span(
                f"{self.component} {kind}",
                context=context_of(rec.headers),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
            )
            self._spans[at] = span
            if operation_id:
                self._by_operation[str(operation_id)] = span
        return span

    def each(self, records: Iterable[TracedRecord]) -> Iterator[Any]:
        """Yield each record with its span current (``for rec in spans.each(records):``).

        The span stays open after the loop (see :meth:`end`); only its being
        current ends with each step.
        """
        for rec in records:
            token = context.attach(trace.set_span_in_context(self._span(rec)))
            try:
                yield rec
            finally:
                context.detach(token)

    @contextmanager
    def of_operation(self, operation_id: str) -> Iterator[None]:
        """Make the span of this batch's last record about ``operation_id`` current.

        Nothing is made current when the batch has no record about it.
        """
        span = self._by_operation.get(operation_id)
        if span is None:
            yield
            return
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    @contextmanager
    def continued(self, operation_id: str, headers: Mapping[str, str], name: str) -> Iterator[None]:
        """Work on an operation outside its input record, in the operation's trace.

        For work a stage does later, when the record is no longer in hand (the
        relay's next try of a dispatch it parked, the processor's resume
        claim): a span ``name`` continues the trace of ``headers`` (what
        :func:`trace_headers` gave while the record's span was current; ``{}``
        starts a trace), is current inside the block and is the operation's
        span for :meth:`of_operation` until :meth:`end`. A second block for
        the same operation in one batch reuses it.

        Args:
            operation_id: the operation.
            headers: its W3C trace headers (``traceparent``, ``tracestate``).
            name: the span's name, e.g. ``relay retry Dispatch``.
        """
        at = (f"continued {operation_id}", -1, -1)
        span = self._spans.get(at)
        if span is None:
            span = self._tracer.start_span(
                name,
                context=context_of(headers.items()),
                attributes={
                    "ledger.component": self.component,
                    "ledger.operation_id": operation_id,
                },
            )
            self._spans[at] = span
            self._by_operation[operation_id] = span
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            context.detach(token)

    def end(self, error: str | None = None) -> None:
        """End every open span (the batch committed, or with ``error``: it did not).

        Args:
            error: why the batch's transaction did not commit (the spans end
                with an error status), or ``None``.
        """
        for span in self._spans.values():
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()
        self._spans.clear()
        self._by_operation.clear()
