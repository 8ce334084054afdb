"""The local cluster's layout, broker and client configuration, passwords and certificates.

Pure or file-only: no broker, no java.
"""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from ledger.cli import main
from ledger.errors import BrokerError
from ledger.kafka import file_properties
from ledger.settings import LedgerSettings
from testbed import broker, certs, cluster
from testbed.broker import PRINCIPALS
from testbed.cluster import ClusterSpec, server_properties


def _spec(
    tmp_path: Path, brokers: int = 3, security: str = "plaintext", **kw: object
) -> ClusterSpec:
    return ClusterSpec.build(tmp_path / "kafka", 40100, brokers=brokers, security=security, **kw)  # type: ignore[arg-type]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ports_are_distinct_and_within_the_port_span(tmp_path: Path) -> None:
    for n in range(1, cluster.MAX_BROKERS + 1):
        spec = _spec(tmp_path, n)
        ports = [p for node in spec.nodes for p in (node.client_port, node.controller_port)]
        assert len(set(ports)) == 2 * n
        assert min(ports) == spec.kafka_port
        assert max(ports) < spec.kafka_port + cluster.PORT_SPAN
    spec = _spec(tmp_path, 3)
    assert spec.bootstrap == "127.0.0.1:40100,127.0.0.1:40101,127.0.0.1:40102"
    assert [n.controller_port for n in spec.nodes] == [40103, 40104, 40105]
    assert spec.node(2).home == spec.kafka_home / "node-2"


def test_every_node_lists_every_voter_and_its_own_listeners(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 3, hosts=["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    voters = "1@10.0.0.1:40103,2@10.0.0.2:40104,3@10.0.0.3:40105"
    for node in spec.nodes:
        props = server_properties(spec, node)
        assert props["node.id"] == str(node.node_id)
        assert props["process.roles"] == "broker,controller"
        assert props["controller.quorum.voters"] == voters
        assert props["listeners"] == (
            f"BROKER://{node.host}:{node.client_port},CONTROLLER://{node.host}:{node.controller_port}"
        )
        assert props["advertised.listeners"] == f"BROKER://{node.host}:{node.client_port}"
        assert props["log.dirs"] == str(node.data)


@pytest.mark.parametrize(
    ("brokers", "rf", "isr"), [(1, "1", "1"), (2, "2", "1"), (3, "3", "2"), (5, "3", "2")]
)
def test_replication_follows_the_node_count(
    tmp_path: Path, brokers: int, rf: str, isr: str
) -> None:
    props = server_properties(_spec(tmp_path, brokers), _spec(tmp_path, brokers).nodes[0])
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
        "default.replication.factor",
    ):
        assert props[key] == rf
    for key in (
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.min.isr",
        "min.insync.replicas",
    ):
        assert props[key] == isr
    assert props["unclean.leader.election.enable"] == "false"


def test_plaintext_has_no_security_and_no_authorizer(tmp_path: Path) -> None:
    props = server_properties(_spec(tmp_path), _spec(tmp_path).nodes[0])
    assert props["listener.security.protocol.map"] == "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert not [k for k in props if k.startswith(("ssl.", "sasl.", "listener.name.", "authorizer"))]


def test_sasl_ssl_node_config(tmp_path: Path) -> None:
    spec = _spec(tmp_path, security="sasl_ssl")
    node = spec.nodes[1]
    props = server_properties(spec, node, {"admin": "pw-admin", "processor": "pw-p"})
    assert props["listener.security.protocol.map"] == "BROKER:SASL_SSL,CONTROLLER:SASL_SSL"
    assert props["authorizer.class.name"] == cluster.AUTHORIZER
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    assert props["listener.name.broker.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["sasl.mechanism.controller.protocol"] == "PLAIN"
    scram_jaas = props["listener.name.broker.scram-sha-512.sasl.jaas.config"]
    assert 'username="admin" password="pw-admin"' in scram_jaas
    plain_jaas = props["listener.name.controller.plain.sasl.jaas.config"]
    assert 'user_admin="pw-admin"' in plain_jaas
    assert "pw-p" not in "".join(props.values())  # only the admin's password is in a node's config
    assert props["ssl.keystore.type"] == props["ssl.truststore.type"] == "PEM"
    assert props["ssl.keystore.location"] == str(spec.keystore(2))
    assert props["ssl.truststore.location"] == str(spec.ca_file)


def test_sasl_plaintext_has_sasl_but_no_tls(tmp_path: Path) -> None:
    spec = _spec(tmp_path, security="sasl_plaintext")
    props = server_properties(spec, spec.nodes[0], {"admin": "x"})
    assert (
        props["listener.security.protocol.map"] == "BROKER:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
    )
    assert props["authorizer.class.name"] == cluster.AUTHORIZER
    assert not [k for k in props if k.startswith("ssl.")]


def test_a_secured_node_config_needs_the_admin_password(tmp_path: Path) -> None:
    spec = _spec(tmp_path, security="sasl_ssl")
    with pytest.raises(BrokerError, match="admin password"):
        server_properties(spec, spec.nodes[0], {"processor": "x"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"brokers": 0}, "1 to"),
        ({"brokers": cluster.MAX_BROKERS + 1}, "1 to"),
        ({"security": "tls"}, "unknown broker security"),
        ({"hosts": ["127.0.0.1"]}, "hosts names 1 nodes"),
        ({"command_prefixes": [["ip"], ["ip"]]}, "command_prefixes names 2"),
        ({"hosts": ["a", "b:1", "c"]}, "node host"),
    ],
)
def test_bad_layouts_are_refused(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"brokers": 3, **kwargs}
    with pytest.raises(BrokerError, match=message):
        ClusterSpec.build(tmp_path, 40100, **args)  # type: ignore[arg-type]


