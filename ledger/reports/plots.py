"""HTML pages of reports: one self-contained page, plots as inline SVG (matplotlib).

``ledger audit --html FILE`` renders the auditor's report with
:func:`audit_html`: the template ``audit.html.j2``
(:func:`ledger.reports.audit.audit_page`, which needs no matplotlib) plus a
bar plot; the testbed's mission pages (:mod:`testbed.mission.html`) share the
page, table and plot helpers below. Needs matplotlib (the ``[plots]``
extra); the CLI loads it through :func:`ledger.reports.audit_html` only
when asked for HTML.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ledger.reports.audit import _int, _list, _map, audit_page

__all__ = ["audit_html", "figure_svg"]

_SVG_METADATA: dict[str, str | None] = {"Date": None, "Creator": None, "Format": None, "Type": None}


_ID_REF = re.compile(r'(\bid="|url\(#|href="#)([^")]+)')


def audit_html(audit: Mapping[str, Any]) -> str:
    """Render an audit report as a self-contained HTML page, with a bar plot.

    Args:
        audit: what :meth:`ledger.audit.AuditReport.to_dict` returns, plus
            ``"ledger"`` (topic prefix) and ``"compacted"`` (bool), both
            optional; every key is optional.

    Returns:
        The page of :func:`ledger.reports.audit.audit_page` (verdict with its
        coverage, when it ran, facts split by coverage, invariants,
        violations, open items with their history commands, offsets read)
        with a bar plot of the violations per invariant (facts checked when
        clean).
    """
    checked = _map(audit.get("checked"))
    violations = [_map(v) for v in _list(audit.get("violations"))]
    per_invariant: dict[str, int] = {str(k): 0 for k in checked}
    for v in violations:
        name = str(v.get("invariant", "?"))
        per_invariant[name] = per_invariant.get(name, 0) + 1
    plot = None
    if per_invariant:
        plotted = per_invariant if violations else {k: _int(checked.get(k)) for k in per_invariant}
        what = "violations" if violations else "facts checked"
        plot = _barh_svg(plotted, what, "audit-invariants")
    return audit_page(audit, plot)


def figure_svg(fig: Figure, name: str) -> str:
    """Render a figure as an inline ``<svg>`` element and release it.

    The XML prolog, DOCTYPE and metadata are dropped, and every ID (and each
    reference to one) is prefixed with ``name`` so that several plots can sit
    in one page without their clip paths or markers colliding. Output is
    deterministic (no date, a fixed hash salt).

    Args:
        fig: the figure; it is cleared afterwards and must not be reused.
        name: unique within the page; letters, digits, ``-`` and ``_`` are
            kept, anything else becomes ``-``.

    Returns:
        The ``<svg ...>...</svg>`` markup.
    """
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", name) or "plot"
    buf = io.StringIO()
    try:
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": prefix}):
            fig.savefig(buf, format="svg", metadata=_SVG_METADATA)
    finally:
        fig.clear()
    svg = buf.getvalue()
    svg = svg[svg.find("<svg") :]
    svg = _ID_REF.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)
    return svg.replace("<svg ", f'<svg role="img" aria-label="{_e(name)}" ', 1)


def _style() -> AbstractContextManager[None]:
    """The plots' look; text stays real ``<text>`` (smaller, searchable)."""
    return matplotlib.rc_context(
        {
            "font.size": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
        }
    )


def _new_figure(width_in: float = 7.5, height_in: float = 3.2) -> Figure:
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _barh_svg(values: Mapping[str, int], what: str, name: str) -> str | None:
    """Horizontal bars, one per key (e.g. violations per invariant)."""
    if not values:
        return None
    keys = list(values)
    with _style():
        fig = _new_figure(height_in=max(1.6, 0.35 * len(keys) + 0.8))
        ax = fig.add_subplot()
        ax.grid(axis="y", visible=False)
        colour = "#c5221f" if what == "violations" else "#1e8e3e"
        bars = ax.barh(range(len(keys)), [values[k] for k in keys], color=colour)
        ax.bar_label(bars, fontsize=7, padding=2)
        ax.set_yticks(range(len(keys)), [_mpl_text(k) for k in keys])
        ax.invert_yaxis()
        ax.set_xlabel(what)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        return figure_svg(fig, name)


def _mpl_text(text: str) -> str:
    """Text safe for matplotlib: no mathtext, no legend-hiding leading underscore."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _e(text: str) -> str:
    return html.escape(text, quote=True)
