"""Scale-out on a three-broker cluster: partitions x instances, with where the CPU went.

For each point of :data:`PARTITIONS` x :data:`INSTANCES` a fresh
:class:`bench.e2e.Rig` runs (its topics with that many partitions, replicated
on the three brokers; that many processes of every stage), one unmeasured
warm-up burst, a rest window without operations (the load the processes
make at rest), then ``runs`` bursts of ``n`` operations (:meth:`Rig.run`
without a rate). Around each measured burst a :class:`bench.cpu.CpuMeter`
reads the CPU time of every process of the point: the three broker JVMs, each
stage process, the reference gateway and the driver (this process), and the
machine's own counters. The point's figures are medians over its bursts, and
its limiting resource is named from them (:func:`bench.cpu.limiting_resource`).

The cluster (:func:`three_brokers`) is the testbed's plain loopback cluster
(``testbed.cluster``, no network namespaces, no root): its own folder
``kafka_home/bench-cluster`` and ports ``kafka_port + CLUSTER_PORT_OFFSET``
onwards, beside the single broker the other sections use; it shares that
broker's jars. Started here, it is stopped here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import throughput
from bench.common import say
from bench.cpu import CpuMeter, point_summary
from bench.e2e import Rig
from ledger.settings import LedgerSettings
from ledger.topics import replication_for
from testbed.cluster import Cluster, ClusterSpec

#: Partitions of the rig's topics at each point.
PARTITIONS = (1, 3, 6)
#: Processes of every stage at each point.
INSTANCES = (1, 2, 3)
#: Brokers of the cluster the points run on.
BROKERS = 3
#: The cluster's first port is the single broker's ``kafka_port`` plus this
#: (the single broker takes ``kafka_port`` and ``+1``; the cluster ``+10 .. +15``).
CLUSTER_PORT_OFFSET = 10
#: Records of the unmeasured transactional loop that warms the cluster's JVMs up.
WARM_UP_RECORDS = 10_000
#: Seconds of each point's rest window (its processes running, no operations).
IDLE_S = 3.0


@contextlib.contextmanager
def three_brokers(base: LedgerSettings) -> Iterator[tuple[LedgerSettings, Cluster]]:
    """Start (or reuse) the benchmark's three-broker cluster; stop it after if started here.

    Args:
        base: settings whose ``kafka_home`` (jars) and ``kafka_port`` the
            cluster derives from.

    Yields:
        ``(settings pointed at the cluster, the cluster)``.

    Raises:
        BrokerError: as :meth:`testbed.cluster.Cluster.start` (a port busy, java missing ...).
    """
    home = Path(base.kafka_home)
    spec = ClusterSpec.build(
        home / "bench-cluster",
        base.kafka_port + CLUSTER_PORT_OFFSET,
        brokers=BROKERS,
        libs=home / "libs",
    )
    cluster = Cluster(spec, base)
    status = cluster.start(wait_s=300)
    say(f"three-broker cluster at {cluster.bootstrap}: {status.message}")
    try:
        yield cluster.client_settings(), cluster
    finally:
        if status.started:
            say("stopping the three-broker cluster")
            cluster.stop()


def _processes(rig: Rig, cluster: Cluster) -> dict[str, tuple[str, int]]:
    """Every process of a point: name -> (group, pid)."""
    out: dict[str, tuple[str, int]] = {}
    for node in cluster.spec.nodes:
        pid = cluster.node_pid(node.node_id)
        if pid is not None:
            out[f"broker-{node.node_id}"] = ("brokers", pid)
    for name, proc in rig.harness.procs.items():
        out[name] = (name.rpartition("-")[0], proc.pid)
    for name, sink in rig.harness.sinks.items():
        if sink.pid is not None:
            out[f"gateway-{name}"] = ("gateway", sink.pid)
    out["driver"] = ("driver", os.getpid())
    return out


def measure_point(
    settings: LedgerSettings, cluster: Cluster, partitions: int, instances: int, n: int, runs: int
) -> dict[str, Any]:
    """One point: a fresh rig, a warm-up burst, a rest window, then ``runs`` bursts of ``n``.

    The rest window (:data:`IDLE_S`, after the warm-up, once the rig is
    quiescent) measures what the point's processes use with no operations,
    so that the CPU each operation adds can be told from it.

    Returns:
        :func:`bench.cpu.point_summary` of the bursts, plus ``brokers`` and
        ``replication_factor`` (replicas of the rig's ``state`` partition 0,
        read from the cluster) and ``min_insync_replicas``.
    """
    rig = Rig(
        settings, f"scale-p{partitions}-i{instances}", partitions=partitions, instances=instances
    )
    try:
        topic = cluster.metadata().topics[rig.settings.topic("state")]
        replicas = len(topic.partitions[0].replicas)
        rig.run(min(50, n), None)  # warm-up: connections, caches
        meter = CpuMeter(_processes(rig, cluster))
        rig.harness.wait_quiescent(timeout_s=60)
        before = meter.read(time.monotonic())
        time.sleep(IDLE_S)  # the load at rest: polling, heartbeats, replica fetches
        idle = meter.usage(before, meter.read(time.monotonic()))
        bursts = []
        for _ in range(runs):
            before = meter.read(time.monotonic())
            burst = rig.run(n, None)
            burst["cpu"] = meter.usage(before, meter.read(time.monotonic()))
            bursts.append(burst)
    finally:
        rig.close()
    row = point_summary(partitions, instances, bursts, meter.cores, idle)
    row.update(
        brokers=BROKERS,
        replication_factor=replicas,
        min_insync_replicas=replication_for(settings, BROKERS).min_insync_replicas,
    )
    return row


def scale(base: LedgerSettings, n: int, runs: int) -> list[dict[str, Any]]:
    """Every point of :data:`PARTITIONS` x :data:`INSTANCES` on the three-broker cluster.

    Args:
        base: settings to derive the cluster and the rigs from.
        n: operations per measured burst.
        runs: measured bursts per point (figures are their medians).

    Returns:
        One row per point (:func:`measure_point`), partitions-major.
    """
    rows = []
    with three_brokers(base) as (settings, cluster):
        # A cold JVM runs its first minute slower (see bench/__main__.py): an
        # unmeasured transactional loop first, so the 1 x 1 baseline is not the cold one.
        say("warming the cluster up (not measured)")
        throughput.transactional_loop(settings, WARM_UP_RECORDS)
        for parts in PARTITIONS:
            for inst in INSTANCES:
                started = time.monotonic()
                row = measure_point(settings, cluster, parts, inst, n, runs)
                row["point_wall_s"] = round(time.monotonic() - started, 1)
                say(
                    f"scale {parts} partition(s) x {inst} instance(s): "
                    f"{row['ops_per_s']:.0f} ops/s ({row['point_wall_s']:.0f} s); {row['limit']}"
                )
                rows.append(row)
    return rows
