"""Auditor replay speed and processor memory.

5. **Auditor replay** — :func:`consumers.auditor.run_audit` (without sink
   readback) over a ledger the end-to-end benchmark filled: events it reads
   per second (journal, state, dispatches, recovery receipts). Baseline: a raw
   ``read_committed`` consume of the same topics from the beginning plus a
   fastavro decode of every value (writer schema found by its fingerprint),
   nothing else.
7. **Memory** — a processor process restoring ``ledger.state`` holding
   ``n`` verified operations: its resident memory once ready, minus that of
   a processor restoring an empty ledger, per operation.
"""

from __future__ import annotations

import io
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from fastavro import schemaless_reader

from bench.common import create, drop, preload, rss_kb, sample_intent, settings_for
from consumers.auditor import run_audit
from ledger.events import OperationState
from ledger.fold import decide
from ledger.kafka import consumer_config
from ledger.serde import HEADER_LEN, registry
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState
from testbed.harness import Harness

#: Topics the auditor reads.
AUDITED = ("journal", "state", "dispatches", "recovery-receipts")


def raw_decode(settings: LedgerSettings) -> dict[str, Any]:
    """Consume the audited topics from the beginning and fastavro-decode every value."""
    reg = registry()
    count = 0
    started = time.perf_counter()
    for short in AUDITED:
        full = settings.topic(short)
        consumer = Consumer(
            consumer_config(
                settings, f"{settings.topic_prefix}.rawreplay", extra={"fetch.wait.max.ms": 10}
            )
        )
        ends = {}
        for p in range(settings.partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(full, p), timeout=10)
            if high > 0:
                ends[p] = high
        consumer.assign([TopicPartition(full, p, OFFSET_BEGINNING) for p in ends])
        done: set[int] = set()
        while len(done) < len(ends):
            for msg in consumer.consume(1000, 0.02):
                if msg.error() is not None:
                    continue
                value = msg.value()
                if value:
                    writer = reg.by_fingerprint[value[2:HEADER_LEN]]
                    schemaless_reader(io.BytesIO(value[HEADER_LEN:]), writer.parsed)
                    count += 1
            for tp in consumer.position([TopicPartition(full, p) for p in ends if p not in done]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
        consumer.close()
    elapsed = time.perf_counter() - started
    return {"events": count, "seconds": elapsed, "per_s": count / elapsed}


def auditor_replay(settings: LedgerSettings) -> dict[str, Any]:
    """The auditor's events per second over the same topics (no sink readback)."""
    started = time.perf_counter()
    report = run_audit(settings, read_sinks=False)
    elapsed = time.perf_counter() - started
    return {
        "seconds": elapsed,
        "violations": len(report.violations),
        "journal_entries": report.journal_entries,
        "operations": report.operations,
    }


def verified_state(i: int) -> OperationState:
    """A typical resting state: the fold's state for a refund intent, read back and verified."""
    recorded = decide(None, sample_intent(i), "bench").state
    assert recorded is not None
    return recorded.model_copy(
        update={
            "state": RecoveryState.OUTCOME_VERIFIED,
            "version": 6,
            "epoch": 1,
            "admitted_approval_id": recorded.approval_id,
            "admitted_policy_version": 1,
            "admitted_at_ms": 1_760_000_000_000,
            "approval_expires_at_ms": 1_760_086_400_000,
            "reason": "read back: committed",
            "owner": "relay-0",
            "effect_id": f"pay-{i:08d}",
            "observation_source": "readback",
            "observation_status": "committed",
            "observed_at_ms": 1_760_000_001_000,
            "dispatches": 1,
        }
    )


def _processor_rss(base: LedgerSettings, n: int) -> int:
    settings = settings_for(base, f"memory{n}")
    create(settings)
    harness = Harness(settings, create=False)
    try:
        if n:
            preload(
                settings,
                "state",
                ((f"refund:{i:06d}:v1", verified_state(i).to_bytes()) for i in range(n)),
            )
        harness.start("processor")
        harness.wait_quiescent(timeout_s=300)  # ready = assigned and restored
        return rss_kb(harness.procs["processor-0"].pid)
    finally:
        harness.stop()
        drop(settings)


def memory(base: LedgerSettings, n: int) -> dict[str, Any]:
    """Processor resident memory per operation in state (bytes), from ``n`` operations."""
    empty = _processor_rss(base, 0)
    full = _processor_rss(base, n)
    return {
        "operations": n,
        "rss_empty_kb": empty,
        "rss_full_kb": full,
        "bytes_per_operation": (full - empty) * 1024 / n,
        "mb_per_100k": (full - empty) / 1024 * 100_000 / n,
    }
