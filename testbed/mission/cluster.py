"""The mission's own local cluster (``--brokers 3``), and the handle its broker chaos uses.

:func:`running_cluster` starts a cluster with :mod:`testbed.cluster` (the one
launcher) in a folder of its own, ``kafka_home/mission-cluster-<N>`` (jars
shared from ``kafka_home/libs``), on fresh data unless that cluster is
already running. With a network (:class:`testbed.netns.NetworkSpec`), node
``i`` (1-based) listens and advertises on its namespace's address and its
java process starts behind ``ip netns exec`` of that namespace; the caller
must itself run in the client namespace. :class:`MissionCluster` adapts the
launcher's fault primitives to :class:`testbed.mission.chaos.ClusterControl`.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator, Sequence

from ledger.errors import BrokerError
from ledger.settings import LedgerSettings
from testbed.cluster import Cluster, ClusterSpec
from testbed.netns import NetworkSpec

#: Longest wait for a node (or the whole cluster) to answer after a start (s).
NODE_WAIT_S = 180.0


class MissionCluster:
    """The broker chaos's handle on a :class:`testbed.cluster.Cluster` (node IDs 1..N).

    Args:
        cluster: the running cluster.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.nodes = cluster.spec.brokers

    def index_of(self, node: int) -> int:
        """0-based index of node ``node`` (its network namespace's number)."""
        return node - 1

    def leader_of(self, topic: str, partition: int) -> int:
        """Node ID leading ``topic[partition]`` (raises ``BrokerError`` when it has none)."""
        return self.cluster.leader_of(topic, partition)

    def active_controller(self) -> int:
        """Node ID of the active KRaft controller.

        Raises:
            BrokerError: no live node knows a live leader (an election is under way).
        """
        found = self.cluster.active_controller()
        if found is None:
            raise BrokerError(
                "no active controller now (an election is under way, or the cluster is down)",
                expected="an active controller",
                observed="none",
            )
        return found

    def kill(self, node: int) -> None:
        """SIGKILL node ``node``."""
        self.cluster.kill_node(node)

    def start(self, node: int) -> None:
        """Start node ``node`` again and wait until it is registered."""
        self.cluster.start_node(node, wait_s=NODE_WAIT_S)

    def rolling_restart(self) -> None:
        """Restart the nodes one by one (clean shutdowns), the active controller last."""
        self.cluster.rolling_restart(wait_s=NODE_WAIT_S)

    def full_restart(self) -> None:
        """SIGKILL every node at once, then start them all."""
        self.cluster.full_restart(wait_s=NODE_WAIT_S, hard=True)

    def restore(self) -> None:
        """Start every node that is down (the launcher keeps running ones) and wait for all."""
        self.cluster.start(wait_s=NODE_WAIT_S)

    def in_sync(self, topics: Sequence[str]) -> bool:
        """True when every node is registered and no partition of ``topics`` lags."""
        registered = set(self.cluster.metadata(5.0).brokers)
        if not registered >= {n.node_id for n in self.cluster.spec.nodes}:
            return False
        wanted = set(topics)
        return not [tp for tp in self.cluster.under_replicated(5.0) if tp[0] in wanted]


@contextlib.contextmanager
def running_cluster(
    settings: LedgerSettings,
    brokers: int,
    network: NetworkSpec | None,
    say: Callable[[str], None],
    keep: bool = False,
) -> Iterator[tuple[LedgerSettings, MissionCluster]]:
    """Start the mission's cluster, yield ``(client settings, handle)``, stop it afterwards.

    Args:
        settings: uses ``kafka_home`` (jars in ``kafka_home/libs``; the
            cluster in ``kafka_home/mission-cluster-<N>``) and ``kafka_port``.
        brokers: nodes (3 for the chaos).
        network: the nodes' namespaces, or ``None`` (all on 127.0.0.1).
        say: progress lines.
        keep: leave a cluster started here running (not with a network: the
            namespaces go when the mission ends).

    Raises:
        BrokerError: the cluster could not be started (see
            :meth:`testbed.cluster.Cluster.start`).
    """
    libs = settings.kafka_home / "libs"
    home = settings.kafka_home / f"mission-cluster-{brokers}"
    layout: dict[str, object] = {}
    if network is not None:
        layout["hosts"] = [network.node_address(i) for i in range(brokers)]
        layout["command_prefixes"] = [network.node_prefix(i) for i in range(brokers)]
    local = settings.model_copy(update={"kafka_home": home})
    spec = ClusterSpec.from_settings(
        local, brokers=brokers, security="plaintext", libs=libs, **layout
    )
    cluster = Cluster(spec, local)
    if not any(cluster.node_pid(n.node_id) for n in spec.nodes):
        for node in spec.nodes:  # fresh data: each mission's cluster starts empty
            shutil.rmtree(node.home, ignore_errors=True)
        if not any(libs.glob("kafka_2.13-*.jar")):
            from testbed import broker

            broker.fetch_jars(settings)
    say(f"starting a {brokers}-node Kafka cluster on {spec.bootstrap} ...")
    status = cluster.start(wait_s=NODE_WAIT_S)
    try:
        yield cluster.client_settings(), MissionCluster(cluster)
    finally:
        if status.started and (not keep or network is not None):
            say(f"stopping the {brokers}-node cluster")
            cluster.stop(timeout_s=30)
