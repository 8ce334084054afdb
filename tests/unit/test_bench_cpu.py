"""CPU accounting of the scale-out benchmark: /proc parsing, shares, limits, ceilings."""

from __future__ import annotations

from typing import Any

import pytest

from bench import cpu

# A real line's shape; the command holds a space and a ')' as a process may.
STAT = (
    "4242 (python -m x) y) S 1 4242 4242 0 -1 4194304 5000 0 0 0 "
    "250 50 3 1 20 0 9 0 1000 300000000 20000 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1"
)
PROC_STAT = (
    "cpu  600 10 300 1000 50 5 5 30 0 0\n"
    "cpu0 300 5 150 500 25 3 2 15 0 0\n"
    "cpu1 300 5 150 500 25 2 3 15 0 0\n"
    "intr 123\n"
)


def test_process_cpu_is_utime_plus_stime_counted_after_the_command_name() -> None:
    assert cpu.process_cpu_s(STAT, 100) == 3.0  # (250 + 50) ticks; children's 3 + 1 not counted


def test_a_line_that_is_not_stat_is_refused() -> None:
    with pytest.raises(ValueError):
        cpu.process_cpu_s("no parentheses here", 100)


def test_machine_busy_counts_steal_and_leaves_out_idle_and_iowait() -> None:
    busy, total = cpu.machine_ticks(PROC_STAT)
    assert total == 600 + 10 + 300 + 1000 + 50 + 5 + 5 + 30
    assert busy == total - 1000 - 50


def _reading(at_s: float, busy: int, total: int, **procs: tuple[str, float]) -> cpu.Reading:
    return cpu.Reading(at_s, (busy, total), procs)


def test_usage_is_cpu_seconds_per_group_over_the_capacity_of_the_window() -> None:
    before = _reading(10.0, 1000, 2000, **{"relay-0": ("relay", 5.0), "broker-1": ("brokers", 1.0)})
    after = _reading(
        12.0,
        1350,
        2400,
        **{
            "relay-0": ("relay", 6.5),
            "broker-1": ("brokers", 1.4),
            "relay-1": ("relay", 0.3),  # started in the window: counts from zero
        },
    )
    u = cpu.usage(before, after, cores=2)
    assert u["wall_s"] == 2.0
    assert u["cpu_s"] == pytest.approx({"relay": 1.8, "brokers": 0.4})
    assert u["utilisation"] == pytest.approx({"relay": 0.45, "brokers": 0.1})
    assert u["ours"] == pytest.approx(0.55)
    assert u["machine_busy"] == pytest.approx(350 / 400)
    assert u["other"] == pytest.approx(0.875 - 0.55)
    assert u["busiest"] == "relay-0"
    assert u["busiest_core"] == pytest.approx(0.75)


def test_the_busiest_process_is_never_a_broker_jvm_which_can_use_more_than_a_core() -> None:
    before = _reading(0.0, 0, 100, **{"relay-0": ("relay", 0.0), "broker-1": ("brokers", 0.0)})
    after = _reading(1.0, 90, 200, **{"relay-0": ("relay", 0.3), "broker-1": ("brokers", 1.5)})
    u = cpu.usage(before, after, cores=2)
    assert (u["busiest"], u["busiest_core"]) == ("relay-0", pytest.approx(0.3))


def test_a_process_gone_by_the_end_is_left_out() -> None:
    before = _reading(0.0, 0, 100, **{"relay-0": ("relay", 5.0)})
    after = _reading(1.0, 50, 200)
    u = cpu.usage(before, after, cores=2)
    assert u["cpu_s"] == {} and u["ours"] == 0 and u["busiest"] == ""


def test_saturated_cores_are_named_with_the_biggest_users_first() -> None:
    line = cpu.limiting_resource(
        {"brokers": 0.28, "relay": 0.31, "driver": 0.001}, 0.97, "relay-0", 0.62, cores=2
    )
    assert line == "CPU: 2 cores saturated (97 % busy): relay 31 %, brokers 28 %, other load 38 %"


def test_one_process_at_a_full_core_is_named_when_the_cores_are_not_saturated() -> None:
    line = cpu.limiting_resource({"relay": 0.46, "brokers": 0.1}, 0.6, "relay-0", 0.92, cores=2)
    assert line.startswith("CPU of one process: relay-0 at 92 % of a core")
    assert "cores 60 % busy" in line


def test_idle_cores_mean_the_point_is_latency_bound() -> None:
    line = cpu.limiting_resource({"relay": 0.2, "brokers": 0.1}, 0.35, "relay-0", 0.4, cores=2)
    assert line.startswith("not CPU: cores 65 % idle (relay 20 %, brokers 10 %, other load 5 %)")
    assert "latency bound" in line


