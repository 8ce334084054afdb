"""CPU accounting for the scale-out benchmark: who used the cores, and what limits a point.

Linux only. A process's CPU time is ``utime + stime`` from ``/proc/<pid>/stat``
(every thread of the process, librdkafka's included; clock ticks of
``SC_CLK_TCK``); the machine's is the ``cpu`` line of ``/proc/stat``, so load
from processes the benchmark did not start (other users of the machine) shows
as ``other``. A :class:`CpuMeter` takes one reading before a measured burst and
one after; :func:`usage` turns the two into CPU seconds per group of processes
(brokers, each stage kind, the gateway, the driver) and shares of the
machine's capacity (``wall s x cores``).

The rest is pure: :func:`limiting_resource` names what bounds a point from
those shares, and :func:`ceiling` projects the highest rate a machine with more
cores could reach from the CPU each operation costs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Machine busy fraction (all processes, ours and others) from which the cores
#: count as saturated.
SATURATED = 0.85
#: Share of one core from which a single process counts as its own limit (a
#: stage is one Python thread under the GIL, plus librdkafka's threads).
ONE_CORE = 0.85
#: Groups whose processes scale with cores (multi-threaded JVMs): no one-core bound.
MULTI_THREADED = frozenset({"brokers"})
#: Groups that run as exactly one process whatever the point (one core at most).
SINGLE_PROCESS = frozenset({"gateway", "driver"})


def process_cpu_s(stat_text: str, ticks_per_s: int) -> float:
    """CPU seconds (user + system) a process has used, from its ``/proc/<pid>/stat`` text.

    The command name (field 2) may hold spaces and parentheses, so fields
    are counted after the last ``)``: ``utime`` and ``stime`` are fields 14
    and 15 of the whole line.

    Args:
        stat_text: the file's one line.
        ticks_per_s: ``os.sysconf("SC_CLK_TCK")`` (100 on Linux).

    Returns:
        ``(utime + stime) / ticks_per_s`` in seconds.

    Raises:
        ValueError: the text is not a ``stat`` line.
    """
    head, sep, tail = stat_text.rpartition(")")
    fields = tail.split()
    if not sep or "(" not in head or len(fields) < 13:
        raise ValueError(f"not a /proc/<pid>/stat line: {stat_text[:80]!r}")
    # fields[0] is field 3 (state): utime is field 14 -> index 11, stime -> 12.
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def machine_ticks(proc_stat_text: str) -> tuple[int, int]:
    """Busy and total clock ticks of all cores so far, from ``/proc/stat`` text.

    Total is user + nice + system + idle + iowait + irq + softirq + steal
    (guest time is already inside user); busy is total less idle and
    iowait, so time a hypervisor stole counts as busy: those cycles were
    not ours to use.

    Args:
        proc_stat_text: the whole of ``/proc/stat`` (its first ``cpu`` line is used).

    Returns:
        ``(busy_ticks, total_ticks)`` summed over every core.

    Raises:
        ValueError: no aggregate ``cpu`` line.
    """
    for line in proc_stat_text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            values = [int(v) for v in parts[1:9]]
            values += [0] * (8 - len(values))
            total = sum(values)
            return total - values[3] - values[4], total
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


@dataclass(frozen=True)
class Reading:
    """One reading of the machine and the watched processes.

    Attributes:
        at_s: ``time.monotonic()`` seconds when it was taken.
        machine: ``(busy_ticks, total_ticks)`` of :func:`machine_ticks`.
        processes: process name -> (group, CPU seconds so far); a process
            that had gone by the reading is missing.
    """

    at_s: float
    machine: tuple[int, int]
    processes: Mapping[str, tuple[str, float]]


def read_process_cpu_s(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used so far, ``None`` if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return process_cpu_s(text, os.sysconf("SC_CLK_TCK"))


def take_reading(at_s: float, processes: Mapping[str, tuple[str, int]]) -> Reading:
    """Read the machine and every named process now.

    Args:
        at_s: the caller's ``time.monotonic()`` seconds.
        processes: process name (``relay-0``, ``broker-2``) -> (group, pid).

    Returns:
        The :class:`Reading`.
    """
    seen: dict[str, tuple[str, float]] = {}
    for name, (group, pid) in processes.items():
        cpu_s = read_process_cpu_s(pid)
        if cpu_s is not None:
            seen[name] = (group, cpu_s)
    return Reading(at_s, machine_ticks(Path("/proc/stat").read_text()), seen)


def usage(before: Reading, after: Reading, cores: int) -> dict[str, Any]:
    """What the watched processes and the machine used between two readings (pure).

    A process present only in ``after`` (started in between) counts from
    zero; one present only in ``before`` (it ended) is left out.

    Args:
        before: the reading at the start of the window.
        after: the reading at its end.
        cores: cores of the machine.

    Returns:
        ``wall_s``; ``cpu_s`` (group -> CPU seconds); ``utilisation`` (group
        -> CPU s / (wall s x cores)); ``ours`` (sum of ``utilisation``);
        ``machine_busy`` (busy fraction of every core, all processes);
        ``other`` (``machine_busy - ours``, at least 0: load we did not
        start); ``busiest`` (the process with the most CPU, leaving out
        the :data:`MULTI_THREADED` groups, which can use more than a core)
        and ``busiest_core`` (its CPU s / wall s: 1.0 is one full core).
    """
    wall_s = max(after.at_s - before.at_s, 1e-9)
    cpu_s: dict[str, float] = {}
    per_process: dict[str, float] = {}
    for name, (group, total) in after.processes.items():
        start = before.processes.get(name, (group, 0.0))[1]
        used = max(0.0, total - start)
        per_process[name] = used
        cpu_s[group] = cpu_s.get(group, 0.0) + used
    capacity = wall_s * cores
    utilisation = {g: s / capacity for g, s in cpu_s.items()}
    busy = after.machine[0] - before.machine[0]
    total_ticks = after.machine[1] - before.machine[1]
    machine_busy = busy / total_ticks if total_ticks > 0 else 0.0
    ours = sum(utilisation.values())
    single = [n for n, (group, _) in after.processes.items() if group not in MULTI_THREADED]
    busiest = max(single, key=lambda n: per_process[n], default="")
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "utilisation": utilisation,
        "ours": ours,
        "machine_busy": machine_busy,
        "other": max(0.0, machine_busy - ours),
        "busiest": busiest,
        "busiest_core": per_process.get(busiest, 0.0) / wall_s,
    }


class CpuMeter:
    """Readings around measured windows, for a fixed set of processes.

    Args:
        processes: process name -> (group, pid), e.g. ``{"relay-0": ("relay", 4242)}``.
        cores: cores of the machine (default ``os.cpu_count()``).
    """

    def __init__(self, processes: Mapping[str, tuple[str, int]], cores: int | None = None) -> None:
        self.processes = dict(processes)
        self.cores = cores or os.cpu_count() or 1

    def read(self, at_s: float) -> Reading:
        """A reading now (``at_s``: the caller's ``time.monotonic()``)."""
        return take_reading(at_s, self.processes)

    def usage(self, before: Reading, after: Reading) -> dict[str, Any]:
        """:func:`usage` on this machine's cores."""
        return usage(before, after, self.cores)


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.0f} %"


