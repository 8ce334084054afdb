"""The parts of the mission report that answer an operator's questions.

Pure functions over what a finished mission observed (no clock, no I/O):

* :func:`held_operations` - which operations the mission left held, in which
  state, at which sink, why, and for how long;
* :func:`effects_by_sink` - effects counted by each sink, per sink (a refund
  and its notification are two effects at two sinks, not a duplicate);
* :func:`fault_marks` - every kill, zombie pause, broker restart and broker
  fault as an event on the mission's timeline;
* :func:`latency_distribution` - readback latencies as a distribution
  (percentiles and buckets).

One clock: every time here is Unix seconds (the wall clock of the machine
that ran the mission: Kafka record timestamps, fault-hook firings, the
mission's own records), and every time on the report is in seconds since
the mission's start (``t0_unix``) on that same clock.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ledger.events import JournalEntry, OperationState
from ledger.states import RecoveryState as S


class JournalRow(Protocol):
    """A journal entry with when Kafka stored it (``testbed.mission.report.JournalRow``)."""

    @property
    def entry(self) -> JournalEntry:
        """The journal entry."""
        ...

    @property
    def at_s(self) -> float:
        """The record's Kafka timestamp (Unix seconds)."""
        ...


#: Final states that leave an operation held: waiting on a readback or a
#: disposition (``UNKNOWN_OUTCOME``) or on a new approval (``NEEDS_REAUTHORISATION``).
HELD_STATES: tuple[S, ...] = (S.UNKNOWN_OUTCOME, S.NEEDS_REAUTHORISATION)

#: Upper bounds (ms) of the readback-latency buckets; the last bucket is open.
LATENCY_BUCKETS_MS: tuple[float, ...] = (50, 100, 250, 500, 1000, 2000, 5000, 10000, 30000)

#: Kinds of timeline events, in legend order.
EVENT_KINDS: tuple[str, ...] = (
    "seam kill",
    "seam pause",
    "chaos kill",
    "zombie pause",
    "broker restart",
    "broker fault",
)


#: A stage process's arguments as a fault hook logs them (``relay --instance 1``).
_STAGE_ARGS = re.compile(r"(\w+) --instance (\S+)")


def _since_start(at: float | None, t0_unix: float) -> float | None:
    return None if at is None else round(at - t0_unix, 1)


def held_operations(
    states: Mapping[str, OperationState],
    journal: Sequence[JournalRow],
    case_of: Mapping[str, int],
    as_of_unix: float,
    t0_unix: float,
) -> list[dict[str, Any]]:
    """The operations the mission left held, oldest first.

    An operation is held when its final state is one of :data:`HELD_STATES`.
    It has been held since the Kafka timestamp of the last applied journal
    entry that moved it into that state.

    Args:
        states: final ``ledger.state`` per operation.
        journal: the journal with Kafka timestamps (Unix seconds).
        case_of: operation ID -> case number (operations not in it are left out).
        as_of_unix: when the states were read (Unix seconds, same clock).
        t0_unix: the mission's start (Unix seconds).

    Returns:
        ``[{"operation_id", "case", "state", "sink", "reason", "since_s"
        (seconds since the mission's start, ``None`` when the journal has no
        entry for it), "age_s" (seconds held at ``as_of_unix``, never negative,
        ``None`` when unknown)}]``.
    """
    entered: dict[str, float] = {}
    for row in journal:
        e = row.entry
        if e.outcome == "APPLIED" and e.to_state is not None and e.to_state != e.from_state:
            st = states.get(e.operation_id)
            if st is not None and e.to_state == st.state:
                entered[e.operation_id] = row.at_s
    held = []
    for op, st in states.items():
        if op not in case_of or st.state not in HELD_STATES:
            continue
        since = entered.get(op)
        held.append(
            {
                "operation_id": op,
                "case": case_of[op],
                "state": str(st.state),
                "sink": st.sink,
                "reason": st.reason,
                "since_s": _since_start(since, t0_unix),
                "age_s": None if since is None else round(max(0.0, as_of_unix - since), 1),
            }
        )
    held.sort(key=lambda h: (h["since_s"] is None, h["since_s"] or 0.0, h["operation_id"]))
    return held


