"""Network namespaces for a local Kafka cluster that can be cut off, made by the test itself.

A :class:`ClusterNetwork` builds, on this machine (as root, with ``ip`` from
iproute2)::

    hub namespace  ──  bridge br0
        ├── veth n0 ── node namespace 0: eth0 10.A.B.10/24   (broker node 0)
        ├── veth n1 ── node namespace 1: eth0 10.A.B.11/24   (broker node 1)
        ├── veth n2 ── node namespace 2: eth0 10.A.B.12/24   (broker node 2)
        └── veth c  ── client namespace: eth0 10.A.B.100/24  (stages, sinks, the runner)

The subnet ``10.A.B.0/24`` and the namespace names (``lk{port}-hub``,
``lk{port}-n{i}``, ``lk{port}-client``) are derived from the Kafka port, so
runs on different ports never collide. Every veth is created inside the hub
namespace and its peer moved straight into its own namespace: no address and
no interface of these is ever in the root namespace (each namespace has its
own loopback too).

:meth:`ClusterNetwork.cut` sets a node's hub-side veth down (the node keeps
its address but nothing reaches it, nor leaves it: a partition);
:meth:`ClusterNetwork.heal` sets it up again. :meth:`ClusterNetwork.down`
kills whatever still runs in the namespaces and deletes them; it runs on
leaving the context manager, at interpreter exit (``atexit``) and on
:meth:`ClusterNetwork.up` failing half-way, so no namespace is left behind.

Processes join a namespace through ``ip netns exec NAME ...``
(:meth:`ClusterNetwork.node_prefix`, :meth:`ClusterNetwork.client_prefix`):
the mission runner re-executes itself in the client namespace, and the
cluster launcher starts each broker node behind its node prefix.

Where namespaces cannot be made (not root, no ``ip``, a container without
``CAP_SYS_ADMIN``), :func:`unavailable_reason` says why, and callers skip
what needs them with that message.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from types import TracebackType

from ledger.errors import BrokerError

log = logging.getLogger(__name__)

#: Environment variable that hands a child process the network the parent made
#: (JSON of :meth:`ClusterNetwork.spec`).
NETNS_ENV = "LEDGER_TESTBED_NETNS"

#: Host part of node ``i``'s address is ``NODE_HOST0 + i``; the client's is ``CLIENT_HOST``.
NODE_HOST0 = 10
CLIENT_HOST = 100
#: Most broker nodes one network holds.
MAX_NODES = 16


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise BrokerError(
            f"{' '.join(cmd)}: {done.stderr.strip() or f'exit {done.returncode}'}",
            expected="exit 0",
            observed=done.returncode,
        )
    return done


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or ``None`` when they can.

    Creates and deletes one throw-away namespace (``ip netns add``) to find out.
    """
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not on PATH"
    if os.geteuid() != 0:
        return "network namespaces need root (`ip netns add` is not permitted)"
    probe = f"lkprobe-{uuid.uuid4().hex[:8]}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted here: {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def subnet_for(kafka_port: int) -> str:
    """The private /24 of the network for ``kafka_port``: ``10.{port // 256}.{port % 256}``.

    Args:
        kafka_port: 1..65535.

    Returns:
        The first three octets, e.g. ``"10.154.168"`` for port 39592.

    Raises:
        ValueError: the port is out of range.
    """
    if not 1 <= kafka_port <= 65535:
        raise ValueError(f"kafka port must be 1..65535, not {kafka_port}")
    return f"10.{kafka_port // 256}.{kafka_port % 256}"


@dataclass(frozen=True)
class NetworkSpec:
    """Names and addresses of one cluster network (what a child process needs).

    Attributes:
        kafka_port: the port the names and subnet derive from.
        nodes: broker nodes.
    """

    kafka_port: int
    nodes: int

    @property
    def prefix(self) -> str:
        """Namespace name prefix, ``lk{port}``."""
        return f"lk{self.kafka_port}"

    @property
    def hub(self) -> str:
        """The hub namespace (holds the bridge)."""
        return f"{self.prefix}-hub"

    @property
    def client(self) -> str:
        """The client namespace (stages, sinks, the mission runner)."""
        return f"{self.prefix}-client"

    def node(self, i: int) -> str:
        """Node ``i``'s namespace."""
        self._check(i)
        return f"{self.prefix}-n{i}"

    def node_address(self, i: int) -> str:
        """Node ``i``'s IPv4 address (only inside its namespace)."""
        self._check(i)
        return f"{subnet_for(self.kafka_port)}.{NODE_HOST0 + i}"

    @property
    def client_address(self) -> str:
        """The client namespace's IPv4 address."""
        return f"{subnet_for(self.kafka_port)}.{CLIENT_HOST}"

    def namespaces(self) -> list[str]:
        """Every namespace of the network (hub last)."""
        return [*(self.node(i) for i in range(self.nodes)), self.client, self.hub]

    def node_prefix(self, i: int) -> list[str]:
        """Command prefix that runs a command in node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.node(i)]

    def client_prefix(self) -> list[str]:
        """Command prefix that runs a command in the client namespace."""
        return ["ip", "netns", "exec", self.client]

    def to_env(self) -> str:
        """JSON for :data:`NETNS_ENV`."""
        return json.dumps({"kafka_port": self.kafka_port, "nodes": self.nodes})

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> NetworkSpec | None:
        """The network a parent process handed down in :data:`NETNS_ENV`, if any.

        Raises:
            ValueError: the variable is set but is not a network spec.
        """
        raw = (os.environ if environ is None else environ).get(NETNS_ENV)
        if not raw:
            return None
        try:
            data = json.loads(raw)
            return cls(int(data["kafka_port"]), int(data["nodes"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{NETNS_ENV} is not a network spec: {raw!r}") from exc

    def _check(self, i: int) -> None:
        if not 0 <= i < self.nodes:
            raise IndexError(f"node {i} out of range 0..{self.nodes - 1}")

    # Cutting and healing work from any namespace (``ip -n`` names the hub).

    def cut(self, i: int) -> None:
        """Cut node ``i`` off: its hub-side link goes down (nothing in or out).

        Raises:
            BrokerError: the link could not be set down.
        """
        _ip("-n", self.hub, "link", "set", f"n{self._idx(i)}", "down")

    def heal(self, i: int) -> None:
        """Restore node ``i``'s link (undo :meth:`cut`).

        Raises:
            BrokerError: the link could not be set up.
        """
        _ip("-n", self.hub, "link", "set", f"n{self._idx(i)}", "up")

    def is_cut(self, i: int) -> bool:
        """True while node ``i``'s hub-side link is down."""
        done = _ip("-n", self.hub, "-o", "link", "show", f"n{self._idx(i)}")
        flags = done.stdout.split("<", 1)[1].split(">", 1)[0].split(",")
        return "UP" not in flags

    def _idx(self, i: int) -> int:
        self._check(i)
        return i


