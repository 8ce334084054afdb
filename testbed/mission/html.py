"""Self-contained HTML pages for mission and audit reports.

Each page is one HTML document: inline CSS, plots drawn by matplotlib and
embedded as inline ``<svg>`` elements. It loads nothing from elsewhere (no
CDN, no fonts, no images) and needs no JavaScript, so it can be attached to a
ticket or opened from disk years later.

Plots are drawn on :class:`matplotlib.figure.Figure` objects with the Agg
canvas and never through ``pyplot``: nothing is registered globally, no GUI
backend is touched, and a figure is released when its SVG has been written.

Every text taken from a report (operation IDs, evidence, outcome names, ...)
is HTML-escaped. Pages render when optional keys are missing; the mission
report schema is described in :func:`mission_html`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ledger.cli.html import (
    _e,
    _fmt,
    _int,
    _is_number,
    _kv_table,
    _list,
    _map,
    _mpl_text,
    _new_figure,
    _page,
    _plot_or_empty,
    _style,
    _table,
    figure_svg,
)
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


_TIMELINE_MAX_POINTS = 600


"""Timelines longer than this are thinned evenly (first and last points kept)
so that the SVG stays small whatever the mission length."""


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


def mission_html(report: Mapping[str, Any]) -> str:
    """Render one mission report as a self-contained HTML page.

    The report is the mission's JSON-serialisable dict. ``mission`` and
    ``checks`` are required; every other key is optional and its section says
    so when it is missing. Shapes used::

        mission: {cases, seed, crash_rate, sink_fault_rate, mode, instances,
                  started_at, wall_s (s), peak_rss_mb (MB), ledger}
        checks: {passed: bool, failures: [str]}
        cases: {total: int, by_outcome: {outcome: int}}
        operations: {total: int, by_state: {state: int},
                     by_class: {class: {state: int}}}
        measures: [{name, count, of, denominator (text), note (optional),
                    by_class: {class: [count, denominator]}}]
        readback_latency_ms: {count, p50, p99, max, samples: [float]} (ms)
        faults: {kills_by_seam: {seam: int}, sink_faults_by_mode: {mode: int},
                 chaos_kills, zombie_pauses, broker_restarts, restarts}
        timeline: [{t_s: float (s since start), states: {state: int}}]
        failovers: [{kind, target, start_s, end_s, duration_s (s since start),
                     note, error}] (broker chaos only)
        effects_per_case: {"<effects>": cases}
        audit: {before_compaction | after_compaction:
                {violations: int, details: [str], checked: {invariant: int}}}

    Args:
        report: the mission report.

    Returns:
        The page, a complete HTML document (``<!DOCTYPE html>`` first) with up
        to three inline SVG plots: operations by state over time, the
        readback-latency histogram (ms) and the effects per case.

    Raises:
        KeyError: when ``mission`` or ``checks`` is missing.
    """
    mission = _map(report["mission"])
    checks = _map(report["checks"])
    title = f"Mission {mission.get('ledger') or mission.get('seed', '')}".strip()
    body = [
        _mission_header(mission, checks),
        _cases_section(_map(report.get("cases"))),
        _operations_section(_map(report.get("operations"))),
        _measures_section(_list(report.get("measures"))),
        _faults_section(_map(report.get("faults"))),
        _latency_section(_map(report.get("readback_latency_ms"))),
        _failover_section(_list(report.get("failovers"))),
        _mission_audit_section(_map(report.get("audit"))),
        "<h2>Operations by state over time</h2>",
        _plot_or_empty(
            _timeline_svg(_list(report.get("timeline")), "timeline"), "no timeline recorded"
        ),
        "<h2>Effects per case</h2>",
        _plot_or_empty(
            _effects_svg({"": _map(report.get("effects_per_case"))}, "effects"),
            "no effects per case recorded",
        ),
    ]
    return _page(title, body)


def compare_html(reports: Sequence[Mapping[str, Any]]) -> str:
    """Render several mission reports side by side (one column per report).

    Typically a ledger run and a checkpoint-only run of the same mission.
    Columns are labelled by ``mission.mode`` (with a ``#n`` suffix when two
    reports share a mode). Rows: verdict and parameters, the measures
    (count / denominator, rate in %, per consequence class), cases by outcome,
    operations by final state, readback latency (ms), fault totals and audit
    violations. Plots: the effects per case of every report as one grouped bar
    chart, then each report's operations-by-state timeline.

    Args:
        reports: mission reports, in the shape described in
            :func:`mission_html`.

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
    body = [
        f"<h1>Mission comparison: {_e(' vs '.join(labels))}</h1>",
        _compare_missions(labels, missions, checks),
        _compare_measures(labels, reports),
        _compare_counts(
            "Cases by outcome",
            "outcome",
            labels,
            [_map(_map(r.get("cases")).get("by_outcome")) for r in reports],
            totals=[_map(r.get("cases")).get("total") for r in reports],
        ),
        _compare_counts(
            "Operations by final state",
            "state",
            labels,
            [_map(_map(r.get("operations")).get("by_state")) for r in reports],
            totals=[_map(r.get("operations")).get("total") for r in reports],
            order=_STATE_ORDER,
            state_names=True,
        ),
        _compare_latency(labels, reports),
        _compare_faults(labels, reports),
        _compare_audit(labels, reports),
        "<h2>Effects per case</h2>",
        _plot_or_empty(
            _effects_svg(
                {
                    label: _map(r.get("effects_per_case"))
                    for label, r in zip(labels, reports, strict=True)
                },
                "effects",
            ),
            "no effects per case recorded",
        ),
        "<h2>Operations by state over time</h2>",
    ]
    for n, (label, r) in enumerate(zip(labels, reports, strict=True)):
        body.append(f"<h3>{_e(label)}</h3>")
        body.append(
            _plot_or_empty(
                _timeline_svg(_list(r.get("timeline")), f"timeline-{n}"), "no timeline recorded"
            )
        )
    return _page(f"Mission comparison: {' vs '.join(labels)}", body)


