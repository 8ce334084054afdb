"""A stage's metrics and health endpoints (no broker: the stage's seams are called directly)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from consumers.metrics import (
    METRICS,
    StageMetrics,
    consumer_lag,
    dispatch_outcome,
    reason_label,
    refusal_kind,
)
from consumers.processor import Processor
from consumers.stage import Record
from ledger.errors import SettingsError
from ledger.events import AdmissionDecision, JournalEntry, OperatingEvent
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from tests.helpers import intent, keyed, readback, receipt, state


def _samples(metrics: StageMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(metrics: StageMetrics, name: str, **labels: str) -> float:
    key = (name, tuple(sorted({"stage": metrics.component, **labels}.items())))
    return _samples(metrics).get(key, 0.0)


def _journal(outcome: str, from_state: str | None, to_state: str) -> JournalEntry:
    return JournalEntry(
        operation_id="op-1",
        seq=1,
        kind="Intent",
        outcome=outcome,  # type: ignore[arg-type]
        from_state=from_state,
        to_state=to_state,
        reason="r",
        input_topic="intents",
        input_partition=0,
        input_offset=0,
        input_event=b"",
    )


def _event(kind: str) -> OperatingEvent:
    return OperatingEvent(event_id=f"e-{kind}", component="processor", kind=kind, reason="r")


def test_counts_of_a_transaction_appear_when_it_commits_and_vanish_when_it_aborts() -> None:
    m = StageMetrics("processor", "0")
    m.written("journal", _journal("APPLIED", None, "NOT_ADMITTED"))
    m.written("journal", _journal("NOOP", "ADMITTED", "ADMITTED"))
    m.written("operating-events", _event("FORBIDDEN_TRANSITION"))
    m.refused("FORBIDDEN_TRANSITION")
    transition = {"from_state": "NONE", "to_state": "NOT_ADMITTED"}
    assert _value(m, "ledger_transitions_total", **transition) == 0  # not committed yet
    m.committed(0.02)
    assert _value(m, "ledger_transitions_total", **transition) == 1
    assert _value(m, "ledger_operating_events_total", kind="FORBIDDEN_TRANSITION") == 1
    assert _value(m, "ledger_refusals_total", reason="FORBIDDEN_TRANSITION") == 1
    assert _value(m, "ledger_transaction_commit_seconds_count") == 1
    # A no-op is no transition.
    assert _value(m, "ledger_transitions_total", from_state="ADMITTED", to_state="ADMITTED") == 0

    m.written("journal", _journal("APPLIED", "NOT_ADMITTED", "ADMITTED"))
    m.failed("abortable", fenced=False)
    m.committed(0.01)  # the next transaction commits: the aborted one's counts are gone
    assert (
        _value(m, "ledger_transitions_total", from_state="NOT_ADMITTED", to_state="ADMITTED") == 0
    )
    assert _value(m, "ledger_transaction_aborts_total", error="abortable") == 1
    m.failed("fatal", fenced=True)
    assert _value(m, "ledger_fencings_total") == 1


def test_two_stages_in_one_process_keep_separate_registries() -> None:
    a, b = StageMetrics("processor", "0"), StageMetrics("processor", "1")
    a.consumed(5)
    assert _value(a, "ledger_records_total") == 5
    assert _value(b, "ledger_records_total") == 0


def test_every_declared_metric_is_exported_and_every_exported_one_declared() -> None:
    m = StageMetrics("relay", "0")
    m.describe_stage("ledger.relay", "ledger.relay.0")
    exported = {
        family.name
        for family in text_string_to_metric_families(generate_latest(m.registry).decode())
    }
    declared = {
        name.removesuffix("_total") if kind == "counter" else name
        for name, (kind, _) in METRICS.items()
    }
    assert exported == declared


def test_refusal_reasons_are_bounded_labels() -> None:
    assert reason_label("amount exceeds approval scope: amount 500, approved up to 100") == (
        "AMOUNT_EXCEEDS_APPROVAL_SCOPE"
    )
    assert reason_label("approval not found") == "APPROVAL_NOT_FOUND"
    assert reason_label(": nothing") == "UNSPECIFIED"
    assert refusal_kind(["x", _event("STALE_FENCING_TOKEN")]) == "STALE_FENCING_TOKEN"
    assert refusal_kind([]) == "UNSPECIFIED"
    m = StageMetrics("authority", "0")
    refused = AdmissionDecision(
        operation_id="op-1",
        approval_id="ap-1",
        parameter_digest="d",
        admitted=False,
        reason="approval has expired",
        evaluated_at_ms=1,
        policy_version=1,
        decided_by="authority-0",
    )
    m.written("admissions", refused)
    m.written("admissions", refused.model_copy(update={"admitted": True, "reason": "admitted"}))
    m.committed(0.01)
    assert _value(m, "ledger_refusals_total", reason="APPROVAL_HAS_EXPIRED") == 1
    assert _value(m, "ledger_refusals_total", reason="ADMITTED") == 0


def test_dispatch_outcomes_come_from_the_receipt_or_readback() -> None:
    assert dispatch_outcome([receipt("op", "d", status="AMBIGUOUS")]) == "AMBIGUOUS"
    assert dispatch_outcome([_event("X"), readback("op", "d", status="ABSENT")]) == "ABSENT"
    assert dispatch_outcome([_event("X")]) == "NONE"
    # A reservation that expired and was taken again: the outcome is the confirmation.
    expired = receipt("op", "d", status="EXPIRED")
    assert dispatch_outcome([expired, receipt("op", "d", status="COMMITTED")]) == "COMMITTED"
    m = StageMetrics("relay", "0")
    m.dispatched("payments", "EXECUTE", "COMMITTED", 0.03)
    assert (
        _value(m, "ledger_dispatches_total", sink="payments", kind="EXECUTE", outcome="COMMITTED")
        == 1
    )
    assert _value(m, "ledger_sink_request_seconds_count", sink="payments", outcome="COMMITTED") == 1


def test_consumer_lag_is_read_per_partition_from_librdkafka_statistics() -> None:
    def part(**offsets: object) -> dict[str, object]:
        return {"fetch_state": "active", **offsets}

    stats = {
        "topics": {
            "ledger.dispatches": {
                "partitions": {
                    # read up to 6 of 10 stable records (the high watermark is further)
                    "0": part(ls_offset=10, hi_offset=12, app_offset=6, committed_offset=2),
                    # nothing read yet: counted from the committed offset
                    "1": part(ls_offset=5, app_offset=-1001, committed_offset=3),
                    # a group that never committed starts at the first offset
                    "2": part(ls_offset=4, app_offset=-1001, committed_offset=-1001, lo_offset=0),
                    # offsets not known yet
                    "3": part(ls_offset=-1001, hi_offset=-1001, app_offset=-1001),
                    # librdkafka's internal partition, and one not fetched
                    "-1": part(ls_offset=9, app_offset=0),
                    "4": {"fetch_state": "none", "ls_offset": 9, "app_offset": 0},
                }
            },
            "ledger.intents": {"partitions": {"2": part(ls_offset=7, app_offset=7)}},
        }
    }
    assert consumer_lag(json.dumps(stats)) == {
        ("ledger.dispatches", 0): 4,
        ("ledger.dispatches", 1): 2,
        ("ledger.dispatches", 2): 4,
        ("ledger.intents", 2): 0,
    }
    m = StageMetrics("relay", "0")
    m.on_stats(json.dumps(stats))
    m.on_stats("not json")  # kept, not raised
    assert _value(m, "ledger_consumer_lag", topic="ledger.dispatches", partition="0") == 4
    assert consumer_lag("{}") == {}
    assert consumer_lag('{"topics": {"t": {"partitions": {"0": "odd"}}}}') == {}


@pytest.fixture
def served() -> Iterator[tuple[StageMetrics, dict[str, Any]]]:
    state: dict[str, Any] = {"ready": False, "waiting": None}
    m = StageMetrics(
        "processor",
        "0",
        stall_s=60.0,
        ready=lambda: bool(state["ready"]),
        waiting=lambda: state["waiting"],
    )
    m.serve("127.0.0.1", 0)
    yield m, state
    m.close()


def _get(m: StageMetrics, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{m.port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_endpoints_answer_for_the_stage(served: tuple[StageMetrics, dict[str, Any]]) -> None:
    m, state = served
    assert m.consumer_settings()["statistics.interval.ms"] > 0  # lag is gathered while served
    status, body = _get(m, "/metrics")
    assert status == 200 and 'ledger_stage_ready{stage="processor"} 0.0' in body

    status, body = _get(m, "/healthz")
    assert status == 200 and json.loads(body)["state"] == "starting"
    m.beat()
    assert json.loads(_get(m, "/healthz")[1])["state"] == "running"
    m.last_beat = time.monotonic() - 61  # the loop stopped going round
    status, body = _get(m, "/healthz")
    assert status == 503 and json.loads(body)["state"] == "stalled"
    state["waiting"] = {"for": "commit_transaction"}  # ... because Kafka is away: alive
    assert _get(m, "/healthz")[0] == 200
    assert _get(m, "/readyz")[0] == 503

    state["waiting"] = None
    m.beat()
    status, body = _get(m, "/readyz")
    assert status == 503 and json.loads(body)["ok"] is False
    state["ready"] = True
    status, body = _get(m, "/readyz")
    assert status == 200 and json.loads(body) == {
        "ok": True,
        "stage": "processor",
        "instance": "0",
        "state": "ready",
    }
    assert 'ledger_stage_ready{stage="processor"} 1.0' in _get(m, "/metrics")[1]
    m.restoring()
    assert _get(m, "/readyz")[0] == 503 and _get(m, "/healthz")[0] == 200
    m.restored()
    assert _value(m, "ledger_restore_seconds_count") == 1
    assert _get(m, "/nothing")[0] == 404


def test_a_port_in_use_is_a_clear_error(served: tuple[StageMetrics, dict[str, Any]]) -> None:
    m, _ = served
    other = StageMetrics("relay", "0")
    assert m.port is not None
    with pytest.raises(SettingsError, match="its own LEDGER_METRICS_PORT"):
        other.serve("127.0.0.1", m.port)
    assert other.consumer_settings() == {}  # not served: no statistics asked for


class _Producer:
    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self, timeout: float) -> int:
        return 0


def test_the_processor_counts_its_transitions_refusals_and_unknown_outcomes(
    tmp_path: Path,
) -> None:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
    stage.producer = _Producer()  # type: ignore[assignment]
    records = [
        Record("intents", 0, 7, "op-new", b"", intent("op-new")),
        Record("receipts", 1, 3, "op-unknown", b"", receipt("op-unknown", "d-1")),
    ]
    stage.handle(records, stage.writer())
    stage.metrics.committed(0.01)
    stage.after_commit()
    m = stage.metrics
    assert _value(m, "ledger_transitions_total", from_state="NONE", to_state="NOT_ADMITTED") == 1
    refusals = {
        labels: v for (name, labels), v in _samples(m).items() if name == "ledger_refusals_total"
    }
    assert sum(refusals.values()) == 1
    assert _value(m, "ledger_unknown_outcomes_open") == 0
    stage._track_unknown(state("op-held", S.UNKNOWN_OUTCOME))
    assert _value(m, "ledger_unknown_outcomes_open") == 1
    stage.partition_of["op-held"] = 2
    stage.on_revoke({2})
    assert _value(m, "ledger_unknown_outcomes_open") == 0


def test_an_aborted_transaction_is_counted_by_the_stage_and_its_counts_dropped(
    tmp_path: Path,
) -> None:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))

    class _Aborting(_Producer):
        def abort_transaction(self, timeout: float) -> None:
            pass

    class _Unassigned:  # its rewind has nothing to seek
        def assignment(self) -> list[object]:
            return []

    stage.producer = _Aborting()  # type: ignore[assignment]
    stage.consumer = _Unassigned()  # type: ignore[assignment]
    stage.handle([Record("intents", 0, 1, "op-x", b"", intent("op-x"))], stage.writer())
    # A stale generation at send_offsets: the group moved on (a fencing), the batch is redone.
    stale = KafkaError(KafkaError.ILLEGAL_GENERATION, "stale", txn_requires_abort=True)
    stage.loop.recover(KafkaException(stale))
    stage.metrics.committed(0.01)  # a later transaction commits
    m = stage.metrics
    assert _value(m, "ledger_transaction_aborts_total", error="abortable") == 1
    assert _value(m, "ledger_fencings_total") == 1
    assert _value(m, "ledger_transitions_total", from_state="NONE", to_state="NOT_ADMITTED") == 0


def test_the_processor_exports_its_stranded_operations_by_reason_and_oldest_age(
    tmp_path: Path,
) -> None:
    stage = Processor(keyed(LedgerSettings(run_dir=tmp_path, stranded_in_flight_s=60)))
    now = [1_000_000]
    stage.strands._now_ms = lambda: now[0]
    m = stage.metrics
    pending = "ledger_stranded_operations"
    assert _value(m, pending, reason="in_flight_without_owner") == 0
    stage._track_unknown(state("op-a", S.EFFECT_PENDING), at_ms=now[0])
    stage._track_unknown(state("op-b", S.EFFECT_PENDING), at_ms=now[0] - 30_000)
    stage._track_unknown(state("op-c", S.OUTCOME_VERIFIED), at_ms=0)  # rests: never
    assert _value(m, pending, reason="in_flight_without_owner") == 0
    now[0] += 45_000  # op-b is 75 s old, op-a 45 s: only op-b is past 60 s
    assert _value(m, pending, reason="in_flight_without_owner") == 1
    age = "ledger_stranded_oldest_age_seconds"
    assert _value(m, age, reason="in_flight_without_owner") == 75
    # It moves on (its receipt committed): no longer stranded.
    stage._track_unknown(state("op-b", S.OUTCOME_VERIFIED))
    assert _value(m, pending, reason="in_flight_without_owner") == 0
    # Held behind a refused record: stranded once held past its bound (60 s default).
    stage.held["op-h"] = (0, "state:0:9 sealed by a key not held here")
    assert _value(m, pending, reason="held_refused_record") == 0
    now[0] += 61_000
    assert _value(m, pending, reason="held_refused_record") == 1
    assert _value(m, pending, reason="in_flight_without_owner") == 1  # op-a, 106 s now
    stage.partition_of["op-a"] = 1
    stage.on_revoke({1})
    assert _value(m, pending, reason="in_flight_without_owner") == 0