class ClusterNetwork(NetworkSpec):
    """A :class:`NetworkSpec` this process creates and deletes.

    Use as a context manager; :meth:`down` is also registered with ``atexit``.

    Args:
        kafka_port: names and the subnet derive from it (see :func:`subnet_for`).
        nodes: broker nodes, 1..:data:`MAX_NODES`.

    Raises:
        ValueError: ``nodes`` out of range.
    """

    _made: list[str]
    _registered: bool

    def __init__(self, kafka_port: int, nodes: int = 3) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}, not {nodes}")
        subnet_for(kafka_port)
        super().__init__(kafka_port, nodes)
        object.__setattr__(self, "_made", [])
        object.__setattr__(self, "_registered", False)

    @property
    def spec(self) -> NetworkSpec:
        """The plain spec (for :data:`NETNS_ENV`)."""
        return NetworkSpec(self.kafka_port, self.nodes)

    def up(self) -> ClusterNetwork:
        """Create the namespaces, the bridge, the veths and the addresses.

        Namespaces left over under the same names (a run that was SIGKILLed)
        are deleted first.

        Returns:
            self.

        Raises:
            BrokerError: a command failed (whatever was made is deleted again).
        """
        if not self._registered:
            atexit.register(self.down)
            object.__setattr__(self, "_registered", True)
        self._delete(self.namespaces())  # leftovers of a killed run
        try:
            for ns in self.namespaces():
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            ends = [(f"n{i}", self.node(i), self.node_address(i)) for i in range(self.nodes)]
            ends.append(("c", self.client, self.client_address))
            for hub_end, ns, address in ends:
                _ip(
                    "-n", self.hub, "link", "add", hub_end, "type", "veth",
                    "peer", "name", "eth0", "netns", ns,
                )  # fmt: skip
                _ip("-n", self.hub, "link", "set", hub_end, "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except Exception:
            self.down()
            raise
        return self

    def pids(self) -> list[int]:
        """PIDs of the processes running in any of the namespaces."""
        found: list[int] = []
        for ns in self.namespaces():
            done = _ip("netns", "pids", ns, check=False)
            found += [int(p) for p in done.stdout.split() if p.isdigit()]
        return found

    def down(self, timeout_s: float = 10.0) -> None:
        """Kill what still runs in the namespaces (SIGTERM, then SIGKILL) and delete them.

        Safe to call more than once; never raises (teardown must finish).
        """
        made = [ns for ns in self.namespaces() if _exists(ns)]
        if not made:
            return
        own = os.getpid()
        try:
            pids = [p for p in self.pids() if p != own]
            for sig in (signal.SIGTERM, signal.SIGKILL):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                deadline = time.monotonic() + timeout_s / 2
                while pids and time.monotonic() < deadline:
                    pids = [p for p in pids if _alive(p)]
                    if pids:
                        time.sleep(0.05)
        except Exception as exc:  # noqa: BLE001 - teardown goes on
            log.warning("netns teardown: stopping processes failed: %s", exc)
        self._delete(made)
        self._made.clear()

    @staticmethod
    def _delete(names: list[str]) -> None:
        for ns in names:
            if _exists(ns):
                done = _ip("netns", "del", ns, check=False)
                if done.returncode != 0:
                    log.warning("netns teardown: %s", done.stderr.strip())

    def __enter__(self) -> ClusterNetwork:
        return self.up()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()


def _exists(ns: str) -> bool:
    return os.path.exists(f"/var/run/netns/{ns}") or os.path.exists(f"/run/netns/{ns}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
