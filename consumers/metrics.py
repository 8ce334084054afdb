"""Prometheus metrics and health endpoints of one stage process.

Each :class:`~consumers.stage.Stage` owns a :class:`StageMetrics` with its own
:class:`prometheus_client.CollectorRegistry` (never the global one, so that
several stages in one process, as in tests, do not clash). With
``LEDGER_METRICS_PORT`` set, :meth:`StageMetrics.serve` answers on that port:

* ``GET /metrics`` -- the Prometheus text format (prometheus-client's WSGI app);
* ``GET /healthz`` -- 200 while the stage's loop goes round (its last turn at
  most ``LEDGER_HEALTH_STALL_S`` seconds ago), or while it is starting,
  restoring state or waiting for Kafka (each of which it says); else 503;
* ``GET /readyz`` -- 200 once the stage has its partitions and has restored
  their state (what its status file calls ready), and Kafka answers; else 503.

The health answers are JSON: ``{"ok": bool, "stage", "instance", ...}``.

Every metric carries the label ``stage`` (``processor``, ``authority``,
``relay``). Counts of what a transaction writes (transitions, refusals,
operating events) move only when the transaction commits (:meth:`committed`);
an aborted one's are dropped. What happened in the world (a sink request, an
abort, a fencing, a restore, a refused clock reading) counts at once. :data:`METRICS` lists every
metric name with its type; docs/operating.md ("Metrics and health") repeats it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ledger.errors import SettingsError
from ledger.events import AdmissionDecision, EffectReceipt, Event, JournalEntry, OperatingEvent
from ledger.events import Readback as ReadbackEvent
from ledger.stranded import StrandedSummary

log = logging.getLogger(__name__)

#: Every metric a stage exports: name (as scraped, counters with ``_total``)
#: -> (type, labels besides ``stage``). The Grafana dashboard may query only these.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ledger_stage_info": ("info", ("ledger_instance", "group", "transactional_id")),
    "ledger_records_total": ("counter", ()),
    "ledger_transitions_total": ("counter", ("from_state", "to_state")),
    "ledger_refusals_total": ("counter", ("reason",)),
    "ledger_operating_events_total": ("counter", ("kind",)),
    "ledger_unknown_outcomes_open": ("gauge", ()),
    "ledger_dispatches_total": ("counter", ("sink", "kind", "outcome")),
    "ledger_sink_request_seconds": ("histogram", ("sink", "outcome")),
    "ledger_transaction_commit_seconds": ("histogram", ()),
    "ledger_transaction_aborts_total": ("counter", ("error",)),
    "ledger_fencings_total": ("counter", ()),
    "ledger_restore_seconds": ("histogram", ()),
    "ledger_consumer_lag": ("gauge", ("topic", "partition")),
    "ledger_stage_ready": ("gauge", ()),
    "ledger_stage_waiting_for_kafka": ("gauge", ()),
    "ledger_unverifiable_held": ("gauge", ()),
    "ledger_loop_age_seconds": ("gauge", ()),
    "ledger_clock_readings_refused_total": ("counter", ("clock",)),
    "ledger_stranded_operations": ("gauge", ("reason",)),
    "ledger_stranded_oldest_age_seconds": ("gauge", ("reason",)),
}

#: librdkafka statistics interval of a stage's consumer while metrics are served
#: (milliseconds): how often ``ledger_consumer_lag`` is refreshed.
STATS_INTERVAL_MS = 5000

#: Buckets of sink request latency (seconds): sinks answer in milliseconds;
#: a request that times out takes ``LEDGER_SINK_TIMEOUT_S`` (default 2 s).
SINK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 30.0)

#: Buckets of transaction commits (seconds).
COMMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: Buckets of restores after an assignment (seconds): reading state back can take minutes.
RESTORE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

#: A stage's answer to ``/healthz`` or ``/readyz``: ok, and what it says about it.
Verdict = tuple[bool, dict[str, Any]]


def reason_label(reason: str) -> str:
    """A bounded label for a refusal reason: its words before any ``:``, in CAPITALS.

    ``"amount exceeds approval scope: amount 500 ..."`` -> ``AMOUNT_EXCEEDS_APPROVAL_SCOPE``
    (the authority's reasons are fixed phrases with details after a colon).
    """
    head = reason.split(":", 1)[0]
    return re.sub(r"[^A-Za-z0-9]+", "_", head).strip("_").upper()[:64] or "UNSPECIFIED"


def refusal_kind(events: Iterable[object]) -> str:
    """The kind of the first operating event among a refusal's outputs (its reason)."""
    for event in events:
        if isinstance(event, OperatingEvent):
            return event.kind
    return "UNSPECIFIED"


def dispatch_outcome(events: Iterable[object]) -> str:
    """What performing a dispatch observed: the status of its receipt or readback.

    Returns:
        ``COMMITTED``, ``REJECTED``, ``AMBIGUOUS`` ... (an
        :class:`~ledger.events.EffectReceipt`'s status) or ``ABSENT``,
        ``UNSUPPORTED`` ... (a :class:`~ledger.events.Readback`'s), for the
        first such event; ``NONE`` when there is none. An ``EXPIRED``
        receipt (a reservation released by its sink and taken again) is a
        note on the way, not the outcome: the receipt after it is.
    """
    for event in events:
        if isinstance(event, EffectReceipt) and event.status == "EXPIRED":
            continue
        if isinstance(event, (EffectReceipt, ReadbackEvent)):
            return str(event.status)
    return "NONE"


def consumer_lag(stats_json: str) -> dict[tuple[str, int], int]:
    """Consumer lag per partition from librdkafka's statistics JSON.

    The lag is the partition's last stable offset (``ls_offset``: what a
    ``read_committed`` consumer can reach; ``hi_offset`` if that is unknown)
    minus the consumer's position: the offset after the last record handed
    to the stage (``app_offset``), else its committed offset, else the
    partition's first offset (a group that never committed starts there).
    librdkafka's own ``consumer_lag`` is not used: it counts from the
    committed offset the consumer last fetched, and a stage commits through
    its transactions, which the consumer does not see.

    Args:
        stats_json: what librdkafka hands ``stats_cb`` (``topics`` ->
            ``partitions`` -> offsets).

    Returns:
        ``(topic, partition) -> lag`` (records, never negative) for every
        partition whose offsets are known; librdkafka's internal partition
        ``-1`` and partitions this consumer does not fetch are left out.

    Raises:
        ValueError: the text is not JSON (``json.JSONDecodeError``).
    """
    stats = json.loads(stats_json)
    lag: dict[tuple[str, int], int] = {}
    topics = stats.get("topics") if isinstance(stats, dict) else None
    for topic, body in (topics or {}).items():
        partitions = body.get("partitions") if isinstance(body, dict) else None
        for pid, part in (partitions or {}).items():
            try:
                partition = int(pid)
                offsets = {
                    k: int(part.get(k, -1))
                    for k in (
                        "ls_offset",
                        "hi_offset",
                        "app_offset",
                        "committed_offset",
                        "lo_offset",
                    )
                }
                fetching = part.get("fetch_state", "active") not in ("none", "stopped")
            except (TypeError, ValueError, AttributeError):
                continue
            end = offsets["ls_offset"] if offsets["ls_offset"] >= 0 else offsets["hi_offset"]
            position = next(
                (
                    offsets[k]
                    for k in ("app_offset", "committed_offset", "lo_offset")
                    if offsets[k] >= 0
                ),
                -1,
            )
            if partition >= 0 and fetching and end >= 0 and position >= 0:
                lag[(str(topic), partition)] = max(0, end - position)
    return lag


class _Server(ThreadingMixIn, WSGIServer):
    """A threading WSGI server whose threads never hold the process up."""

    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Say nothing."""


class _Live(Collector):
    """Gauges read when scraped: consumer lag, readiness, waiting, loop age."""

    def __init__(self, metrics: StageMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> Iterable[Metric]:
        """The families (no samples), so registering does not collect."""
        return list(self._families())

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "ledger_consumer_lag",
            "Records not yet consumed per input partition (last stable offset - position)",
            labels=["stage", "topic", "partition"],
        )
        yield GaugeMetricFamily(
            "ledger_stage_ready", "1 when /readyz answers 200, else 0", labels=["stage"]
        )
        yield GaugeMetricFamily(
            "ledger_stage_waiting_for_kafka",
            "1 while the stage waits for Kafka to answer, else 0",
            labels=["stage"],
        )
        yield GaugeMetricFamily(
            "ledger_unverifiable_held",
            "Keys (operations, approvals) held because evidence about them cannot be "
            "verified with this stage's keys",
            labels=["stage"],
        )
        yield GaugeMetricFamily(
            "ledger_loop_age_seconds",
            "Seconds since the stage's loop last went round (0 before it starts)",
            labels=["stage"],
        )
        yield GaugeMetricFamily(
            "ledger_stranded_operations",
            "Operations on the processor's partitions stranded short of where they should "
            "rest, by reason (ledger.stranded; LEDGER_STRANDED_*_S)",
            labels=["stage", "reason"],
        )
        yield GaugeMetricFamily(
            "ledger_stranded_oldest_age_seconds",
            "Age of the oldest stranded operation, by reason (seconds; 0 when none)",
            labels=["stage", "reason"],
        )

    def collect(self) -> Iterable[Metric]:
        """The current values."""
        m = self.metrics
        stage = m.component
        lag, ready, waiting, held, age, stranded, oldest = self._families()
        for (topic, partition), value in sorted(m.lag.items()):
            lag.add_metric([stage, topic, str(partition)], value)
        ready.add_metric([stage], 1.0 if m.readiness()[0] else 0.0)
        waiting.add_metric([stage], 1.0 if m.waiting() else 0.0)
        held.add_metric([stage], float(len(m._held())))
        age.add_metric([stage], m.loop_age_s())
        summary = m.stranded()
        if summary is not None:  # only the processor owns operations
            for reason, count in sorted(summary.count.items()):
                stranded.add_metric([stage, str(reason)], float(count))
                oldest.add_metric([stage, str(reason)], summary.oldest_age_s[reason])
        return [lag, ready, waiting, held, age, stranded, oldest]


class StageMetrics:
    """The metrics and health of one stage (see the module docstring).

    Args:
        component: the stage (``processor`` ...), the ``stage`` label.
        instance: its instance name.
        stall_s: longest pause of the loop ``/healthz`` accepts (seconds).
        ready: True once the stage has its partitions and restored them.
        waiting: what the stage waits for while Kafka does not answer
            (``None`` when it does not wait).
        held: what the stage holds for evidence it cannot verify (key ->
            record and reason, :meth:`consumers.stage.Stage.unverifiable_held`):
            ``/readyz`` answers 503 and ``/healthz`` says so while it is not
            empty, and the ``ledger_unverifiable_held`` gauge counts it.
    """

    def __init__(
        self,
        component: str,
        instance: str,
        *,
        stall_s: float = 120.0,
        ready: Callable[[], bool] = lambda: False,
        waiting: Callable[[], object] = lambda: None,
        held: Callable[[], dict[str, str]] = dict,
    ) -> None:
        self.component = component
        self._held = held
        #: the stranded operations' summary (the processor sets it; ``None``: none owned).
        self.stranded: Callable[[], StrandedSummary | None] = lambda: None
        self.instance = instance
        self.stall_s = stall_s
        self._ready = ready
        self._waiting = waiting
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.info = Info("ledger_stage", "The stage this process runs", ["stage"], registry=r)
        self.records = Counter(
            "ledger_records", "Input records consumed and committed", ["stage"], registry=r
        )
        self.transitions = Counter(
            "ledger_transitions",
            "Recovery state changes the processor committed (from NONE: a new operation)",
            ["stage", "from_state", "to_state"],
            registry=r,
        )
        self.refusals = Counter(
            "ledger_refusals",
            "Inputs refused: by the processor (operating event kind) or the authority (reason)",
            ["stage", "reason"],
            registry=r,
        )
        self.operating_events = Counter(
            "ledger_operating_events",
            "Operating events committed, by kind",
            ["stage", "kind"],
            registry=r,
        )
        self.unknown_outcomes = Gauge(
            "ledger_unknown_outcomes_open",
            "Operations in UNKNOWN_OUTCOME on the processor's partitions",
            ["stage"],
            registry=r,
        )
        self.dispatches = Counter(
            "ledger_dispatches",
            "Dispatches the relay performed against a sink, by what it observed",
            ["stage", "sink", "kind", "outcome"],
            registry=r,
        )
        self.sink_seconds = Histogram(
            "ledger_sink_request_seconds",
            "Time to perform one dispatch against its sink (seconds)",
            ["stage", "sink", "outcome"],
            buckets=SINK_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "ledger_transaction_commit_seconds",
            "Time of commit_transaction, retries included (seconds)",
            ["stage"],
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.aborts = Counter(
            "ledger_transaction_aborts",
            "Transactions that did not commit, by librdkafka's error class",
            ["stage", "error"],
            registry=r,
        )
        self.fencings = Counter(
            "ledger_fencings",
            "Transactions Kafka refused because a newer producer took this one's identity",
            ["stage"],
            registry=r,
        )
        self.restore_seconds = Histogram(
            "ledger_restore_seconds",
            "Restores of state after an assignment or a failed producer "
            "(seconds; _count: restores)",
            ["stage"],
            buckets=RESTORE_BUCKETS,
            registry=r,
        )
        self.clock_refusals = Counter(
            "ledger_clock_readings_refused",
            "Clock readings refused as far from the stage's other sources of time "
            "(never used as the time; see LEDGER_CLOCK_MAX_SKEW_S)",
            ["stage", "clock"],
            registry=r,
        )
        r.register(_Live(self))
        #: (topic, partition) -> consumer lag, from the latest librdkafka statistics.
        self.lag: dict[tuple[str, int], int] = {}
        #: monotonic time of the loop's last turn (``None``: not started).
        self.last_beat: float | None = None
        #: monotonic time a restore began (``None``: not restoring).
        self.restoring_since: float | None = None
        #: counts of the open transaction: (counter, label values) -> amount.
        self._staged: dict[tuple[Counter, tuple[str, ...]], float] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        #: the port served on (``None``: not serving).
        self.port: int | None = None

    # ------------------------------------------------------------------ counting

    def describe_stage(self, group: str, transactional_id: str) -> None:
        """Set ``ledger_stage_info`` (instance name, consumer group, transactional ID)."""
        self.info.labels(self.component).info(
            {"ledger_instance": self.instance, "group": group, "transactional_id": transactional_id}
        )

    def _stage(self, counter: Counter, *labels: str, amount: float = 1.0) -> None:
        key = (counter, (self.component, *labels))
        self._staged[key] = self._staged.get(key, 0.0) + amount

    def written(self, topic: str, event: Event | None) -> None:
        """A record was written into the open transaction: count what it says, on commit.

        Operating events count by kind; journal entries that applied a change
        count as transitions; refused admission decisions count as refusals.
        """
        if isinstance(event, OperatingEvent):
            self._stage(self.operating_events, event.kind)
        elif isinstance(event, JournalEntry) and event.outcome == "APPLIED":
            self._stage(self.transitions, event.from_state or "NONE", event.to_state or "NONE")
        elif isinstance(event, AdmissionDecision) and not event.admitted:
            self._stage(self.refusals, reason_label(event.reason))

    def refused(self, reason: str) -> None:
        """The open transaction refuses an input for ``reason`` (counted on commit)."""
        self._stage(self.refusals, reason)

    def committed(self, seconds: float) -> None:
        """The open transaction committed after ``seconds``: its counts become visible."""
        self.commit_seconds.labels(self.component).observe(seconds)
        staged, self._staged = self._staged, {}
        for (counter, labels), amount in staged.items():
            counter.labels(*labels).inc(amount)

    def failed(self, error_class: str, *, fenced: bool) -> None:
        """The open transaction did not commit (``retriable``, ``abortable`` or ``fatal``)."""
        self._staged = {}
        self.aborts.labels(self.component, error_class).inc()
        if fenced:
            self.fencings.labels(self.component).inc()

    def consumed(self, count: int) -> None:
        """``count`` input records were processed and their offsets committed."""
        self.records.labels(self.component).inc(count)

    def dispatched(self, sink: str, kind: str, outcome: str, seconds: float) -> None:
        """The relay performed a dispatch of ``kind`` at ``sink``, observing ``outcome``."""
        self.dispatches.labels(self.component, sink, kind, outcome).inc()
        self.sink_seconds.labels(self.component, sink, outcome).observe(seconds)

    def clock_refused(self, clock: str) -> None:
        """A reading of the ``clock`` (``system``/``manual``) was refused (counted at once)."""
        self.clock_refusals.labels(self.component, clock).inc()

    def restoring(self) -> None:
        """A restore of state begins (``/healthz`` stays 200, ``/readyz`` 503 meanwhile)."""
        self.restoring_since = time.monotonic()

    def restored(self) -> None:
        """The restore begun by :meth:`restoring` is done."""
        if self.restoring_since is not None:
            self.restore_seconds.labels(self.component).observe(
                time.monotonic() - self.restoring_since
            )
        self.restoring_since = None

    def beat(self) -> None:
        """The loop goes round."""
        self.last_beat = time.monotonic()

    def on_stats(self, stats_json: str) -> None:
        """Librdkafka's ``stats_cb``: refresh the consumer lag (bad JSON is logged, not raised)."""
        try:
            self.lag = consumer_lag(stats_json)
        except ValueError as exc:
            log.debug("%s: unreadable librdkafka statistics: %s", self.component, exc)

    def consumer_settings(self) -> dict[str, Any]:
        """Extra consumer configuration: statistics for the lag while metrics are served."""
        if self._server is None:
            return {}
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_stats}

    # ------------------------------------------------------------------ health

    def waiting(self) -> bool:
        """True while the stage waits for Kafka to answer."""
        return self._waiting() is not None

    def loop_age_s(self) -> float:
        """Seconds since the loop's last turn (0 before it started)."""
        return 0.0 if self.last_beat is None else time.monotonic() - self.last_beat

    def liveness(self) -> Verdict:
        """``/healthz``: is the loop alive?

        Returns:
            ``(ok, body)``: ok while the loop went round within ``stall_s``
            seconds, or it is starting, restoring or waiting for Kafka; the
            body says which (``state``) and the loop's age in seconds.
        """
        age = self.loop_age_s()
        if self.last_beat is None:
            state = "starting"
        elif self.waiting():
            state = "waiting for Kafka"
        elif self.restoring_since is not None:
            state = "restoring"
        elif age <= self.stall_s:
            state = "running"
        else:
            state = "stalled"
        body: dict[str, Any] = {
            "state": state,
            "loop_age_s": round(age, 3),
            "stall_s": self.stall_s,
        }
        held = self._held()
        if held:
            body["unverifiable_held"] = len(held)
            body["unverifiable"] = dict(sorted(held.items())[:10])
        return state != "stalled", body

    def readiness(self) -> Verdict:
        """``/readyz``: has the stage its partitions, restored, and does Kafka answer?"""
        if self.restoring_since is not None:
            return False, {"state": "restoring"}
        if self.waiting():
            return False, {"state": "waiting for Kafka", "waiting": self._waiting()}
        if not self._ready():
            return False, {"state": "not assigned or not restored yet"}
        held = self._held()
        if held:
            return False, {
                "state": f"holding {len(held)} key(s) on evidence its keys cannot verify "
                "(restore the keys folder this ledger's records were sealed with, then restart)",
                "unverifiable_held": len(held),
                "unverifiable": dict(sorted(held.items())[:10]),
            }
        return True, {"state": "ready"}

    # ------------------------------------------------------------------ serving

    def app(self) -> Callable[..., Iterable[bytes]]:
        """The WSGI application: ``/metrics``, ``/healthz``, ``/readyz``; 404 elsewhere."""
        metrics_app = make_wsgi_app(self.registry)

        def verdict(start_response: Callable[..., Any], answer: Verdict) -> list[bytes]:
            ok, body = answer
            payload = json.dumps(
                {"ok": ok, "stage": self.component, "instance": self.instance, **body},
                default=str,
            ).encode()
            start_response(
                "200 OK" if ok else "503 Service Unavailable",
                [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))],
            )
            return [payload]

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO") or "/"
            if path == "/metrics":
                result: Iterable[bytes] = metrics_app(environ, start_response)
                return result
            if path == "/healthz":
                return verdict(start_response, self.liveness())
            if path == "/readyz":
                return verdict(start_response, self.readiness())
            body = b"not found: try /metrics, /healthz or /readyz\n"
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [body]

        return app

    def serve(self, host: str, port: int) -> int:
        """Serve the endpoints on ``host:port`` from a daemon thread.

        Args:
            host: the address to listen on (``0.0.0.0``: every interface).
            port: the port; ``0`` takes any free one.

        Returns:
            The port it listens on.

        Raises:
            SettingsError: the port cannot be taken (in use by another
                process, e.g. a second stage on this host with the same
                ``LEDGER_METRICS_PORT``).
        """
        try:
            server = make_server(
                host, port, self.app(), server_class=_Server, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise SettingsError(
                f"{self.component}-{self.instance}: cannot serve metrics on {host}:{port} "
                f"({exc.strerror or exc}); give each stage process on a host its own "
                "LEDGER_METRICS_PORT (or 0 for any free port)",
                observed=f"{host}:{port}",
            ) from exc
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever,
            name=f"metrics-{self.component}-{self.instance}",
            daemon=True,
        )
        self._thread.start()
        log.info(
            "%s-%s: metrics on http://%s:%s/metrics (and /healthz, /readyz)",
            self.component,
            self.instance,
            host,
            self.port,
        )
        return self.port

    def close(self) -> None:
        """Stop serving (no-op when not serving)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        self.port = None
