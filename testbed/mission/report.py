"""The mission report: a pure function of what the sinks and the ledger hold.

:func:`build` takes the facts a finished mission gathered (final states,
effects counted by the sinks themselves, the journal with its Kafka
timestamps, fault-hook firings, the audits) and returns the report as a
JSON-ready dict; :func:`render_text` prints it for a terminal and
:func:`compare_text` puts several side by side. The HTML page comes from
:mod:`testbed.mission.html`.

Every measure carries its denominator and its split by consequence class
(``irreversible`` refunds, ``reversible-external`` notifications and callback
bookings, ``reversible-internal`` goodwill credits and their reversals). Three
sections follow the measures: ``compensations`` (goodwill credits reversed
because their refund was refused), ``reservations`` (callback bookings by how
their hold ended) and ``upgrade`` (the gateway's contract upgrade mid-run: the
refunds that crossed it and those held because of it, with why).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ledger.audit import AuditReport
from ledger.events import (
    Claim,
    Disposition,
    EffectReceipt,
    Event,
    JournalEntry,
    OperationState,
    Readback,
    RecoveryReceipt,
    decode_event,
)
from ledger.fold import replay_decisions
from ledger.states import RecoveryState as S
from testbed.mission.answers import (
    effects_by_sink,
    fault_marks,
    held_operations,
    latency_distribution,
    percentile,
)
from testbed.mission.model import (
    Audits,
    AuditSummary,
    CaseCounts,
    Checks,
    Eligibility,
    FaultCounts,
    Measure,
    MissionHeader,
    MissionReport,
    OperationCounts,
)
from testbed.mission.plan import MISSION_SINKS, PURE_CLASS, SEAM_STAGE, Case, MissionOptions

__all__ = ["JournalRow", "MissionFacts", "build", "compare_text", "percentile", "render_text"]


@dataclass(frozen=True)
class JournalRow:
    """One journal entry with when Kafka stored it.

    Attributes:
        entry: the journal entry.
        at_s: the record's Kafka timestamp (Unix seconds).
        claim_id: the claim's ID when the input was a claim.
        postcondition: the readback status when the input was a postcondition
            readback, or a committed receipt that carries one (the relay's
            readback right after the effect).
        receipt_status: the receipt's status when the input was an effect receipt.
        reservation: the reservation end that receipt records, if any.
        contract_version: the contract version the relay acted under (receipts).
        receipt_key: the receipt's identity (a receipt redelivered to the
            processor is journaled again, as a no-op, under the same key).
    """

    entry: JournalEntry
    at_s: float
    claim_id: str | None = None
    postcondition: str | None = None
    receipt_status: str | None = None
    reservation: str | None = None
    contract_version: int | None = None
    receipt_key: str | None = None

    @classmethod
    def of(cls, event: Event, at_s: float) -> JournalRow:
        """Wrap a decoded journal record.

        Raises:
            TypeError: ``event`` is not a journal entry.
        """
        if not isinstance(event, JournalEntry):
            raise TypeError(f"not a journal entry: {event.KIND}")
        claim_id = postcondition = None
        if event.kind in ("Claim", "Readback"):
            inner = decode_event(event.input_event)
            if isinstance(inner, Claim):
                claim_id = inner.claim_id
            elif isinstance(inner, Readback) and inner.kind == "POSTCONDITION":
                postcondition = inner.status
        elif event.kind == EffectReceipt.KIND:
            receipt = decode_event(event.input_event)
            if isinstance(receipt, EffectReceipt):
                return cls(
                    event,
                    at_s,
                    postcondition=receipt.postcondition_status,
                    receipt_status=str(receipt.status),
                    reservation=receipt.reservation,
                    contract_version=receipt.contract_version,
                    receipt_key=(
                        f"{receipt.attempt_id}|{receipt.status}|{receipt.reservation}|"
                        f"{receipt.observed_at_ms}"
                    ),
                )
        return cls(event, at_s, claim_id, postcondition)


@dataclass(frozen=True)
class MissionFacts:
    """Everything a finished mission observed (input of :func:`build`).

    Attributes:
        options: the mission's options.
        ledger: its topic prefix.
        started_at: ISO-8601 UTC start time.
        wall_s: wall time of the mission up to the audits (seconds).
        peak_rss_mb: peak resident memory of all its processes together (MiB,
            sampled once a second).
        driver_peak_rss_mb: peak resident memory of the workflow process (MiB).
        cases: the planned cases.
        outcomes: case number -> outcome.
        eligibility_evaluations: eligibility decisions made (pure steps).
        states: final ``ledger.state`` per operation.
        effects: sink -> operation -> effects the sink holds.
        sink_stats: sink -> its counters.
        journal: the journal, in order per partition.
        fired: fault-hook firings (``testbed.faults.fired``).
        armed: hooks still armed at the end (never reached).
        chaos_kills: component -> SIGKILLs at arbitrary points.
        zombie_pauses: component -> pauses past the session timeout.
        restarts: stage processes restarted.
        broker_restarts: broker restarts done.
        broker_restart_note: why a planned broker restart did not happen.
        races: ``(operation ID, [claim IDs])`` per resumer race.
        nudge_claims: claims the workflow made on operations that stopped moving.
        stale_dispatches: ``{"operation_id", "token", "refused"}`` per stale dispatch
            sent; ``{"operation_id", "token", "refused": None, "skipped": why}``
            for a race whose loser was not sent one.
        reauth_reasons: reason -> reauthorisations.
        reconciled: the reconciler's results.
        timeline: ``{"t_s", "states"}`` samples (``t_s``: seconds since ``t0_unix``).
        audit_before: the audit before forced compaction.
        audit_after: the audit after it.
        policy_changed_at: cases started when the policy version changed.
        stage_errors: stage -> exits other than by SIGKILL.
        kafka_fenced: stage process -> its transactions Kafka refused as a
            zombie's (group generation gone, producer fenced).
        process_starts: ``(Unix time, stage process name)`` of every start.
        failovers: broker faults (``testbed.mission.chaos.FaultWindow.as_dict``):
            ``kind``, ``target``, ``start`` and ``end`` (Unix seconds; ``end``
            ``None`` when the cluster never became whole again), ``note``,
            ``error``.
        t0_unix: the mission's start (Unix seconds); every time on the
            report is in seconds since it.
        as_of_unix: when the final states were read (Unix seconds; the
            ages of held operations are taken at it).
        fault_events: faults the mission injected itself (chaos kills,
            zombie pauses, broker restarts): ``{"kind", "at", "end", "target"}``
            (Unix seconds; see :func:`testbed.mission.answers.fault_marks`).
        upgrade: the gateway upgrade, ``{"at_case", "from_version",
            "to_version", "in_flight": {operation ID: state at the upgrade}}``,
            or ``None`` when it was not released.
        upgrade_holds: ``{"operation_id", "reason"}`` of every
            ``CONTRACT_UPGRADE_HOLD`` operating event.
        side_ends: side operation (goodwill credit, reversal, booking) -> how
            the workflow saw it end.
        reservation_expiries: times the ledger clock was moved past the
            booking sink's hold while a relay was down.
    """

    options: MissionOptions
    ledger: str
    started_at: str
    wall_s: float
    peak_rss_mb: float
    driver_peak_rss_mb: float
    cases: Sequence[Case]
    outcomes: Mapping[int, str]
    eligibility_evaluations: int
    states: Mapping[str, OperationState]
    effects: Mapping[str, Mapping[str, int]]
    sink_stats: Mapping[str, Mapping[str, int]]
    journal: Sequence[JournalRow]
    fired: Sequence[Mapping[str, Any]]
    armed: Sequence[Mapping[str, Any]]
    chaos_kills: Mapping[str, int]
    zombie_pauses: Mapping[str, int]
    restarts: int
    broker_restarts: int
    broker_restart_note: str
    races: Sequence[tuple[str, list[str]]]
    nudge_claims: Sequence[str]
    stale_dispatches: Sequence[Mapping[str, Any]]
    reauth_reasons: Mapping[str, int]
    reconciled: Sequence[Mapping[str, Any]]
    timeline: Sequence[Mapping[str, Any]]
    audit_before: AuditReport
    audit_after: AuditReport
    policy_changed_at: int | None
    stage_errors: Mapping[str, int]
    kafka_fenced: Mapping[str, int]
    process_starts: Sequence[tuple[float, str]] = ()
    failovers: Sequence[Mapping[str, Any]] = ()
    t0_unix: float = 0.0
    as_of_unix: float = 0.0
    fault_events: Sequence[Mapping[str, Any]] = ()
    upgrade: Mapping[str, Any] | None = None
    upgrade_holds: Sequence[Mapping[str, Any]] = ()
    side_ends: Mapping[str, str] = field(default_factory=dict)
    reservation_expiries: int = 0


def _measure(
    name: str,
    count: int,
    of: int,
    denominator: str,
    by_class: Mapping[str, tuple[int, int]],
    note: str = "",
) -> Measure:
    return Measure(
        name=name,
        count=count,
        of=of,
        denominator=denominator,
        by_class={k: list(v) for k, v in by_class.items()},
        note=note,
    )


def _audit(report: AuditReport) -> AuditSummary:
    return AuditSummary(
        violations=len(report.violations),
        details=[
            f"{v.invariant} {v.operation_id or '-'}: {v.evidence}" for v in report.violations[:200]
        ],
        checked=dict(report.checked),
        operations=report.operations,
        journal_entries=report.journal_entries,
    )


def readback_latencies(
    journal: Sequence[JournalRow],
    fired: Sequence[Mapping[str, Any]],
    starts: Sequence[tuple[float, str]] = (),
) -> tuple[list[float], int]:
    """Latencies of :func:`readback_resumes` (milliseconds) and the unattributed count."""
    resumes, unattributed = readback_resumes(journal, fired, starts)
    return [ms for _begun, _at, ms in resumes], unattributed


def readback_resumes(
    journal: Sequence[JournalRow],
    fired: Sequence[Mapping[str, Any]],
    starts: Sequence[tuple[float, str]] = (),
) -> tuple[list[tuple[float, float, float]], int]:
    """Time from the start of each resume to the authoritative readback that decided it.

    A resume starts at the latest of: the last accepted claim on the
    operation, the last fault-hook firing for it (the crash), and the last
    (re)start of the stage process that made the observation (a restarted
    relay reads back what it may have sent). It ends at the journal entry
    whose decision wrote the recovery receipt. Receipts written from the
    reconciler's end-of-mission readbacks are left out (their operations were
    held on purpose).

    Returns:
        ``([(resume start, readback, latency in milliseconds)], resumes with
        no attributable start)``; times are Unix seconds.
    """
    _, steps = replay_decisions(row.entry for row in journal)
    crash_at: dict[str, list[float]] = defaultdict(list)
    for f in fired:
        crash_at[str(f.get("operation_id"))].append(float(f.get("at", 0.0)))
    last_claim: dict[str, float] = {}
    samples: list[tuple[float, float, float]] = []
    unattributed = 0
    for row, (entry, event, _before, decision) in zip(journal, steps, strict=True):
        op = entry.operation_id
        if entry.kind == "Claim" and entry.outcome == "APPLIED":
            last_claim[op] = row.at_s
        if not any(isinstance(out.event, RecoveryReceipt) for out in decision.outputs):
            continue
        if isinstance(event, Readback | EffectReceipt) and event.observer == "reconciler":
            continue
        begun = [t for t in crash_at.get(op, []) if t <= row.at_s]
        if op in last_claim:
            begun.append(last_claim[op])
        observer = getattr(event, "observer", None)
        begun += [t for t, name in starts if name == observer and t <= row.at_s]
        if not begun:
            unattributed += 1
            continue
        start = max(begun)
        samples.append((start, row.at_s, round((row.at_s - start) * 1000.0, 1)))
    return samples, unattributed


def split_by_failover(
    resumes: Sequence[tuple[float, float, float]], failovers: Sequence[Mapping[str, Any]]
) -> tuple[list[float], list[float]]:
    """Readback latencies of resumes that overlapped a broker failover, and of the others.

    Args:
        resumes: ``(resume start, readback, latency ms)`` (:func:`readback_resumes`).
        failovers: windows with ``start`` and ``end`` (Unix seconds; a window
            without ``start`` was skipped, one without ``end`` never closed).

    Returns:
        ``(during, outside)``: latencies in milliseconds; a resume is during a
        failover when ``[start, readback]`` meets ``[window start, window end]``.
    """
    windows = [
        (float(w["start"]), float(w["end"]) if w.get("end") else math.inf)
        for w in failovers
        if w.get("start")
    ]
    during: list[float] = []
    outside: list[float] = []
    for begun, at, ms in resumes:
        hit = any(begun <= end and at >= start for start, end in windows)
        (during if hit else outside).append(ms)
    return during, outside


def lost_transitions(
    journal: Sequence[JournalRow],
    states: Mapping[str, OperationState],
    effects: Mapping[str, Mapping[str, int]],
) -> set[str]:
    """Operations whose effect a sink holds but the ledger does not.

    The journal is replayed with the processor's fold; every operation with
    at least one effect at a sink must reach a state that records it
    (``EFFECT_COMMITTED``, ``OUTCOME_VERIFIED``, or ``UNKNOWN_OUTCOME``, held
    because it may have happened), and ``ledger.state`` must hold the
    replay's version of it (no transition journaled but lost from the state).

    Args:
        journal: the whole journal, in order per partition.
        states: the final ``ledger.state`` per operation.
        effects: sink -> operation -> effects the sink itself holds.

    Returns:
        The operation IDs that fail (empty when nothing was lost).
    """
    replayed, _ = replay_decisions(row.entry for row in journal)
    recorded = {S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED, S.UNKNOWN_OUTCOME}
    held = {op for ops in effects.values() for op, n in ops.items() if n > 0}
    return {
        op
        for op in held
        if op not in replayed
        or replayed[op].state not in recorded
        or op not in states
        or states[op].version != replayed[op].version
    }


def _latency_summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else None,
    }


def build(f: MissionFacts) -> dict[str, Any]:
    """The mission report as JSON (:meth:`MissionReport.to_json` of :func:`build_model`).

    Returns:
        The dict ``testbed.mission.html.mission_html`` renders; see :func:`build_model`.
    """
    return build_model(f).to_json()


def build_model(f: MissionFacts) -> MissionReport:
    """The mission report as a typed model (:mod:`testbed.mission.model`).

    Returns:
        The report, whose JSON form has ``mission``, ``cases``, ``operations``,
        ``measures``, ``held_operations``, ``effects_by_sink``,
        ``readback_latency_ms`` (with ``p90`` and ``buckets``), ``faults``,
        ``timeline``, ``timeline_events``, ``audit`` and ``checks``; times in
        seconds since the mission's start, all on one clock. The shapes of
        the new parts are those of :mod:`testbed.mission.answers`.
    """
    opts = f.options
    sink_of: dict[str, str] = {}
    case_of: dict[str, int] = {}
    for case in f.cases:
        for op, sink in case.operations().items():
            sink_of[op] = sink
            case_of[op] = case.number
    ops = [op for op in sink_of if op in f.states]

    def cls(op: str) -> str:
        return MISSION_SINKS[sink_of[op]].consequence

    def effects(op: str) -> int:
        return int(f.effects.get(sink_of[op], {}).get(op, 0))

    def split(selected: Sequence[str], hits: set[str]) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for op in selected:
            c, n = out.get(cls(op), (0, 0))
            out[cls(op)] = (c + (op in hits), n + 1)
        return out

    # operations and their final states
    by_state = Counter(str(f.states[op].state) for op in ops)
    by_class: dict[str, dict[str, int]] = defaultdict(dict)
    for op in ops:
        state = str(f.states[op].state)
        by_class[cls(op)][state] = by_class[cls(op)].get(state, 0) + 1
    by_class[PURE_CLASS]["eligibility decisions (pure, not in the ledger)"] = len(f.cases)

    measures: list[Measure] = []

    # duplicate effects, counted by the sinks
    with_effect = [op for op in ops if effects(op) > 0]
    dups = {op for op in with_effect if effects(op) > 1}
    extra = sum(effects(op) - 1 for op in dups)
    measures.append(
        _measure(
            "duplicate effects",
            len(dups),
            len(with_effect),
            "operations with an effect at a sink",
            split(with_effect, dups),
            f"counted by the sinks themselves; {extra} effect(s) beyond the first",
        )
    )

    # unknown outcomes
    ever_unknown = {
        r.entry.operation_id
        for r in f.journal
        if r.entry.to_state == S.UNKNOWN_OUTCOME and r.entry.outcome == "APPLIED"
    }
    still = {op for op in ops if f.states[op].state == S.UNKNOWN_OUTCOME}
    released_by: Counter[str] = Counter()
    for r in f.journal:
        e = r.entry
        if e.from_state == S.UNKNOWN_OUTCOME and e.to_state not in (None, S.UNKNOWN_OUTCOME):
            released_by["disposition" if e.kind == Disposition.KIND else "readback"] += 1
    unknown_ops = sorted(op for op in ops if op in ever_unknown)
    measures.append(
        _measure(
            "unresolved unknown outcomes",
            len(still),
            len(unknown_ops),
            "operations that entered UNKNOWN_OUTCOME",
            split(unknown_ops, still),
            f"held for reconciliation, none released by time; resolved: "
            f"{released_by['readback']} by readback, {released_by['disposition']} by disposition",
        )
    )

    # racing and stale resumers
    claim_outcome = {r.claim_id: r.entry.outcome for r in f.journal if r.claim_id}
    losers = losers_refused = double_winners = undecided = 0
    for _op, claim_ids in f.races:
        applied = sum(1 for c in claim_ids if claim_outcome.get(c) == "APPLIED")
        undecided += sum(1 for c in claim_ids if c not in claim_outcome)
        double_winners += applied > 1
        losers += len(claim_ids) - min(applied, 1)
        losers_refused += sum(1 for c in claim_ids if claim_outcome.get(c) == "REFUSED")
    probed = [s for s in f.stale_dispatches if not s.get("skipped")]
    not_probed = len(f.stale_dispatches) - len(probed)
    stale_sent = len(probed)
    stale_refused = sum(1 for s in probed if s.get("refused"))
    gateway_refusals = sum(int(s.get("stale_rejections", 0)) for s in f.sink_stats.values())
    raced_ops = [op for op, _ in f.races if op in f.states]
    measures.append(
        _measure(
            "stale-resumer rejections",
            losers_refused + stale_refused,
            losers + stale_sent,
            "losing resumers (claims that lost a race, stale dispatches sent)",
            {"irreversible": (losers_refused + stale_refused, losers + stale_sent)},
            f"{len(f.races)} races on {len(raced_ops)} refunds: {double_winners} with two "
            f"winners, {undecided} claims undecided; the sinks refused {gateway_refusals} stale "
            "fencing token(s) in all (zombie relays included)"
            + (
                f"; {not_probed} loser(s) not sent a stale dispatch: their refund is held by "
                "the gateway upgrade, so the winner's newer token never reached the gateway"
                if not_probed
                else ""
            ),
        )
    )

    # reauthorisations
    reauthorised = {op for op in ops if f.states[op].reauthorisations > 0}
    reasons = ", ".join(f"{n} {k}" for k, n in sorted(f.reauth_reasons.items())) or "none"
    measures.append(
        _measure(
            "reauthorisations",
            sum(f.states[op].reauthorisations for op in ops),
            len(ops),
            "operations submitted for admission",
            split(ops, reauthorised),
            f"by reason: {reasons}; policy version 2 from case "
            f"{f.policy_changed_at if f.policy_changed_at is not None else '-'}",
        )
    )

    # postcondition mismatches
    post = [r for r in f.journal if r.postcondition is not None]
    mismatched = {r.entry.operation_id for r in post if r.postcondition == "MISMATCH"}
    post_ops = sorted({r.entry.operation_id for r in post})
    measures.append(
        _measure(
            "postcondition mismatches",
            len(mismatched),
            len(post_ops),
            "operations with a postcondition readback",
            split(post_ops, mismatched),
        )
    )

    # compensations: a goodwill credit is reversed when its refund is refused
    compensations = compensation_section(f, ops)
    reversals = [op for op in ops if f.states[op].compensates is not None]
    failed = {
        op
        for op in reversals
        if S(f.states[op].state) not in (S.OUTCOME_VERIFIED, S.EFFECT_COMMITTED)
    }
    measures.append(
        _measure(
            "compensation failures",
            len(failed),
            len(reversals),
            "compensations published (reversals of a goodwill credit whose refund was refused)",
            split(reversals, failed),
            f"{compensations['refused_with_credit']} refused refund(s) had a goodwill credit; "
            f"{compensations['reversed']} credit(s) reversed, "
            f"{compensations['not_compensated']} not compensated (the credit had not settled); "
            "failures by state: "
            + (
                ", ".join(f"{k} {n}" for k, n in compensations["failures_by_state"].items())
                or "none"
            ),
        )
    )

    # reservations: callback bookings by how their hold ended
    reservations = reservation_section(f, ops)
    bookings = [op for op in ops if MISSION_SINKS[sink_of[op]].reservation]
    unconfirmed = {op for op in bookings if op not in reservations["confirmed_ops"]}
    measures.append(
        _measure(
            "reservations not confirmed",
            len(unconfirmed),
            len(bookings),
            "callback bookings (try-confirm-cancel)",
            split(bookings, unconfirmed),
            f"hold ends journaled: {reservations['ends']['CONFIRMED']} confirmed, "
            f"{reservations['ends']['CANCELLED']} cancelled, {reservations['ends']['EXPIRED']} "
            f"expired (released by the sink itself, reserved again); the sink counts "
            f"{reservations['released_by_sink']} release(s), cancelled or expired",
        )
    )

    # the gateway upgrade
    upgrade = upgrade_section(f)
    if upgrade is not None:
        held_ops = set(upgrade["held_ops"])
        crossing = sorted(set(upgrade["in_flight_ops"]) | held_ops)
        measures.append(
            _measure(
                "operations held by the gateway upgrade",
                len(held_ops),
                len(crossing),
                "refunds in flight when the gateway's contract changed (or held by it)",
                split([op for op in crossing if op in sink_of], held_ops),
                f"version {upgrade['from_version']} -> {upgrade['to_version']} after case "
                f"{upgrade['at_case']}; {upgrade['still_held']} still held at the end; "
                f"{upgrade['steps_held']} step(s) held in all, {upgrade['superseded_steps']} of "
                "them on dispatches already superseded (no effect); "
                + ("; ".join(f"{n}: {why}" for why, n in upgrade["held_by_reason"].items()) or "-"),
            )
        )

    # notifications must describe a verified refund
    refund_of = {c.notify_op: c.refund_op for c in f.cases}
    sent = [op for op in ops if sink_of[op] == "mailer" and effects(op) > 0]
    unverified = {
        op
        for op in sent
        if refund_of[op] not in f.states or f.states[refund_of[op]].state != S.OUTCOME_VERIFIED
    }
    measures.append(
        _measure(
            "notifications describing an unverified refund",
            len(unverified),
            len(sent),
            "notifications sent",
            split(sent, unverified),
        )
    )

    # resumes
    resumed = {op for op in ops if f.states[op].recovery_receipts > 0}
    measures.append(
        _measure(
            "operations resumed with a recovery receipt",
            len(resumed),
            len(ops),
            "operations",
            split(ops, resumed),
            f"{sum(f.states[op].recovery_receipts for op in ops)} recovery receipts in all",
        )
    )

    resumes, unattributed = readback_resumes(f.journal, f.fired, f.process_starts)
    latencies = [ms for _b, _a, ms in resumes]
    during, outside = split_by_failover(resumes, f.failovers)

    effect_ops = sorted({op for held in f.effects.values() for op, n in held.items() if n > 0})
    lost = lost_transitions(f.journal, f.states, f.effects)
    measures.append(
        _measure(
            "lost transitions",
            len(lost),
            len(effect_ops),
            "operations with an effect at a sink",
            split([op for op in effect_ops if op in sink_of], lost),
            "the journal's replay must record every effect the sinks hold "
            "(EFFECT_COMMITTED, OUTCOME_VERIFIED or held UNKNOWN_OUTCOME), and "
            "ledger.state must be at the replay's version",
        )
    )
    deaths = sum(f.stage_errors.values())
    measures.append(
        _measure(
            "stage deaths by error",
            deaths,
            len(f.process_starts),
            "stage process starts",
            {},
            "exits other than the SIGKILLs the mission sends on purpose: "
            + (", ".join(f"{k} {n}" for k, n in sorted(f.stage_errors.items())) or "none"),
        )
    )

    # faults
    kills_by_seam = Counter(str(x.get("seam")) for x in f.fired)
    sink_faults = Counter(
        mode
        for c in f.cases
        for mode, op in (
            (c.refund.sink_fault, c.refund_op),
            (c.notify.sink_fault, c.notify_op),
            (c.goodwill.sink_fault if c.goodwill else None, c.goodwill_op),
            (c.reversal.sink_fault, c.reversal_op),
        )
        if mode is not None and op in f.states
    )
    faults_fired = sum(int(s.get("faults_fired", 0)) for s in f.sink_stats.values())
    unreached = Counter(str(a.get("seam")) for a in f.armed)

    # effects per sink (a case has one operation per sink: two effects at one sink are a duplicate)
    sink_ops: dict[str, list[str]] = {sink: [] for sink in MISSION_SINKS}
    for op in ops:
        sink_ops[sink_of[op]].append(op)
    per_sink = effects_by_sink(
        sink_ops, {s: c.consequence for s, c in MISSION_SINKS.items()}, f.effects
    )

    # held operations and fault marks, on one clock (Unix seconds, shown since the start)
    stamps = [r.at_s for r in f.journal]
    t0 = f.t0_unix or (min(stamps) if stamps else 0.0)
    as_of = f.as_of_unix or (max(stamps) if stamps else t0)
    held = held_operations({op: f.states[op] for op in ops}, f.journal, case_of, as_of, t0)
    marks = fault_marks(f.fired, f.fault_events, f.failovers, t0)

    # checks
    failures: list[str] = []
    outcomes = Counter(f.outcomes.values())
    unfinished = sum(n for o, n in outcomes.items() if o.startswith(("unfinished", "stuck")))
    if unfinished:
        failures.append(f"{unfinished} case(s) did not reach an outcome")
    if f.stage_errors:
        failures.append(f"stage process(es) died of an error: {dict(f.stage_errors)}")
    for w in f.failovers:
        if w.get("error"):
            failures.append(f"broker fault {w['kind']} failed: {w['error']}")
    if opts.mode == "ledger":
        if dups:
            failures.append(f"{len(dups)} operation(s) with duplicate effects")
        if lost:
            failures.append(f"{len(lost)} operation(s) with lost transitions: {sorted(lost)[:5]}")
        if double_winners or losers_refused != losers or stale_refused != stale_sent:
            failures.append(
                f"losing resumers not all fenced: {double_winners} races with two winners, "
                f"{losers_refused}/{losers} losing claims refused, "
                f"{stale_refused}/{stale_sent} stale dispatches refused"
            )
        if unverified:
            failures.append(f"{len(unverified)} notification(s) describe an unverified refund")
        if compensations["missing"]:
            failures.append(
                f"{len(compensations['missing'])} settled goodwill credit(s) of a refused refund "
                f"were not compensated: {compensations['missing'][:5]}"
            )
        if compensations["wrongly_compensated"]:
            failures.append(
                "goodwill credit(s) compensated although the refund was paid: "
                f"{compensations['wrongly_compensated'][:5]}"
            )
        if mismatched:
            failures.append(f"{len(mismatched)} postcondition mismatch(es)")
        for label, audit in (("before", f.audit_before), ("after", f.audit_after)):
            if audit.violations:
                failures.append(f"audit {label} compaction: {len(audit.violations)} violation(s)")
    return MissionReport(
        mission=MissionHeader(
            cases=opts.cases,
            seed=opts.seed,
            crash_rate=opts.crash_rate,
            sink_fault_rate=opts.sink_faults,
            race_rate=opts.races,
            mode=opts.mode,
            instances=opts.instances,
            brokers=opts.brokers,
            broker_chaos=opts.broker_chaos,
            started_at=f.started_at,
            wall_s=round(f.wall_s, 1),
            peak_rss_mb=round(f.peak_rss_mb, 1),
            driver_peak_rss_mb=round(f.driver_peak_rss_mb, 1),
            ledger=f.ledger,
        ),
        cases=CaseCounts(total=len(f.cases), by_outcome=dict(outcomes.most_common())),
        eligibility=Eligibility(
            evaluated=f.eligibility_evaluations,
            eligible=sum(1 for c in f.cases if c.refund_op in f.states),
        ),
        operations=OperationCounts(
            total=len(ops),
            by_state=dict(by_state.most_common()),
            by_class={k: dict(v) for k, v in by_class.items()},
        ),
        measures=measures,
        compensations={k: v for k, v in compensations.items() if not k.endswith("_ops")},
        reservations={k: v for k, v in reservations.items() if not k.endswith("_ops")},
        upgrade=(
            None
            if upgrade is None
            else {k: v for k, v in upgrade.items() if k not in ("in_flight_ops",)}
        ),
        held_operations=held,
        effects_by_sink=per_sink,
        readback_latency_ms={
            **latency_distribution(latencies),
            "unattributed": unattributed,
            "samples": latencies,
            "during_failover": _latency_summary(during),
            "outside_failover": _latency_summary(outside),
        },
        failovers=[dict(w) for w in f.failovers],
        faults=FaultCounts(
            kills_by_seam={s: kills_by_seam.get(s, 0) for s in SEAM_STAGE},
            kills_by_stage=dict(Counter(SEAM_STAGE.get(str(x.get("seam")), "?") for x in f.fired)),
            hooks_never_reached=dict(unreached),
            chaos_kills=sum(f.chaos_kills.values()),
            chaos_kills_by_stage=dict(f.chaos_kills),
            zombie_pauses=sum(f.zombie_pauses.values()),
            zombie_pauses_by_stage=dict(f.zombie_pauses),
            zombie_transactions_fenced_by_kafka=sum(f.kafka_fenced.values()),
            zombie_transactions_fenced_by_stage=dict(f.kafka_fenced),
            sink_faults_by_mode=dict(sink_faults),
            sink_faults_fired=faults_fired,
            broker_restarts=f.broker_restarts,
            broker_restart_note=f.broker_restart_note,
            restarts=f.restarts,
            resumer_races=len(f.races),
            stale_dispatches=stale_sent,
            nudges=len(f.nudge_claims),
        ),
        timeline=list(f.timeline),
        timeline_events=marks,
        reconciled=Counter(str(r.get("observed")) for r in f.reconciled),
        audit=Audits(
            before_compaction=_audit(f.audit_before),
            after_compaction=_audit(f.audit_after),
        ),
        checks=Checks(passed=not failures, failures=failures),
    )


REFUSED = (S.ABANDONED, S.NEEDS_REAUTHORISATION)


def compensation_section(f: MissionFacts, ops: Sequence[str]) -> dict[str, Any]:
    """Goodwill credits and their compensations, case by case.

    A case's credit is due a compensation when its refund was refused
    (``ABANDONED``, or left needing authority) and the credit settled
    (``OUTCOME_VERIFIED`` or ``EFFECT_COMMITTED``).

    Returns:
        ``{"credits", "refused_with_credit", "due", "published", "reversed",
        "not_compensated", "failures_by_state": {state: n}, "missing": [credit
        operation IDs due a compensation that has none], "wrongly_compensated":
        [credits reversed although the refund was paid]}``.
    """
    known = set(ops)
    credits = refused = due = published = reversed_ = not_compensated = 0
    failures: Counter[str] = Counter()
    missing: list[str] = []
    wrong: list[str] = []
    for c in f.cases:
        if c.goodwill is None or c.goodwill_op not in known:
            continue
        credits += 1
        refund = f.states.get(c.refund_op)
        credit = f.states[c.goodwill_op]
        reversal = f.states.get(c.reversal_op)
        refund_refused = refund is not None and S(refund.state) in REFUSED
        if refund_refused:
            refused += 1
        settled = S(credit.state) in (S.OUTCOME_VERIFIED, S.EFFECT_COMMITTED)
        if refund_refused and settled:
            due += 1
            if reversal is None:
                missing.append(c.goodwill_op)
        elif refund_refused:
            not_compensated += 1
        if reversal is not None:
            published += 1
            if refund is not None and S(refund.state) == S.OUTCOME_VERIFIED:
                wrong.append(c.goodwill_op)
            if S(reversal.state) in (S.OUTCOME_VERIFIED, S.EFFECT_COMMITTED):
                reversed_ += 1
            else:
                failures[str(reversal.state)] += 1
    return {
        "credits": credits,
        "refused_with_credit": refused,
        "due": due,
        "published": published,
        "reversed": reversed_,
        "not_compensated": not_compensated,
        "failures_by_state": dict(failures),
        "missing": missing,
        "wrongly_compensated": wrong,
    }


def reservation_section(f: MissionFacts, ops: Sequence[str]) -> dict[str, Any]:
    """Callback bookings by how their holds ended (from the journaled receipts).

    Returns:
        ``{"bookings", "by_state": {state: n}, "ends": {"CONFIRMED",
        "CANCELLED", "EXPIRED": n (journaled hold ends)}, "released_by_sink"
        (the booking sink's own count of releases: cancelled or expired),
        "clock_moves" (times the ledger clock
        passed a hold while a relay was down), "confirmed_ops": [operation IDs]}``.
    """
    bookings = [
        op
        for op in ops
        if MISSION_SINKS.get(f.states[op].sink, MISSION_SINKS["mailer"]).reservation
    ]
    ends: Counter[str] = Counter({"CONFIRMED": 0, "CANCELLED": 0, "EXPIRED": 0})
    wanted = set(bookings)
    seen: set[str] = set()
    for r in f.journal:
        # Every journaled end counts once, applied or not (a confirmation the
        # fold already knew from a readback is journaled as a no-op).
        if r.reservation and r.entry.operation_id in wanted and r.receipt_key not in seen:
            seen.add(r.receipt_key or "")
            ends[r.reservation] += 1
    confirmed = {
        op for op in bookings if S(f.states[op].state) in (S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED)
    }
    released = sum(
        int(f.sink_stats.get(sink, {}).get("reservations_released", 0))
        for sink, contract in MISSION_SINKS.items()
        if contract.reservation
    )
    return {
        "bookings": len(bookings),
        "by_state": dict(Counter(str(f.states[op].state) for op in bookings)),
        "ends": dict(ends),
        "released_by_sink": released,
        "clock_moves": f.reservation_expiries,
        "confirmed_ops": sorted(confirmed),
    }


def upgrade_section(f: MissionFacts) -> dict[str, Any] | None:
    """The gateway's contract upgrade: what was in flight, what crossed, what was held.

    Returns:
        ``None`` when no upgrade was released, else ``{"at_case",
        "from_version", "to_version", "in_flight" (refunds in flight at the
        upgrade), "in_flight_by_state": {state at the upgrade: n},
        "final_state_of_in_flight": {state: n}, "acted_under": {contract
        version: receipts of in-flight refunds}, "held": n (operations a hold
        moved into an unknown outcome), "held_ops": [operation IDs],
        "held_by_reason": {reason: n}, "still_held": n (still
        ``UNKNOWN_OUTCOME`` at the end), "steps_held": n
        (``CONTRACT_UPGRADE_HOLD`` events), "superseded_steps": n (held steps
        of operations no hold moved), "in_flight_ops": [...]}``.
    """
    if f.upgrade is None:
        return None
    in_flight: Mapping[str, str] = f.upgrade.get("in_flight", {})
    acted: Counter[str] = Counter()
    for r in f.journal:
        if r.entry.operation_id in in_flight and r.contract_version is not None:
            acted[str(r.contract_version)] += 1
    # A hold counts when it moved the operation (its journal entry applied);
    # a hold of a dispatch the ledger had already superseded changes nothing.
    held_reason: dict[str, str] = {}
    for r in f.journal:
        e = r.entry
        if e.outcome == "APPLIED" and UPGRADE_HOLD_MARK in e.reason:
            held_reason.setdefault(e.operation_id, e.reason)
    steps = [str(h.get("operation_id")) for h in f.upgrade_holds]
    by_reason = Counter(_upgrade_reason(why) for why in held_reason.values())
    return {
        "at_case": f.upgrade.get("at_case"),
        "from_version": f.upgrade.get("from_version"),
        "to_version": f.upgrade.get("to_version"),
        "in_flight": len(in_flight),
        "in_flight_by_state": dict(Counter(in_flight.values())),
        "final_state_of_in_flight": dict(
            Counter(str(f.states[op].state) for op in in_flight if op in f.states)
        ),
        "acted_under": dict(sorted(acted.items())),
        "held": len(held_reason),
        "held_ops": sorted(held_reason),
        "held_by_reason": dict(by_reason.most_common()),
        "still_held": sum(
            1 for op in held_reason if op in f.states and S(f.states[op].state) == S.UNKNOWN_OUTCOME
        ),
        "steps_held": len(steps),
        "superseded_steps": sum(1 for op in steps if op not in held_reason),
        "in_flight_ops": sorted(in_flight),
    }


#: Words of every reason :func:`ledger.upgrades.upgrade_hold` gives.
UPGRADE_HOLD_MARK = "changed its contract from version"


def _upgrade_reason(reason: str) -> str:
    """A hold's reason from the sink's name on (what the operation and step add is dropped)."""
    at = reason.find(UPGRADE_HOLD_MARK)
    start = reason.rfind(" ", 0, max(at - 1, 0)) + 1 if at > 0 else 0
    return reason[start:][:240]


def _rate(count: int, of: int) -> str:
    return f"{count}/{of}" + (f" ({100 * count / of:.1f}%)" if of else "")


def render_text(report: Mapping[str, Any]) -> str:
    """The report for a terminal: a few aligned tables."""
    m = report["mission"]
    lines = [
        f"mission {m['mode']}: {m['cases']} cases, seed {m['seed']}, "
        f"crash rate {m['crash_rate']}, {m['instances']} instance(s) per stage - "
        f"{m['wall_s']} s, peak RSS {m['peak_rss_mb']} MiB",
        "",
        "cases:",
    ]
    lines += [f"  {n:>6}  {o}" for o, n in report["cases"]["by_outcome"].items()]
    lines += ["", "operations by final state (per consequence class):"]
    for klass, states in report["operations"]["by_class"].items():
        lines.append(f"  {klass}: " + ", ".join(f"{s} {n}" for s, n in states.items()))
    lines += ["", "measures:"]
    for ms in report["measures"]:
        split = "; ".join(f"{k} {_rate(*v)}" for k, v in ms["by_class"].items())
        lines.append(f"  {ms['name']:<48} {_rate(ms['count'], ms['of']):>18}  [{split}]")
        lines.append(
            f"  {'':<48} of {ms['denominator']}" + (f"; {ms['note']}" if ms["note"] else "")
        )
    lines += _side_sections(report)
    per_sink = report.get("effects_by_sink") or {}
    if per_sink:
        lines += ["", "effects by sink (counted by the sinks; one operation per case per sink):"]
        lines.append(
            f"  {'sink':<12} {'class':<22} {'operations':>10} {'effects':>8} {'cases':>6} "
            f"{'duplicates':>10}"
        )
        for sink, e in per_sink.items():
            lines.append(
                f"  {sink:<12} {e['consequence']:<22} {e['operations']:>10} {e['effects']:>8} "
                f"{e['cases']:>6} {e['duplicates']:>10}"
            )
    held = report.get("held_operations")
    if held is not None:
        lines += ["", f"held operations: {len(held)}"]
        for h in held:
            age = "-" if h["age_s"] is None else f"{h['age_s']} s"
            lines.append(
                f"  {h['operation_id']:<22} {h['state']:<22} {h['sink']:<9} held {age:>9}  "
                f"{h['reason'] or '-'}"
            )
    lat = report["readback_latency_ms"]
    lines += [
        "",
        f"time to authoritative readback after a resume: p50 {lat['p50']} ms, "
        f"p90 {lat.get('p90')} ms, p99 {lat['p99']} ms, max {lat['max']} ms over "
        f"{lat['count']} resumes",
    ]
    buckets = lat.get("buckets") or []
    if lat["count"] and buckets:
        width = max(b["count"] for b in buckets) or 1
        for b in buckets:
            bound = f"<= {b['up_to_ms']:g} ms" if b["up_to_ms"] is not None else "longer"
            lines.append(f"  {bound:>12} {b['count']:>6} {'#' * round(30 * b['count'] / width)}")
    if report.get("failovers"):
        d, o = lat["during_failover"], lat["outside_failover"]
        lines += [
            f"  during broker failovers: p50 {d['p50']} ms, p99 {d['p99']} ms over "
            f"{d['count']}; outside: p50 {o['p50']} ms, p99 {o['p99']} ms over {o['count']}",
            "",
            "broker faults:",
        ]
        for w in report["failovers"]:
            span = (
                f"{w.get('start_s')} s -> {w.get('end_s')} s ({w.get('duration_s')} s)"
                if w.get("start")
                else "-"
            )
            extra = w.get("error") or w.get("note") or ""
            lines.append(f"  {w['kind']:<16} {w.get('target', ''):<40} {span}  {extra}")
    fl = report["faults"]
    note = f" ({fl['broker_restart_note']})" if fl["broker_restart_note"] else ""
    lines += [
        "",
        "faults injected:",
        "  kills at seams: " + ", ".join(f"{s} {n}" for s, n in fl["kills_by_seam"].items()),
        f"  chaos kills {fl['chaos_kills']}, zombie pauses {fl['zombie_pauses']}, broker restarts "
        f"{fl['broker_restarts']}{note}, "
        f"stage restarts {fl['restarts']}",
        "  sink faults: " + ", ".join(f"{k} {n}" for k, n in fl["sink_faults_by_mode"].items()),
        f"  resumer races {fl['resumer_races']}, stale dispatches {fl['stale_dispatches']}, "
        f"zombie transactions fenced by Kafka {fl['zombie_transactions_fenced_by_kafka']}",
    ]
    events = report.get("timeline_events")
    if events:
        lines += ["", "faults on the timeline (seconds since the start):"]
        shown = 60
        for ev in events[:shown]:
            span = f"{ev['t_s']}" + (f" -> {ev['end_s']}" if ev.get("end_s") is not None else "")
            lines.append(f"  {span:>16}  {ev['kind']:<15} {ev['target']:<24} {ev['detail']}")
        if len(events) > shown:
            lines.append(f"  ... and {len(events) - shown} more (JSON timeline_events, HTML page)")
    for label, key in (("before", "before_compaction"), ("after", "after_compaction")):
        audit = report["audit"][key]
        lines.append(f"audit {label} compaction: {audit['violations']} violation(s)")
        lines += [f"  {d}" for d in audit["details"][:20]]
    checks = report["checks"]
    lines.append("PASSED" if checks["passed"] else "FAILED: " + "; ".join(checks["failures"]))
    return "\n".join(lines)


def _side_sections(report: Mapping[str, Any]) -> list[str]:
    """The compensation, reservation and upgrade sections for a terminal."""
    lines: list[str] = []
    comp = report.get("compensations")
    if comp:
        failures = ", ".join(f"{k} {n}" for k, n in comp["failures_by_state"].items()) or "none"
        lines += [
            "",
            "compensations (goodwill credits reversed when the refund was refused):",
            f"  goodwill credits {comp['credits']}; refunds refused with a credit "
            f"{comp['refused_with_credit']}; compensations due {comp['due']}, published "
            f"{comp['published']}, reversed {comp['reversed']}; failed: {failures}; "
            f"not compensated (credit not settled) {comp['not_compensated']}",
        ]
    res = report.get("reservations")
    if res:
        ends = res["ends"]
        lines += [
            "",
            "reservations (callback bookings, try-confirm-cancel):",
            f"  bookings {res['bookings']}: "
            + ", ".join(f"{k} {n}" for k, n in res["by_state"].items()),
            f"  hold ends journaled: confirmed {ends.get('CONFIRMED', 0)}, cancelled "
            f"{ends.get('CANCELLED', 0)}, expired {ends.get('EXPIRED', 0)}; released by the "
            f"sink itself {res['released_by_sink']} (relay kept down past the hold "
            f"{res['clock_moves']} time(s))",
        ]
    up = report.get("upgrade")
    if up:
        lines += [
            "",
            f"gateway upgrade: contract version {up['from_version']} -> {up['to_version']} "
            f"after case {up['at_case']}",
            f"  refunds in flight at the upgrade {up['in_flight']} ("
            + ", ".join(f"{k} {n}" for k, n in up["in_flight_by_state"].items())
            + "); their final states: "
            + ", ".join(f"{k} {n}" for k, n in up["final_state_of_in_flight"].items()),
            "  receipts of those refunds by contract version: "
            + (", ".join(f"v{k} {n}" for k, n in up["acted_under"].items()) or "none"),
            f"  held because of the upgrade: {up['held']}",
        ]
        lines += [f"    {n:>5}  {why}" for why, n in up["held_by_reason"].items()]
    return lines


def compare_text(reports: Sequence[Mapping[str, Any]]) -> str:
    """Several mission reports side by side (one column per report)."""
    heads = [f"{r['mission']['mode']} ({r['mission']['instances']}i)" for r in reports]
    width = max(20, *(len(h) for h in heads))
    lines = [f"{'':<48}" + "".join(f"{h:>{width + 2}}" for h in heads)]

    def row(label: str, values: Sequence[str]) -> None:
        lines.append(f"{label:<48}" + "".join(f"{v:>{width + 2}}" for v in values))

    row("cases", [str(r["cases"]["total"]) for r in reports])
    row("operations", [str(r["operations"]["total"]) for r in reports])
    names = [m["name"] for m in reports[0]["measures"]]
    for name in names:
        values = []
        for r in reports:
            ms = next((m for m in r["measures"] if m["name"] == name), None)
            values.append(_rate(ms["count"], ms["of"]) if ms else "-")
        row(name, values)
    sinks = list(dict.fromkeys(s for r in reports for s in r.get("effects_by_sink") or {}))
    for sink in sinks:
        cells = []
        for r in reports:
            e = (r.get("effects_by_sink") or {}).get(sink)
            cells.append(f"{e['effects']} / {e['duplicates']}" if e else "-")
        row(f"{sink}: effects / cases with a duplicate", cells)
    row(
        "held operations",
        [str(len(r["held_operations"])) if "held_operations" in r else "-" for r in reports],
    )
    row(
        "readback after resume p50 / p90 / p99 (ms)",
        [
            " / ".join(
                "-" if (v := r["readback_latency_ms"].get(q)) is None else f"{v:.0f}"
                for q in ("p50", "p90", "p99")
            )
            for r in reports
        ],
    )
    row(
        "audit violations (before / after compaction)",
        [
            f"{r['audit']['before_compaction']['violations']} / "
            f"{r['audit']['after_compaction']['violations']}"
            for r in reports
        ],
    )
    row("wall time (s)", [str(r["mission"]["wall_s"]) for r in reports])
    row("verdict", ["PASSED" if r["checks"]["passed"] else "FAILED" for r in reports])
    return "\n".join(lines)
