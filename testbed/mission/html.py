"""Self-contained HTML pages for mission reports, from Jinja2 templates.

The pages are ``testbed/templates/mission.html.j2`` and
``mission_compare.html.j2``, extending the ledger's ``base.html.j2`` (rendered
with :func:`ledger.cli.render.render`, ``packages=("testbed",)``). This module
turns a report into the templates' tables and plots; the templates lay them
out. Each page is one HTML document: inline CSS, plots drawn by matplotlib and
embedded as inline ``<svg>`` elements (:func:`ledger.cli.html.figure_svg`). It
loads nothing from elsewhere and needs no JavaScript.

Every text taken from a report (operation IDs, evidence, outcome names, ...)
is escaped by the templates' autoescaping; cells built here as markup are
:class:`markupsafe.Markup` with their parts escaped. Pages render when
optional keys are missing (older reports); the mission report schema is
described in :func:`mission_html`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from markupsafe import Markup

from ledger.cli.html import _mpl_text, _new_figure, _style, figure_svg
from ledger.cli.render import fmt, render
from ledger.states import RecoveryState

__all__ = ["compare_html", "mission_html"]

_STATE_ORDER = [s.value for s in RecoveryState]

_STATE_COLOURS = {
    "NOT_ADMITTED": "#a6a6a6",
    "ADMITTED": "#9ecae1",
    "EFFECT_PENDING": "#4292c6",
    "EFFECT_COMMITTED": "#74c476",
    "OUTCOME_VERIFIED": "#238b45",
    "UNKNOWN_OUTCOME": "#fd8d3c",
    "NEEDS_REAUTHORISATION": "#9e67bd",
    "ABANDONED": "#d62728",
}

_FALLBACK_COLOURS = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f", "#1f77b4"]

_SERIES_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]

#: Colour and line style of each kind of fault on the timeline.
_EVENT_STYLE: dict[str, tuple[str, str]] = {
    "seam kill": ("#d62728", "-"),
    "seam pause": ("#e377c2", "-"),
    "chaos kill": ("#000000", "--"),
    "zombie pause": ("#9467bd", ":"),
    "broker restart": ("#ff7f0e", "-."),
    "broker fault": ("#8c564b", "-."),
}

#: Timelines longer than this are thinned evenly (first and last points kept)
#: so that the SVG stays small whatever the mission length.
_TIMELINE_MAX_POINTS = 600

_HIST_MAX_BINS = 60

_MISSION_LABELS = {
    "mode": "mode",
    "cases": "cases",
    "seed": "seed",
    "crash_rate": "crash rate (per step)",
    "sink_fault_rate": "sink fault rate (per call)",
    "instances": "instances per stage",
    "started_at": "started at",
    "wall_s": "wall time (s)",
    "peak_rss_mb": "peak RSS (MB)",
    "ledger": "ledger (topic prefix)",
}

_FAULT_LABELS = {
    "kills_by_seam": "process kills by seam",
    "sink_faults_by_mode": "sink faults by mode",
    "chaos_kills": "chaos kills",
    "zombie_pauses": "zombie pauses",
    "zombie_transactions_fenced_by_kafka": "zombie transactions fenced by Kafka",
    "broker_restarts": "broker restarts",
    "restarts": "stage restarts",
    "kills_by_stage": "seam kills by stage",
    "hooks_never_reached": "fault hooks never reached",
    "chaos_kills_by_stage": "chaos kills by stage",
    "zombie_pauses_by_stage": "zombie pauses by stage",
    "zombie_transactions_fenced_by_stage": "zombie transactions fenced, by process",
    "sink_faults_fired": "sink faults fired",
    "broker_restart_note": "broker restart note",
    "resumer_races": "resumer races",
    "stale_dispatches": "stale dispatches sent by losing resumers",
    "nudges": "claims on operations that stopped moving",
}

_AUDIT_PHASES = {
    "before_compaction": "before compaction",
    "after_compaction": "after compaction",
}

_SINK_COLUMNS = (
    ("operations", "operations"),
    ("effects", "effects"),
    ("cases", "cases with an effect"),
    ("duplicates", "cases with a duplicate"),
    ("extra_effects", "effects beyond the first"),
)


def _table(
    headers: Sequence[Any] | None,
    rows: Sequence[Sequence[Any]],
    num: Iterable[int] = (),
    total_last: bool = False,
) -> dict[str, Any]:
    """A table for the templates' ``table`` macro (cells: text, or Markup)."""
    return {"headers": headers, "rows": rows, "num": sorted(num), "total_last": total_last}


