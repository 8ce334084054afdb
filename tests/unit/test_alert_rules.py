"""The shipped Prometheus alerting rules read only exported metrics, and alarm on stranded work."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from consumers.metrics import METRICS

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "ledger-alerts.yaml"


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_rule_reads_only_metrics_the_stages_export_with_their_labels() -> None:
    exported = set(METRICS)
    labels = {"stage"} | {label for _, names in METRICS.values() for label in names}
    for rule in _rules():
        expr = str(rule["expr"])
        names = set(re.findall(r"\bledger_[a-z_]+\b", expr))
        assert names and names <= exported, f"{rule['alert']}: {sorted(names - exported)}"
        for group in re.findall(r"by \(([^)]*)\)", expr):
            assert {x.strip() for x in group.split(",")} <= labels, expr
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]  # type: ignore[index]


def test_a_stranded_operation_of_any_reason_raises_an_alert() -> None:
    stranded = [r for r in _rules() if "ledger_stranded_operations" in str(r["expr"])]
    assert stranded, "no alert on ledger_stranded_operations"
    assert "by (reason)" in str(stranded[0]["expr"])
    assert str(stranded[0]["expr"]).rstrip().endswith("> 0")
