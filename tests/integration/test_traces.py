"""Traces on the real broker: one trace follows an operation from the service that published
its intent, through the processor, the authority kernel and the relay (and its sink
requests), to the record that verifies its outcome, in real stage processes exporting over
OTLP/HTTP to a collector in the test; the sink receives the same trace in its requests, a
resumed relay reads the effect back in the operation's trace, and the stages' spans arrive
because a stage flushes them when it is stopped (SIGTERM)."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from consumers.history import partition_for
from consumers.reader import current_states, wait_for_decision
from consumers.stages import STAGES
from ledger.contracts import PAYMENT_GATEWAY
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it (IDs in lower-case hex)."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    attributes: dict[str, Any]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Collector:
    """A minimal OTLP/HTTP trace receiver on loopback: ``POST /v1/traces`` (protobuf)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                collector.receive(ExportTraceServiceRequest.FromString(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def receive(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            service=str(resource.get("service.name")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self.lock:
            self.spans.extend(received)

    def snapshot(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _poll(check: Callable[[], str | None], timeout_s: float, what: str) -> None:
    """Poll ``check`` (``None``: satisfied, else what is missing) until a deadline."""
    deadline = time.monotonic() + timeout_s
    missing = check()
    while missing is not None and time.monotonic() < deadline:
        time.sleep(0.1)
        missing = check()
    assert missing is None, f"{what}: {missing}"


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as running:
        yield running


def _publisher_trace(spans: list[ReceivedSpan], op: str) -> str | None:
    for span in spans:
        if span.name == "publish Intent" and span.attributes.get("ledger.operation_id") == op:
            return span.trace_id
    return None


def _trace_of(collector: Collector, op: str) -> str:
    trace_id = _publisher_trace(collector.snapshot(), op)
    assert trace_id is not None, f"no publish span for {op}"
    return trace_id


def _stage_env(harness: Harness, collector: Collector, delays_ms: dict[str, int]) -> None:
    """Make every stage process export its spans to ``collector`` (batch delay per stage)."""
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
    for component in STAGES:
        harness.stage_env[component] = {
            **env,
            "OTEL_BSP_SCHEDULE_DELAY": str(delays_ms.get(component, 100)),
        }


def _service_publisher(settings: LedgerSettings, collector: Collector) -> LedgerPublisher:
    """A publisher whose spans (service ``case-service``) go to ``collector`` at once."""
    provider = TracerProvider(resource=Resource.create({"service.name": "case-service"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector.url}/v1/traces"))
    )
    return LedgerPublisher(settings, tracer_provider=provider)


def _complete(collector: Collector, op: str, *, tree: bool) -> Callable[[], str | None]:
    """A check: the operation's one trace has spans of every process, up to OUTCOME_VERIFIED
    (and, with ``tree``, no span whose parent is missing)."""

    def check() -> str | None:
        spans = collector.snapshot()
        trace_id = _publisher_trace(spans, op)
        if trace_id is None:
            return "no publish span yet"
        in_trace = [s for s in spans if s.trace_id == trace_id]
        services = {s.service for s in in_trace}
        wanted = {"case-service", "ledger-processor", "ledger-authority", "ledger-relay"}
        if not wanted <= services:
            return f"services {sorted(services)} in trace {trace_id}"
        if not any(
            s.service == "ledger-processor"
            and s.attributes.get("ledger.to_state") == "OUTCOME_VERIFIED"
            for s in in_trace
        ):
            return "no processor span reaching OUTCOME_VERIFIED"
        ids = {s.span_id for s in in_trace}
        orphans = [s.name for s in in_trace if s.parent_id and s.parent_id not in ids]
        if tree and orphans:
            return f"spans whose parent has not arrived: {orphans}"
        return None

    return check


def _received(requests: list[dict[str, Any]], method: str, path: str, trace_id: str) -> bool:
    """Whether the sink received ``method path`` with a traceparent of ``trace_id``."""
    return any(
        r["method"] == method
        and r["path"] == path
        and (r["traceparent"] or "").split("-")[1:2] == [trace_id]
        for r in requests
    )


def test_one_trace_from_intent_to_verified_outcome(
    ledger_settings: LedgerSettings, collector: Collector
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    # The processor's and the kernel's spans leave only when they stop (a long batch
    # delay): their flush at SIGTERM is tested. The relay, which a fault kills, exports
    # at once.
    _stage_env(harness, collector, {"processor": 600_000, "authority": 600_000, "relay": 100})
    sink = harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = _service_publisher(settings, collector)
    happy, resumed = "refund:traced:v1", "refund:traced-resumed:v1"

    def trace_of(op: str) -> str:
        return _trace_of(collector, op)

    def operation_spans(op: str) -> list[ReceivedSpan]:
        return [s for s in collector.snapshot() if s.attributes.get("ledger.operation_id") == op]

    try:
        approve(pub, "ap-1")
        approve(pub, "ap-2")
        publish(pub, happy, approval="ap-1")
        harness.start_all()
        harness.wait_quiescent(90)

        def relay_done() -> str | None:
            trace_id = trace_of(happy)
            names = {
                s.name
                for s in collector.snapshot()
                if s.trace_id == trace_id and s.service == "ledger-relay"
            }
            return None if "GET /accounts/{id}" in names else f"relay spans so far: {names}"

        _poll(relay_done, 30, "the relay's spans before it is killed")
        # The relay dies after the sink committed, before its receipt: the
        # restarted relay reads the effect back, in the operation's trace.
        harness.arm("after_sink_commit_before_receipt", resumed)
        publish(pub, resumed, approval="ap-2")
        harness.wait_quiescent(90)
        assert harness.restart("relay"), "the armed relay did not die"
        harness.wait_quiescent(90)
        states = current_states(settings)
        assert states[happy].state == S.OUTCOME_VERIFIED
        assert states[resumed].state == S.OUTCOME_VERIFIED
        with sink.client() as client:
            requests = client.traces()
    finally:
        pub.close()
        harness.stop()
    _poll(_complete(collector, happy, tree=True), 30, f"the trace of {happy}")
    _poll(_complete(collector, resumed, tree=False), 30, f"the trace of {resumed}")

    for op in (happy, resumed):
        trace_id = trace_of(op)
        # Every span about the operation, in every process, is in its one trace.
        assert {s.trace_id for s in operation_spans(op)} == {trace_id}
    happy_trace = [s for s in collector.snapshot() if s.trace_id == trace_of(happy)]
    (root,) = [s for s in happy_trace if not s.parent_id]
    assert root.service == "case-service" and root.name == "publish Intent"
    names = {(s.service, s.name) for s in happy_trace}
    assert {
        ("ledger-processor", "processor Intent"),
        ("ledger-authority", "authority AdmissionRequest"),
        ("ledger-processor", "processor AdmissionDecision"),
        ("ledger-relay", "relay Dispatch"),
        ("ledger-relay", "POST /operations"),
        ("ledger-processor", "processor EffectReceipt"),
        ("ledger-relay", "GET /accounts/{id}"),  # read right after the effect: no VERIFY hop
    } <= names, sorted(names)

    # The sink received each operation's trace with the HTTP requests: the submit and the
    # postcondition of both, and the resumed relay's readback of the second.
    def received(method: str, path: str, op: str) -> bool:
        return _received(requests, method, path, trace_of(op))

    assert received("POST", "/operations", happy)
    assert received("GET", "/accounts/acct-1", happy)
    assert received("POST", "/operations", resumed)
    assert received("GET", f"/operations/{resumed}", resumed)
    relay_reads = [
        s
        for s in operation_spans(resumed)
        if s.service == "ledger-relay" and s.name == "GET /operations/{id}"
    ]
    assert relay_reads, "the resumed relay's readback span"


def test_a_processor_resume_continues_the_operations_trace(
    ledger_settings: LedgerSettings, collector: Collector
) -> None:
    """The processor dies with the operation in flight (dispatched, no relay yet); the
    restarted processor's claim, the readback it asks for and the verified outcome are all
    in the trace the service started."""
    settings = ledger_settings
    harness = Harness(settings, create=False)
    _stage_env(harness, collector, {})
    sink = harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = _service_publisher(settings, collector)
    op = "refund:traced-claimed:v1"
    try:
        approve(pub, "ap-1")
        publish(pub, op, approval="ap-1")
        harness.start("processor")
        harness.start("authority")
        harness.wait_quiescent(90)
        assert current_states(settings)[op].state == S.EFFECT_PENDING

        def dispatched() -> str | None:
            spans = [s for s in collector.snapshot() if s.trace_id == _trace_of(collector, op)]
            names = {s.name for s in spans if s.service == "ledger-processor"}
            return None if "processor AdmissionDecision" in names else f"so far {names}"

        _poll(dispatched, 30, "the processor's spans before it is killed")
        harness.kill("processor")
        harness.start("processor")
        # The relay starts only once the restarted processor has decided its own claim:
        # started earlier, it may send the first dispatch and have its receipt decided
        # before the claim, which is then refused with nothing left to read back.
        claim = wait_for_decision(settings, "claims", partition_for(op, settings.partitions), 0, 60)
        assert claim is not None and claim.outcome == "APPLIED", claim
        harness.start("relay")
        harness.wait_quiescent(90)
        assert current_states(settings)[op].state == S.OUTCOME_VERIFIED
        with sink.client() as client:
            requests = client.traces()
    finally:
        pub.close()
        harness.stop()
    _poll(_complete(collector, op, tree=True), 30, f"the trace of {op}")
    trace_id = _trace_of(collector, op)
    names = {(s.service, s.name) for s in collector.snapshot() if s.trace_id == trace_id}
    assert {
        ("ledger-processor", "processor resume"),
        ("ledger-processor", "processor Claim"),
        ("ledger-relay", "GET /operations/{id}"),
    } <= names, sorted(names)
    assert _received(requests, "GET", f"/operations/{op}", trace_id)
    assert _received(requests, "POST", "/operations", trace_id)