def effects_by_sink(
    sink_ops: Mapping[str, Sequence[str]],
    consequence: Mapping[str, str],
    effects: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, Any]]:
    """Effects the sinks hold, one entry per sink.

    Every case has at most one operation per sink, so at one sink a case with
    two effects is a duplicate; a refund and its notification are one effect
    at each of two sinks.

    Args:
        sink_ops: sink -> the mission's operations at it (one per case that
            reached it).
        consequence: sink -> its consequence class.
        effects: sink -> operation -> effects the sink itself holds.

    Returns:
        ``{sink: {"consequence", "operations", "effects", "cases" (cases with
        an effect at this sink), "duplicates" (cases with more than one),
        "extra_effects" (effects beyond the first), "by_effects" ({"<n>":
        cases with n effects at this sink})}}``.
    """
    out: dict[str, dict[str, Any]] = {}
    for sink, ops in sink_ops.items():
        held = effects.get(sink, {})
        counts = [int(held.get(op, 0)) for op in ops]
        by_effects = Counter(counts)
        out[sink] = {
            "consequence": consequence.get(sink, ""),
            "operations": len(ops),
            "effects": sum(counts),
            "cases": sum(1 for n in counts if n > 0),
            "duplicates": sum(1 for n in counts if n > 1),
            "extra_effects": sum(n - 1 for n in counts if n > 1),
            "by_effects": {str(n): by_effects[n] for n in sorted(by_effects)},
        }
    return out


def fault_marks(
    fired: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    failovers: Sequence[Mapping[str, Any]],
    t0_unix: float,
) -> list[dict[str, Any]]:
    """Every fault of the mission as an event on its timeline, in time order.

    Args:
        fired: fault-hook firings (``testbed.faults.fired``: ``at`` Unix
            seconds, ``seam``, ``operation_id``, ``process``, ``action``
            ``kill`` or ``pause``); a stage's process (``relay --instance 1``)
            is named as the mission names it (``relay-1``).
        events: faults the mission injected itself: ``{"kind": "chaos kill" |
            "zombie pause" | "broker restart", "at": Unix seconds, "end": Unix
            seconds or None (pauses, restarts), "target": str}``.
        failovers: broker-chaos windows (``start``, ``end`` Unix seconds,
            ``kind``, ``target``); a window never started is left out.
        t0_unix: the mission's start (Unix seconds).

    Returns:
        ``[{"t_s", "end_s" (seconds since the start; ``end_s`` ``None`` for an
        instant or an unfinished span), "kind" (one of :data:`EVENT_KINDS`),
        "target", "detail"}]``.
    """
    marks: list[dict[str, Any]] = []
    for f in fired:
        at = f.get("at")
        if not isinstance(at, int | float):
            continue
        pause = f.get("action") == "pause"
        process = str(f.get("process") or "")
        named = _STAGE_ARGS.fullmatch(process)
        marks.append(
            {
                "t_s": _since_start(float(at), t0_unix),
                "end_s": None,
                "kind": "seam pause" if pause else "seam kill",
                "target": f"{named[1]}-{named[2]}" if named else process,
                "detail": f"{f.get('seam', '?')} on {f.get('operation_id', '?')}",
            }
        )
    for e in events:
        end = e.get("end")
        marks.append(
            {
                "t_s": _since_start(float(e["at"]), t0_unix),
                "end_s": _since_start(float(end), t0_unix) if end else None,
                "kind": str(e.get("kind", "?")),
                "target": str(e.get("target", "")),
                "detail": str(e.get("detail", "")),
            }
        )
    for w in failovers:
        if not w.get("start"):
            continue
        end = w.get("end")
        marks.append(
            {
                "t_s": _since_start(float(w["start"]), t0_unix),
                "end_s": _since_start(float(end), t0_unix) if end else None,
                "kind": "broker fault",
                "target": str(w.get("target", "")),
                "detail": str(w.get("kind", "")) + (f": {w['error']}" if w.get("error") else ""),
            }
        )
    marks.sort(key=lambda m: (m["t_s"], m["kind"], m["target"]))
    return marks


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_distribution(samples_ms: Sequence[float]) -> dict[str, Any]:
    """Latencies (ms) as a distribution.

    Returns:
        ``{"count", "p50", "p90", "p99", "max" (ms, ``None`` without
        samples), "buckets": [{"up_to_ms": bound or None (the open last
        bucket), "count"}]}`` with :data:`LATENCY_BUCKETS_MS` as bounds (a
        sample equal to a bound falls in that bound's bucket).
    """
    counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    for ms in samples_ms:
        i = next((k for k, b in enumerate(LATENCY_BUCKETS_MS) if ms <= b), len(LATENCY_BUCKETS_MS))
        counts[i] += 1
    bounds: list[float | None] = [*LATENCY_BUCKETS_MS, None]
    return {
        "count": len(samples_ms),
        "p50": percentile(samples_ms, 50),
        "p90": percentile(samples_ms, 90),
        "p99": percentile(samples_ms, 99),
        "max": max(samples_ms) if samples_ms else None,
        "buckets": [{"up_to_ms": b, "count": n} for b, n in zip(bounds, counts, strict=True)],
    }
