"""ledger.tracing: the exporter from the OTEL_* variables, W3C headers on records, one span per
record continuing the record's trace, and trace headers that leave the seal intact."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ledger import tracing
from ledger.authn import AUTH_HEADER, Keyring, MacKey
from ledger.tracing import (
    MAX_TRACE_HEADER_BYTES,
    TRACEPARENT,
    RecordSpans,
    context_of,
    exporters_from_env,
    with_trace,
)
from tests import helpers
from tests.helpers import keyed

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = int("0af7651916cd43dd8448eb211c80319c", 16)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, ()),
        ({"OTEL_TRACES_EXPORTER": "none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console, OTLP"}, ("console", "otlp")),
        ({"OTEL_TRACES_EXPORTER": "otlp,none"}, ()),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, ()),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, ("otlp",)),
    ],
)
def test_exporters_follow_the_standard_variables(
    environ: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert exporters_from_env(environ) == expected


def test_configure_installs_nothing_when_tracing_is_off() -> None:
    assert tracing.configure("ledger-test", environ={"OTEL_TRACES_EXPORTER": "none"}) == ()
    assert tracing._provider is None
    tracing.flush()
    tracing.shutdown()  # nothing to stop: no error


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_headers_round_trip_and_bad_ones_start_no_trace() -> None:
    provider, _ = _provider()
    with tracing.tracer(provider).start_as_current_span("publish"):
        headers = with_trace([(AUTH_HEADER, b"seal")])
        trace_id = tracing.current_trace_id()
    assert headers is not None and headers[0] == (AUTH_HEADER, b"seal")
    names = [name for name, _ in headers]
    assert TRACEPARENT in names
    from opentelemetry import trace

    ctx = trace.get_current_span(context_of(headers)).get_span_context()
    assert format(ctx.trace_id, "032x") == trace_id and ctx.is_remote
    # No current span: nothing is added.
    assert with_trace(None) is None and with_trace([(AUTH_HEADER, b"x")]) == [(AUTH_HEADER, b"x")]
    for bad in (b"garbage", b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01", b"x" * 10_000):
        invalid = trace.get_current_span(context_of([(TRACEPARENT, bad)])).get_span_context()
        assert not invalid.is_valid
    too_long = "a=" + "b" * MAX_TRACE_HEADER_BYTES
    kept = context_of([(TRACEPARENT, PARENT.encode()), ("tracestate", too_long.encode())])
    span_ctx = trace.get_current_span(kept).get_span_context()
    assert span_ctx.trace_id == TRACE_ID and len(span_ctx.trace_state) == 0


@dataclass(frozen=True)
class _Rec:
    topic: str
    partition: int
    offset: int
    key: str
    headers: tuple[tuple[str, Any], ...]
    event: Any


def test_record_spans_continue_each_records_trace_and_outputs_carry_it() -> None:
    provider, exporter = _provider()
    intent = helpers.intent("refund:traced:v1")
    records = [
        _Rec("intents", 0, 7, intent.operation_id, ((TRACEPARENT, PARENT.encode()),), intent),
        _Rec("intents", 1, 3, "refund:untraced:v1", (), helpers.intent("refund:untraced:v1")),
    ]
    spans = RecordSpans("processor", provider)
    written: list[list[tuple[str, Any]] | None] = []
    for _rec in spans.each(records):
        written.append(with_trace([(AUTH_HEADER, b"seal")]))
    # The relay meets the records again in a second loop: the same spans.
    for _ in spans.each(records):
        pass
    with spans.of_operation("refund:traced:v1"):
        marker = with_trace(None)
    assert exporter.get_finished_spans() == ()  # open until the batch ends
    spans.end()
    finished = exporter.get_finished_spans()
    assert len(finished) == 2
    traced, untraced = sorted(finished, key=lambda s: s.attributes["messaging.kafka.offset"])[::-1]
    assert traced.context.trace_id == TRACE_ID
    assert traced.parent is not None and traced.parent.span_id == int("b7ad6b7169203331", 16)
    assert traced.name == "processor Intent" and traced.kind is SpanKind.CONSUMER
    assert traced.attributes["ledger.operation_id"] == "refund:traced:v1"
    assert untraced.parent is None and untraced.context.trace_id != TRACE_ID
    # Each output carries its own record's span as parent, not the other's.
    first = dict(written[0] or [])[TRACEPARENT].decode()
    second = dict(written[1] or [])[TRACEPARENT].decode()
    assert first == f"00-{TRACE_ID:032x}-{traced.context.span_id:016x}-01"
    assert second.split("-")[1] == f"{untraced.context.trace_id:032x}"
    assert dict(marker or [])[TRACEPARENT].decode() == first


def test_a_batch_that_does_not_commit_ends_its_spans_in_error() -> None:
    provider, exporter = _provider()
    spans = RecordSpans("relay", provider)
    rec = _Rec("dispatches", 0, 1, "op", (), helpers.intent("refund:x:v1"))
    for _ in spans.each([rec]):
        pass
    spans.end("aborted")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.status.description == "aborted"


def test_trace_headers_leave_the_seal_valid_and_are_not_covered_by_it() -> None:
    """The traceparent is advisory: adding or changing it does not touch authentication."""
    key = MacKey(os.urandom(32))
    keyring = Keyring()
    keyring.add_mac(key)
    value = helpers.receipt("refund:sealed:v1", "refund:sealed:v1#1.1").to_bytes()
    seal = key.seal("receipts", b"refund:sealed:v1", value)
    for parent in (PARENT, PARENT.replace("b7ad", "ffff")):
        headers = [(AUTH_HEADER, seal), (TRACEPARENT, parent.encode())]
        assert keyring.check("receipts", b"refund:sealed:v1", value, headers) is None
    # The seal still covers the value: a changed value under the same headers is refused.
    assert keyring.check("receipts", b"refund:sealed:v1", value + b"x", headers) is not None


def test_sink_requests_carry_the_current_traceparent() -> None:
    from sinks.client import SinkClient

    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get(TRACEPARENT))
        return httpx.Response(404, json={"status": "absent"})

    provider, exporter = _provider()
    client = SinkClient("http://sink", transport=httpx.MockTransport(answer))
    with tracing.tracer(provider).start_as_current_span("relay Dispatch") as span:
        client.readback("refund:rb:v1", 2)
    client.readback("refund:rb:v1", 2)
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert seen[0] is not None and seen[0].split("-")[1] == trace_id
    assert seen[1] is None  # no current span, no header


def test_without_an_sdk_the_incoming_trace_still_reaches_the_outputs() -> None:
    """No exporter configured: the API's no-op tracer keeps the record's trace and parent."""
    rec = _Rec("dispatches", 2, 9, "op", ((TRACEPARENT, PARENT.encode()),), None)
    spans = RecordSpans("relay")  # the global provider: nothing installed in this process
    for _ in spans.each([rec]):
        headers = with_trace(None)
        assert tracing.current_trace_id() == f"{TRACE_ID:032x}"
    spans.end()
    assert dict(headers or [])[TRACEPARENT].decode() == PARENT


def test_work_outside_the_record_continues_the_operations_trace() -> None:
    """A parked dispatch's next try (or a resume's claim) is a span in the operation's trace."""
    provider, exporter = _provider()
    spans = RecordSpans("relay", provider)
    with spans.continued("refund:parked:v1", {TRACEPARENT: PARENT}, "relay retry Dispatch"):
        first = with_trace(None)
    with spans.of_operation("refund:parked:v1"):
        second = with_trace(None)
    with spans.continued("refund:fresh:v1", {}, "relay retry Dispatch"):
        fresh = tracing.current_trace_id()
    spans.end()
    parked = next(s for s in exporter.get_finished_spans() if s.context.trace_id == TRACE_ID)
    assert parked.name == "relay retry Dispatch" and parked.parent is not None
    assert dict(first or [])[TRACEPARENT] == dict(second or [])[TRACEPARENT]
    assert fresh is not None and fresh != f"{TRACE_ID:032x}"
    assert len(exporter.get_finished_spans()) == 2


