"""One Kafka client configuration: properties file, pass-through variables, refusals, masking."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger import kafka
from ledger.cli import main
from ledger.errors import LedgerError, LocalFileError
from ledger.kafka import (
    MASK,
    admin_config,
    bootstrap_servers,
    client_config,
    consumer_config,
    describe,
    env_properties,
    is_secret,
    masked,
    parse_properties,
    producer_config,
)
from ledger.settings import LedgerSettings

SECURED = """\
# Confluent Cloud, say
! a comment in the other style
bootstrap.servers=pkc-1.example.cloud:9092
security.protocol = SASL_SSL
sasl.mechanism: SCRAM-SHA-512
sasl.username  svc-ledger
sasl.password=s3cr\\=et\\u0021
ssl.ca.location=/etc/ledger/ca.pem
socket.timeout.ms=\\
    45000
"""


@pytest.fixture(autouse=True)
def _no_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own LEDGER_KAFKA_* variables must not leak into these tests."""
    import os

    for name in list(os.environ):
        if name.startswith("LEDGER_KAFKA_"):
            monkeypatch.delenv(name)


def _settings(tmp_path: Path, text: str | None = None, **fields: object) -> LedgerSettings:
    path = None
    if text is not None:
        path = tmp_path / "client.properties"
        path.write_text(text)
    return LedgerSettings(
        bootstrap_servers="127.0.0.1:1", run_dir=tmp_path, kafka_config_file=path, **fields
    )


# ------------------------------------------------------------------------------------ parsing


def test_the_java_properties_format_is_read_as_kafkas_tools_read_it(tmp_path: Path) -> None:
    props = parse_properties(SECURED, tmp_path / "f")
    assert {k: p.value for k, p in props.items()} == {
        "bootstrap.servers": "pkc-1.example.cloud:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc-ledger",
        "sasl.password": "s3cr=et!",
        "ssl.ca.location": "/etc/ledger/ca.pem",
        "socket.timeout.ms": "45000",
    }
    assert props["sasl.mechanism"].source == f"{tmp_path / 'f'}:5"
    assert props["socket.timeout.ms"].source == f"{tmp_path / 'f'}:9"


def test_a_key_given_twice_keeps_its_last_value(tmp_path: Path) -> None:
    props = parse_properties("client.id=a\nclient.id=b\n", tmp_path / "f")
    assert props["client.id"].value == "b"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("security.protocol=SASL_SSL\nsasl.password\n", 2),
        ("# fine\n\n=value\n", 3),
        ("sasl.username=me\nsasl.password=\n", 2),
        ("sasl.password=hunter2\\u12G4\n", 1),
    ],
)
def test_a_malformed_file_names_the_file_and_line_not_the_text(
    tmp_path: Path, text: str, line: int
) -> None:
    settings = _settings(tmp_path, text)
    with pytest.raises(LocalFileError, match=rf"client.properties, line {line}\b") as info:
        client_config(settings)
    assert "hunter2" not in str(info.value)  # the line may hold a secret: never quoted


def test_a_missing_file_is_a_local_file_error(tmp_path: Path) -> None:
    settings = _settings(tmp_path, None).model_copy(
        update={"kafka_config_file": tmp_path / "nope.properties"}
    )
    with pytest.raises(LocalFileError, match="nope.properties"):
        producer_config(settings)


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "client.id=first\n")
    assert client_config(settings)["client.id"] == "first"
    assert settings.kafka_config_file is not None
    settings.kafka_config_file.write_text("client.id=second-and-longer\n")
    assert client_config(settings)["client.id"] == "second-and-longer"


# ---------------------------------------------------------------------------------- precedence


def test_defaults_then_file_then_variables_then_the_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(
        tmp_path,
        "bootstrap.servers=file:9092\nlinger.ms=50\nclient.id=from-file\nsocket.timeout.ms=7000\n",
        kafka_debug="eos",
    )
    monkeypatch.setenv("LEDGER_KAFKA_SOCKET_TIMEOUT_MS", "8000")
    monkeypatch.setenv("LEDGER_KAFKA_SASL_USERNAME", "env-user")
    producer = producer_config(settings, **{"client.id": "relay-0"})
    assert producer["bootstrap.servers"] == "file:9092"  # the file beats the settings' default
    assert producer["debug"] == "eos"  # a default the file left alone
    assert producer["linger.ms"] == "50"  # the file beats the ledger's tuning
    assert producer["socket.timeout.ms"] == "8000"  # a variable beats the file
    assert producer["sasl.username"] == "env-user"
    assert producer["client.id"] == "relay-0"  # the role's own property beats both
    assert producer["enable.idempotence"] is True
    assert producer["acks"] == "all"
    assert producer["partitioner"] == kafka.PARTITIONER
    assert producer["logger"] is kafka.CLIENT_LOGGER
    assert bootstrap_servers(settings) == "file:9092"


