"""The scale-out part of ``bench/REPORT.md`` and ``plots/scale.svg`` (pure formatting).

Reads the ``scale`` rows of ``results.json`` (:func:`bench.cpu.point_summary`
plus the cluster's ``brokers`` and ``replication_factor``); rows from before
the CPU accounting (no ``cpu``) still render, with ``n/a`` where a figure is
missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.cpu import ceiling, parallelism  # noqa: E402

#: The larger machine the report projects onto (cores free for the ledger).
LARGER_CORES = 8
#: Plot colours of the CPU groups (others get matplotlib's cycle).
COLOURS = {
    "brokers": "#4a7ab5",
    "processor": "#e39c37",
    "authority": "#8c6bb1",
    "relay": "#d1495b",
    "gateway": "#66a182",
    "driver": "#999999",
    "other": "#dddddd",
}


def _pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.0f} %"


def projected(row: dict[str, Any], cores: int = LARGER_CORES) -> tuple[float, str] | None:
    """The point's :func:`bench.cpu.ceiling` on ``cores`` cores from its measured CPU.

    With a rest window measured, the CPU per operation above the rest load
    and the rest load itself (in cores); else all CPU per operation.

    Returns:
        ``(operations per second, what binds)``, ``None`` for a row without CPU figures.
    """
    cpu = row.get("cpu")
    if not cpu:
        return None
    per_op_ms = cpu.get("marginal_ms_per_op") or cpu["cpu_ms_per_op"]
    per_op_s = {g: ms / 1000 for g, ms in per_op_ms.items()}
    parallel = parallelism(list(per_op_s), row["partitions"], row["instances"])
    return ceiling(per_op_s, parallel, cores, cpu.get("idle_cores"))


def _base(scale: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in scale if r["partitions"] == 1 and r["instances"] == 1), None)


def _groups_text(values: dict[str, float], digits: int = 1) -> str:
    ranked = sorted(values.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{g} {v:.{digits}f}" for g, v in ranked if round(v, digits) > 0)


def _cost_text(row: dict[str, Any]) -> str:
    cpu = row["cpu"]
    gross = cpu["cpu_ms_per_op"]
    text = f"{sum(gross.values()):.1f} ms of CPU ({_groups_text(gross)})"
    rest, marginal = cpu.get("idle_cores"), cpu.get("marginal_ms_per_op")
    if rest is not None and marginal is not None:
        text += (
            f"; at rest its processes use {sum(rest.values()):.2f} cores "
            f"({_groups_text(rest, 2)}), and above that an operation adds "
            f"{sum(marginal.values()):.1f} ms ({_groups_text(marginal)})"
        )
    return text


def _rest_growth(base: dict[str, Any], most: dict[str, Any]) -> str:
    low, high = base["cpu"].get("idle_cores"), most["cpu"].get("idle_cores")
    if low is None or high is None:
        return ""
    return (
        f", and the processes' rest load was {sum(low.values()):.2f} cores at 1 x 1 and "
        f"{sum(high.values()):.2f} at {most['partitions']} x {most['instances']}"
    )


def larger_machine(scale: list[dict[str, Any]], cores: int = LARGER_CORES) -> str:
    """The generated paragraph: what a machine with ``cores`` cores would show, and why.

    Derived from the rows' CPU per operation: all of it over every core
    bounds the rate, and so does each single-threaded process's share (a
    stage's work splits by partition, so only ``min(instances, partitions)``
    of its processes can be busy).

    Returns:
        Markdown text (one paragraph); empty without CPU figures.
    """
    rows = [r for r in scale if r.get("cpu")]
    base = _base(rows)
    if base is None:
        return ""
    here = base["cores"]
    saturated = [r for r in rows if r["limit"].startswith("CPU")]
    most = max(rows, key=lambda r: (min(r["partitions"], r["instances"]), r["partitions"]))
    base_here = projected(base, here)
    base_big = projected(base, cores)
    most_big = projected(most, cores)
    assert base_here and base_big and most_big  # rows with cpu figures
    costs = [sum(r["cpu"]["cpu_ms_per_op"].values()) for r in rows]
    text = [
        f"**What a larger machine would show.** At 1 partition x 1 instance an operation "
        f"costs {_cost_text(base)}. On this machine's {here} cores that allows at "
        f"most {base_here[0]:.0f} operations/s (bound: {base_here[1]}); the rig reached "
        f"{base['ops_per_s']:.0f}.",
    ]
    if saturated:
        best = max(rows, key=lambda r: r["ops_per_s"])
        text.append(
            f" {len(saturated)} of {len(rows)} points had the cores saturated, so more "
            "partitions and instances had no core to run on: the best point, "
            f"{best['partitions']} x {best['instances']}, reached "
            f"{best['ops_per_s'] / base['ops_per_s']:.2f}x the 1 x 1 rate; CPU per operation "
            f"ranged from {min(costs):.1f} to {max(costs):.1f} ms over the points"
            f"{_rest_growth(base, most)}."
        )
    else:
        text.append(
            " No point saturated the cores: the rate is bounded by waiting (transaction "
            "commits and the relay's round trips), which partitions x instances overlap "
            "and more cores do not shorten."
        )
    text.append(
        f" With {cores} cores free for the ledger the same costs would allow "
        f"{base_big[0]:.0f}/s at 1 x 1 (bound: {base_big[1]}, one process of each "
        f"stage, each on one core at most) and {most_big[0]:.0f}/s at "
        f"{most['partitions']} x {most['instances']} (bound: {most_big[1]}): partitions "
        "x instances only help once cores are free, and only up to min(instances, "
        "partitions) busy processes per stage; beyond that the one gateway process and "
        "the brokers' share of the cores bind, and every extra process adds its rest "
        "load. These are ceilings from CPU alone: the model ignores commit intervals "
        "and round trips."
    )
    return "".join(text)


def section(scale: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of the scale-out section: the table and :func:`larger_machine`.

    Args:
        scale: the ``scale`` rows of ``results.json``.

    Returns:
        Lines to append to the report (empty for no rows).
    """
    if not scale:
        return []
    first = scale[0]
    base = _base(scale)
    cluster = (
        f"{first['brokers']} brokers (local loopback cluster), replication factor "
        f"{first.get('replication_factor', '?')}, min.insync.replicas "
        f"{first.get('min_insync_replicas', '?')}"
        if "brokers" in first
        else "the single broker"
    )
    lines = [
        "",
        "## Scale-out: partitions x instances of every stage",
        "",
        f"On {cluster}; each point a fresh rig, one warm-up burst, then the median of "
        f"{len(first['runs'])} bursts of {first.get('burst', '?')} operations (first publish "
        "to last OUTCOME_VERIFIED). CPU is `utime + stime` of each process over the "
        f"measured bursts, as a share of the machine's capacity (wall x "
        f"{first.get('cores', '?')} cores); *other* is load from processes the benchmark "
        "did not start. *At rest*: what the point's processes use with no operations "
        "(a 3 s window after the warm-up: polling, heartbeats, replica fetches), as a "
        "share of the cores; CPU per operation is shown in all and, in brackets, above "
        "that rest load. The ceiling projects the latter and the rest load onto "
        f"{LARGER_CORES} cores (`bench.cpu.ceiling`).",
        "",
        "| partitions | instances | ops/s | / 1x1 | CPU busy (ours + other) | ours at rest | "
        f"CPU ms/op (above rest) | ceiling on {LARGER_CORES} cores | limiting resource |",
        "|---:|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for row in scale:
        ratio = f"{row['ops_per_s'] / base['ops_per_s']:.2f}" if base else "n/a"
        cpu = row.get("cpu")
        busy = (
            f"{_pct(cpu['machine_busy'])} ({_pct(cpu['ours'])} + {_pct(cpu['other'])})"
            if cpu
            else "n/a"
        )
        rest = cpu.get("idle_cores") if cpu else None
        at_rest = _pct(sum(rest.values()) / row["cores"]) if rest is not None else "n/a"
        cost = f"{sum(cpu['cpu_ms_per_op'].values()):.1f}" if cpu else "n/a"
        if cpu and cpu.get("marginal_ms_per_op") is not None:
            cost += f" ({sum(cpu['marginal_ms_per_op'].values()):.1f})"
        big = projected(row)
        ceiling_text = f"{big[0]:.0f}/s ({big[1]})" if big else "n/a"
        lines.append(
            f"| {row['partitions']} | {row['instances']} | {row['ops_per_s']:,.0f} | {ratio} | "
            f"{busy} | {at_rest} | {cost} | {ceiling_text} | {row.get('limit', 'n/a')} |"
        )
    paragraph = larger_machine(scale)
    if paragraph:
        lines += ["", paragraph]
    return lines


def plot(scale: list[dict[str, Any]], out: Path) -> str | None:
    """Write ``out/scale.svg``: operations/s over partitions per instance count, and the CPU split.

    The left panel has one line per instance count; the right one, when the
    rows have CPU figures, one stacked bar per point (share of the machine's
    capacity by group, then other load).

    Returns:
        The file name, ``None`` for no rows.
    """
    if not scale:
        return None
    with_cpu = [r for r in scale if r.get("cpu")]
    fig, axes = plt.subplots(1, 2 if with_cpu else 1, figsize=(11 if with_cpu else 6, 3.4))
    ax = axes[0] if with_cpu else axes
    for inst in sorted({r["instances"] for r in scale}):
        rows = sorted((r for r in scale if r["instances"] == inst), key=lambda r: r["partitions"])
        ax.plot(
            [r["partitions"] for r in rows],
            [r["ops_per_s"] for r in rows],
            marker="o",
            label=f"{inst} instance(s) per stage",
        )
    ax.set_xlabel("partitions")
    ax.set_ylabel("operations per second (median)")
    ax.set_xticks(sorted({r["partitions"] for r in scale}))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    if with_cpu:
        right = axes[1]
        groups = sorted({g for r in with_cpu for g in r["cpu"]["utilisation"]})
        labels = [f"{r['partitions']}x{r['instances']}" for r in with_cpu]
        bottom = [0.0] * len(with_cpu)
        for group in [*groups, "other"]:
            values = [
                100
                * (r["cpu"]["other"] if group == "other" else r["cpu"]["utilisation"].get(group, 0))
                for r in with_cpu
            ]
            label = "other load" if group == "other" else group
            right.bar(labels, values, bottom=bottom, label=label, color=COLOURS.get(group))
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        right.set_xlabel("partitions x instances")
        right.set_ylabel("% of all cores, measured bursts")
        right.set_ylim(0, 105)
        right.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out / "scale.svg")
    plt.close(fig)
    return "scale.svg"
