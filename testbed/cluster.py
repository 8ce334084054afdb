"""A local N-node Kafka KRaft cluster from the broker's Maven jars, optionally secured.

``ledger broker start --brokers 3 [--security sasl_ssl|sasl_plaintext]``
runs here (one node, plaintext, stays with :mod:`testbed.broker`). Every node
is ``broker,controller`` (combined mode), a detached ``java kafka.Kafka``
process with its own folder under ``kafka_home``::

    libs/                          jars, shared with the single-node broker
    cluster.json                   the layout last started (ClusterSpec.to_json)
    node-<i>/config/server.properties   (mode 0600: it holds the admin password)
    node-<i>/config/log4j2.properties
    node-<i>/data/                 KRaft metadata log and topic data
    node-<i>/logs/server.log, broker.out, format.log
    node-<i>/node.pid              PID of the node we started
    security/ca.pem, ca.key        the cluster's CA (testbed.certs), kept
    security/node-<i>.pem          node key + certificate + CA (PEM keystore)
    security/users.json            SCRAM passwords, made once (mode 0600)
    clients/<user>.properties      librdkafka client properties per principal

**Ports** (all within ``kafka_port .. kafka_port + 2N - 1``): node ``i``
(1-based) takes client port ``kafka_port + i - 1`` and controller port
``kafka_port + N + i - 1``, so the first node keeps ``kafka_port`` and the
default bootstrap list still reaches the cluster.

**Replication**: internal topics (offsets, transaction state, share state)
and topics created without a replication factor get ``min(N, 3)`` replicas and
``min.insync.replicas`` 2 from three nodes on (1 below).

**Security** (:data:`SECURITY_MODES`): ``plaintext``; ``sasl_plaintext`` or
``sasl_ssl``: the client/inter-broker listener ``BROKER`` takes SCRAM-SHA-512
(users :data:`testbed.broker.PRINCIPALS`, bootstrapped into the metadata log
when the storage is formatted), the controller listener ``CONTROLLER`` takes
PLAIN for ``admin`` only (SCRAM cannot authenticate controllers: its
credentials live in the metadata log the controllers serve); with
``sasl_ssl`` both are TLS with the cluster's CA. The ``StandardAuthorizer``
runs with ``allow.everyone.if.no.acl.found=false`` and ``User:admin`` as the
only super user: every other principal can do nothing until ACLs allow it.

**Fault primitives** (:class:`Cluster`, for chaos missions):
:meth:`Cluster.kill_node` (SIGKILL), :meth:`Cluster.stop_node` (SIGTERM),
:meth:`Cluster.start_node`, :meth:`Cluster.leader_of`,
:meth:`Cluster.active_controller`, :meth:`Cluster.wait_fully_replicated`,
:meth:`Cluster.rolling_restart`, :meth:`Cluster.full_restart`. A node may run
on its own host address and behind a command prefix (e.g.
``["ip", "netns", "exec", "ns-1"]``), see :meth:`ClusterSpec.build`; the
process that calls these must reach every node's host, and the prefix must
``exec`` java (as ``ip netns exec`` and ``nsenter`` do) or at least leave it
findable: a node's PID is its recorded one, else the ``java kafka.Kafka``
process whose command line names the node's ``server.properties``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._metadata import ClusterMetadata

from ledger.errors import BrokerError, BrokerUnavailableError
from ledger.kafka import admin_config
from ledger.settings import LedgerSettings
from testbed import broker, certs, launcher
from testbed.broker import PRINCIPALS
from testbed.launcher import CLUSTER_ID

Security = Literal["plaintext", "sasl_plaintext", "sasl_ssl"]
#: The security modes of ``ledger broker start --security``.
SECURITY_MODES: tuple[str, ...] = get_args(Security)
#: Most nodes a local cluster may have (two ports each within kafka_port..+49).
MAX_BROKERS = 9
#: Ports a cluster may use from ``kafka_port`` on.
PORT_SPAN = 50
#: SASL mechanism of clients and brokers on the ``BROKER`` listener.
SCRAM_MECHANISM = "SCRAM-SHA-512"
#: The authorizer of a secured cluster.
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
#: The super user: brokers, controllers, topic and ACL administration.
SUPER_USER = "admin"
#: Java heap of each node.
NODE_HEAP = ("-Xms128m", "-Xmx512m")
#: Where a node's KRaft client keeps its election state (leader, epoch).
QUORUM_STATE = Path("__cluster_metadata-0") / "quorum-state"

_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Node:
    """One node of the cluster (broker and controller in one process).

    Attributes:
        node_id: ``1..N`` (``node.id``).
        host: the address it listens on and advertises.
        client_port: its ``BROKER`` listener (clients and other brokers).
        controller_port: its ``CONTROLLER`` listener (KRaft quorum).
        home: its folder, ``kafka_home/node-<id>``.
        prefix: command prefix its java process is started under (may be empty).
    """

    node_id: int
    host: str
    client_port: int
    controller_port: int
    home: Path
    prefix: tuple[str, ...] = ()

    @property
    def bootstrap(self) -> str:
        """``host:client_port``."""
        return f"{self.host}:{self.client_port}"

    @property
    def server_properties(self) -> Path:
        """``node-<i>/config/server.properties``."""
        return self.home / "config" / "server.properties"

    @property
    def data(self) -> Path:
        """``node-<i>/data``: metadata log and topic data."""
        return self.home / "data"

    @property
    def logs(self) -> Path:
        """``node-<i>/logs``."""
        return self.home / "logs"

    @property
    def log_file(self) -> Path:
        """The node's own log, ``logs/server.log``."""
        return self.logs / "server.log"

    @property
    def stdout_file(self) -> Path:
        """stdout/stderr of its java process, ``logs/broker.out``."""
        return self.logs / "broker.out"

    @property
    def pid_file(self) -> Path:
        """``node-<i>/node.pid``."""
        return self.home / "node.pid"

    def broker_paths(self, libs: Path) -> launcher.KafkaPaths:
        """The node's folders in :mod:`testbed.launcher`'s terms."""
        config = self.home / "config"
        return launcher.KafkaPaths(
            home=self.home,
            libs=libs,
            config_dir=config,
            server_properties=self.server_properties,
            log4j_config=config / "log4j2.properties",
            data=self.data,
            logs=self.logs,
            log_file=self.log_file,
            stdout_file=self.stdout_file,
            pid_file=self.pid_file,
            lock_file=self.home / "node.lock",
        )