def test_ceiling_is_the_lower_of_all_cores_and_each_single_threaded_group() -> None:
    per_op = {"relay": 0.004, "brokers": 0.003, "gateway": 0.002, "processor": 0.001}
    # all cores: 8 / 0.010 = 800/s; relay on one process: 250/s
    assert cpu.ceiling(per_op, {"relay": 1, "gateway": 1, "processor": 1}, 8) == (
        pytest.approx(250.0),
        "relay",
    )
    # three relays: 750/s; the gateway's one process: 500/s
    assert cpu.ceiling(per_op, {"relay": 3, "gateway": 1, "processor": 3}, 8) == (
        pytest.approx(500.0),
        "gateway",
    )
    # two cores: 200/s, whatever the processes
    assert cpu.ceiling(per_op, {"relay": 3, "gateway": 1, "processor": 3}, 2) == (
        pytest.approx(200.0),
        "cores",
    )
    assert cpu.ceiling({}, {}, 2) == (float("inf"), "nothing")


def test_the_rest_load_takes_its_cores_before_any_operation_runs() -> None:
    per_op = {"relay": 0.004, "brokers": 0.006}
    # (2 - 1.0 - 0.2) / 0.010 = 80/s; the relay: (1 - 0.2) / 0.004 = 200/s
    assert cpu.ceiling(per_op, {"relay": 1}, 2, {"brokers": 1.0, "relay": 0.2}) == (
        pytest.approx(80.0),
        "cores",
    )
    # on 8 cores: (8 - 1.2) / 0.010 = 680/s; the relay binds at 200/s
    assert cpu.ceiling(per_op, {"relay": 1}, 8, {"brokers": 1.0, "relay": 0.2}) == (
        pytest.approx(200.0),
        "relay",
    )


def test_only_as_many_stage_processes_as_partitions_can_work() -> None:
    groups = ["brokers", "processor", "relay", "gateway", "driver"]
    assert cpu.parallelism(groups, partitions=1, instances=3) == {
        "processor": 1,
        "relay": 1,
        "gateway": 1,
        "driver": 1,
    }
    assert cpu.parallelism(groups, partitions=6, instances=3)["relay"] == 3


def _burst(ops_per_s: float, relay_s: float, busy: float) -> dict[str, Any]:
    return {
        "operations": 200,
        "ops_per_s": ops_per_s,
        "cpu": {
            "wall_s": 2.0,
            "cpu_s": {"relay": relay_s, "brokers": 0.8},
            "utilisation": {"relay": relay_s / 4, "brokers": 0.2},
            "ours": relay_s / 4 + 0.2,
            "machine_busy": busy,
            "other": busy - relay_s / 4 - 0.2,
            "busiest": f"relay-{int(relay_s)}",
            "busiest_core": relay_s / 2,
        },
    }


def test_a_point_is_the_median_of_its_bursts_and_named_from_those_medians() -> None:
    bursts = [_burst(100.0, 1.0, 0.9), _burst(120.0, 1.2, 0.95), _burst(90.0, 1.4, 0.99)]
    row = cpu.point_summary(3, 2, bursts, cores=2)
    assert row["ops_per_s"] == 100.0 and row["runs"] == [100.0, 120.0, 90.0]
    assert row["burst"] == 200 and row["partitions"] == 3 and row["instances"] == 2
    assert row["cpu"]["cpu_ms_per_op"] == pytest.approx({"relay": 6.0, "brokers": 4.0})
    assert row["cpu"]["utilisation"]["relay"] == pytest.approx(0.3)
    assert row["cpu"]["machine_busy"] == 0.95
    assert row["cpu"]["busiest"] == "relay-1"  # of the median burst (100/s)
    assert row["limit"].startswith("CPU: 2 cores saturated (95 % busy): relay 30 %")


def test_the_cpu_an_operation_adds_is_what_it_used_above_the_rest_load() -> None:
    bursts = [_burst(100.0, 1.0, 0.9), _burst(120.0, 1.2, 0.95), _burst(90.0, 1.4, 0.99)]
    idle = {"wall_s": 3.0, "cpu_s": {"relay": 0.3, "brokers": 0.6}}
    row = cpu.point_summary(3, 2, bursts, cores=2, idle=idle)
    assert row["cpu"]["idle_cores"] == pytest.approx({"relay": 0.1, "brokers": 0.2})
    # relay: 1.2 s in the median burst less 0.1 core x 2 s, over 200 operations
    assert row["cpu"]["marginal_ms_per_op"] == pytest.approx({"relay": 5.0, "brokers": 2.0})
    assert row["idle"] == idle


def test_a_point_without_bursts_is_refused() -> None:
    with pytest.raises(ValueError):
        cpu.point_summary(1, 1, [], cores=2)
