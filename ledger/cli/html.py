"""HTML pages of reports: one self-contained page, plots as inline SVG (matplotlib).

``ledger audit --html FILE`` renders the auditor's report with
:func:`audit_html`: the template ``audit.html.j2`` (:func:`ledger.cli.pages.audit_page`,
which needs no matplotlib) plus a bar plot; the testbed's mission pages
(:mod:`testbed.mission.html`) share the page, table and plot helpers below. Needs matplotlib (the
``[testbed]`` extra); the CLI imports this module only when asked for HTML.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["audit_html", "figure_svg"]

_SVG_METADATA: dict[str, str | None] = {"Date": None, "Creator": None, "Format": None, "Type": None}


_ID_REF = re.compile(r'(\bid="|url\(#|href="#)([^")]+)')


_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #1d1d1f; margin: 2em auto; max-width: 1100px; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; }
h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
h3 { font-size: 1em; margin: 1.2em 0 .4em; }
table { border-collapse: collapse; margin: .4em 0 1em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f5f5f7; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: 600; background: #fafafa; }
.badge { display: inline-block; padding: .15em .7em; border-radius: 1em; color: #fff;
         font-weight: 700; letter-spacing: .05em; vertical-align: middle; }
.badge.pass { background: #1e8e3e; }
.badge.fail { background: #c5221f; }
.muted, .sub { color: #666; }
.sub { font-size: .85em; }
.failures li, .violations li { color: #c5221f; }
.grid { display: flex; flex-wrap: wrap; gap: 2em; }
.plot { margin: .5em 0 1.5em; }
.plot svg { max-width: 100%; height: auto; }
.empty { color: #666; font-style: italic; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .92em; }
"""


def audit_html(audit: Mapping[str, Any]) -> str:
    """Render an audit report as a self-contained HTML page, with a bar plot.

    Args:
        audit: what :meth:`ledger.audit.AuditReport.to_dict` returns, plus
            ``"ledger"`` (topic prefix) and ``"compacted"`` (bool), both
            optional; every key is optional.

    Returns:
        The page of :func:`ledger.cli.pages.audit_page` (verdict with its
        coverage, when it ran, facts split by coverage, invariants,
        violations, open items with their history commands, offsets read)
        with a bar plot of the violations per invariant (facts checked when
        clean).
    """
    from ledger.cli.pages import audit_page

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


def _page(title: str, body: Iterable[str]) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body>\n</html>\n"
    )


def _table(
    headers: Sequence[str] | None,
    rows: Iterable[Sequence[str]],
    num: set[int] | None = None,
    total_last: bool = False,
) -> str:
    """A table; ``headers`` (none: no header row) are plain text, escaped here;
    cells are HTML already. Columns in ``num`` are right-aligned."""
    num = num or set()
    lines = ["<table>"]
    if headers is not None:
        head = "".join(
            f'<th class="num">{_e(h)}</th>' if i in num else f"<th>{_e(h)}</th>"
            for i, h in enumerate(headers)
        )
        lines.append(f"<thead><tr>{head}</tr></thead>")
    lines.append("<tbody>")
    body = list(rows)
    for r, row in enumerate(body):
        cells = "".join(
            f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(row)
        )
        cls = ' class="total"' if total_last and r == len(body) - 1 else ""
        lines.append(f"<tr{cls}>{cells}</tr>")
    lines.append("</tbody>\n</table>")
    return "\n".join(lines)


def _kv_table(rows: Sequence[tuple[str, str]], num: bool = False) -> str:
    """Two-column table without a header: label (plain text), value (HTML)."""
    return _table(None, [[_e(k), v] for k, v in rows], num={1} if num else set())


def _plot_or_empty(svg: str | None, empty: str) -> str:
    if svg is None:
        return f'<p class="empty">{_e(empty)}</p>' if empty else ""
    return f'<div class="plot">{svg}</div>'


def _code(value: Any) -> str:
    return f"<code>{_e(str(value))}</code>"


def _fmt(value: Any) -> str:
    """A value as escaped HTML text: integers plainly, floats to 4 significant
    digits (whole numbers without a fraction), ``None`` as a dash."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        if abs(value) >= 1000:
            return f"{value:.0f}"
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return _e(", ".join(f"{k}: {v}" for k, v in value.items()))
    if isinstance(value, list | tuple):
        return _e(", ".join(str(v) for v in value))
    return _e(str(value))


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any) -> int:
    return int(value) if _is_number(value) and math.isfinite(value) else 0