def mission_html(report: Mapping[str, Any]) -> str:
    """Render one mission report as a self-contained HTML page.

    The report is the mission's JSON-serialisable dict
    (:func:`testbed.mission.report.build`). ``mission`` and ``checks`` are
    required; every other key is optional and its section says so when it is
    missing. Times are seconds since the mission's start, on one clock.
    Shapes used::

        mission: {cases, seed, crash_rate, sink_fault_rate, mode, instances,
                  started_at, wall_s (s), peak_rss_mb (MB), ledger}
        checks: {passed: bool, failures: [str]}
        cases: {total: int, by_outcome: {outcome: int}}
        operations: {total: int, by_state: {state: int},
                     by_class: {class: {state: int}}}
        measures: [{name, count, of, denominator (text), note (optional),
                    by_class: {class: [count, denominator]}}]
        held_operations: [{operation_id, case, state, sink, reason,
                           since_s, age_s (s)}]
        effects_by_sink: {sink: {consequence, operations, effects, cases,
                          duplicates, extra_effects, by_effects: {"<n>": cases}}}
        readback_latency_ms: {count, p50, p90, p99, max, samples: [float],
                              buckets: [{up_to_ms, count}]} (ms)
        faults: {kills_by_seam: {seam: int}, sink_faults_by_mode: {mode: int},
                 chaos_kills, zombie_pauses, broker_restarts, restarts}
        timeline: [{t_s: float, states: {state: int}}]
        timeline_events: [{t_s, end_s (or null), kind, target, detail}]
        failovers: [{kind, target, start_s, end_s, duration_s, note, error}]
        audit: {before_compaction | after_compaction:
                {violations: int, details: [str], checked: {invariant: int}}}

    Args:
        report: the mission report.

    Returns:
        The page, a complete HTML document (``<!DOCTYPE html>`` first) with up
        to three inline SVG plots: operations by state over time with every
        fault marked, the readback-latency distribution (histogram and CDF
        with p50/p90/p99) and the effects per case at each sink.

    Raises:
        KeyError: when ``mission`` or ``checks`` is missing.
    """
    mission = _map(report["mission"])
    checks = _map(report["checks"])
    events = [_map(e) for e in _list(report.get("timeline_events"))]
    kinds = _ordered([str(e.get("kind", "?")) for e in events], list(_EVENT_STYLE))
    context = {
        "title": f"Mission {mission.get('ledger') or mission.get('seed', '')}".strip(),
        "name": str(mission.get("ledger") or "mission"),
        "passed": bool(checks.get("passed")),
        "failures": [str(f) for f in _list(checks.get("failures"))],
        "params": _mission_params(mission),
        "cases": _cases_table(_map(report.get("cases"))),
        "operations": _operations_table(_map(report.get("operations"))),
        "measures": _measures_table(_list(report.get("measures"))),
        "held": _held_table(report.get("held_operations")),
        "side_tables": _side_tables(report),
        "effects": _effects_table(_map(report.get("effects_by_sink"))),
        "effects_svg": _effects_svg(_map(report.get("effects_by_sink")), "effects"),
        "faults": _faults_tables(_map(report.get("faults"))),
        "latency": _latency(_map(report.get("readback_latency_ms"))),
        "failovers": _failover_table(_list(report.get("failovers"))),
        "events": _events_table(events),
        "event_kinds": [(k, sum(1 for e in events if e.get("kind") == k)) for k in kinds],
        "timeline_svg": _timeline_svg(_list(report.get("timeline")), events, "timeline"),
        "audits": _audits(_map(report.get("audit"))),
    }
    return render("mission.html.j2", packages=("testbed",), **context)


