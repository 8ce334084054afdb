"""Network namespaces for the partition fault (real ``ip netns``; skipped without root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.netns import NETNS_ENV, ClusterNetwork, NetworkSpec, subnet_for, unavailable_reason

#: Within this session's port range (LEDGER_KAFKA_PORT .. +49), clear of the brokers.
PORT = int(os.environ.get("LEDGER_KAFKA_PORT", "19092")) + 47

SERVER = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 9000))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""

PROBE = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], 9000), timeout=1.5)
    print(s.recv(2).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


def test_names_and_subnet_derive_from_the_port() -> None:
    spec = NetworkSpec(39592, 3)
    assert subnet_for(39592) == "10.154.168"
    assert spec.node_address(2) == "10.154.168.12"
    assert spec.client_address == "10.154.168.100"
    assert spec.namespaces() == ["lk39592-n0", "lk39592-n1", "lk39592-n2", "lk39592-client",
                                 "lk39592-hub"]  # fmt: skip
    assert NetworkSpec(39593, 3).node_address(0) != spec.node_address(0)
    assert NetworkSpec.from_env({NETNS_ENV: spec.to_env()}) == spec
    assert NetworkSpec.from_env({}) is None
    with pytest.raises(ValueError, match=NETNS_ENV):
        NetworkSpec.from_env({NETNS_ENV: "{"})
    with pytest.raises(ValueError):
        subnet_for(70000)


def _probe(net: ClusterNetwork, address: str) -> str:
    done = subprocess.run(
        [*net.client_prefix(), sys.executable, "-c", PROBE, address],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def _exists(ns: str) -> bool:
    return Path(f"/run/netns/{ns}").exists() or Path(f"/var/run/netns/{ns}").exists()


def test_a_node_is_reachable_from_the_client_namespace_only_and_can_be_cut_off() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    net = ClusterNetwork(PORT, 2)
    with net:
        assert all(_exists(ns) for ns in net.namespaces())
        node = net.node_address(1)
        server = subprocess.Popen(
            [*net.node_prefix(1), sys.executable, "-c", SERVER, node],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        assert _probe(net, node) == "hi"
        # no address of the network exists in the root namespace
        root = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True)
        assert subnet_for(PORT) + "." not in root.stdout
        net.cut(1)
        assert net.is_cut(1) and not net.is_cut(0)
        assert _probe(net, node) in ("TimeoutError", "OSError", "ConnectionRefusedError")
        net.heal(1)
        assert not net.is_cut(1)
        assert _probe(net, node) == "hi"
        assert server.pid in net.pids()
    # teardown: what ran inside is stopped, and no namespace is left behind
    assert server.wait(timeout=10) is not None
    assert not any(_exists(ns) for ns in net.namespaces())
    net.down()  # again: nothing to do, no error
