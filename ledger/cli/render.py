"""Moved to :mod:`ledger.reports.render`; these names stay here for the testbed plug-in."""

from __future__ import annotations

from ledger.reports.render import environment, fmt, render

__all__ = ["environment", "fmt", "render"]