def compare_html(reports: Sequence[Mapping[str, Any]]) -> str:
    """Render several mission reports side by side (one column per report).

    Typically a ledger run and a checkpoint-only run of the same mission.
    Columns are labelled by ``mission.mode`` (with a ``#n`` suffix when two
    reports share a mode). Rows: verdict and parameters, the measures
    (count / denominator, rate in %, per consequence class), effects by sink,
    held operations, cases by outcome, operations by final state, readback
    latency (ms), fault totals and audit violations. Plots: each report's
    operations-by-state timeline with its faults marked.

    Args:
        reports: mission reports, in the shape described in :func:`mission_html`.

    Returns:
        The page, a complete self-contained HTML document.

    Raises:
        ValueError: when ``reports`` is empty.
        KeyError: when a report has no ``mission`` or ``checks``.
    """
    if not reports:
        raise ValueError("compare_html needs at least one mission report; got none")
    missions = [_map(r["mission"]) for r in reports]
    checks = [_map(r["checks"]) for r in reports]
    labels = _column_labels(missions)
    title = f"Mission comparison: {' vs '.join(labels)}"
    sections = [
        ("Missions", _compare_missions(labels, missions, checks), "no missions"),
        ("Measures", _compare_measures(labels, reports), "no measures recorded"),
        ("Effects by sink", _compare_sinks(labels, reports), "no effects by sink recorded"),
        (
            "Cases by outcome",
            _compare_counts(
                labels,
                "outcome",
                [_map(_map(r.get("cases")).get("by_outcome")) for r in reports],
                [_map(r.get("cases")).get("total") for r in reports],
            ),
            "no outcome counts recorded",
        ),
        (
            "Operations by final state",
            _compare_counts(
                labels,
                "state",
                [_map(_map(r.get("operations")).get("by_state")) for r in reports],
                [_map(r.get("operations")).get("total") for r in reports],
                order=_STATE_ORDER,
                state_names=True,
            ),
            "no state counts recorded",
        ),
        ("Readback latency", _compare_latency(labels, reports), ""),
        ("Faults injected", _compare_faults(labels, reports), "no faults recorded"),
        ("Audit violations", _compare_audit(labels, reports), "no audit recorded"),
    ]
    timelines = [
        (
            label,
            _timeline_svg(
                _list(r.get("timeline")),
                [_map(e) for e in _list(r.get("timeline_events"))],
                f"timeline-{n}",
            ),
        )
        for n, (label, r) in enumerate(zip(labels, reports, strict=True))
    ]
    return render(
        "mission_compare.html.j2",
        packages=("testbed",),
        title=title,
        sections=sections,
        timelines=timelines,
    )


# ---------------------------------------------------------------------- one mission