def test_a_parked_dispatch_is_tried_again_in_its_operations_trace(tmp_path: Path) -> None:
    """The relay parks a dispatch whose sink refused the connection with its trace headers;
    the next try sends the same trace to the sink."""
    from consumers.relay import Relay
    from ledger.contracts import PAYMENT_GATEWAY
    from ledger.events import Dispatch
    from ledger.settings import LedgerSettings
    from sinks.client import SinkClient
    from sinks.registry import SinkEndpoint, save_sinks

    url = "http://127.0.0.1:9"
    sent: list[str | None] = []

    def sink(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get(TRACEPARENT))
        if len(sent) == 1:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(
            201, json={"status": "committed", "effect_id": "e-1", "committed_ms": 1}
        )

    # This stand-in sink answers every request as a submit: no postcondition
    # readback right after the effect (it would be a third request).
    settings = keyed(
        LedgerSettings(run_dir=tmp_path, sink_retry_backoff_s=0.0, relay_inline_verify=False)
    )
    save_sinks(settings.sinks_path(), {"payments": SinkEndpoint(url=url, contract=PAYMENT_GATEWAY)})
    provider, exporter = _provider()
    relay = Relay(settings)
    relay.spans = RecordSpans("relay", provider)
    relay.sinks.clients["payments"] = SinkClient(url, transport=httpx.MockTransport(sink))
    d = Dispatch(
        dispatch_id="refund:p:v1#1.1",
        operation_id="refund:p:v1",
        kind="EXECUTE",
        sink="payments",
        action="refund",
        params_json='{"account":"a","amount_minor":1}',
        parameter_digest="0" * 64,
        fencing_token=1,
        state_version=2,
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
    )
    rec = _Rec("dispatches", 0, 5, d.operation_id, ((TRACEPARENT, PARENT.encode()),), d)
    for _ in relay.spans.each([rec]):
        assert relay.parking.attempt(d, 0, 5, fresh=True) == []
    relay.spans.end()
    parked = relay.parking.parked[d.dispatch_id]
    assert parked.trace[TRACEPARENT].split("-")[1] == f"{TRACE_ID:032x}"
    relay.parking.new_pass()  # a new pass, as a retry round starts one
    with relay.spans.continued(d.operation_id, parked.trace, "relay retry Dispatch"):
        (receipt,) = relay.parking.attempt(d, 0, 5, fresh=parked.fresh)
    relay.spans.end()
    assert receipt[0] == "receipts" and d.dispatch_id not in relay.parking.parked
    assert [p.split("-")[1] for p in sent if p] == [f"{TRACE_ID:032x}"] * 2
    names = {s.name for s in exporter.get_finished_spans() if s.context.trace_id == TRACE_ID}
    assert {"relay Dispatch", "relay retry Dispatch"} <= names


def test_the_console_exporter_prints_the_spans_when_the_process_stops() -> None:
    """OTEL_TRACES_EXPORTER=console in a fresh process: the stage's service name and the span
    reach standard output at shutdown (the global provider is set once per process)."""
    import subprocess
    import sys

    code = (
        "from ledger import tracing\n"
        "print(tracing.configure('ledger-relay', instance='2'))\n"
        "with tracing.tracer().start_as_current_span('relay Dispatch'):\n"
        "    print(tracing.current_trace_id())\n"
        "tracing.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_EXPORTER"] = "console"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    ).stdout
    lines = out.splitlines()
    assert lines[0] == "('console',)"
    trace_id = lines[1]
    assert len(trace_id) == 32 and f'"trace_id": "0x{trace_id}"' in out
    assert '"name": "relay Dispatch"' in out and '"service.name": "ledger-relay"' in out
    assert '"service.instance.id": "2"' in out
