"""Scraping live stages on the real broker: the endpoints answer, and the counters
move with the work (and the JSON log lines name the stage and the operation)."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.contracts import PAYMENT_GATEWAY
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration

STAGES = ("processor", "authority", "relay")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def _scrape(port: int) -> Samples:
    status, text = _get(port, "/metrics")
    assert status == 200, text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def _until(what: str, check: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def served(
    ledger_settings: LedgerSettings,
) -> Iterator[tuple[Harness, LedgerPublisher, dict[str, int]]]:
    harness = Harness(ledger_settings, create=False)
    ports = {stage: _free_port() for stage in STAGES}
    for stage in STAGES:
        harness.stage_env[stage] = {
            "LEDGER_METRICS_PORT": str(ports[stage]),
            "LEDGER_METRICS_HOST": "127.0.0.1",
            "LEDGER_LOG_FORMAT": "json",
        }
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    try:
        yield harness, pub, ports
    finally:
        pub.close()
        harness.stop()


def test_live_stages_serve_health_readiness_and_counters_that_move_with_the_work(
    served: tuple[Harness, LedgerPublisher, dict[str, int]],
) -> None:
    harness, pub, ports = served
    harness.start_all()
    for stage, port in ports.items():
        _until(f"{stage} /healthz", lambda port=port: _get(port, "/healthz")[0] == 200)
        _until(f"{stage} /readyz", lambda port=port: _get(port, "/readyz")[0] == 200)
        body = json.loads(_get(port, "/readyz")[1])
        assert (body["stage"], body["instance"], body["ok"]) == (stage, "0", True)
        samples = _scrape(port)
        assert _total(samples, "ledger_stage_ready", stage=stage) == 1
        # Assigned and restored: the restore was timed.
        assert _total(samples, "ledger_restore_seconds_count", stage=stage) >= 1
        # The status file names the port (what `ledger console` probes on this host).
        status = json.loads((harness.run_dir / "status" / f"{stage}-0.json").read_text())
        assert status["metrics_port"] == port
    assert _get(ports["relay"], "/nothing")[0] == 404

    before = {stage: _scrape(port) for stage, port in ports.items()}
    assert _total(before["processor"], "ledger_transitions_total") == 0
    assert _total(before["relay"], "ledger_dispatches_total") == 0

    op, refused_op = "refund:metrics:v1", "refund:metrics-refused:v1"
    approve(pub)
    publish(pub, op)
    publish(pub, refused_op, approval="ap-not-granted")
    harness.wait_quiescent(120)

    def verified() -> bool:
        after = _scrape(ports["processor"])
        return _total(after, "ledger_transitions_total", to_state=str(S.OUTCOME_VERIFIED)) >= 1

    _until("the processor to count OUTCOME_VERIFIED", verified)
    processor = _scrape(ports["processor"])
    authority = _scrape(ports["authority"])
    relay = _scrape(ports["relay"])
    created = {"from_state": "NONE", "to_state": str(S.NOT_ADMITTED)}
    assert _total(processor, "ledger_transitions_total", **created) == 2
    assert _total(processor, "ledger_records_total") > 0
    assert _total(processor, "ledger_transaction_commit_seconds_count") > 0
    assert _total(authority, "ledger_refusals_total", reason="APPROVAL_NOT_FOUND") == 1
    assert _total(authority, "ledger_operating_events_total", kind="ADMISSION_REFUSED") == 1
    executed = {"sink": "payments", "kind": "EXECUTE", "outcome": "COMMITTED"}
    assert _total(relay, "ledger_dispatches_total", **executed) == 1
    assert _total(relay, "ledger_sink_request_seconds_count", sink="payments") >= 1
    assert _total(relay, "ledger_transaction_aborts_total") == 0

    # librdkafka's statistics arrive every few seconds: then the lag of each
    # input partition is known (the ledger quiescent: zero).
    def lags() -> dict[frozenset[tuple[str, str]], float]:
        scraped = _scrape(ports["relay"])
        return {labels: v for (n, labels), v in scraped.items() if n == "ledger_consumer_lag"}

    partitions = harness.settings.partitions
    _until("the relay's consumer lag", lambda: len(lags()) == partitions, timeout_s=60)
    assert all(dict(labels)["topic"] == harness.settings.topic("dispatches") for labels in lags())
    assert sum(lags().values()) == 0
    for port in ports.values():
        assert _get(port, "/healthz")[0] == 200

    # The JSON log lines name their stage; the authority's line about the
    # admission names the operation it decided.
    harness.stop()
    for stage in STAGES:
        text = (harness.run_dir / "logs" / f"{stage}-0.log").read_text()
        lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
        assert lines, stage
        assert all(x["stage"] == stage and x["instance"] == "0" for x in lines), stage
        assert all("trace_id" in x and "operation_id" in x for x in lines), stage
    authority_lines = [
        json.loads(x)
        for x in (harness.run_dir / "logs" / "authority-0.log").read_text().splitlines()
        if x.startswith("{")
    ]
    admissions = [x for x in authority_lines if "admission" in x["message"]]
    assert {x["operation_id"] for x in admissions} >= {op, refused_op}
