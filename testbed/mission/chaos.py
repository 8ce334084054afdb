"""Broker chaos for the mission: faults that hit a local three-node cluster, in turn.

With ``ledger mission run --brokers 3 --broker-chaos`` the mission hands a
:class:`BrokerChaos` the cluster (a :class:`ClusterControl`) and, when the
nodes run in their own network namespaces, the network
(:class:`testbed.netns.NetworkSpec`). While the workflow runs and its stages
are SIGKILLed at every seam, :meth:`BrokerChaos.poke` starts the next fault
of :data:`STEPS` in a background thread once the mission has got far enough:

1. ``leader-kill``: SIGKILL the node leading the busiest partition of the
   mission's topics (most records), then start it again;
2. ``controller-kill``: SIGKILL the active KRaft controller, then start it;
3. ``rolling-restart``: restart every node in turn;
4. ``full-restart``: stop every node, then start them all;
5. ``partition``: cut one node off the network (the leader of the busiest
   partition), hold the cut past the broker session timeout, then heal it.

Each fault is a :class:`FaultWindow` from the moment it is injected to the
moment the cluster is whole again (every node up, every partition of the
mission's topics fully in sync), recorded on the mission's report with its
times, so that readback latencies can be split by whether a resume
overlapped a failover. Without a network (namespaces not permitted), the
partition is skipped with the reason recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from testbed.netns import NetworkSpec

log = logging.getLogger(__name__)

#: The faults, in the order they hit.
STEPS: tuple[str, ...] = (
    "leader-kill",
    "controller-kill",
    "rolling-restart",
    "full-restart",
    "partition",
)

#: How long a cut node stays cut (s): past the broker session timeout (9 s
#: by default in KRaft), so that the controller fences it and its
#: partitions' leadership moves.
PARTITION_HOLD_S = 20.0
#: How long a killed node stays down before it is started again (s).
DOWN_S = 5.0
#: Longest error text a fault window keeps (the first line of the error).
ERROR_CHARS = 300
#: How long to wait for the cluster to be whole again after a fault (s).
HEAL_TIMEOUT_S = 180.0


class ClusterControl(Protocol):
    """What the chaos needs from the cluster launcher (``testbed.broker``)."""

    nodes: int

    def index_of(self, node: int) -> int:
        """0-based index of node ``node`` (its network namespace's number)."""
        ...

    def leader_of(self, topic: str, partition: int) -> int:
        """Node ID leading ``topic[partition]``."""
        ...

    def active_controller(self) -> int:
        """Node ID of the active KRaft controller."""
        ...

    def kill(self, node: int) -> None:
        """SIGKILL one node."""
        ...

    def start(self, node: int) -> None:
        """Start one (stopped) node and wait until it answers."""
        ...

    def rolling_restart(self) -> None:
        """Restart every node in turn, each back before the next goes."""
        ...

    def full_restart(self) -> None:
        """Stop every node, then start them all again."""
        ...

    def in_sync(self, topics: Sequence[str]) -> bool:
        """True when every node is up and every partition of ``topics`` is fully replicated."""
        ...

    def restore(self) -> None:
        """Start every node that is down (after a fault that failed half-way)."""
        ...


@dataclass
class FaultWindow:
    """One broker fault on the mission's timeline.

    Attributes:
        kind: one of :data:`STEPS`.
        target: what it hit (``"node 1 (leader of journal[3])"``).
        start: when it was injected (Unix seconds).
        end: when the cluster was whole again (Unix seconds); ``None`` while
            it lasts, or when it never healed (see ``error``).
        injected_after_cases: cases started when it was injected.
        note: how it went (``"skipped: ..."`` when it could not be run).
        error: what went wrong running it, if anything.
    """

    kind: str
    target: str = ""
    start: float = 0.0
    end: float | None = None
    injected_after_cases: int = 0
    note: str = ""
    error: str | None = None

    def as_dict(self, t0: float) -> dict[str, Any]:
        """JSON-ready, with times also relative to ``t0`` (Unix seconds of the mission's start)."""
        out = asdict(self)
        out["start_s"] = round(self.start - t0, 1) if self.start else None
        out["end_s"] = round(self.end - t0, 1) if self.end else None
        out["duration_s"] = round(self.end - self.start, 1) if self.end and self.start else None
        return out


@dataclass
class BrokerChaos:
    """The broker-fault schedule of one mission.

    Args:
        control: the cluster.
        network: the nodes' network namespaces, or ``None`` (no partition).
        busiest: ``() -> (topic, partition)`` with the most records among
            the mission's topics.
        topics: the mission's topic names (what must be back in sync).
        say: progress lines.
        unavailable: why there is no network, when ``network`` is ``None``.
        steps: the faults to run, in order (default :data:`STEPS`).
        down_s: how long a killed node stays down (seconds).
        partition_hold_s: how long the cut node stays cut (seconds).
        heal_timeout_s: how long to wait for the cluster to be whole again
            after each fault (seconds); past it the fault is recorded as failed.
    """

    control: ClusterControl
    network: NetworkSpec | None
    busiest: Callable[[], tuple[str, int]]
    topics: Sequence[str]
    say: Callable[[str], None] = lambda _: None
    unavailable: str = "no network namespaces"
    steps: Sequence[str] = STEPS
    down_s: float = DOWN_S
    partition_hold_s: float = PARTITION_HOLD_S
    heal_timeout_s: float = HEAL_TIMEOUT_S
    windows: list[FaultWindow] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def done(self) -> bool:
        """True when every step has run (or been skipped) and none is running."""
        return len(self.windows) == len(self.steps) and not self.running

    @property
    def running(self) -> bool:
        """True while a fault is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def poke(self, started: int, total: int) -> None:
        """Start the next fault once ``started`` cases reach its share of ``total``.

        Fault ``k`` (0-based) is due at ``(k + 1) / (len(steps) + 1)`` of the
        cases; only one runs at a time. Call it from the mission's loop.
        """
        if self.running or len(self.windows) >= len(self.steps):
            return
        k = len(self.windows)
        if started * (len(self.steps) + 1) < (k + 1) * total:
            return
        self._launch(self.steps[k], started)

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for the fault in progress (if any) to end."""
        if self._thread is not None:
            self._thread.join(timeout_s)

    def finish(self, timeout_s: float = 900.0, started: int = 0) -> None:
        """Run the faults still due, one after the other, and wait for the last.

        Raises:
            TimeoutError: a fault is still running after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._thread is not None:
                self._thread.join(max(0.0, deadline - time.monotonic()))
                if self._thread.is_alive():
                    raise TimeoutError(f"broker fault still running after {timeout_s:.0f} s")
            if len(self.windows) >= len(self.steps):
                return
            self._launch(self.steps[len(self.windows)], started)

    def _launch(self, kind: str, started: int) -> None:
        window = FaultWindow(kind, injected_after_cases=started)
        with self._lock:
            self.windows.append(window)
        self._thread = threading.Thread(
            target=self._run, args=(window,), name=f"chaos-{kind}", daemon=True
        )
        self._thread.start()

    def _run(self, w: FaultWindow) -> None:
        try:
            getattr(self, "_" + w.kind.replace("-", "_"))(w)
            if w.note.startswith("skipped"):
                self.say(f"broker chaos: {w.kind} {w.note}")
                return
            self._wait_whole(w)
            w.end = time.time()
            self.say(f"broker chaos: {w.kind} ({w.target}) over in {w.end - w.start:.1f} s")
        except Exception as exc:  # noqa: BLE001 - recorded on the report, the mission goes on
            first = (str(exc).strip().splitlines() or [""])[0]
            w.error = f"{type(exc).__name__}: {first}"[:ERROR_CHARS]  # the log has it all
            log.exception("broker chaos: %s failed", w.kind)
            self.say(f"broker chaos: {w.kind} failed: {w.error}")
            try:  # the mission goes on on a whole cluster
                self.control.restore()
            except Exception as again:  # noqa: BLE001 - the next fault or the end says more
                log.warning("broker chaos: restoring the cluster after %s: %s", w.kind, again)

    def _wait_whole(self, w: FaultWindow) -> None:
        deadline = time.monotonic() + self.heal_timeout_s
        while not self._in_sync():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cluster not whole again {self.heal_timeout_s:.0f} s after {w.kind}"
                )
            time.sleep(0.5)

    def _in_sync(self) -> bool:
        try:
            return self.control.in_sync(self.topics)
        except Exception as exc:  # noqa: BLE001 - asked again until the deadline
            log.info("broker chaos: in-sync check failed: %s", exc)
            return False

    def _busiest_leader(self) -> tuple[int, str]:
        """``(node, description)`` of the leader of the busiest partition.

        Asked again until ``heal_timeout_s`` while the answer fails (just
        after a restart a client's metadata can be stale, a partition
        leaderless for a moment).
        """
        deadline = time.monotonic() + self.heal_timeout_s
        while True:
            try:
                topic, partition = self.busiest()
                node = self.control.leader_of(topic, partition)
                return node, f"node {node} (leader of {topic}[{partition}])"
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("broker chaos: finding the busiest partition's leader: %s", exc)
                time.sleep(0.5)

    # ------------------------------------------------------------------ the faults

    def _leader_kill(self, w: FaultWindow) -> None:
        node, w.target = self._busiest_leader()
        self.say(f"broker chaos: SIGKILL {w.target}")
        w.start = time.time()
        self.control.kill(node)
        time.sleep(self.down_s)
        self.control.start(node)

    def _controller_kill(self, w: FaultWindow) -> None:
        node = self.control.active_controller()
        w.target = f"node {node} (active controller)"
        self.say(f"broker chaos: SIGKILL {w.target}")
        w.start = time.time()
        self.control.kill(node)
        time.sleep(self.down_s)
        self.control.start(node)

    def _rolling_restart(self, w: FaultWindow) -> None:
        w.target = f"all {self.control.nodes} nodes, one at a time"
        self.say("broker chaos: rolling restart")
        w.start = time.time()
        self.control.rolling_restart()

    def _full_restart(self, w: FaultWindow) -> None:
        w.target = f"all {self.control.nodes} nodes"
        self.say("broker chaos: full-cluster restart")
        w.start = time.time()
        self.control.full_restart()

    def _partition(self, w: FaultWindow) -> None:
        if self.network is None:
            w.note = f"skipped: {self.unavailable}"
            return
        node, w.target = self._busiest_leader()
        hold = self.partition_hold_s
        self.say(f"broker chaos: cutting {w.target} off the network for {hold:.0f} s")
        w.start = time.time()
        index = self.control.index_of(node)
        self.network.cut(index)
        try:
            time.sleep(hold)
        finally:
            self.network.heal(index)
        w.note = f"cut for {hold:.0f} s, then healed"

    def report(self, t0: float) -> list[dict[str, Any]]:
        """Every window so far, JSON-ready (times relative to ``t0``, Unix seconds)."""
        with self._lock:
            return [w.as_dict(t0) for w in self.windows]
