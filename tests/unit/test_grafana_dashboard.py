"""The Grafana dashboard under deploy/grafana/ queries only metrics the stages export."""

from __future__ import annotations

import json
import re
from typing import Any

from consumers.metrics import METRICS
from tests.helpers import PROJECT_ROOT

DASHBOARDS = sorted((PROJECT_ROOT / "deploy" / "grafana").glob("*.json"))

#: What Prometheus calls the series of each metric type.
SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "info": ("",),
    "histogram": ("_bucket", "_count", "_sum"),
}


def _series() -> set[str]:
    """Every series name the stages export (counters already end in ``_total``)."""
    return {name + suffix for name, (kind, _) in METRICS.items() for suffix in SUFFIXES[kind]}


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


def test_there_is_a_dashboard() -> None:
    assert DASHBOARDS, "deploy/grafana/*.json"


def test_every_dashboard_is_json_with_a_prometheus_datasource_variable() -> None:
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for panel in _panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]


def test_every_metric_a_dashboard_queries_is_exported_and_labels_exist() -> None:
    exported = _series()
    labels = {"stage", "le", "instance", "job"} | {
        label for _, names in METRICS.values() for label in names
    }
    used: set[str] = set()
    for path in DASHBOARDS:
        for expr in _queries(json.loads(path.read_text())):
            names = set(re.findall(r"\bledger_[a-z_]+\b", expr))
            assert names, expr
            unknown = names - exported
            assert not unknown, f"{path.name}: {sorted(unknown)} in {expr}"
            used |= names
            for group in re.findall(r"by \(([^)]*)\)", expr):
                for label in (x.strip() for x in group.split(",")):
                    assert label in labels, f"{path.name}: label {label!r} in {expr}"
    # The dashboard shows every metric the issue asks for (not only some).
    for name, (kind, _) in METRICS.items():
        assert any(name + suffix in used for suffix in SUFFIXES[kind]), f"no panel shows {name}"


def test_the_checker_refuses_an_unknown_metric() -> None:
    assert "ledger_made_up_total" not in _series()
    assert "ledger_transitions_total" in _series()
    assert "ledger_sink_request_seconds_bucket" in _series()
