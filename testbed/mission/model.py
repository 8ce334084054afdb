"""The mission report as a typed model: what :func:`testbed.mission.report.build` returns.

Frozen dataclasses, one per part of the report; :meth:`MissionReport.to_json`
turns the whole into the JSON-ready dict the text and HTML renderings, the
mission's ``report.json`` and ``ledger mission compare`` read (same keys, in
the same order, as the report has always had). Times are seconds since the
mission's start, latencies milliseconds, sizes MiB.

The parts whose shapes are those of :mod:`testbed.mission.answers` (held
operations, effects by sink, the latency distribution, fault marks) and the
side sections (compensations, reservations, the gateway upgrade) stay plain
mappings, as those modules build them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measure:
    """One measured property: ``count`` of ``of`` (the ``denominator``), split by class.

    Attributes:
        name: what is counted (e.g. ``duplicate effects``).
        count: how many have it.
        of: how many could have it.
        denominator: what ``of`` counts.
        by_class: consequence class -> ``[count, of]``.
        note: a sentence of detail; empty when none.
    """

    name: str
    count: int
    of: int
    denominator: str
    by_class: Mapping[str, list[int]]
    note: str = ""


@dataclass(frozen=True)
class AuditSummary:
    """One audit of the ledger (:class:`ledger.audit.AuditReport`), summarised.

    Attributes:
        violations: how many invariants were violated.
        details: the first 200 violations, one line each.
        checked: invariant -> how many times it was checked.
        operations: operations audited.
        journal_entries: journal entries replayed.
    """

    violations: int
    details: Sequence[str]
    checked: Mapping[str, int]
    operations: int
    journal_entries: int


@dataclass(frozen=True)
class Audits:
    """The audits before and after the compaction the mission forces."""

    before_compaction: AuditSummary
    after_compaction: AuditSummary


@dataclass(frozen=True)
class MissionHeader:
    """What was run: the options, when, for how long and with how much memory.

    Attributes:
        cases: cases planned.
        seed: the plan's random seed.
        crash_rate: share of seams armed with a SIGKILL.
        sink_fault_rate: share of operations given a sink fault.
        race_rate: share of refunds raced by a second resumer.
        mode: ``ledger`` or ``checkpoint-only``.
        instances: instances per stage.
        brokers: Kafka nodes.
        broker_chaos: broker faults hit the cluster while it ran.
        started_at: start time, ISO 8601.
        wall_s: seconds the run took (one decimal).
        peak_rss_mb: the stages' peak resident memory (MiB, one decimal).
        driver_peak_rss_mb: the driver's own peak (MiB, one decimal).
        ledger: the ledger's topic prefix and settings in force.
    """

    cases: int
    seed: int
    crash_rate: float
    sink_fault_rate: float
    race_rate: float
    mode: str
    instances: int
    brokers: int
    broker_chaos: bool
    started_at: str
    wall_s: float
    peak_rss_mb: float
    driver_peak_rss_mb: float
    ledger: Any


@dataclass(frozen=True)
class CaseCounts:
    """Cases in all and by outcome (most common first)."""

    total: int
    by_outcome: Mapping[str, int]


@dataclass(frozen=True)
class Eligibility:
    """Pure eligibility decisions made, and the cases found eligible (given a refund)."""

    evaluated: int
    eligible: int


@dataclass(frozen=True)
class OperationCounts:
    """Ledger operations in all, by final state and by consequence class."""

    total: int
    by_state: Mapping[str, int]
    by_class: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class FaultCounts:
    """The faults the mission injected, and what they reached.

    Attributes:
        kills_by_seam: seam -> SIGKILLs fired there (every seam, 0 included).
        kills_by_stage: stage -> SIGKILLs at its seams.
        hooks_never_reached: seam -> armed kills the run never reached.
        chaos_kills: stage kills from outside (not at a seam), in all.
        chaos_kills_by_stage: the same by stage.
        zombie_pauses: stages paused (SIGSTOP) while a successor took over.
        zombie_pauses_by_stage: the same by stage.
        zombie_transactions_fenced_by_kafka: a paused stage's transactions
            Kafka fenced when it woke.
        zombie_transactions_fenced_by_stage: the same by stage.
        sink_faults_by_mode: planned sink faults by mode.
        sink_faults_fired: sink faults the sinks report having fired.
        broker_restarts: broker restarts during the run.
        broker_restart_note: why (or why not) the broker was restarted.
        restarts: stage restarts.
        resumer_races: races between two resumers.
        stale_dispatches: stale dispatches sent to probe the fencing.
        nudges: claims made to nudge a held operation on.
    """

    kills_by_seam: Mapping[str, int]
    kills_by_stage: Mapping[str, int]
    hooks_never_reached: Mapping[str, int]
    chaos_kills: int
    chaos_kills_by_stage: Mapping[str, int]
    zombie_pauses: int
    zombie_pauses_by_stage: Mapping[str, int]
    zombie_transactions_fenced_by_kafka: int
    zombie_transactions_fenced_by_stage: Mapping[str, int]
    sink_faults_by_mode: Mapping[str, int]
    sink_faults_fired: int
    broker_restarts: int
    broker_restart_note: str | None
    restarts: int
    resumer_races: int
    stale_dispatches: int
    nudges: int


@dataclass(frozen=True)
class Checks:
    """Whether the mission passed, and each failure as a sentence."""

    passed: bool
    failures: Sequence[str]


@dataclass(frozen=True)
class MissionReport:
    """The whole report; :meth:`to_json` gives its JSON form (keys in this order)."""

    mission: MissionHeader
    cases: CaseCounts
    eligibility: Eligibility
    operations: OperationCounts
    measures: Sequence[Measure]
    compensations: Mapping[str, Any]
    reservations: Mapping[str, Any]
    upgrade: Mapping[str, Any] | None
    held_operations: Any
    effects_by_sink: Any
    readback_latency_ms: Mapping[str, Any]
    failovers: Sequence[Mapping[str, Any]]
    faults: FaultCounts
    timeline: Sequence[Any]
    timeline_events: Any
    reconciled: Mapping[str, int]
    audit: Audits
    checks: Checks

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (nested parts as dicts, field order kept)."""
        plain = _plain(self)
        assert isinstance(plain, dict)
        return plain


def _plain(value: Any) -> Any:
    """``value`` with every dataclass in it (in lists too) made a dict, in field order.

    Mappings and other values are kept as they are (not copied):
    :func:`dataclasses.asdict` would rebuild a ``Counter`` from its items,
    which counts the pairs instead of keeping the counts.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
