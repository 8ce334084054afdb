"""The broker-chaos schedule of the mission, against a fake cluster (no broker, no namespace)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from testbed.mission.chaos import STEPS, BrokerChaos
from testbed.netns import NetworkSpec


class FakeCluster:
    """Records what the chaos asks of the cluster."""

    def __init__(self, nodes: int = 3, leader: int = 1, controller: int = 2) -> None:
        self.nodes = nodes
        self.leader = leader
        self.controller = controller
        self.calls: list[tuple[str, int | None]] = []
        self.whole = True
        self.fail_on: str | None = None

    def index_of(self, node: int) -> int:
        return node - 1  # node IDs 1..N, namespaces 0..N-1

    def leader_of(self, topic: str, partition: int) -> int:
        self.calls.append((f"leader_of {topic}[{partition}]", None))
        return self.leader

    def active_controller(self) -> int:
        return self.controller

    def kill(self, node: int) -> None:
        if self.fail_on == "kill":
            raise RuntimeError("no such node\n" + "a long log tail\n" * 100)
        self.calls.append(("kill", node))

    def start(self, node: int) -> None:
        self.calls.append(("start", node))

    def rolling_restart(self) -> None:
        self.calls.append(("rolling", None))

    def full_restart(self) -> None:
        self.calls.append(("full", None))

    def in_sync(self, topics: Sequence[str]) -> bool:
        return self.whole

    def restore(self) -> None:
        self.calls.append(("restore", None))


class FakeNetwork(NetworkSpec):
    """A spec whose cut and heal are recorded instead of run."""

    def __init__(self) -> None:
        super().__init__(39592, 3)
        object.__setattr__(self, "log", [])

    def cut(self, i: int) -> None:
        self.log.append(("cut", i))  # type: ignore[attr-defined]

    def heal(self, i: int) -> None:
        self.log.append(("heal", i))  # type: ignore[attr-defined]


def _chaos(cluster: FakeCluster, network: NetworkSpec | None, **kw: float) -> BrokerChaos:
    return BrokerChaos(
        cluster,
        network,
        lambda: ("mission-x.journal", 2),
        ["mission-x.journal"],
        unavailable="not root",
        down_s=0.0,
        partition_hold_s=0.0,
        heal_timeout_s=kw.get("heal_timeout_s", 5.0),
    )


def test_faults_hit_in_turn_as_the_mission_gets_further() -> None:
    cluster, network = FakeCluster(), FakeNetwork()
    chaos = _chaos(cluster, network)
    chaos.poke(0, 600)
    assert chaos.windows == []  # nothing due before a sixth of the cases
    chaos.poke(100, 600)  # 1/6: the first fault
    chaos.finish(timeout_s=10, started=100)
    assert [w.kind for w in chaos.windows] == list(STEPS)
    assert chaos.done
    assert ("kill", 1) in cluster.calls and ("kill", 2) in cluster.calls
    assert cluster.calls.index(("kill", 1)) < cluster.calls.index(("start", 1))
    assert ("rolling", None) in cluster.calls and ("full", None) in cluster.calls
    assert network.log == [("cut", 0), ("heal", 0)]  # type: ignore[attr-defined]
    for w in chaos.windows:
        assert w.error is None
        assert w.start and w.end and w.end >= w.start
    assert chaos.windows[0].target == "node 1 (leader of mission-x.journal[2])"
    assert chaos.windows[1].target == "node 2 (active controller)"
    report = chaos.report(chaos.windows[0].start)
    assert report[0]["start_s"] == 0.0 and report[0]["duration_s"] is not None


def test_only_one_fault_at_a_time_and_each_at_its_share() -> None:
    chaos = _chaos(FakeCluster(), FakeNetwork())
    chaos.poke(100, 600)
    chaos.poke(200, 600)  # the first still runs (or has just ended): at most one more
    chaos.join(5)
    assert not chaos.running
    n = len(chaos.windows)
    chaos.poke(150 if n == 1 else 250, 600)  # not yet the next one's share
    assert len(chaos.windows) == n
    chaos.poke(600, 600)
    assert len(chaos.windows) == n + 1
    chaos.join(5)


def test_without_a_network_the_partition_is_skipped_with_the_reason() -> None:
    chaos = _chaos(FakeCluster(), None)
    chaos.finish(timeout_s=10)
    cut = chaos.windows[-1]
    assert cut.kind == "partition" and cut.note == "skipped: not root"
    assert cut.start == 0.0 and cut.end is None and cut.error is None


def test_a_fault_that_fails_or_never_heals_is_recorded_not_raised() -> None:
    cluster = FakeCluster()
    cluster.fail_on = "kill"
    chaos = _chaos(cluster, None)
    chaos.finish(timeout_s=10)
    assert chaos.windows[0].error == "RuntimeError: no such node"  # its first line only
    assert ("restore", None) in cluster.calls  # a fault that failed half-way leaves all nodes up
    cluster.fail_on = None
    cluster.whole = False
    chaos = _chaos(cluster, None, heal_timeout_s=0.0)
    chaos.finish(timeout_s=10)
    assert chaos.windows[0].end is None
    assert "not whole again" in str(chaos.windows[0].error)


@pytest.mark.parametrize("node", [-1, 3])
def test_the_network_refuses_a_node_it_does_not_have(node: int) -> None:
    with pytest.raises(IndexError):
        NetworkSpec(39592, 3).node(node)