@dataclass(frozen=True)
class ClusterSpec:
    """The layout of a local cluster; build one with :meth:`build` or :meth:`from_settings`.

    Attributes:
        kafka_home: the cluster's folder (see the module docstring).
        kafka_port: first port; the cluster uses ``kafka_port .. + 2N - 1``.
        brokers: number of nodes ``N`` (1 to :data:`MAX_BROKERS`).
        security: one of :data:`SECURITY_MODES`.
        hosts: per node, the address it listens on and advertises.
        command_prefixes: per node, the command its java runs under.
        libs: the broker jars (default ``kafka_home/libs``).
    """

    kafka_home: Path
    kafka_port: int
    brokers: int
    security: Security
    hosts: tuple[str, ...]
    command_prefixes: tuple[tuple[str, ...], ...]
    libs: Path

    @classmethod
    def build(
        cls,
        kafka_home: Path,
        kafka_port: int,
        brokers: int = 3,
        security: str = "plaintext",
        hosts: Sequence[str] | None = None,
        command_prefixes: Sequence[Sequence[str]] | None = None,
        libs: Path | None = None,
    ) -> ClusterSpec:
        """Check and build a layout.

        Args:
            kafka_home: the cluster's folder (made absolute).
            kafka_port: the first port (node 1's client port).
            brokers: number of nodes, 1 to :data:`MAX_BROKERS`.
            security: ``plaintext``, ``sasl_plaintext`` or ``sasl_ssl``.
            hosts: one address per node (default ``127.0.0.1`` for each), e.g.
                the node's address inside its network namespace.
            command_prefixes: one argument list per node prepended to its java
                command (default none), e.g. ``["ip", "netns", "exec", "ns-1"]``.
            libs: the broker jars (default ``kafka_home/libs``).

        Returns:
            The layout.

        Raises:
            BrokerError: a value is out of range or a list has the wrong length.
        """
        if not 1 <= brokers <= MAX_BROKERS:
            raise BrokerError(
                f"a local cluster has 1 to {MAX_BROKERS} brokers, not {brokers}",
                expected=f"1..{MAX_BROKERS}",
                observed=str(brokers),
            )
        if security not in SECURITY_MODES:
            raise BrokerError(
                f"unknown broker security {security!r}; choose one of {', '.join(SECURITY_MODES)}",
                expected=" | ".join(SECURITY_MODES),
                observed=security,
            )
        if not 1024 <= kafka_port <= 65535 - 2 * brokers:
            raise BrokerError(
                f"kafka_port {kafka_port} leaves no room for {brokers} nodes' ports",
                expected=f"1024..{65535 - 2 * brokers}",
                observed=str(kafka_port),
            )
        host_list = tuple(hosts) if hosts is not None else ("127.0.0.1",) * brokers
        prefix_list = (
            tuple(tuple(p) for p in command_prefixes)
            if command_prefixes is not None
            else ((),) * brokers
        )
        for name, values in (("hosts", host_list), ("command_prefixes", prefix_list)):
            if len(values) != brokers:
                raise BrokerError(
                    f"{name} names {len(values)} nodes but the cluster has {brokers}",
                    expected=str(brokers),
                    observed=str(len(values)),
                )
        if any(not h or any(c in h for c in " ,:/") for h in host_list):
            raise BrokerError(
                f"a node host must be an address or name without ' ,:/', not {host_list}",
                expected="host",
                observed=",".join(host_list),
            )
        home = Path(kafka_home).absolute()
        return cls(
            kafka_home=home,
            kafka_port=kafka_port,
            brokers=brokers,
            security=cast(Security, security),
            hosts=host_list,
            command_prefixes=prefix_list,
            libs=Path(libs).absolute() if libs is not None else home / "libs",
        )

    @classmethod
    def from_settings(
        cls,
        settings: LedgerSettings,
        brokers: int | None = None,
        security: str | None = None,
        **kwargs: Any,
    ) -> ClusterSpec:
        """The layout for ``settings`` (``kafka_home``, ``kafka_port``, ``brokers``,
        ``broker_security``); ``brokers``/``security`` override the settings and
        ``kwargs`` go to :meth:`build` (``hosts``, ``command_prefixes``, ``libs``).

        Raises:
            BrokerError: as :meth:`build`.
        """
        return cls.build(
            Path(settings.kafka_home),
            settings.kafka_port,
            brokers=settings.brokers if brokers is None else brokers,
            security=settings.broker_security if security is None else security,
            **kwargs,
        )

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The nodes, ``node_id`` 1..N."""
        n = self.brokers
        return tuple(
            Node(
                node_id=i,
                host=self.hosts[i - 1],
                client_port=self.kafka_port + i - 1,
                controller_port=self.kafka_port + n + i - 1,
                home=self.kafka_home / f"node-{i}",
                prefix=self.command_prefixes[i - 1],
            )
            for i in range(1, n + 1)
        )

    def node(self, node_id: int) -> Node:
        """Node ``node_id`` (1-based).

        Raises:
            BrokerError: there is no such node.
        """
        if not 1 <= node_id <= self.brokers:
            raise BrokerError(
                f"the cluster has nodes 1..{self.brokers}, not {node_id}",
                expected=f"1..{self.brokers}",
                observed=str(node_id),
            )
        return self.nodes[node_id - 1]

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:client_port``, comma-separated."""
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def secured(self) -> bool:
        """SASL (and perhaps TLS) is on."""
        return self.security != "plaintext"

    @property
    def replication_factor(self) -> int:
        """Replicas of internal and default topics: ``min(N, 3)``."""
        return min(self.brokers, 3)

    @property
    def min_insync_replicas(self) -> int:
        """``min.insync.replicas``: 2 from three nodes on, else 1."""
        return 2 if self.brokers >= 3 else 1

    @property
    def security_dir(self) -> Path:
        """``kafka_home/security``: CA, node keystores, passwords."""
        return self.kafka_home / "security"

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients trust (``ssl.ca.location``)."""
        return self.security_dir / "ca.pem"

    @property
    def users_file(self) -> Path:
        """``security/users.json``: principal -> SCRAM password (mode 0600)."""
        return self.security_dir / "users.json"

    @property
    def clients_dir(self) -> Path:
        """``kafka_home/clients``: one properties file per principal."""
        return self.kafka_home / "clients"

    def client_file(self, principal: str) -> Path:
        """``clients/<principal>.properties`` (exists once a secured cluster started)."""
        return self.clients_dir / f"{principal}.properties"

    def keystore(self, node_id: int) -> Path:
        """``security/node-<i>.pem``."""
        return self.security_dir / f"node-{node_id}.pem"

    def to_json(self) -> str:
        """The layout as JSON (``cluster.json``)."""
        return json.dumps(
            {
                "kafka_home": str(self.kafka_home),
                "kafka_port": self.kafka_port,
                "brokers": self.brokers,
                "security": self.security,
                "hosts": list(self.hosts),
                "command_prefixes": [list(p) for p in self.command_prefixes],
                "libs": str(self.libs),
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> ClusterSpec:
        """The layout :meth:`to_json` wrote.

        Raises:
            BrokerError: the JSON is not such a layout.
        """
        try:
            raw = json.loads(text)
            return cls.build(
                Path(raw["kafka_home"]),
                int(raw["kafka_port"]),
                brokers=int(raw["brokers"]),
                security=str(raw["security"]),
                hosts=[str(h) for h in raw["hosts"]],
                command_prefixes=[[str(a) for a in p] for p in raw["command_prefixes"]],
                libs=Path(raw["libs"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BrokerError(
                f"not a cluster layout ({exc}); stop the cluster's java processes and "
                "delete cluster.json",
                expected="cluster.json",
                observed="malformed",
            ) from None


def recorded_spec(kafka_home: Path) -> ClusterSpec | None:
    """The layout last started in ``kafka_home`` (its ``cluster.json``), if any.

    Raises:
        BrokerError: ``cluster.json`` is malformed.
    """
    path = Path(kafka_home).absolute() / "cluster.json"
    try:
        return ClusterSpec.from_json(path.read_text())
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------- configuration


def _jaas(module: str, username: str, password: str, **users: str) -> str:
    extra = "".join(f' user_{name}="{pw}"' for name, pw in users.items())
    return f'{module} required username="{username}" password="{password}"{extra};'


def server_properties(
    spec: ClusterSpec, node: Node, passwords: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The ``server.properties`` of one node, as a dict (pure).

    Args:
        spec: the cluster.
        node: one of ``spec.nodes``.
        passwords: principal -> password; required (with ``admin``) when the
            cluster is secured.

    Returns:
        Property name -> value.

    Raises:
        BrokerError: a secured cluster without the admin's password.
    """
    proto = {"plaintext": "PLAINTEXT", "sasl_plaintext": "SASL_PLAINTEXT", "sasl_ssl": "SASL_SSL"}[
        spec.security
    ]
    rf, isr = str(spec.replication_factor), str(spec.min_insync_replicas)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": ",".join(
            f"{n.node_id}@{n.host}:{n.controller_port}" for n in spec.nodes
        ),
        "listeners": (
            f"BROKER://{node.host}:{node.client_port},"
            f"CONTROLLER://{node.host}:{node.controller_port}"
        ),
        "advertised.listeners": f"BROKER://{node.host}:{node.client_port}",
        "listener.security.protocol.map": f"BROKER:{proto},CONTROLLER:{proto}",
        "inter.broker.listener.name": "BROKER",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(node.data),
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "unclean.leader.election.enable": "false",
        "offsets.topic.num.partitions": str(spec.brokers),
        "transaction.state.log.num.partitions": str(spec.brokers),
        "group.initial.rebalance.delay.ms": "0",
        "log.cleaner.backoff.ms": "500",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        "auto.create.topics.enable": "false",
    }
    if not spec.secured:
        return props
    if not passwords or SUPER_USER not in passwords:
        raise BrokerError(
            f"a secured cluster needs the {SUPER_USER} password (security/users.json)",
            expected=SUPER_USER,
            observed="missing",
        )
    admin_pw = passwords[SUPER_USER]
    props.update(
        {
            "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.broker.sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.broker.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": _jaas(
                "org.apache.kafka.common.security.scram.ScramLoginModule", SUPER_USER, admin_pw
            ),
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": _jaas(
                "org.apache.kafka.common.security.plain.PlainLoginModule",
                SUPER_USER,
                admin_pw,
                **{SUPER_USER: admin_pw},
            ),
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{SUPER_USER}",
        }
    )
    if spec.security == "sasl_ssl":
        props.update(
            {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(spec.keystore(node.node_id)),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(spec.ca_file),
                "ssl.client.auth": "none",
                "ssl.endpoint.identification.algorithm": "https",
            }
        )
    return props


