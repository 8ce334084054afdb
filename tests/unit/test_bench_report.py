"""The benchmark report: ratios, targets met or missed, and what limits a miss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import report


def _results(processor_per_s: float, replay_ratio: float) -> dict[str, Any]:
    return {
        "meta": {"date": "2026-01-01T00:00:00Z", "runs": 3, "commit_interval_ms": 100},
        "kafka": {"produce_per_s": 20_000.0, "consume_per_s": 90_000.0, "record_bytes": 250},
        "txnloop": {"per_s": 10_000.0},
        "processor": {"per_s": processor_per_s},
        "replay": {"auditor_per_s": 7_000.0, "raw_per_s": 10_000.0, "ratio": replay_ratio},
        "recovery": {
            "ratio": 1.5,
            "recovery_s": 15.0,
            "fresh_s": 10.0,
            "runs": [{"operations": 1000}],
        },
        "memory": {"bytes_per_operation": 900.0, "runs": [{"operations": 100_000}]},
        "scale": [
            {"partitions": p, "instances": i, "ops_per_s": 10.0 * p * i, "runs": []}
            for p in (1, 2, 4)
            for i in (1, 2)
        ],
    }


def test_ratios_are_quotients_of_the_same_runs() -> None:
    r = report.ratios(_results(4_000.0, 0.8))
    assert r["processor / bare loop"] == 0.4
    assert r["bare loop / Kafka produce limit"] == 0.5
    assert r["auditor / raw consume+decode"] == 0.8
    assert r["processor / Quix Streams EOS step"] is None  # the peers did not run


def test_a_missed_target_is_flagged_with_what_limits_it(tmp_path: Path) -> None:
    path = report.write(_results(4_000.0, 0.8), tmp_path)
    text = path.read_text()
    assert "| processor / bare loop | 0.40 | >= 0.5 | **no** |" in text
    assert "| auditor / raw consume+decode | 0.80 | >= 0.7 | yes |" in text
    assert report.LIMITS["processor / bare loop"] in text
    assert report.LIMITS["auditor / raw consume+decode"] not in text
    assert (tmp_path / "plots" / "scale.svg").exists()


def test_a_met_target_needs_no_explanation(tmp_path: Path) -> None:
    text = report.write(_results(6_000.0, 0.9), tmp_path).read_text()
    assert "Where a target is missed" not in text
    lines = report.headlines(_results(6_000.0, 0.9))
    assert "processor / bare loop: 0.60 (target >= 0.5: yes)" in lines


def _with_e2e(ledger_ops_per_s: float, dbos_ops_per_s: float | None) -> dict[str, Any]:
    results = _results(6_000.0, 0.9)
    results["e2e"] = {
        "sustainable_ops_per_s": ledger_ops_per_s,
        "paced": {"0.5": [{"p50_s": 0.2, "p99_s": 0.4, "operations": 50, "target_rate": 5.0}]},
        "relay_instances": 1,
        "sink_limit": {
            "ops_per_s": 200.0,
            "processes": 1,
            "requests_per_operation": ["POST /operations", "GET /accounts/{account}"],
            "runs": [],
        },
    }
    if dbos_ops_per_s is not None:
        results["peers"] = {"dbos": {"throughput": {"median_ops_per_s": dbos_ops_per_s}}}
    return results


def test_the_end_to_end_figure_is_a_ratio_to_the_sink_only_limit(tmp_path: Path) -> None:
    results = _with_e2e(150.0, None)
    r = report.ratios(results)
    assert r["ledger end to end / sink-only limit"] == 0.75
    assert r["ledger end to end / DBOS workflow"] is None
    text = report.write(results, tmp_path).read_text()
    assert "| ledger end to end / sink-only limit | 0.75 | >= 0.8 | **no** |" in text
    assert report.LIMITS["ledger end to end / sink-only limit"] in text
    assert "POST /operations + GET /accounts/{account} per operation from 1" in text
    assert "No ledger / DBOS ratio" in text  # said, not left blank


def test_the_end_to_end_figure_is_a_ratio_to_dbos_on_the_same_gateway(tmp_path: Path) -> None:
    results = _with_e2e(180.0, 120.0)
    assert report.ratios(results)["ledger end to end / DBOS workflow"] == 1.5
    text = report.write(results, tmp_path).read_text()
    assert "No ledger / DBOS ratio" not in text
    assert "ledger end to end / sink-only limit: 0.90 (target >= 0.8: yes)" in report.headlines(
        results
    )


def _with_history(small_s: float, large_s: float) -> dict[str, Any]:
    results = _results(6_000.0, 0.9)

    def size(settled: int, recovery_s: float, relay_s: float) -> dict[str, Any]:
        return {
            "settled": settled,
            "in_flight": 1000,
            "recovery_s": recovery_s,
            "restore_s": {"processor": 0.5, "authority": 0.4, "relay": relay_s},
            "dominating": "relay",
            "runs": [],
        }

    results["history"] = {
        "small": size(1000, small_s, 0.2),
        "large": size(100_000, large_s, 9.0),
        "ratio": large_s / small_s,
        "processor_restore": {
            "operations": 1_000_000,
            "seconds": 20.0,
            "records_per_s": 50_000.0,
            "runs": [20.0, 21.0, 19.0],
        },
    }
    return results


def test_a_restart_over_a_long_history_names_the_stage_whose_restore_grew(
    tmp_path: Path,
) -> None:
    results = _with_history(10.0, 30.0)
    assert report.ratios(results)[report.HISTORY_RATIO] == 3.0
    text = report.write(results, tmp_path).read_text()
    assert f"| {report.HISTORY_RATIO} | 3.00 | <= 1.5 | **no** |" in text
    assert "the relay's restore dominates" in text
    assert "relay 0.2 -> 9.0 s" in text
    assert "The authority's restore is longer" not in text
    assert "| 10. restart over 100,000 settled operations (s) | 30.0 |" in text
    assert "| 11. processor restore, one partition of 1,000,000 operations (s) | 20.0 |" in text


def test_a_restart_bounded_by_the_work_in_flight_needs_no_explanation(tmp_path: Path) -> None:
    results = _with_history(10.0, 12.0)
    text = report.write(results, tmp_path).read_text()
    assert f"| {report.HISTORY_RATIO} | 1.20 | <= 1.5 | yes |" in text
    assert "restore dominates" not in text


def test_an_authority_restore_longer_than_the_gating_ones_is_named_too() -> None:
    results = _with_history(10.0, 30.0)
    results["history"]["large"]["restore_s"]["authority"] = 60.0
    text = report.history_limit(results)
    assert text.startswith("the relay's restore dominates")
    assert "The authority's restore is longer still" in text