def limiting_resource(
    utilisation: Mapping[str, float],
    machine_busy: float,
    busiest: str,
    busiest_core: float,
    cores: int,
) -> str:
    """Name what limits a point, from where the CPU went (pure).

    In order: the cores are saturated (the machine at least
    :data:`SATURATED` busy, whoever used it); else one process runs at
    :data:`ONE_CORE` of a core or more (it cannot use a second one); else
    it is not CPU: the cores have time to spare and operations wait on
    something else (transaction commits, the relay's round trips to the
    gateway, the driver's polling), so the point is latency bound.

    Args:
        utilisation: group -> share of the machine's capacity (0..1).
        machine_busy: busy fraction of the machine (0..1), all processes.
        busiest: name of the process with the most CPU (``relay-0``).
        busiest_core: that process's CPU s per wall s (1.0: one full core).
        cores: cores of the machine.

    Returns:
        One line, e.g. ``"CPU: 2 cores saturated (97 % busy): relay 31 %,
        brokers 28 %, ..."``.
    """
    ranked = sorted(utilisation.items(), key=lambda kv: -kv[1])
    parts = [f"{g} {_pct(u)}" for g, u in ranked if u >= 0.005]
    other = max(0.0, machine_busy - sum(utilisation.values()))
    if other >= 0.005:
        parts.append(f"other load {_pct(other)}")
    shares = ", ".join(parts) or "nothing measured"
    process = f"{busiest} at {_pct(busiest_core)} of a core"
    if machine_busy >= SATURATED:
        line = f"CPU: {cores} cores saturated ({_pct(machine_busy)} busy): {shares}"
        return f"{line}; {process}" if busiest_core >= ONE_CORE else line
    if busiest_core >= ONE_CORE:
        return (
            f"CPU of one process: {process} (one Python thread); cores "
            f"{_pct(machine_busy)} busy: {shares}"
        )
    return (
        f"not CPU: cores {_pct(1 - machine_busy)} idle ({shares}); operations wait on "
        "commits and round trips (latency bound)"
    )


def ceiling(
    cpu_s_per_op: Mapping[str, float],
    parallel: Mapping[str, int],
    cores: int,
    idle_cores: Mapping[str, float] | None = None,
) -> tuple[float, str]:
    """Highest operations/s the measured CPU cost allows on ``cores`` cores (pure).

    Two bounds, the lower wins: the cores left after the idle load
    (``idle_cores``: polling, heartbeats, replication fetches that run
    whatever the rate) shared by all the CPU an operation costs,
    ``(cores - sum(idle_cores)) / sum(cpu_s_per_op)``; and each group's
    CPU on the processes that can share its work, ``(parallel[group] -
    idle_cores[group]) / cpu_s_per_op[group]`` (a stage's work is split by
    partition, so at most ``min(instances, partitions)`` of its processes
    are busy, each on one core at most). Groups in :data:`MULTI_THREADED`
    have only the first bound. The model ignores waiting (commit
    intervals, round trips): it is a ceiling.

    Args:
        cpu_s_per_op: group -> CPU seconds per verified operation (above the idle load).
        parallel: group -> processes that can work at once (missing: 1).
        cores: cores of the machine to project onto.
        idle_cores: group -> cores the group uses with no operations (missing: 0).

    Returns:
        ``(operations per second, what binds)``: ``"cores"`` or a group name;
        ``(inf, "nothing")`` when no CPU was measured.
    """
    idle = idle_cores or {}
    total = sum(cpu_s_per_op.values())
    free = max(0.0, cores - sum(idle.values()))
    best = (free / total, "cores") if total > 0 else (float("inf"), "nothing")
    for group, cost in cpu_s_per_op.items():
        if group in MULTI_THREADED or cost <= 0:
            continue
        room = max(0.0, min(parallel.get(group, 1), cores) - idle.get(group, 0.0))
        bound = room / cost
        if bound < best[0]:
            best = (bound, group)
    return best