def test_layout_round_trips_through_json(tmp_path: Path) -> None:
    spec = _spec(
        tmp_path,
        3,
        "sasl_ssl",
        hosts=["10.9.0.1", "10.9.0.2", "10.9.0.3"],
        command_prefixes=[["ip", "netns", "exec", f"ns-{i}"] for i in (1, 2, 3)],
    )
    again = ClusterSpec.from_json(spec.to_json())
    assert again == spec
    assert again.nodes[2].prefix == ("ip", "netns", "exec", "ns-3")
    with pytest.raises(BrokerError, match="not a cluster layout"):
        ClusterSpec.from_json("{}")


def test_settings_choose_the_default_layout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LEDGER_BROKERS", "3")
    monkeypatch.setenv("LEDGER_BROKER_SECURITY", "sasl_ssl")
    settings = LedgerSettings(kafka_home=tmp_path, kafka_port=40200)
    spec = ClusterSpec.from_settings(settings)
    assert (spec.brokers, spec.security, spec.kafka_port) == (3, "sasl_ssl", 40200)
    assert ClusterSpec.from_settings(settings, brokers=1, security="plaintext").brokers == 1
    monkeypatch.setenv("LEDGER_BROKER_SECURITY", "kerberos")
    with pytest.raises(ValueError, match="broker_security"):
        LedgerSettings()


def test_defaults_are_one_plaintext_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEDGER_BROKERS", raising=False)
    monkeypatch.delenv("LEDGER_BROKER_SECURITY", raising=False)
    settings = LedgerSettings()
    assert (settings.brokers, settings.broker_security) == (1, "plaintext")


def test_passwords_are_made_once_private_and_complete(tmp_path: Path) -> None:
    spec = _spec(tmp_path, security="sasl_ssl")
    first = cluster.ensure_passwords(spec)
    assert set(first) == set(PRINCIPALS)
    assert len(set(first.values())) == len(PRINCIPALS)
    assert all(len(pw) == 40 and int(pw, 16) >= 0 for pw in first.values())
    assert _mode(spec.users_file) == 0o600
    assert cluster.ensure_passwords(spec) == first


def test_client_files_are_what_ledger_kafka_reads(tmp_path: Path) -> None:
    spec = _spec(tmp_path, security="sasl_ssl")
    passwords = cluster.prepare_security(spec)
    for principal in PRINCIPALS:
        path = spec.client_file(principal)
        assert _mode(path) == 0o600
        props = {k: p.value for k, p in file_properties(path).items()}  # accepted, not refused
        assert props == {
            "bootstrap.servers": spec.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": principal,
            "sasl.password": passwords[principal],
            "ssl.ca.location": str(spec.ca_file),
        }
    for node in spec.nodes:
        assert _mode(spec.keystore(node.node_id)) == 0o600
    plain = _spec(tmp_path / "sp", security="sasl_plaintext")
    assert "ssl.ca.location" not in cluster.client_properties(plain, "relay", "pw")