def _mission_params(mission: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [(label, fmt(mission[key])) for key, label in _MISSION_LABELS.items() if key in mission]
    rows += [(str(k), fmt(v)) for k, v in mission.items() if k not in _MISSION_LABELS]
    return rows


def _cases_table(cases: Mapping[str, Any]) -> dict[str, Any] | None:
    by_outcome = _map(cases.get("by_outcome"))
    if not by_outcome:
        return None
    total = cases.get("total", sum(_int(v) for v in by_outcome.values()))
    rows = [[str(k), fmt(v), _rate(v, total)] for k, v in by_outcome.items()]
    rows.append(["total", fmt(total), _rate(total, total)])
    return _table(["outcome", "cases", "share"], rows, num={1, 2}, total_last=True)


def _operations_table(ops: Mapping[str, Any]) -> dict[str, Any] | None:
    by_state = _map(ops.get("by_state"))
    by_class = {str(k): _map(v) for k, v in _map(ops.get("by_class")).items()}
    states = _ordered(list(by_state) + [s for per in by_class.values() for s in per], _STATE_ORDER)
    if not states:
        return None
    classes = list(by_class)
    rows: list[list[Any]] = [
        [_state_cell(s), fmt(by_state.get(s, 0))] + [fmt(by_class[c].get(s, 0)) for c in classes]
        for s in states
    ]
    rows.append(
        ["total", fmt(ops.get("total", sum(_int(v) for v in by_state.values())))]
        + [str(sum(_int(v) for v in by_class[c].values())) for c in classes]
    )
    headers = ["state", "all classes", *classes]
    return _table(headers, rows, num=range(1, len(headers)), total_last=True)


def _measures_table(measures: list[Any]) -> dict[str, Any] | None:
    items = [_map(m) for m in measures]
    if not items:
        return None
    classes = _ordered([str(c) for m in items for c in _map(m.get("by_class"))], [])
    rows = []
    for m in items:
        split = _map(m.get("by_class"))
        rows.append(
            [
                str(m.get("name", "?")),
                fmt(m.get("count")),
                fmt(m.get("of")),
                str(m.get("denominator", "")),
                _rate(m.get("count"), m.get("of")),
            ]
            + [_pair_cell(split.get(c)) for c in classes]
            + [str(m.get("note", ""))]
        )
    headers = ["measure", "count", "of", "denominator", "rate"]
    headers += [f"{c}: count / of (rate)" for c in classes] + ["note"]
    return _table(headers, rows, num={1, 2, 4} | set(range(5, 5 + len(classes))))


def _side_tables(report: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """The compensation, reservation and upgrade sections: ``(title, lead, table)``."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    comp = _map(report.get("compensations"))
    if comp:
        rows = [
            ["goodwill credits", fmt(comp.get("credits"))],
            ["refunds refused with a credit", fmt(comp.get("refused_with_credit"))],
            ["compensations due (credit settled)", fmt(comp.get("due"))],
            ["compensations published", fmt(comp.get("published"))],
            ["credits reversed", fmt(comp.get("reversed"))],
            ["not compensated (credit not settled)", fmt(comp.get("not_compensated"))],
        ]
        rows += [
            [f"failed compensations: {state}", fmt(n)]
            for state, n in _map(comp.get("failures_by_state")).items()
        ]
        lead = (
            "A goodwill credit (reversible-internal) is reversed by its own operation, under a "
            "standing policy approval, when the case's refund is refused."
        )
        out.append(("Compensations", lead, _table(["", "operations"], rows, num={1})))
    res = _map(report.get("reservations"))
    if res:
        ends = _map(res.get("ends"))
        rows = [["callback bookings", fmt(res.get("bookings"))]]
        rows += [[f"final state {k}", fmt(n)] for k, n in _map(res.get("by_state")).items()]
        rows += [[f"holds {k.lower()} (journaled)", fmt(n)] for k, n in ends.items()]
        rows += [
            ["holds released by the sink itself", fmt(res.get("released_by_sink"))],
            ["relay kept down past the hold", fmt(res.get("clock_moves"))],
        ]
        lead = (
            "The booking sink offers try-confirm-cancel: the relay confirms a hold only while "
            "the admission stands, cancels it otherwise, and reserves again a hold the sink "
            "released."
        )
        out.append(("Reservations", lead, _table(["", "count"], rows, num={1})))
    up = _map(report.get("upgrade"))
    if up:
        rows = [
            ["refunds in flight at the upgrade", fmt(up.get("in_flight"))],
            *[[f"  in {k} then", fmt(n)] for k, n in _map(up.get("in_flight_by_state")).items()],
            *[
                [f"  ended {k}", fmt(n)]
                for k, n in _map(up.get("final_state_of_in_flight")).items()
            ],
            *[
                [f"  receipts under version {k}", fmt(n)]
                for k, n in _map(up.get("acted_under")).items()
            ],
            ["held because of the upgrade", fmt(up.get("held"))],
            *[[f"  {why}", fmt(n)] for why, n in _map(up.get("held_by_reason")).items()],
        ]
        lead = (
            f"The payment gateway's contract went from version {up.get('from_version')} to "
            f"{up.get('to_version')} after case {up.get('at_case')}; the release manifest says "
            "which in-flight states may resume under it."
        )
        out.append(("Gateway upgrade", lead, _table(["", "count"], rows, num={1})))
    return out


def _held_table(held: Any) -> dict[str, Any] | None:
    """``None`` when the report does not say (an older report); else a table, maybe empty."""
    if held is None:
        return None
    rows = [
        [
            Markup("<code>{}</code>").format(h.get("operation_id", "?")),
            fmt(h.get("case")),
            _state_cell(str(h.get("state", "?"))),
            str(h.get("sink", "")),
            str(h.get("reason") or "—"),
            fmt(h.get("since_s")),
            fmt(h.get("age_s")),
        ]
        for h in (_map(x) for x in _list(held))
    ]
    return _table(
        ["operation", "case", "state", "sink", "reason", "held since (s)", "age (s)"],
        rows,
        num={1, 5, 6},
    )


def _effects_table(per_sink: Mapping[str, Any]) -> dict[str, Any] | None:
    if not per_sink:
        return None
    rows: list[list[Any]] = []
    totals = dict.fromkeys((k for k, _ in _SINK_COLUMNS), 0)
    for sink, e in per_sink.items():
        e = _map(e)
        rows.append(
            [Markup("<code>{}</code>").format(sink), str(e.get("consequence", ""))]
            + [fmt(e.get(k)) for k, _ in _SINK_COLUMNS]
        )
        for k, _ in _SINK_COLUMNS:
            totals[k] += _int(e.get(k))
    rows.append(["all sinks", ""] + [str(totals[k]) for k, _ in _SINK_COLUMNS])
    headers = ["sink", "consequence class"] + [label for _, label in _SINK_COLUMNS]
    return _table(headers, rows, num=range(2, len(headers)), total_last=True)


def _faults_tables(faults: Mapping[str, Any]) -> dict[str, Any] | None:
    if not faults:
        return None
    tables = []
    scalars = []
    for key in _ordered(list(faults), list(_FAULT_LABELS)):
        value = faults[key]
        label = _FAULT_LABELS.get(key, key)
        if isinstance(value, Mapping):
            rows = [[str(k), fmt(v)] for k, v in value.items()]
            rows.append(["total", str(sum(_int(v) for v in value.values()))])
            head = [key.rsplit("_by_", 1)[-1], "count"]
            tables.append((label, _table(head, rows, num={1}, total_last=True)))
        else:
            scalars.append((label, fmt(value)))
    return {"tables": tables, "scalars": scalars}


def _latency(latency: Mapping[str, Any]) -> dict[str, Any] | None:
    if not latency:
        return None
    rows = [("readbacks", fmt(latency.get("count")))]
    rows += [
        (f"{q} (ms)", fmt(latency.get(q))) for q in ("p50", "p90", "p99", "max") if q in latency
    ]
    if latency.get("unattributed"):
        rows.append(("resumes with no attributable start", fmt(latency.get("unattributed"))))
    for key, label in (("during_failover", "during failovers"), ("outside_failover", "outside")):
        part = _map(latency.get(key))
        if part:
            p50, p99, over = (fmt(part.get(k)) for k in ("p50", "p99", "count"))
            rows.append((f"{label}: p50 / p99 (ms) over n", f"{p50} / {p99} over {over}"))
    buckets = [_map(b) for b in _list(latency.get("buckets"))]
    count = _int(latency.get("count"))
    bucket_rows = []
    below = 0
    for b in buckets:
        n = _int(b.get("count"))
        below += n
        bound = b.get("up_to_ms")
        bucket_rows.append(
            [f"≤ {fmt(bound)}" if bound is not None else "longer", str(n), _rate(below, count)]
        )
    marks = {q: float(latency[q]) for q in ("p50", "p90", "p99") if _is_number(latency.get(q))}
    samples = [float(x) for x in _list(latency.get("samples")) if _is_number(x)]
    return {
        "rows": rows,
        "buckets": _table(["readback within (ms)", "resumes", "cumulative"], bucket_rows, {1, 2})
        if bucket_rows
        else None,
        "svg": _latency_svg(samples, marks, "readback-latency"),
    }


def _failover_table(failovers: list[Any]) -> dict[str, Any] | None:
    if not failovers:
        return None
    rows = []
    for w in (_map(x) for x in failovers):
        rows.append(
            [
                str(w.get("kind", "")),
                str(w.get("target", "")),
                fmt(w.get("start_s")),
                fmt(w.get("end_s")),
                fmt(w.get("duration_s")),
                str(w.get("error") or w.get("note") or ""),
            ]
        )
    return _table(
        ["fault", "target", "start (s)", "end (s)", "duration (s)", "note"], rows, num={2, 3, 4}
    )


def _events_table(events: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    if not events:
        return None
    rows = [
        [
            fmt(e.get("t_s")),
            fmt(e.get("end_s")) if e.get("end_s") is not None else "",
            _kind_cell(str(e.get("kind", "?"))),
            str(e.get("target", "")),
            str(e.get("detail", "")),
        ]
        for e in events
    ]
    return _table(["at (s)", "until (s)", "fault", "target", "detail"], rows, num={0, 1})


def _audits(audit: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key in _ordered(list(audit), list(_AUDIT_PHASES)):
        phase = _map(audit[key])
        checked = _map(phase.get("checked"))
        out.append(
            {
                "label": _AUDIT_PHASES.get(key, key),
                "count": _int(phase.get("violations")),
                "checked": _table(
                    ["invariant", "facts checked"],
                    [[str(k), fmt(v)] for k, v in checked.items()],
                    num={1},
                )
                if checked
                else None,
                "details": [str(d) for d in _list(phase.get("details"))],
            }
        )
    return out


# ---------------------------------------------------------------------- comparison


def _column_labels(missions: Sequence[Mapping[str, Any]]) -> list[str]:
    bases = [str(m.get("mode") or f"report {n}") for n, m in enumerate(missions, 1)]
    return [f"{b} #{n}" if bases.count(b) > 1 else b for n, b in enumerate(bases, 1)]


def _compare_missions(
    labels: list[str], missions: list[Mapping[str, Any]], checks: list[Mapping[str, Any]]
) -> dict[str, Any]:
    verdicts = []
    for c in checks:
        cell = _badge(bool(c.get("passed")))
        failures = [str(f) for f in _list(c.get("failures"))]
        if failures:
            items = Markup("").join(Markup("<li>{}</li>").format(f) for f in failures)
            cell += Markup('<ul class="failures">{}</ul>').format(items)
        verdicts.append(cell)
    keys = _ordered([k for m in missions for k in m], list(_MISSION_LABELS))
    rows: list[list[Any]] = [["checks", *verdicts]]
    rows += [
        [_MISSION_LABELS.get(k, k)] + [fmt(m.get(k)) for m in missions] for k in keys if k != "mode"
    ]
    return _table(["", *labels], rows)


def _compare_measures(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> Any:
    per_report = [
        {str(_map(m).get("name", "?")): _map(m) for m in _list(r.get("measures"))} for r in reports
    ]
    names = _ordered([n for ms in per_report for n in ms], [])
    if not names:
        return None
    rows = []
    for name in names:
        found = [ms[name] for ms in per_report if name in ms]
        denominator = next((str(m["denominator"]) for m in found if m.get("denominator")), "")
        first = Markup("{}").format(name)
        if denominator:
            first += Markup('<div class="sub">of {}</div>').format(denominator)
        cells: list[Any] = [first]
        for ms in per_report:
            m = ms.get(name)
            if m is None:
                cells.append("—")
                continue
            count, of = m.get("count"), m.get("of")
            cell = Markup("{} / {} ({})").format(fmt(count), fmt(of), _rate(count, of))
            for cls, pair in _map(m.get("by_class")).items():
                cell += Markup('<div class="sub">{}: {}</div>').format(cls, _pair_cell(pair))
            cells.append(cell)
        rows.append(cells)
    return _table(["measure (count / of, rate)", *labels], rows, num=range(1, len(labels) + 1))


def _compare_sinks(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> Any:
    per = [_map(r.get("effects_by_sink")) for r in reports]
    sinks = _ordered([str(s) for p in per for s in p], [])
    if not sinks:
        return None
    rows = []
    for sink in sinks:
        for key, label in _SINK_COLUMNS:
            values = [fmt(_map(p.get(sink)).get(key)) if sink in p else "—" for p in per]
            rows.append([Markup("<code>{}</code> {}").format(sink, label), *values])
    return _table(["", *labels], rows, num=range(1, len(labels) + 1))


def _compare_counts(
    labels: list[str],
    what: str,
    counts: list[Mapping[str, Any]],
    totals: list[Any],
    order: Sequence[str] = (),
    state_names: bool = False,
) -> Any:
    keys = _ordered([str(k) for c in counts for k in c], order)
    if not keys:
        return None
    rows: list[list[Any]] = [
        [_state_cell(k) if state_names else k] + [fmt(c.get(k, 0)) for c in counts] for k in keys
    ]
    rows.append(
        ["total"]
        + [
            fmt(t) if t is not None else str(sum(_int(v) for v in c.values()))
            for c, t in zip(counts, totals, strict=True)
        ]
    )
    return _table([what, *labels], rows, num=range(1, len(labels) + 1), total_last=True)


def _compare_latency(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> Any:
    lat = [_map(r.get("readback_latency_ms")) for r in reports]
    rows = [
        [label] + [fmt(x.get(key)) for x in lat]
        for key, label in (
            ("count", "readbacks"),
            ("p50", "p50 (ms)"),
            ("p90", "p90 (ms)"),
            ("p99", "p99 (ms)"),
            ("max", "max (ms)"),
        )
    ]
    return _table(["", *labels], rows, num=range(1, len(labels) + 1))


def _compare_faults(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> Any:
    faults = [_map(r.get("faults")) for r in reports]
    keys = _ordered([k for f in faults for k in f], list(_FAULT_LABELS))
    rows = []
    for key in keys:
        label = _FAULT_LABELS.get(key, key)
        cells = []
        for f in faults:
            value = f.get(key)
            if isinstance(value, Mapping):
                cells.append(str(sum(_int(v) for v in value.values())))
            else:
                cells.append(fmt(value))
        rows.append([label + (" (total)" if "_by_" in key else ""), *cells])
    held = [r.get("held_operations") for r in reports]
    if any(h is not None for h in held):
        rows.append(
            ["held operations", *(fmt(len(_list(h))) if h is not None else "—" for h in held)]
        )
    if not rows:
        return None
    return _table(["", *labels], rows, num=range(1, len(labels) + 1))


def _compare_audit(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> Any:
    audits = [_map(r.get("audit")) for r in reports]
    keys = _ordered([k for a in audits for k in a], list(_AUDIT_PHASES))
    if not keys:
        return None
    rows = [
        [_AUDIT_PHASES.get(k, k)]
        + [fmt(_map(a.get(k)).get("violations")) if k in a else "—" for a in audits]
        for k in keys
    ]
    return _table(["", *labels], rows, num=range(1, len(labels) + 1))


# ---------------------------------------------------------------------- plots


def _timeline_svg(
    timeline: list[Any], events: Sequence[Mapping[str, Any]], name: str
) -> str | None:
    """Stacked area of operations per state, every fault marked; x in seconds since the start.

    Instants (kills) are vertical lines, spans (zombie pauses, broker
    restarts and faults) shaded bands with a line at their start; one legend
    entry per state and per kind of fault.
    """
    points = []
    for p in timeline:
        point = _map(p)
        if _is_number(point.get("t_s")):
            points.append((float(point["t_s"]), _map(point.get("states"))))
    if not points:
        return None
    points.sort(key=lambda p: p[0])
    points = _thin(points, _TIMELINE_MAX_POINTS)
    states = _ordered([str(s) for _, st in points for s in st], _STATE_ORDER)
    if not states:
        return None
    xs = [t for t, _ in points]
    ys = [[float(_int(st.get(s, 0))) for _, st in points] for s in states]
    marks = [e for e in events if _is_number(e.get("t_s"))]
    with _style():
        fig = _new_figure(height_in=3.6)
        ax = fig.add_subplot()
        ax.stackplot(
            xs, ys, labels=[_mpl_text(s) for s in states], colors=_state_colours(states), lw=0
        )
        kinds = _ordered([str(e.get("kind", "?")) for e in marks], list(_EVENT_STYLE))
        for n, kind in enumerate(kinds):
            colour, dash = _EVENT_STYLE.get(kind, (_FALLBACK_COLOURS[n % 6], "-"))
            style: Any = dash  # one of matplotlib's line-style names
            mine = [e for e in marks if str(e.get("kind", "?")) == kind]
            starts = [float(e["t_s"]) for e in mine]
            ax.vlines(
                starts,
                0,
                1,
                transform=ax.get_xaxis_transform(),
                colors=colour,
                linestyles=style,
                linewidth=0.9,
                alpha=0.8,
                label=_mpl_text(f"{kind} ({len(mine)})"),
            )
            for e in mine:
                if _is_number(e.get("end_s")) and float(e["end_s"]) > float(e["t_s"]):
                    ax.axvspan(float(e["t_s"]), float(e["end_s"]), color=colour, alpha=0.12, lw=0)
        right = max([xs[-1], *(float(e["t_s"]) for e in marks)])
        ax.set_xlabel("seconds since the mission's start")
        ax.set_ylabel("operations")
        ax.set_xlim(min(xs[0], 0.0), right if right > xs[0] else xs[0] + 1)
        ax.margins(y=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
        return figure_svg(fig, name)


def _latency_svg(samples_ms: list[float], marks: Mapping[str, float], name: str) -> str | None:
    """Histogram and cumulative distribution of latencies (ms), p50/p90/p99 marked on both."""
    finite = sorted(x for x in samples_ms if math.isfinite(x))
    if not finite:
        return None
    bins = max(5, min(_HIST_MAX_BINS, round(math.sqrt(len(finite)) * 2)))
    colours = dict(zip(("p50", "p90", "p99"), ("#238b45", "#ff7f0e", "#d62728"), strict=True))
    with _style():
        fig = _new_figure(height_in=3.0)
        hist, cdf = fig.subplots(1, 2)
        hist.hist(finite, bins=bins, color="#4292c6", edgecolor="white", linewidth=0.5)
        hist.set_xlabel("readback latency (ms)")
        hist.set_ylabel("resumes")
        ys = [(i + 1) / len(finite) for i in range(len(finite))]
        cdf.step(finite, ys, where="post", color="#4292c6", linewidth=1.2)
        cdf.set_xlabel("readback latency (ms)")
        cdf.set_ylabel("share of resumes at or below")
        cdf.set_ylim(0, 1.02)
        for label, value in marks.items():
            colour = colours.get(label, "#7f7f7f")
            for ax in (hist, cdf):
                ax.axvline(
                    value,
                    color=colour,
                    linestyle="--",
                    linewidth=1.1,
                    label=_mpl_text(f"{label} {value:.0f} ms") if ax is cdf else None,
                )
        if marks:
            cdf.legend(loc="lower right", frameon=False, fontsize=8)
        return figure_svg(fig, name)


def _effects_svg(per_sink: Mapping[str, Any], name: str) -> str | None:
    """Cases per number of effects at each sink: one bar group per count, one colour per sink."""
    series = {str(s): _map(_map(e).get("by_effects")) for s, e in per_sink.items()}
    series = {s: c for s, c in series.items() if c}
    if not series:
        return None
    keys = sorted({str(k) for c in series.values() for k in c}, key=_effects_key)
    width = 0.8 / len(series)
    with _style():
        fig = _new_figure(width_in=max(5.0, min(11.0, 2.0 + 0.6 * len(keys) * len(series))))
        ax = fig.add_subplot()
        ax.grid(axis="x", visible=False)
        for n, (sink, counts) in enumerate(series.items()):
            offsets = [i + (n - (len(series) - 1) / 2) * width for i in range(len(keys))]
            bars = ax.bar(
                offsets,
                [_int(counts.get(k, 0)) for k in keys],
                width=width,
                label=_mpl_text(sink),
                color=_SERIES_COLOURS[n % len(_SERIES_COLOURS)],
            )
            ax.bar_label(bars, fontsize=7, padding=1)
        ax.set_xticks(range(len(keys)), [_mpl_text(k) for k in keys])
        ax.set_xlabel("effects of a case at one sink (counted by the sink; 2 or more: duplicate)")
        ax.set_ylabel("cases")
        ax.legend(frameon=False)
        return figure_svg(fig, name)


# ---------------------------------------------------------------------- helpers


def _state_colours(states: Sequence[str]) -> list[str]:
    out = []
    spare = iter(_FALLBACK_COLOURS * (1 + len(states) // len(_FALLBACK_COLOURS)))
    for s in states:
        out.append(_STATE_COLOURS.get(s) or next(spare))
    return out


def _thin(points: list[tuple[float, Mapping[str, Any]]], limit: int) -> list[Any]:
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


def _effects_key(key: str) -> tuple[int, float, str]:
    try:
        return (0, float(key), key)
    except ValueError:
        return (1, 0.0, key)


def _badge(ok: bool) -> Markup:
    return Markup('<span class="badge {}">{}</span>').format(
        "pass" if ok else "fail", "PASSED" if ok else "FAILED"
    )


def _state_cell(state: str) -> Markup:
    colour = _STATE_COLOURS.get(state, "#ccc")
    return Markup(
        '<span style="display:inline-block;width:.8em;height:.8em;background:{};'
        'margin-right:.4em;border-radius:2px"></span><code>{}</code>'
    ).format(colour, state)


def _kind_cell(kind: str) -> Markup:
    colour = _EVENT_STYLE.get(kind, ("#7f7f7f", "-"))[0]
    return Markup(
        '<span style="display:inline-block;width:.8em;height:.25em;background:{};'
        'margin-right:.4em;vertical-align:middle"></span>{}'
    ).format(colour, kind)


def _pair_cell(pair: Any) -> Any:
    """``[count, denominator]`` as ``count / of (rate)``; anything else as text."""
    if isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2:
        return Markup("{} / {} ({})").format(fmt(pair[0]), fmt(pair[1]), _rate(pair[0], pair[1]))
    return "—" if pair is None else fmt(pair)


def _rate(count: Any, of: Any) -> Markup:
    """``count / of`` as a percentage, or ``—`` when undefined."""
    if not (_is_number(count) and _is_number(of)) or float(of) == 0:
        return Markup("—")
    return Markup("{}&nbsp;%").format(f"{100.0 * float(count) / float(of):.3g}")


def _ordered(keys: Iterable[str], order: Sequence[str]) -> list[str]:
    """Unique keys: those in ``order`` first (in that order), then the rest as met."""
    seen = list(dict.fromkeys(keys))
    known = [k for k in order if k in seen]
    return known + [k for k in seen if k not in order]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _int(value: Any) -> int:
    return int(value) if _is_number(value) else 0