def parallelism(groups: list[str], partitions: int, instances: int) -> dict[str, int]:
    """Processes of each group that can work at once (pure).

    Args:
        groups: group names of a point (stage kinds, ``gateway``, ``driver``, ``brokers``).
        partitions: partitions of the rig's topics.
        instances: processes of each stage.

    Returns:
        group -> ``min(instances, partitions)`` for a stage, 1 for a group in
        :data:`SINGLE_PROCESS`; multi-threaded groups are left out.
    """
    out: dict[str, int] = {}
    for group in groups:
        if group in MULTI_THREADED:
            continue
        out[group] = 1 if group in SINGLE_PROCESS else min(instances, partitions)
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def point_summary(
    partitions: int,
    instances: int,
    bursts: list[dict[str, Any]],
    cores: int,
    idle: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One scale-out point from its measured bursts: medians and the limiting resource (pure).

    Args:
        partitions: partitions of the point's topics.
        instances: processes of every stage.
        bursts: :meth:`bench.e2e.Rig.run` results (``operations``,
            ``ops_per_s``), each with ``cpu``: the :func:`usage` of its window.
        cores: cores of the machine.
        idle: the :func:`usage` of a window with the point's processes
            running and no operations (their load at rest), if measured.

    Returns:
        ``partitions``, ``instances``, ``cores``, ``burst`` (operations per
        burst), ``runs`` (operations/s of each burst), ``ops_per_s`` (their
        median), ``bursts`` (as given), ``cpu`` (medians over the bursts:
        ``utilisation`` group -> share of capacity, ``cpu_ms_per_op`` group ->
        CPU ms per verified operation, ``ours``, ``machine_busy``, ``other``,
        ``busiest_core``; ``busiest`` of the median burst; with ``idle``
        also ``idle_cores`` group -> cores used at rest and
        ``marginal_ms_per_op`` group -> CPU ms per operation above that
        rest load, at least 0), ``idle`` (as given) and ``limit``
        (:func:`limiting_resource` of the medians).

    Raises:
        ValueError: no bursts.
    """
    if not bursts:
        raise ValueError("a scale-out point needs at least one burst")
    rates = [float(b["ops_per_s"]) for b in bursts]
    middle = sorted(bursts, key=lambda b: float(b["ops_per_s"]))[len(bursts) // 2]
    groups = sorted({g for b in bursts for g in b["cpu"]["cpu_s"]})

    def med(key: str) -> float:
        return _median([float(b["cpu"][key]) for b in bursts])

    utilisation = {
        g: _median([float(b["cpu"]["utilisation"].get(g, 0.0)) for b in bursts]) for g in groups
    }
    per_op = {
        g: _median([1000 * float(b["cpu"]["cpu_s"].get(g, 0.0)) / b["operations"] for b in bursts])
        for g in groups
    }
    machine_busy = med("machine_busy")
    busiest = str(middle["cpu"]["busiest"])
    busiest_core = med("busiest_core")
    cpu: dict[str, Any] = {
        "utilisation": utilisation,
        "cpu_ms_per_op": per_op,
        "ours": med("ours"),
        "machine_busy": machine_busy,
        "other": med("other"),
        "busiest": busiest,
        "busiest_core": busiest_core,
    }
    if idle is not None:
        rest = {g: float(v) / float(idle["wall_s"]) for g, v in idle["cpu_s"].items()}

        def above_rest(b: dict[str, Any], g: str) -> float:
            wall_s, ops = float(b["cpu"]["wall_s"]), int(b["operations"])
            used = float(b["cpu"]["cpu_s"].get(g, 0.0)) - rest.get(g, 0.0) * wall_s
            return 1000 * max(0.0, used) / ops

        cpu["idle_cores"] = rest
        cpu["marginal_ms_per_op"] = {g: _median([above_rest(b, g) for b in bursts]) for g in groups}
    return {
        "partitions": partitions,
        "instances": instances,
        "cores": cores,
        "burst": int(bursts[0]["operations"]),
        "runs": rates,
        "ops_per_s": _median(rates),
        "bursts": bursts,
        "idle": idle,
        "cpu": cpu,
        "limit": limiting_resource(utilisation, machine_busy, busiest, busiest_core, cores),
    }