def test_client_settings_and_env_point_at_the_principals_file(tmp_path: Path) -> None:
    spec = _spec(tmp_path, security="sasl_ssl")
    running = cluster.Cluster(spec, LedgerSettings(kafka_home=tmp_path / "other"))
    settings = running.client_settings("relay", topic_prefix="tx")
    assert settings.kafka_config_file == spec.client_file("relay")
    assert settings.bootstrap_servers == spec.bootstrap
    assert settings.topic_prefix == "tx"
    env = running.client_env("service")
    assert env["LEDGER_KAFKA_CONFIG_FILE"] == str(spec.client_file("service"))
    assert env["LEDGER_KAFKA_PORT"] == "40100"
    with pytest.raises(BrokerError, match="unknown principal"):
        running.client_settings("mallory")
    plain = cluster.Cluster(_spec(tmp_path / "p"), LedgerSettings())
    assert plain.client_settings("relay").kafka_config_file is None
    assert "LEDGER_KAFKA_CONFIG_FILE" not in plain.client_env()


def test_ca_is_made_once_and_signs_node_certificates(tmp_path: Path) -> None:
    ca_cert, ca_key = certs.ensure_ca(tmp_path)
    made = ca_cert.read_bytes()
    assert certs.ensure_ca(tmp_path) == (ca_cert, ca_key)
    assert ca_cert.read_bytes() == made
    assert _mode(ca_key) == 0o600
    store = certs.write_node_keystore(
        tmp_path / "node-1.pem", "node-1", ["10.1.2.3", "kafka-1"], ca_cert, ca_key
    )
    assert _mode(store) == 0o600
    text = store.read_text()
    assert text.startswith("-----BEGIN PRIVATE KEY-----")
    chain = x509.load_pem_x509_certificates(text.encode())
    ca = x509.load_pem_x509_certificate(made)
    assert chain[1] == ca
    leaf = chain[0]
    leaf.verify_directly_issued_by(ca)  # raises unless the CA signed it
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.1.2.3"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "kafka-1"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)


def test_half_a_ca_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("x")
    with pytest.raises(ValueError, match="half of a CA"):
        certs.ensure_ca(tmp_path)


def test_subject_alt_names_keep_order_without_duplicates() -> None:
    assert certs.subject_alt_names(["127.0.0.1", "10.0.0.1", "10.0.0.1"]) == [
        "127.0.0.1",
        "localhost",
        "10.0.0.1",
    ]


def test_cli_refuses_a_cluster_too_large() -> None:
    result = CliRunner().invoke(main, ["broker", "start", "--brokers", "99"])
    assert result.exit_code == 2
    assert "--brokers" in result.output
    result = CliRunner().invoke(main, ["broker", "start", "--security", "kerberos"])
    assert result.exit_code == 2


def test_a_fresh_folder_fetches_its_jars_under_the_lock_start_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start`` on a fresh ``kafka_home`` fetches the jars while it holds the folder's lock.

    Fetching must not take that lock a second time (a new descriptor's flock
    on the same file waits forever): the preparation finishes in bounded time.
    """
    spec = _spec(tmp_path, 3)
    fetched: list[Path] = []

    def fake_fetch(paths: broker._Paths) -> Path:
        paths.libs.mkdir(parents=True, exist_ok=True)
        (paths.libs / "kafka_2.13-0.jar").write_bytes(b"")
        fetched.append(paths.libs)
        return paths.libs

    monkeypatch.setattr(broker, "_fetch_jars", fake_fetch)
    monkeypatch.setattr(broker, "_check_java", lambda: None)
    monkeypatch.setattr(cluster.Cluster, "_format", lambda self, passwords: None)
    node = cluster.Cluster(spec, LedgerSettings(kafka_home=str(spec.kafka_home)))
    errors: list[BaseException] = []

    def prepare_locked() -> None:
        try:
            with node._locked():
                node._prepare()
        except BaseException as exc:  # reported to the test thread
            errors.append(exc)

    worker = threading.Thread(target=prepare_locked, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "preparing a fresh folder waited on its own lock"
    assert errors == []
    assert fetched == [spec.kafka_home / "libs"]
