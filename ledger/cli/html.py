"""Moved to :mod:`ledger.reports.plots` (matplotlib); these names stay here for the testbed plug-in.

Nothing in :mod:`ledger.cli` imports this module: ``ledger audit --html``
goes through :func:`ledger.reports.audit_html`, which names the extra when
matplotlib is missing.
"""

from __future__ import annotations

from ledger.reports.plots import _mpl_text, _new_figure, _style, audit_html, figure_svg

__all__ = ["_mpl_text", "_new_figure", "_style", "audit_html", "figure_svg"]