def test_without_file_or_variables_the_settings_decide(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert admin_config(settings) == {
        "bootstrap.servers": "127.0.0.1:1",
        "logger": kafka.CLIENT_LOGGER,
    }
    consumer = consumer_config(settings, "g", isolation="read_uncommitted")
    assert consumer["isolation.level"] == "read_uncommitted"
    assert consumer["enable.auto.commit"] is False
    assert bootstrap_servers(settings) == "127.0.0.1:1"


def test_a_file_cannot_weaken_what_a_role_sets(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "isolation.level=read_committed\nacks=-1\n")
    assert consumer_config(settings, "g", isolation="read_uncommitted")["isolation.level"] == (
        "read_uncommitted"
    )
    assert producer_config(settings)["acks"] == "all"


def test_variable_names_map_to_dotted_properties_and_skip_the_ledgers_own() -> None:
    environ = {
        "LEDGER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "LEDGER_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET": "x",
        "LEDGER_KAFKA_HOME": "/opt/kafka",
        "LEDGER_KAFKA_PORT": "19092",
        "LEDGER_KAFKA_DEBUG": "eos",
        "LEDGER_KAFKA_CONFIG_FILE": "/etc/client.properties",
        "LEDGER_KAFKA_": "nothing",
        "KAFKA_HEAP_OPTS": "-Xmx1g",
        "LEDGER_TOPIC_PREFIX": "ledger",
    }
    props = env_properties(environ)
    assert {k: (p.value, p.source) for k, p in props.items()} == {
        "security.protocol": ("SASL_SSL", "LEDGER_KAFKA_SECURITY_PROTOCOL"),
        "sasl.oauthbearer.client.secret": ("x", "LEDGER_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET"),
    }


# ------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    "line",
    [
        "enable.idempotence=false",
        "acks=1",
        "request.required.acks=0",
        "isolation.level=read_uncommitted",
        "enable.auto.commit=true",
        "auto.offset.reset=latest",
        "partitioner=consistent_random",
        "transactional.id=shared",
        "group.id=mine",
        "group.instance.id=pod-0",
        "transaction.timeout.ms=60000",
    ],
)
def test_a_file_that_weakens_the_ledger_is_refused_with_its_line(tmp_path: Path, line: str) -> None:
    settings = _settings(tmp_path, f"client.id=x\n{line}\n")
    key = line.split("=")[0]
    with pytest.raises(LocalFileError, match=rf"client.properties:2\).*{key}"):
        consumer_config(settings, "g")
    with pytest.raises(LocalFileError):
        producer_config(settings)


@pytest.mark.parametrize(
    "line",
    ["enable.idempotence=true", "acks=all", "acks=-1", "isolation.level=read_committed"],
)
def test_a_file_may_restate_a_safe_value(tmp_path: Path, line: str) -> None:
    settings = _settings(tmp_path, f"{line}\n")
    assert producer_config(settings)["enable.idempotence"] is True


def test_a_variable_that_weakens_the_ledger_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_KAFKA_ENABLE_IDEMPOTENCE", "false")
    with pytest.raises(LedgerError, match="LEDGER_KAFKA_ENABLE_IDEMPOTENCE"):
        producer_config(_settings(tmp_path))


# ------------------------------------------------------------------------------------- masking


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "ssl.key.pem",
        "sasl.jaas.config",
        "some.api.token",
        "SASL.PASSWORD",
    ],
)
def test_secret_keys_are_masked(key: str) -> None:
    assert is_secret(key)
    assert masked({key: "hunter2", "client.id": "c"}) == {key: MASK, "client.id": "c"}


@pytest.mark.parametrize(
    "key",
    [
        "sasl.username",
        "ssl.key.location",
        "ssl.keystore.location",
        "ssl.ca.location",
        "ssl.certificate.pem",
        "sasl.kerberos.keytab",
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.oauthbearer.client.id",
        "security.protocol",
        "bootstrap.servers",
    ],
)
def test_names_of_files_and_non_secrets_are_shown(key: str) -> None:
    assert not is_secret(key)


def test_masked_never_shows_objects_or_secrets(tmp_path: Path) -> None:
    config = producer_config(_settings(tmp_path, "sasl.password=hunter2\n"))
    shown = masked(config)
    assert shown["sasl.password"] == MASK
    assert shown["logger"] == "<Logger>"
    assert "hunter2" not in repr(shown)


def test_ledger_config_shows_the_properties_in_force_without_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "client.properties"
    path.write_text(SECURED)
    monkeypatch.setenv("LEDGER_KAFKA_CONFIG_FILE", str(path))
    monkeypatch.setenv("LEDGER_KAFKA_SSL_KEY_PASSWORD", "pa55word-from-env")
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["config"])
    assert result.exit_code == 0, result.output
    assert "s3cr=et!" not in result.output
    assert "pa55word-from-env" not in result.output
    assert f"sasl.password={MASK}  # {path}:7" in result.output
    assert f"ssl.key.password={MASK}  # LEDGER_KAFKA_SSL_KEY_PASSWORD" in result.output
    assert f"bootstrap.servers=pkc-1.example.cloud:9092  # {path}:3" in result.output
    assert "sasl.username=svc-ledger" in result.output
    assert "enable.idempotence=true" in result.output


def test_ledger_config_refuses_an_unsafe_file_with_exit_status_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "client.properties"
    path.write_text("acks=1\n")
    monkeypatch.setenv("LEDGER_KAFKA_CONFIG_FILE", str(path))
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["config"])
    assert result.exit_code == 1
    assert f"{path}:1" in result.output and "acks=1" in result.output


def test_describe_lists_sources(tmp_path: Path) -> None:
    described = {p.key: p for p in describe(_settings(tmp_path, "client.id=c\n"))}
    assert described["bootstrap.servers"].source == "defaults"
    assert described["client.id"].source.endswith("client.properties:1")


def test_an_unknown_key_reaches_librdkafka_which_names_it(tmp_path: Path) -> None:
    from confluent_kafka import KafkaException, Producer

    config = producer_config(_settings(tmp_path, "no.such.property=1\n"))
    assert config["no.such.property"] == "1"
    with pytest.raises(KafkaException, match="no.such.property"):
        Producer(config)
