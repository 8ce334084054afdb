"""HTML reports the ledger renders: the Jinja2 environment, the audit page, inline plots.

* :mod:`ledger.reports.render` -- one template environment for every page
  (the audit, an operation's history, the operator console, the testbed's
  mission reports); Jinja2 only, a core dependency;
* :mod:`ledger.reports.audit` -- the audit page without plots;
* :mod:`ledger.reports.plots` -- the same page with a bar plot, and the
  plot helpers the testbed's pages share (matplotlib, the ``[plots]``
  extra), reached through :func:`audit_html`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ledger.extras import require_extra

__all__ = ["audit_html"]


def audit_html(audit: Mapping[str, Any]) -> str:
    """The audit report as one self-contained HTML page with a bar plot (needs matplotlib).

    Args:
        audit: what :meth:`ledger.audit.AuditReport.to_dict` returns, plus
            ``"ledger"`` (topic prefix); see :func:`ledger.reports.plots.audit_html`.

    Returns:
        The page, as text.

    Raises:
        MissingExtraError: matplotlib is not installed (the ``[plots]`` extra).
    """
    require_extra("plots", "an HTML report (--html)")
    plots = importlib.import_module("ledger.reports.plots")
    page: str = plots.audit_html(audit)
    return page