def render_properties(props: Mapping[str, str], header: str) -> str:
    """Java properties text: a ``#`` header line, then ``key=value`` lines.

    Values are written as they are (none of ours holds a newline or a
    leading blank; ``\\`` is doubled).
    """
    lines = [f"# {header}"]
    lines += [f"{k}={v.replace(chr(92), chr(92) * 2)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def client_properties(spec: ClusterSpec, principal: str, password: str) -> dict[str, str]:
    """librdkafka client properties of ``principal`` for a secured cluster (pure).

    Args:
        spec: a secured cluster.
        principal: the SCRAM user.
        password: its password.

    Returns:
        ``bootstrap.servers``, ``security.protocol``, ``sasl.mechanism``,
        ``sasl.username``, ``sasl.password`` and, with TLS, ``ssl.ca.location``.
    """
    props = {
        "bootstrap.servers": spec.bootstrap,
        "security.protocol": spec.security.upper(),
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": principal,
        "sasl.password": password,
    }
    if spec.security == "sasl_ssl":
        props["ssl.ca.location"] = str(spec.ca_file)
    return props


def ensure_passwords(spec: ClusterSpec) -> dict[str, str]:
    """The SCRAM passwords of :data:`PRINCIPALS`, made once and kept in ``users.json``.

    A principal missing from the file gets a new random password (160 bits,
    hex); existing ones never change. The file has mode 0600.

    Returns:
        Principal -> password.

    Raises:
        BrokerError: ``users.json`` is not a JSON object of strings.
    """
    path = spec.users_file
    current: dict[str, str] = {}
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
            if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
                raise ValueError("not an object of strings")
            current = {str(k): v for k, v in raw.items()}
        except ValueError as exc:
            raise BrokerError(
                f"{path} is not the cluster's password file ({exc}); delete the cluster's "
                "node-*/ and security/ folders to start afresh",
                expected="principal -> password",
                observed="malformed",
            ) from None
    missing = [p for p in PRINCIPALS if p not in current]
    if missing:
        for principal in missing:
            current[principal] = secrets.token_hex(20)
        certs._write_private(path, (json.dumps(current, indent=2) + "\n").encode())
    return current


def prepare_security(spec: ClusterSpec) -> dict[str, str]:
    """Write a secured cluster's material: passwords, CA and node keystores (TLS), client files.

    The CA and the passwords are made once and kept; node keystores and
    client files are rewritten (cheap), so they always match the layout.

    Args:
        spec: a secured cluster (``sasl_plaintext`` or ``sasl_ssl``).

    Returns:
        Principal -> SCRAM password.

    Raises:
        BrokerError: ``users.json`` is malformed.
        ValueError: half a CA is on disk (see :func:`testbed.certs.ensure_ca`).
    """
    passwords = ensure_passwords(spec)
    if spec.security == "sasl_ssl":
        ca_cert, ca_key = certs.ensure_ca(spec.security_dir)
        for node in spec.nodes:
            certs.write_node_keystore(
                spec.keystore(node.node_id), f"node-{node.node_id}", [node.host], ca_cert, ca_key
            )
    for principal in PRINCIPALS:
        text = render_properties(
            client_properties(spec, principal, passwords[principal]),
            f"{principal} on the local {spec.security} cluster (written by testbed.cluster)",
        )
        certs._write_private(spec.client_file(principal), text.encode())
    return passwords


# --------------------------------------------------------------------------- status


@dataclass(frozen=True)
class NodeStatus:
    """One node's state.

    Attributes:
        node_id: ``1..N``.
        pid: its java process, if alive.
        alive: ``pid`` is set.
        host: its address.
        client_port: its ``BROKER`` port.
        controller_port: its ``CONTROLLER`` port.
        registered: the cluster's metadata lists it as a live broker
            (``None``: the cluster did not answer).
        log_file: ``node-<i>/logs/server.log``.
    """

    node_id: int
    pid: int | None
    alive: bool
    host: str
    client_port: int
    controller_port: int
    registered: bool | None
    log_file: Path


@dataclass(frozen=True)
class ClusterStatus:
    """The cluster's state.

    Attributes:
        nodes: per node, in ``node_id`` order.
        controller: the active KRaft controller's ``node_id`` (from the
            nodes' quorum state), ``None`` when unknown.
        bootstrap: every node's ``host:port``.
        security: the security mode.
        kafka_home: the cluster's folder.
        client_files: principal -> client properties file (secured only).
        started: this call started at least one node.
        running: every node is alive and registered.
        message: one human sentence.
    """

    nodes: tuple[NodeStatus, ...]
    controller: int | None
    bootstrap: str
    security: str
    kafka_home: Path
    client_files: Mapping[str, Path]
    started: bool
    running: bool
    message: str


# --------------------------------------------------------------------------- the cluster


class Cluster:
    """A local cluster: lifecycle and fault primitives.

    Args:
        spec: the layout.
        settings: the caller's settings; its environment-derived client
            properties apply to the cluster module's own admin clients, which
            authenticate as ``admin`` on a secured cluster.
    """

    def __init__(self, spec: ClusterSpec, settings: LedgerSettings) -> None:
        self.spec = spec
        self.settings = settings

    @classmethod
    def recorded(cls, settings: LedgerSettings) -> Cluster | None:
        """The cluster last started in ``settings.kafka_home``, if any.

        Raises:
            BrokerError: its ``cluster.json`` is malformed.
        """
        spec = recorded_spec(Path(settings.kafka_home))
        return None if spec is None else cls(spec, settings)

    # ------------------------------------------------------------ clients

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, comma-separated."""
        return self.spec.bootstrap

    def client_settings(self, principal: str = SUPER_USER, **overrides: Any) -> LedgerSettings:
        """The caller's settings pointed at this cluster as ``principal``.

        Args:
            principal: one of :data:`PRINCIPALS` (ignored on a plaintext cluster).
            **overrides: further settings fields (``topic_prefix``, ``run_dir`` ...).

        Returns:
            Settings with ``bootstrap_servers``, ``kafka_home``, ``kafka_port``
            and, when secured, ``kafka_config_file`` (the principal's client file).

        Raises:
            BrokerError: ``principal`` is not one of :data:`PRINCIPALS`.
        """
        update: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "kafka_home": self.spec.kafka_home,
            "kafka_port": self.spec.kafka_port,
            "brokers": self.spec.brokers,
            "broker_security": self.spec.security,
            "kafka_config_file": self._client_file(principal) if self.spec.secured else None,
        }
        update.update(overrides)
        return self.settings.model_copy(update=update)

    def client_env(self, principal: str = SUPER_USER) -> dict[str, str]:
        """Environment variables that point a ledger process at this cluster as ``principal``.

        Returns:
            ``LEDGER_BOOTSTRAP_SERVERS``, ``KAFKA_BOOTSTRAP_SERVERS``,
            ``LEDGER_KAFKA_HOME``, ``LEDGER_KAFKA_PORT``, ``LEDGER_BROKERS``,
            ``LEDGER_BROKER_SECURITY`` and, when secured,
            ``LEDGER_KAFKA_CONFIG_FILE``: merge them over ``os.environ``.

        Raises:
            BrokerError: ``principal`` is not one of :data:`PRINCIPALS`.
        """
        env = {
            "LEDGER_BOOTSTRAP_SERVERS": self.bootstrap,
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "LEDGER_KAFKA_HOME": str(self.spec.kafka_home),
            "LEDGER_KAFKA_PORT": str(self.spec.kafka_port),
            "LEDGER_BROKERS": str(self.spec.brokers),
            "LEDGER_BROKER_SECURITY": self.spec.security,
        }
        if self.spec.secured:
            env["LEDGER_KAFKA_CONFIG_FILE"] = str(self._client_file(principal))
        return env

    def _client_file(self, principal: str) -> Path:
        if principal not in PRINCIPALS:
            raise BrokerError(
                f"unknown principal {principal!r}; the cluster's users are {', '.join(PRINCIPALS)}",
                expected=" | ".join(PRINCIPALS),
                observed=principal,
            )
        return self.spec.client_file(principal)

    def admin(self, bootstrap: str | None = None) -> AdminClient:
        """An admin client of this cluster as ``admin`` (optionally through one node only)."""
        settings = self.client_settings(SUPER_USER)
        extra = {"bootstrap.servers": bootstrap} if bootstrap else {}
        return AdminClient(admin_config(settings, **extra))

    def metadata(self, timeout_s: float = 10, bootstrap: str | None = None) -> ClusterMetadata:
        """Cluster metadata (brokers, topics, partitions with leader/replicas/ISR).

        Raises:
            BrokerUnavailableError: no node answered within ``timeout_s``.
        """
        try:
            return self.admin(bootstrap).list_topics(timeout=timeout_s)
        except KafkaException as exc:
            raise BrokerUnavailableError(
                f"the cluster at {bootstrap or self.bootstrap} did not answer: {exc}",
                expected="metadata",
                observed=str(exc),
            ) from None

    # ------------------------------------------------------------ processes

    def node_pid(self, node_id: int) -> int | None:
        """PID of node ``node_id``'s java process if it is alive, else ``None``.

        The recorded PID when its command line is the node's ``java
        kafka.Kafka``; else such a process found in ``/proc`` (a command
        prefix that forks, e.g. ``sudo``, leaves java a child of the recorded
        process); else the recorded PID if it is a child of this process that
        has not exec'd java yet (a node just launched).
        """
        node = self.spec.node(node_id)
        marker = str(node.server_properties)

        def is_node(cmd: str | None) -> bool:
            return cmd is not None and "kafka.Kafka" in cmd and cmd.rstrip().endswith(marker)

        pid = launcher.read_pid_file(node.broker_paths(self.spec.libs))
        recorded = pid is not None and launcher.alive(pid)
        if pid is not None and recorded and is_node(launcher.cmdline(pid)):
            return pid
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if is_node(cmd) and launcher.alive(int(entry.name)):
                return int(entry.name)
        if pid is not None and recorded and pid in launcher.children:
            return pid
        return None

    def _prepare(self) -> dict[str, str] | None:
        """Jars, security material, configs and formatted storage of every node.

        Called with the broker folder's lock held (:meth:`_locked`), so it
        fetches jars without taking that lock again.
        """
        spec = self.spec
        if not any(spec.libs.glob("kafka_2.13-*.jar")):
            if spec.libs == spec.kafka_home / "libs":
                # The caller (start) holds the folder's lock already: a second
                # flock on a new descriptor of the same file would wait forever.
                home_settings = self.settings.model_copy(update={"kafka_home": spec.kafka_home})
                broker._fetch_jars(broker._Paths.of(home_settings))
            else:
                raise BrokerError(
                    f"no Kafka jars in {spec.libs}; fetch them with `ledger broker fetch`",
                    expected="kafka_2.13 jars",
                    observed="missing",
                )
        broker._check_java()
        passwords = prepare_security(spec) if spec.secured else None
        for node in spec.nodes:
            paths = node.broker_paths(spec.libs)
            for folder in (paths.config_dir, node.data, node.logs):
                folder.mkdir(parents=True, exist_ok=True)
            text = render_properties(
                server_properties(spec, node, passwords),
                "Written by testbed.cluster on every start; edits are overwritten.",
            )
            certs._write_private(node.server_properties, text.encode())
            paths.log4j_config.write_text(broker._LOG4J2)
        self._format(passwords)
        return passwords

    def _format_marker(self) -> dict[str, Any]:
        return {
            "cluster_id": CLUSTER_ID,
            "brokers": self.spec.brokers,
            "scram": list(PRINCIPALS) if self.spec.secured else [],
        }

    def _format(self, passwords: Mapping[str, str] | None) -> None:
        """Format every node's storage once; refuse data formatted for another layout."""
        want = self._format_marker()
        todo: list[Node] = []
        for node in self.spec.nodes:
            marker = node.home / "format.json"
            if (node.data / "meta.properties").is_file():
                have = json.loads(marker.read_text()) if marker.is_file() else None
                if have != want:
                    raise BrokerError(
                        f"{node.data} was formatted for another cluster layout ({have}, "
                        f"now {want}); stop the cluster (ledger broker stop) and delete "
                        f"{self.spec.kafka_home}/node-*/ to start it afresh",
                        expected=json.dumps(want),
                        observed=json.dumps(have),
                    )
                continue
            todo.append(node)
        scram: list[str] = []
        for principal, password in (passwords or {}).items():
            scram += ["--add-scram", f"{SCRAM_MECHANISM}=[name={principal},password={password}]"]
        running: list[tuple[Node, subprocess.Popen[bytes], Path]] = []
        for node in todo:
            paths = node.broker_paths(self.spec.libs)
            log = node.logs / "format.log"
            cmd = launcher.format_command(paths, *scram)
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            running.append((node, proc, log))
        for node, proc, log in running:
            rc = proc.wait(timeout=300)
            if rc != 0:
                raise BrokerError(
                    f"formatting node {node.node_id}'s storage in {node.data} failed "
                    f"(exit {rc}); see {log}:\n{launcher.tail(log)}",
                    expected="formatted storage",
                    observed=f"StorageTool exit {rc}",
                )
            (node.home / "format.json").write_text(json.dumps(want) + "\n")

    def _launch(self, node: Node) -> int:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        pid = launcher.launch(
            node.broker_paths(self.spec.libs),
            banner=f"testbed.cluster node {node.node_id} start {stamp}",
            heap=NODE_HEAP,
            prefix=node.prefix,
        )
        _log.info("started Kafka node %d pid %d (log %s)", node.node_id, pid, node.log_file)
        return pid

    def _check_ports(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            for port in (node.client_port, node.controller_port):
                if broker._port_open(port, node.host):
                    raise BrokerError(
                        f"port {node.host}:{port} (node {node.node_id}) is in use by a "
                        "process this cluster did not start; stop it or choose another "
                        "LEDGER_KAFKA_PORT",
                        expected="free port",
                        observed=f"{node.host}:{port} busy",
                    )

    def _registered(self, timeout_s: float, bootstrap: str | None = None) -> set[int] | None:
        try:
            return set(self.metadata(timeout_s, bootstrap).brokers)
        except BrokerUnavailableError:
            return None

    def _wait_nodes(self, node_ids: Sequence[int], deadline: float) -> None:
        """Wait until each node is alive, answers on its own port and is registered."""
        pending = list(node_ids)
        while pending:
            node = self.spec.node(pending[0])
            if self.node_pid(node.node_id) is None:
                raise BrokerError(
                    f"node {node.node_id} exited during start-up; see {node.log_file} and "
                    f"{node.stdout_file}:\n{launcher.tail(node.stdout_file)}\n"
                    f"{launcher.tail(node.log_file)}",
                    expected="running node",
                    observed="exited",
                )
            remaining = deadline - time.monotonic()
            seen = self._registered(max(0.5, min(5.0, remaining)), node.bootstrap)
            if seen is not None and node.node_id in seen:
                pending.pop(0)
                continue
            if time.monotonic() >= deadline:
                raise BrokerUnavailableError(
                    f"node {node.node_id} did not answer on {node.bootstrap} in time; see "
                    f"{node.log_file}:\n{launcher.tail(node.log_file)}",
                    expected="node registered",
                    observed="no answer",
                )
            time.sleep(0.2)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The broker folder's lock (shared with :mod:`testbed.broker`)."""
        home = self.spec.kafka_home
        home.mkdir(parents=True, exist_ok=True)
        with (home / "broker.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ------------------------------------------------------------ lifecycle

    def start(self, wait_s: float = 180) -> ClusterStatus:
        """Start every node that is not running (formatting storage once) and wait for all.

        Idempotent: running nodes are kept. Also from several processes at
        once (the broker folder's lock serialises them).

        Args:
            wait_s: how long to wait until every node answers (seconds).

        Returns:
            The status; ``started`` when this call launched a node.

        Raises:
            BrokerError: a single-node broker of :mod:`testbed.broker` or a
                cluster of another layout runs in this folder; a port is busy;
                the data was formatted for another layout; java, Maven or
                the format failed; a node exited during start-up; or
                (:class:`BrokerUnavailableError`) a node did not answer in
                time (the nodes this call started are stopped again).
        """
        deadline = time.monotonic() + wait_s
        spec = self.spec
        with self._locked():
            single = broker._recorded_pid(broker._Paths.of(self.client_settings()))
            if single is not None:
                raise BrokerError(
                    f"the single-node broker (pid {single}) runs in {spec.kafka_home}; stop it "
                    "first (ledger broker stop)",
                    expected="no single-node broker",
                    observed=f"pid {single}",
                )
            previous = recorded_spec(spec.kafka_home)
            if previous is not None and previous != spec:
                alive = [
                    n.node_id for n in previous.nodes if self._other(previous).node_pid(n.node_id)
                ]
                if alive:
                    raise BrokerError(
                        f"a cluster of another layout runs in {spec.kafka_home} (nodes "
                        f"{alive} alive: {previous.brokers} brokers, {previous.security}); "
                        "stop it first (ledger broker stop)",
                        expected="no other cluster",
                        observed=f"{previous.brokers} brokers, {previous.security}",
                    )
            down = [n for n in spec.nodes if self.node_pid(n.node_id) is None]
            self._check_ports(down)
            if down:
                self._prepare()
            (spec.kafka_home / "cluster.json").write_text(spec.to_json() + "\n")
            launched: list[int] = []
            try:
                for node in down:
                    self._launch(node)
                    launched.append(node.node_id)
                self._wait_nodes([n.node_id for n in spec.nodes], deadline)
            except BrokerError:
                for node_id in launched:
                    self._stop_pid(node_id, timeout_s=15)
                raise
        started = bool(launched)
        verb = f"started nodes {launched}" if started else "reused the running cluster"
        return self.status(
            started=started, message=f"{verb} ({spec.brokers} brokers, {spec.security})"
        )

    def _other(self, spec: ClusterSpec) -> Cluster:
        return Cluster(spec, self.settings)

    def _stop_pid(self, node_id: int, timeout_s: float) -> str:
        node = self.spec.node(node_id)
        pid = self.node_pid(node_id)
        if pid is None:
            node.pid_file.unlink(missing_ok=True)
            return f"node {node_id} was not running"
        how = launcher.terminate(pid, timeout_s=timeout_s)
        node.pid_file.unlink(missing_ok=True)
        return f"stopped node {node_id} (pid {pid}, {how})"

    def stop(self, timeout_s: float = 60) -> str:
        """Stop every node (SIGTERM to all at once, SIGKILL after ``timeout_s``).

        Returns:
            One line per node saying what was done.

        Raises:
            BrokerError: a process survived SIGKILL.
        """
        with self._locked():
            pids = {n.node_id: self.node_pid(n.node_id) for n in self.spec.nodes}
            for pid in pids.values():
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
            lines = []
            for node_id, pid in pids.items():
                if pid is None:
                    lines.append(f"node {node_id} was not running")
                else:
                    how = launcher.terminate(pid, timeout_s=timeout_s)
                    lines.append(f"stopped node {node_id} (pid {pid}, {how})")
                self.spec.node(node_id).pid_file.unlink(missing_ok=True)
            return "\n".join(lines)

    def status(self, started: bool = False, message: str | None = None) -> ClusterStatus:
        """Report on every node without changing anything.

        Args:
            started: recorded in the result (for :meth:`start`).
            message: overrides the summary sentence.
        """
        pids = {n.node_id: self.node_pid(n.node_id) for n in self.spec.nodes}
        seen = self._registered(5.0) if any(pids.values()) else None
        nodes = tuple(
            NodeStatus(
                node_id=n.node_id,
                pid=pids[n.node_id],
                alive=pids[n.node_id] is not None,
                host=n.host,
                client_port=n.client_port,
                controller_port=n.controller_port,
                registered=None if seen is None else n.node_id in seen,
                log_file=n.log_file,
            )
            for n in self.spec.nodes
        )
        running = all(s.alive and s.registered for s in nodes)
        alive = sum(s.alive for s in nodes)
        if message is None:
            message = (
                f"cluster of {self.spec.brokers} ({self.spec.security}): {alive} node(s) alive"
                + ("" if seen is None else f", {len(seen)} registered")
            )
        files = {p: self.spec.client_file(p) for p in PRINCIPALS} if self.spec.secured else {}
        return ClusterStatus(
            nodes=nodes,
            controller=self.active_controller(),
            bootstrap=self.bootstrap,
            security=self.spec.security,
            kafka_home=self.spec.kafka_home,
            client_files=files,
            started=started,
            running=running,
            message=message,
        )

    # ------------------------------------------------------------ faults

    def kill_node(self, node_id: int) -> int:
        """SIGKILL node ``node_id`` (no clean shutdown) and wait until it is gone.

        Returns:
            The PID that was killed.

        Raises:
            BrokerError: the node is not running, or survived SIGKILL.
        """
        node = self.spec.node(node_id)
        pid = self.node_pid(node_id)
        if pid is None:
            raise BrokerError(
                f"node {node_id} is not running; nothing to kill",
                expected="running node",
                observed="down",
            )
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if not launcher.wait_gone(pid, 10):
            raise BrokerError(
                f"node {node_id} (pid {pid}) survived SIGKILL",
                expected="gone",
                observed="alive",
            )
        node.pid_file.unlink(missing_ok=True)
        _log.info("killed node %d (pid %d)", node_id, pid)
        return pid

    def stop_node(self, node_id: int, timeout_s: float = 60) -> str:
        """Stop node ``node_id`` cleanly (SIGTERM, SIGKILL after ``timeout_s``).

        Returns:
            What was done, one line.
        """
        with self._locked():
            return self._stop_pid(node_id, timeout_s)

    def start_node(self, node_id: int, wait_s: float = 120) -> int:
        """Start node ``node_id`` again on its data (it must have been started once).

        Waits until it answers on its own port and is registered again.
        A node already running is left alone.

        Returns:
            Its PID.

        Raises:
            BrokerError: the node was never formatted, its port is taken,
                it exited, or (:class:`BrokerUnavailableError`) it did not
                answer within ``wait_s``.
        """
        node = self.spec.node(node_id)
        deadline = time.monotonic() + wait_s
        with self._locked():
            pid = self.node_pid(node_id)
            if pid is None:
                if not (node.data / "meta.properties").is_file():
                    raise BrokerError(
                        f"node {node_id} was never formatted; start the cluster first",
                        expected="formatted node",
                        observed="no meta.properties",
                    )
                self._check_ports([node])
                pid = self._launch(node)
            self._wait_nodes([node_id], deadline)
        return pid

    def leader_of(self, topic: str, partition: int = 0, timeout_s: float = 10) -> int:
        """The node that leads ``topic``'s ``partition`` now (from cluster metadata).

        Returns:
            Its ``node_id``.

        Raises:
            BrokerError: no such topic or partition, or it has no leader
                (``-1``: the leader is down and no in-sync replica took over).
            BrokerUnavailableError: the cluster did not answer.
        """
        md = self.metadata(timeout_s)
        described = md.topics.get(topic)
        if described is None or partition not in described.partitions:
            raise BrokerError(
                f"no partition {topic}[{partition}] on the cluster",
                expected=f"{topic}[{partition}]",
                observed="missing",
            )
        leader = described.partitions[partition].leader
        if leader < 0:
            raise BrokerError(
                f"{topic}[{partition}] has no leader now",
                expected="a leader",
                observed=str(leader),
            )
        return int(leader)

    def active_controller(self) -> int | None:
        """The active KRaft controller's ``node_id``, read cheaply from the nodes' quorum state.

        Each node persists its election state (epoch, leader) in
        ``data/__cluster_metadata-0/quorum-state`` whenever it changes: the
        leader named by the live node with the highest epoch is the active
        controller. (Kafka's ``DescribeCluster`` through a broker names a
        random broker in KRaft, so the admin client cannot tell.)

        Returns:
            The ``node_id``, or ``None`` when no live node knows a live leader
            (an election is under way, or the cluster is down).
        """
        best: tuple[int, int] | None = None
        for node in self.spec.nodes:
            if self.node_pid(node.node_id) is None:
                continue
            try:
                state = json.loads((node.data / QUORUM_STATE).read_text())
            except (OSError, ValueError):
                continue
            epoch, leader = int(state.get("leaderEpoch", -1)), int(state.get("leaderId", -1))
            if leader > 0 and (best is None or epoch > best[0]):
                best = (epoch, leader)
        if best is None or best[1] > self.spec.brokers or self.node_pid(best[1]) is None:
            return None
        return best[1]

    def under_replicated(self, timeout_s: float = 10) -> list[tuple[str, int]]:
        """Partitions whose in-sync replicas are fewer than their replicas, or leaderless.

        Returns:
            ``(topic, partition)`` pairs, sorted; internal topics included.

        Raises:
            BrokerUnavailableError: the cluster did not answer.
        """
        md = self.metadata(timeout_s)
        lagging = [
            (name, p.id)
            for name, topic in md.topics.items()
            for p in topic.partitions.values()
            if p.leader < 0 or set(p.isrs) != set(p.replicas)
        ]
        return sorted(lagging)

    def wait_fully_replicated(self, timeout_s: float = 120) -> None:
        """Wait until every node is registered and no partition is under-replicated.

        Raises:
            BrokerUnavailableError: still not so after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        lagging: list[tuple[str, int]] | str = "no answer"
        while time.monotonic() < deadline:
            try:
                seen = self._registered(5.0)
                if seen is not None and seen >= {n.node_id for n in self.spec.nodes}:
                    lagging = self.under_replicated(5.0)
                    if not lagging:
                        return
                else:
                    lagging = f"registered brokers {sorted(seen or ())}"
            except BrokerUnavailableError as exc:
                lagging = exc.message
            time.sleep(0.5)
        raise BrokerUnavailableError(
            f"the cluster is not fully replicated after {timeout_s:g} s: {str(lagging)[:500]}",
            expected="no under-replicated partition",
            observed=str(lagging)[:200],
        )

    def rolling_restart(self, wait_s: float = 180, hard: bool = False) -> list[int]:
        """Restart one node at a time, the active controller last.

        Each node is stopped (SIGTERM, or SIGKILL when ``hard``), started
        again, and the next one waits until no partition is under-replicated.

        Args:
            wait_s: per node: the longest wait for it to answer and for
                replication to catch up (seconds).
            hard: SIGKILL instead of a clean shutdown.

        Returns:
            The node IDs in the order they were restarted.

        Raises:
            BrokerError: a node could not be stopped or started;
                :class:`BrokerUnavailableError` when replication did not
                catch up in time.
        """
        controller = self.active_controller()
        order = [n.node_id for n in self.spec.nodes if n.node_id != controller]
        if controller is not None:
            order.append(controller)
        for node_id in order:
            self.wait_fully_replicated(wait_s)
            if hard:
                self.kill_node(node_id)
            else:
                self.stop_node(node_id)
            self.start_node(node_id, wait_s)
        self.wait_fully_replicated(wait_s)
        return order

    def full_restart(self, wait_s: float = 180, hard: bool = False) -> ClusterStatus:
        """Stop every node (SIGTERM, or SIGKILL all when ``hard``), then start them all.

        Returns:
            The status after the restart.

        Raises:
            BrokerError: as :meth:`stop` and :meth:`start`.
        """
        if hard:
            for node in self.spec.nodes:
                if self.node_pid(node.node_id) is not None:
                    self.kill_node(node.node_id)
        else:
            self.stop()
        return self.start(wait_s)


# --------------------------------------------------------------------------- module API


def start(
    settings: LedgerSettings,
    brokers: int | None = None,
    security: str | None = None,
    wait_s: float = 180,
    **layout: Any,
) -> Cluster:
    """Start (or reuse) the local cluster for ``settings``; see :meth:`Cluster.start`.

    Args:
        settings: ``kafka_home``, ``kafka_port``, ``brokers``, ``broker_security``.
        brokers: overrides ``settings.brokers``.
        security: overrides ``settings.broker_security``.
        wait_s: longest wait for every node (seconds).
        **layout: ``hosts``, ``command_prefixes``, ``libs`` (see :meth:`ClusterSpec.build`).

    Returns:
        The running cluster (its :meth:`Cluster.status` says more).

    Raises:
        BrokerError: as :meth:`ClusterSpec.build` and :meth:`Cluster.start`.
    """
    cluster = Cluster(ClusterSpec.from_settings(settings, brokers, security, **layout), settings)
    cluster.start(wait_s)
    return cluster


__all__ = [
    "AUTHORIZER",
    "MAX_BROKERS",
    "PRINCIPALS",
    "SECURITY_MODES",
    "Cluster",
    "ClusterSpec",
    "ClusterStatus",
    "Node",
    "NodeStatus",
    "client_properties",
    "ensure_passwords",
    "prepare_security",
    "recorded_spec",
    "render_properties",
    "server_properties",
    "start",
]
