"""Shared pieces of the benchmarks: settings, topics, sample records, statistics.

Every benchmark runs against the broker the ledger itself uses
(``LedgerSettings``: ``LEDGER_BOOTSTRAP_SERVERS`` / ``KAFKA_BOOTSTRAP_SERVERS``)
on its own topic prefix, and removes its topics afterwards. Figures are
medians of ``runs`` repetitions; every ledger figure is reported as a ratio
to a baseline measured in the same run on the same broker.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from ledger.events import Approval, Intent
from ledger.kafka import admin_config, producer_config
from ledger.settings import LedgerSettings
from ledger.topics import create_topics
from producers.publisher import build_intent

#: The checkout: the folder that holds ``pyproject.toml``.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


#: Where ``make bench`` writes its results and run folders.
BENCH_DIR = PROJECT_ROOT / "bench"


def settings_for(
    base: LedgerSettings, name: str, *, partitions: int = 3, run_root: Path | None = None
) -> LedgerSettings:
    """Settings of one benchmark ledger: its own topic prefix and run folder.

    The clock is the system clock (as in production); sinks and trusted keys
    live in the run folder.
    """
    tag = uuid.uuid4().hex[:6]
    root = run_root or (base.run_dir / "bench")
    return base.model_copy(
        update={
            "topic_prefix": f"bench-{name}-{tag}",
            "partitions": partitions,
            "run_dir": (root / f"{name}-{tag}").resolve(),
            "clock": "system",
            "sinks_file": None,
            "trusted_keys_file": None,
        }
    )


def create(settings: LedgerSettings) -> None:
    """Create the ledger's topics (and the run folder)."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    create_topics(settings)


def drop(settings: LedgerSettings) -> None:
    """Delete every topic of the benchmark ledger (best effort)."""
    admin = AdminClient(admin_config(settings))
    doomed = [
        n for n in admin.list_topics(timeout=10).topics if n.startswith(settings.topic_prefix + ".")
    ]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            with contextlib.suppress(Exception):
                future.result(timeout=30)


def sample_operation_id(i: int) -> str:
    """Operation ID of the ``i``-th benchmark operation."""
    return f"refund:{i:06d}:v1"


def sample_intent(i: int, approval_id: str | None = None, subject: str | None = None) -> Intent:
    """A typical refund intent (the mission's shape) for operation :func:`sample_operation_id`.

    The amount is in minor currency units (pence).
    """
    op = sample_operation_id(i)
    return build_intent(
        operation_id=op,
        sink="payments",
        action="refund",
        params={"account": f"acct-{i:06d}", "amount_minor": 1500 + i % 9000, "currency": "GBP"},
        actor="svc-remediation",
        subject=subject or f"customer-{i % 997:04d}",
        purpose="fee-remediation",
        decision_version=1,
        approval_id=approval_id or f"auto:{op}",
    )


def sample_approval(intent: Intent, now_ms: int, policy_version: int = 1) -> Approval:
    """An unsigned approval scoped to exactly ``intent`` (valid for a day)."""
    return Approval(
        approval_id=intent.approval_id or "",
        reviewer="policy-engine",
        policy_version=policy_version,
        expires_at_ms=now_ms + 86_400_000,
        scope_subject=intent.subject,
        scope_max_amount_minor=intent.amount_minor,
        scope_operation_id=intent.operation_id,
        granted_at_ms=now_ms,
    )


def preload(settings: LedgerSettings, topic: str, records: Iterable[tuple[str, bytes]]) -> int:
    """Produce ``(key, value)`` records to a ledger topic (idempotent, acks=all).

    Returns:
        How many were written.

    Raises:
        RuntimeError: if some were not delivered.
    """
    producer = Producer(producer_config(settings, **{"queue.buffering.max.messages": 1_000_000}))
    n = 0
    full = settings.topic(topic)
    for key, value in records:
        while True:
            try:
                producer.produce(full, key=key.encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records to {full} were not delivered")
    return n


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by nearest rank; ``nan`` when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return float(ordered[rank - 1])


def repeat(runs: int, once: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Call ``once(run_index)`` ``runs`` times and return the results."""
    return [once(i) for i in range(runs)]


def rss_kb(pid: int) -> int:
    """Resident set size of a process in KiB (``VmRSS``), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def say(message: str) -> None:
    """Progress line on stderr (``make bench`` shows it)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
