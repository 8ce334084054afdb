"""Pages of the ledger's own reports that need no plotting library.

:func:`audit_page` renders an audit report with the template
``audit.html.j2``; ``ledger audit --html`` adds a bar plot of the invariants
(:func:`ledger.reports.plots.audit_html`, matplotlib), the operator console shows
the same page without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ledger.audit.report import LEDGER_AND_SINKS, UNSETTLED_STATES, coverage_words
from ledger.reports.render import render

__all__ = ["audit_context", "audit_page", "coverage_label"]


def coverage_label(coverage: Mapping[str, Any] | None) -> str:
    """What an audit covered, in words.

    Args:
        coverage: the report's ``coverage`` (``{"sink_readback": bool, ...}``)
            or ``None`` for a report that does not say.

    Returns:
        ``ledger and sink readback`` (only when at least one sink fact was
        checked), ``ledger only; no sink readback`` (sinks asked, no fact
        checked against them), ``ledger only, sink readback off`` or
        ``coverage not recorded``.
    """
    if not isinstance(coverage, Mapping) or "sink_readback" not in coverage:
        return "coverage not recorded"
    return coverage_words(bool(coverage.get("sink_readback")), _sink_facts(coverage))


def _sink_facts(coverage: Mapping[str, Any]) -> int | None:
    value = coverage.get("sink_facts")
    return _int(value) if value is not None else None


def audit_context(audit: Mapping[str, Any], plot: str | None = None) -> dict[str, Any]:
    """The variables of ``audit.html.j2`` for one report.

    Args:
        audit: what :meth:`ledger.audit.AuditReport.to_dict` returns, plus
            ``"ledger"`` (topic prefix) and ``"compacted"`` (bool), both
            optional; every key is optional.
        plot: an inline ``<svg>`` of the invariants, or ``None``.

    Returns:
        ``title``, ``verdict`` (``ok``, ``head``, ``sentence``), ``coverage``
        (words), ``params`` (label, value rows), ``invariants`` rows,
        ``violations``, ``open_items``, ``open_counts``, ``offsets`` rows,
        ``unauthenticated`` and ``plot``.
    """
    checked = _map(audit.get("checked"))
    violations = [_map(v) for v in _list(audit.get("violations"))]
    per_invariant: dict[str, int] = {str(k): 0 for k in checked}
    for v in violations:
        name = str(v.get("invariant", "?"))
        per_invariant[name] = per_invariant.get(name, 0) + 1
    facts = sum(_int(x) for x in checked.values())
    coverage = audit.get("coverage")
    words = coverage_label(coverage)
    ledger = audit.get("ledger")
    n = len(violations)
    if n:
        head = f"{n} VIOLATION{'S' if n != 1 else ''}"
        sentence = f"{n} violation{'s' if n != 1 else ''} of the ledger's invariants ({words})"
    elif _list(audit.get("unverifiable_records")) or _list(audit.get("unverified")):
        u = len(_list(audit.get("unverifiable_records")))
        why = (
            [f"{u} record{'s' if u != 1 else ''} sealed by keys not held here could not be checked"]
            if u
            else []
        )
        why += [str(w) for w in _list(audit.get("unverified"))]
        head = "NOT VERIFIED"
        sentence = (
            f"not verified: no violations in {facts} facts checked, but {'; '.join(why)} ({words})"
        )
    elif _list(audit.get("stranded")):
        k = len(_list(audit.get("stranded")))
        head = "STRANDED"
        sentence = (
            f"stranded: no violations in {facts} facts checked, but {k} operation"
            f"{'s' if k != 1 else ''} stopped short of where they should rest ({words})"
        )
    elif unsettled := [
        i for i in map(_map, _list(audit.get("open_items"))) if i.get("state") in UNSETTLED_STATES
    ]:
        k = len(unsettled)
        head = "OPEN"
        sentence = (
            f"open: no violations in {facts} facts checked, but {k} operation"
            f"{'s' if k != 1 else ''} whose outcome is unknown, held for a person ({words})"
        )
    else:
        head = "CLEAN"
        sentence = f"clean: no violations in {facts} facts checked ({words})"
    params: list[tuple[str, Any]] = [("ledger (topic prefix)", ledger)]
    if audit.get("ran_at"):
        took = audit.get("took_s")
        params.append(
            (
                "ran at (wall clock, UTC)",
                f"{audit['ran_at']}" + (f", took {took:.1f} s" if _is_number(took) else ""),
            )
        )
    params += [
        ("operations", audit.get("operations")),
        ("journal entries replayed", audit.get("journal_entries")),
        ("facts checked", facts),
    ]
    if isinstance(coverage, Mapping):
        params.append(("… in the ledger's records", coverage.get("ledger_facts")))
        sink = coverage.get("sink_facts")
        params.append(
            (
                "… against sink readback",
                "not read (ledger audit --no-sinks)"
                if sink is None or not coverage.get("sink_readback")
                else sink
                if _int(sink)
                else "none (no registered sink with readback answered for an operation)",
            )
        )
    params.append(
        (
            "unauthenticated records (refused)",
            len(_list(audit.get("unauthenticated_records")))
            if audit.get("authenticity_checked")
            else "seals not checked",
        )
    )
    if audit.get("compacted") is not None:
        params.append(
            ("compaction", "after compaction" if audit.get("compacted") else "before compaction")
        )
    invariants = [[name, checked.get(name, 0), count] for name, count in per_invariant.items()]
    invariants.append(["total", facts, n])
    items = [_map(i) for i in _list(audit.get("open_items"))]
    counts: dict[str, int] = {}
    for i in items:
        counts[str(i.get("state"))] = counts.get(str(i.get("state")), 0) + 1
    offsets = [
        [
            str(topic),
            ", ".join(f"{p}: {end}" for p, end in _map(parts).items()),
            sum(_int(end) for end in _map(parts).values()),
        ]
        for topic, parts in _map(audit.get("offsets")).items()
    ]
    return {
        "title": f"Audit of {ledger}" if ledger else "Ledger audit",
        "verdict": {
            "ok": not n and head not in ("STRANDED", "OPEN"),
            "head": head,
            "sentence": sentence,
        },
        "coverage": words,
        # the badge is green only for a verdict that holds for sink readback too
        "sink_readback": words == LEDGER_AND_SINKS,
        "params": params,
        "invariants": invariants,
        "violations": violations,
        "open_items": items,
        "open_counts": counts,
        "open_recorded": "open_items" in audit,
        "offsets": offsets,
        "unauthenticated": [
            [r.get("topic"), r.get("partition"), r.get("offset"), r.get("reason")]
            for r in map(_map, _list(audit.get("unauthenticated_records"))[:200])
        ],
        "plot": plot,
    }


def audit_page(audit: Mapping[str, Any], plot: str | None = None) -> str:
    """Render an audit report as one self-contained HTML page (template ``audit.html.j2``).

    Args:
        audit: see :func:`audit_context`.
        plot: an inline ``<svg>`` of the invariants, or ``None``.

    Returns:
        The page: the verdict and the coverage it holds for (ledger only, or
        ledger and sink readback), when it ran, the facts checked split by
        coverage, the invariants, the violations, every open item (held
        unknown outcome, reauthorisation pending, abandoned) with its age and
        the command that shows its history, and the offsets read.
    """
    return render("audit.html.j2", **audit_context(audit, plot))


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any) -> int:
    return int(value) if _is_number(value) and math.isfinite(value) else 0
