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


def _with_peers(quix_per_s: float, kstreams: dict[str, Any]) -> dict[str, Any]:
    results = _results(6_000.0, 0.9)
    results["peers"] = {
        "quixstreams": {"median_records_per_s": quix_per_s},
        "kafka_streams": kstreams,
    }
    return results


def test_the_processor_is_a_ratio_to_each_streams_peer(tmp_path: Path) -> None:
    runs = [{"first_output_s": s, "records_per_s": 12_000.0} for s in (2.5, 1.25, 4.0)]
    results = _with_peers(
        5_000.0,
        {"median_records_per_s": 12_000.0, "version": "4.1.1", "all_verified": True, "runs": runs},
    )
    r = report.ratios(results)
    assert r["processor / Quix Streams EOS step"] == 1.2
    assert r["processor / Kafka Streams EOS step"] == 0.5
    names = list(r)  # the two streams peers' ratios stand side by side
    assert names.index("processor / Kafka Streams EOS step") == (
        names.index("processor / Quix Streams EOS step") + 1
    )
    text = report.write(results, tmp_path).read_text()
    assert "| processor / Kafka Streams EOS step | 0.50 |  |  |" in text
    assert "| 9. Kafka Streams EOS v2 step, records/s | 12,000 | Java, Kafka Streams 4.1.1," in text
    assert "warm-up; first output 2.5 s after start (`bench/peers/kstreams_bench.py`)" in text
    assert "processor / Kafka Streams EOS step: 0.50" in report.headlines(results)


def test_a_kafka_streams_peer_that_could_not_run_is_reported_not_divided(tmp_path: Path) -> None:
    results = _with_peers(5_000.0, {"error": "kstreams-peer.jar missing (make bench builds it)"})
    assert report.ratios(results)["processor / Kafka Streams EOS step"] is None
    text = report.write(results, tmp_path).read_text()
    assert "| 9. kafka_streams | failed | kstreams-peer.jar missing" in text
    assert "9. Kafka Streams EOS v2 step" not in text


def _scale_row(partitions: int, instances: int, ops_per_s: float, busy: float) -> dict[str, Any]:
    per_op = {"relay": 4.0, "brokers": 3.0, "gateway": 2.0, "processor": 2.0, "driver": 1.0}
    gross = {g: ms + 1.0 for g, ms in per_op.items()}
    return {
        "partitions": partitions,
        "instances": instances,
        "cores": 2,
        "burst": 200,
        "runs": [ops_per_s] * 3,
        "ops_per_s": ops_per_s,
        "brokers": 3,
        "replication_factor": 3,
        "min_insync_replicas": 2,
        "bursts": [],
        "cpu": {
            "utilisation": {g: ms * ops_per_s / 2000 for g, ms in gross.items()},
            "cpu_ms_per_op": gross,
            "marginal_ms_per_op": per_op,
            "idle_cores": {"brokers": 0.5, "relay": 0.2},
            "ours": busy - 0.05,
            "machine_busy": busy,
            "other": 0.05,
            "busiest": "relay-0",
            "busiest_core": 0.5,
        },
        "limit": "CPU: 2 cores saturated" if busy >= 0.85 else "not CPU: cores idle",
    }


def _with_scale() -> dict[str, Any]:
    results = _results(6_000.0, 0.9)
    results["scale"] = [
        _scale_row(p, i, 150.0 + p, 0.97 if p > 1 else 0.6) for p in (1, 3, 6) for i in (1, 2, 3)
    ]
    return results


def test_the_scale_ratio_is_six_partitions_to_one_best_over_instances() -> None:
    r = report.ratios(_with_scale())
    assert r["end to end, 6 partitions / 1 (best over 1, 2, 3 instances)"] == 156.0 / 151.0
    # rows of the older grid (1, 2, 4 partitions) give no such ratio
    assert (
        report.ratios(_results(6_000.0, 0.9))[
            "end to end, 6 partitions / 1 (best over 1, 2, 3 instances)"
        ]
        is None
    )


def test_the_scale_table_names_the_limit_and_projects_onto_a_larger_machine(
    tmp_path: Path,
) -> None:
    text = report.write(_with_scale(), tmp_path).read_text()
    assert "On 3 brokers (local loopback cluster), replication factor 3" in text
    assert "the median of 3 bursts of 200 operations" in text
    # 12 ms/op above a rest load of 0.7 cores: (8 - 0.7) / 0.012 = 608/s on 8 cores;
    # the relay's 4 ms on one process (0.2 of it at rest) binds first: 0.8 / 0.004 = 200/s;
    # on three (6 partitions x 3 instances) the gateway's one process: 1 / 0.002 = 500/s
    assert "| 1 | 1 | 151 | 1.00 | 60 % (55 % + 5 %) | 35 % | 17.0 (12.0) | 200/s (relay) |" in text
    assert (
        "| 6 | 3 | 156 | 1.03 | 97 % (92 % + 5 %) | 35 % | 17.0 (12.0) | 500/s (gateway) |" in text
    )
    assert "| 500/s (gateway) | CPU: 2 cores saturated |" in text
    assert "**What a larger machine would show.**" in text
    assert "at rest its processes use 0.70 cores (brokers 0.50, relay 0.20)" in text
    assert "6 of 9 points had the cores saturated" in text
    assert "the best point, 6 x 1, reached 1.03x the 1 x 1 rate" in text
    assert "the processes' rest load was 0.70 cores at 1 x 1 and 0.70 at 6 x 3." in text
    assert "would allow 200/s at 1 x 1 (bound: relay" in text
    assert "and 500/s at 6 x 3 (bound: gateway)" in text
    assert (tmp_path / "plots" / "scale.svg").exists()


def test_scale_rows_without_cpu_figures_still_render(tmp_path: Path) -> None:
    text = report.write(_results(6_000.0, 0.9), tmp_path).read_text()
    assert "| 4 | 2 | 80 | 8.00 | n/a | n/a | n/a | n/a | n/a |" in text
    assert "What a larger machine would show" not in text
    assert (tmp_path / "plots" / "scale.svg").exists()


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
    assert "| 6. restart over 100,000 settled operations (s) | 30.0 |" in text
    assert "| 6. processor restore, one partition of 1,000,000 operations (s) | 20.0 |" in text


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