def _mission_header(mission: Mapping[str, Any], checks: Mapping[str, Any]) -> str:
    passed = bool(checks.get("passed"))
    failures = [str(f) for f in _list(checks.get("failures"))]
    badge = '<span class="badge pass">PASSED</span>' if passed else _fail_badge()
    name = mission.get("ledger") or "mission"
    parts = [f"<h1>Mission report: {_e(str(name))} {badge}</h1>"]
    if failures:
        parts.append('<ul class="failures">')
        parts.extend(f"<li>{_e(f)}</li>" for f in failures)
        parts.append("</ul>")
    elif not passed:
        parts.append('<p class="muted">the checks failed without naming a failure</p>')
    parts.append("<h2>Parameters</h2>")
    parts.append(_kv_table(_mission_params(mission)))
    return "\n".join(parts)


def _mission_params(mission: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [(label, _fmt(mission[key])) for key, label in _MISSION_LABELS.items() if key in mission]
    rows += [(str(k), _fmt(v)) for k, v in mission.items() if k not in _MISSION_LABELS]
    return rows


def _cases_section(cases: Mapping[str, Any]) -> str:
    by_outcome = _map(cases.get("by_outcome"))
    head = "<h2>Cases by outcome</h2>"
    if not by_outcome:
        return head + '<p class="empty">no case outcomes recorded</p>'
    total = cases.get("total", sum(_int(v) for v in by_outcome.values()))
    rows = [[_e(str(k)), _fmt(v), _rate(v, total)] for k, v in by_outcome.items()]
    rows.append(["total", _fmt(total), _rate(total, total)])
    return head + _table(["outcome", "cases", "share"], rows, num={1, 2}, total_last=True)


def _operations_section(ops: Mapping[str, Any]) -> str:
    by_state = _map(ops.get("by_state"))
    by_class = {str(k): _map(v) for k, v in _map(ops.get("by_class")).items()}
    head = "<h2>Operations by final state</h2>"
    states = _ordered(list(by_state) + [s for per in by_class.values() for s in per], _STATE_ORDER)
    if not states:
        return head + '<p class="empty">no operations recorded</p>'
    classes = list(by_class)
    rows = [
        [_state_cell(s), _fmt(by_state.get(s, 0))] + [_fmt(by_class[c].get(s, 0)) for c in classes]
        for s in states
    ]
    rows.append(
        ["total", _fmt(ops.get("total", sum(_int(v) for v in by_state.values())))]
        + [str(sum(_int(v) for v in by_class[c].values())) for c in classes]
    )
    headers = ["state", "all classes"] + classes
    return head + _table(headers, rows, num=set(range(1, len(headers))), total_last=True)


def _measures_section(measures: list[Any]) -> str:
    head = "<h2>Measures</h2>"
    items = [_map(m) for m in measures]
    if not items:
        return head + '<p class="empty">no measures recorded</p>'
    classes = _ordered([str(c) for m in items for c in _map(m.get("by_class"))], [])
    rows = []
    for m in items:
        split = _map(m.get("by_class"))
        rows.append(
            [
                _e(str(m.get("name", "?"))),
                _fmt(m.get("count")),
                _fmt(m.get("of")),
                _e(str(m.get("denominator", ""))),
                _rate(m.get("count"), m.get("of")),
            ]
            + [_pair_cell(split.get(c)) for c in classes]
            + [_e(str(m.get("note", "")))]
        )
    headers = ["measure", "count", "of", "denominator", "rate"]
    headers += [f"{c}: count / of (rate)" for c in classes] + ["note"]
    return head + _table(headers, rows, num={1, 2, 4} | set(range(5, 5 + len(classes))))


def _faults_section(faults: Mapping[str, Any]) -> str:
    head = "<h2>Faults injected</h2>"
    if not faults:
        return head + '<p class="empty">no faults recorded</p>'
    tables = []
    scalars = []
    for key in _ordered(list(faults), list(_FAULT_LABELS)):
        value = faults[key]
        label = _FAULT_LABELS.get(key, key)
        if isinstance(value, Mapping):
            rows = [[_e(str(k)), _fmt(v)] for k, v in value.items()]
            rows.append(["total", str(sum(_int(v) for v in value.values()))])
            tables.append(
                f"<div><h3>{_e(label)}</h3>"
                + _table([key.rsplit("_by_", 1)[-1], "count"], rows, num={1}, total_last=True)
                + "</div>"
            )
        else:
            scalars.append((label, _fmt(value)))
    out = head + '<div class="grid">' + "".join(tables)
    if scalars:
        out += "<div><h3>other faults</h3>" + _kv_table(scalars, num=True) + "</div>"
    return out + "</div>"


def _latency_section(latency: Mapping[str, Any]) -> str:
    head = "<h2>Readback latency</h2>"
    if not latency:
        return head + '<p class="empty">no readback latency recorded</p>'
    rows = [
        ("readbacks", _fmt(latency.get("count"))),
        ("p50 (ms)", _fmt(latency.get("p50"))),
        ("p99 (ms)", _fmt(latency.get("p99"))),
        ("max (ms)", _fmt(latency.get("max"))),
    ]
    for key, label in (("during_failover", "during failovers"), ("outside_failover", "outside")):
        part = _map(latency.get(key))
        if part:
            rows.append(
                (f"{label}: p50 / p99 (ms) over n", f"{_fmt(part.get('p50'))} / "
                 f"{_fmt(part.get('p99'))} over {_fmt(part.get('count'))}")
            )  # fmt: skip
    marks = {name: float(latency[name]) for name in ("p50", "p99") if _is_number(latency.get(name))}
    svg = _histogram_svg(
        [float(x) for x in _list(latency.get("samples")) if _is_number(x)],
        marks,
        "readback-latency",
    )
    return head + _kv_table(rows, num=True) + _plot_or_empty(svg, "no latency samples recorded")


def _failover_section(failovers: list[Any]) -> str:
    if not failovers:
        return ""
    rows = []
    for w in failovers:
        w = _map(w)
        rows.append(
            [
                _e(str(w.get("kind", ""))),
                _e(str(w.get("target", ""))),
                _fmt(w.get("start_s")),
                _fmt(w.get("end_s")),
                _fmt(w.get("duration_s")),
                _e(str(w.get("error") or w.get("note") or "")),
            ]
        )
    return "<h2>Broker faults</h2>" + _table(
        ["fault", "target", "start (s)", "end (s)", "duration (s)", "note"], rows, num={2, 3, 4}
    )


def _mission_audit_section(audit: Mapping[str, Any]) -> str:
    head = "<h2>Audit</h2>"
    if not audit:
        return head + '<p class="empty">no audit recorded</p>'
    parts = [head, '<div class="grid">']
    for key in _ordered(list(audit), list(_AUDIT_PHASES)):
        phase = _map(audit[key])
        label = _AUDIT_PHASES.get(key, key)
        count = _int(phase.get("violations"))
        details = [str(d) for d in _list(phase.get("details"))]
        verdict = (
            '<span class="badge pass">CLEAN</span>'
            if count == 0
            else f'<span class="badge fail">{count} VIOLATION{"S" if count != 1 else ""}</span>'
        )
        checked = _map(phase.get("checked"))
        parts.append(f"<div><h3>{_e(label)} {verdict}</h3>")
        if checked:
            rows = [[_e(str(k)), _fmt(v)] for k, v in checked.items()]
            parts.append(_table(["invariant", "facts checked"], rows, num={1}))
        if details:
            parts.append('<ul class="violations">' if count else "<ul>")
            parts.extend(f"<li>{_e(d)}</li>" for d in details)
            parts.append("</ul>")
        elif count:
            parts.append('<p class="muted">no violation details recorded</p>')
        parts.append("</div>")
    parts.append("</div>")
    return "\n".join(parts)


def _column_labels(missions: Sequence[Mapping[str, Any]]) -> list[str]:
    bases = [str(m.get("mode") or f"report {n}") for n, m in enumerate(missions, 1)]
    return [f"{b} #{n}" if bases.count(b) > 1 else b for n, b in enumerate(bases, 1)]


def _compare_missions(
    labels: list[str], missions: list[Mapping[str, Any]], checks: list[Mapping[str, Any]]
) -> str:
    verdicts = []
    for c in checks:
        failures = [str(f) for f in _list(c.get("failures"))]
        cell = '<span class="badge pass">PASSED</span>' if c.get("passed") else _fail_badge()
        if failures:
            cell += '<ul class="failures">' + "".join(f"<li>{_e(f)}</li>" for f in failures)
            cell += "</ul>"
        verdicts.append(cell)
    keys = _ordered([k for m in missions for k in m], list(_MISSION_LABELS))
    rows = [["checks", *verdicts]]
    rows += [
        [_e(_MISSION_LABELS.get(k, k))] + [_fmt(m.get(k)) for m in missions]
        for k in keys
        if k != "mode"
    ]
    return "<h2>Missions</h2>" + _table(["", *labels], rows)


def _compare_measures(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> str:
    head = "<h2>Measures</h2>"
    per_report = [
        {str(_map(m).get("name", "?")): _map(m) for m in _list(r.get("measures"))} for r in reports
    ]
    names = _ordered([n for ms in per_report for n in ms], [])
    if not names:
        return head + '<p class="empty">no measures recorded</p>'
    rows = []
    for name in names:
        found = [ms[name] for ms in per_report if name in ms]
        denominator = next((str(m["denominator"]) for m in found if m.get("denominator")), "")
        first = _e(name) + (f'<div class="sub">of {_e(denominator)}</div>' if denominator else "")
        cells = [first]
        for ms in per_report:
            m = ms.get(name)
            if m is None:
                cells.append("—")
                continue
            count, of = m.get("count"), m.get("of")
            cell = f"{_fmt(count)} / {_fmt(of)} ({_rate(count, of)})"
            for cls, pair in _map(m.get("by_class")).items():
                cell += f'<div class="sub">{_e(str(cls))}: {_pair_cell(pair)}</div>'
            cells.append(cell)
        rows.append(cells)
    headers = ["measure (count / of, rate)", *labels]
    return head + _table(headers, rows, num=set(range(1, len(headers))))


def _compare_counts(
    title: str,
    what: str,
    labels: list[str],
    counts: list[Mapping[str, Any]],
    totals: list[Any],
    order: Sequence[str] = (),
    state_names: bool = False,
) -> str:
    keys = _ordered([str(k) for c in counts for k in c], order)
    head = f"<h2>{_e(title)}</h2>"
    if not keys:
        return head + f'<p class="empty">no {_e(what)} counts recorded</p>'
    rows = [
        [_state_cell(k) if state_names else _e(k)] + [_fmt(c.get(k, 0)) for c in counts]
        for k in keys
    ]
    rows.append(
        ["total"]
        + [
            _fmt(t) if t is not None else str(sum(_int(v) for v in c.values()))
            for c, t in zip(counts, totals, strict=True)
        ]
    )
    return head + _table([what, *labels], rows, num=set(range(1, len(labels) + 1)), total_last=True)


def _compare_latency(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> str:
    lat = [_map(r.get("readback_latency_ms")) for r in reports]
    rows = [
        [label] + [_fmt(x.get(key)) for x in lat]
        for key, label in (
            ("count", "readbacks"),
            ("p50", "p50 (ms)"),
            ("p99", "p99 (ms)"),
            ("max", "max (ms)"),
        )
    ]
    return "<h2>Readback latency</h2>" + _table(
        ["", *labels], rows, num=set(range(1, len(labels) + 1))
    )


def _compare_faults(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> str:
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
                cells.append(_fmt(value))
        rows.append([_e(label) + (" (total)" if "_by_" in key else ""), *cells])
    if not rows:
        return '<h2>Faults injected</h2><p class="empty">no faults recorded</p>'
    return "<h2>Faults injected</h2>" + _table(
        ["", *labels], rows, num=set(range(1, len(labels) + 1))
    )


def _compare_audit(labels: list[str], reports: Sequence[Mapping[str, Any]]) -> str:
    audits = [_map(r.get("audit")) for r in reports]
    keys = _ordered([k for a in audits for k in a], list(_AUDIT_PHASES))
    if not keys:
        return '<h2>Audit violations</h2><p class="empty">no audit recorded</p>'
    rows = [
        [_e(_AUDIT_PHASES.get(k, k))]
        + [_fmt(_map(a.get(k)).get("violations")) if k in a else "—" for a in audits]
        for k in keys
    ]
    return "<h2>Audit violations</h2>" + _table(
        ["", *labels], rows, num=set(range(1, len(labels) + 1))
    )


def _timeline_svg(timeline: list[Any], name: str) -> str | None:
    """Stacked area of operations per state; x in seconds since the start."""
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
    with _style():
        fig = _new_figure()
        ax = fig.add_subplot()
        ax.stackplot(
            xs, ys, labels=[_mpl_text(s) for s in states], colors=_state_colours(states), lw=0
        )
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("operations")
        ax.set_xlim(xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1)
        ax.margins(y=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False, fontsize=8)
        return figure_svg(fig, name)


def _histogram_svg(samples_ms: list[float], marks: Mapping[str, float], name: str) -> str | None:
    """Histogram of latencies in ms, with vertical lines at the given marks."""
    finite = [x for x in samples_ms if math.isfinite(x)]
    if not finite:
        return None
    bins = max(5, min(_HIST_MAX_BINS, round(math.sqrt(len(finite)) * 2)))
    with _style():
        fig = _new_figure(height_in=2.8)
        ax = fig.add_subplot()
        ax.hist(finite, bins=bins, color="#4292c6", edgecolor="white", linewidth=0.5)
        coloured = list(zip(marks.items(), ("#238b45", "#d62728"), strict=False))
        for (_, value), colour in coloured:
            ax.axvline(value, color=colour, linestyle="--", linewidth=1.2)
        low, high = ax.get_xlim()
        for (label, value), colour in coloured:
            right_half = value > (low + high) / 2  # label on the side with room
            ax.annotate(
                f"{_mpl_text(label)} {value:.0f} ms",
                xy=(value, 1),
                xycoords=("data", "axes fraction"),
                xytext=(-3 if right_half else 3, -12),
                textcoords="offset points",
                ha="right" if right_half else "left",
                color=colour,
                fontsize=8,
            )
        ax.set_xlabel("readback latency (ms)")
        ax.set_ylabel("readbacks")
        return figure_svg(fig, name)


def _effects_svg(series: Mapping[str, Mapping[str, Any]], name: str) -> str | None:
    """Bars of cases per number of effects; one bar group per key, one colour per series."""
    present = {label: counts for label, counts in series.items() if counts}
    if not present:
        return None
    keys = sorted({str(k) for c in present.values() for k in c}, key=_effects_key)
    width = 0.8 / len(present)
    with _style():
        fig = _new_figure(width_in=max(5.0, min(11.0, 2.0 + 0.6 * len(keys) * len(present))))
        ax = fig.add_subplot()
        ax.grid(axis="x", visible=False)
        for n, (label, counts) in enumerate(present.items()):
            offsets = [i + (n - (len(present) - 1) / 2) * width for i in range(len(keys))]
            values = [_int(counts.get(k, 0)) for k in keys]
            bars = ax.bar(
                offsets,
                values,
                width=width,
                label=_mpl_text(label) if label else None,
                color=_SERIES_COLOURS[n % len(_SERIES_COLOURS)],
            )
            ax.bar_label(bars, fontsize=7, padding=1)
        ax.set_xticks(range(len(keys)), [_mpl_text(k) for k in keys])
        ax.set_xlabel("effects per case (counted by the sinks)")
        ax.set_ylabel("cases")
        if len(present) > 1 or next(iter(present)):
            ax.legend(frameon=False)
        return figure_svg(fig, name)


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


def _fail_badge() -> str:
    return '<span class="badge fail">FAILED</span>'


def _state_cell(state: str) -> str:
    colour = _STATE_COLOURS.get(state, "#ccc")
    return (
        f'<span style="display:inline-block;width:.8em;height:.8em;background:{colour};'
        f'margin-right:.4em;border-radius:2px"></span><code>{_e(state)}</code>'
    )


def _pair_cell(pair: Any) -> str:
    """``[count, denominator]`` as ``count / of (rate)``; anything else as text."""
    if isinstance(pair, Sequence) and not isinstance(pair, str) and len(pair) == 2:
        return f"{_fmt(pair[0])} / {_fmt(pair[1])} ({_rate(pair[0], pair[1])})"
    return "—" if pair is None else _fmt(pair)


def _rate(count: Any, of: Any) -> str:
    """``count / of`` as a percentage, or ``—`` when undefined."""
    if not (_is_number(count) and _is_number(of)) or float(of) == 0:
        return "—"
    return f"{100.0 * float(count) / float(of):.3g}&nbsp;%"


def _ordered(keys: Iterable[str], order: Sequence[str]) -> list[str]:
    """Unique keys: those in ``order`` first (in that order), then the rest as met."""
    seen = list(dict.fromkeys(keys))
    known = [k for k in order if k in seen]
    return known + [k for k in seen if k not in order]
