"""Integration tests of testbed.broker and ledger.topics on a real broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    ResourceType,
)

from ledger import topics
from ledger.cli import main
from ledger.errors import SettingsError, TopicConfigError
from ledger.settings import LedgerSettings
from ledger.topology import TOPICS
from testbed import broker
from testbed.compaction import force_compaction

if TYPE_CHECKING:
    from tests.conftest import KafkaUnderTest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def unique(kind: str) -> str:
    return f"test-{kind}-{uuid.uuid4().hex[:12]}"


def _admin(settings: LedgerSettings) -> AdminClient:
    """A fresh admin client. Keep it in a variable while waiting on its futures:
    a collected client cancels them."""
    return AdminClient({"bootstrap.servers": settings.bootstrap_servers})


def _configs(settings: LedgerSettings, topic: str) -> dict[str, ConfigEntry]:
    admin = _admin(settings)
    res = ConfigResource(ResourceType.TOPIC, topic)
    return dict(admin.describe_configs([res])[res].result(timeout=30))


def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _set_configs(settings: LedgerSettings, topic: str, values: dict[str, str]) -> None:
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in values.items()
        ],
    )
    admin = _admin(settings)
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    _until(
        lambda: all(_configs(settings, topic)[k].value == v for k, v in values.items()),
        f"{values} on {topic}",
    )


def _read_all(settings: LedgerSettings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every committed record, skipping reserved keys."""
    parts = len(_admin(settings).list_topics(topic, timeout=10).topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    out: list[tuple[bytes | None, bytes | None]] = []
    at_eof: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(at_eof) < parts:
            assert time.monotonic() < deadline, f"reading {topic} timed out"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                at_eof.add(msg.partition())
                continue
            if not topics.is_reserved_key(msg.key()):
                out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def test_create_topics_is_idempotent_with_the_right_layout(ledger_settings: LedgerSettings) -> None:
    s = ledger_settings  # the fixture already created the topics once
    assert topics.create_topics(s) == []
    assert topics.create_topics(s) == []

    present = _admin(s).list_topics(timeout=10).topics
    for spec in TOPICS:
        name = s.topic(spec.name)
        assert len(present[name].partitions) == (1 if spec.single_partition else 3), name
        cfg = _configs(s, name)
        assert cfg["cleanup.policy"].value == spec.cleanup, name
        if spec.cleanup == "compact":
            assert cfg["min.compaction.lag.ms"].value == "0", name
            assert cfg["segment.ms"].value == str(topics.COMPACTED_SEGMENT_MS), name
        else:
            assert cfg["retention.ms"].value == str(spec.retention_ms), name
    assert s.topic("journal") in topics.check_topics(s)


def test_check_topics_refuses_compact_delete_with_retention(
    ledger_settings: LedgerSettings,
) -> None:
    s = ledger_settings
    name = s.topic("intents")
    _set_configs(s, name, {"cleanup.policy": "compact,delete", "retention.ms": "86400000"})

    with pytest.raises(TopicConfigError) as caught:
        topics.check_topics(s)
    err = caught.value
    assert err.topic == name
    assert err.config == "cleanup.policy"
    assert err.observed == "compact,delete"
    assert f"{name}: cleanup.policy=compact,delete" in str(err)
    assert "auditors" in str(err)
    # Only that topic is wrong; the others pass.
    topics.check_topics(s, ["state", "journal"])


def test_check_topics_refuses_retention_on_the_journal(ledger_settings: LedgerSettings) -> None:
    s = ledger_settings
    name = s.topic("journal")
    _set_configs(s, name, {"retention.ms": "3600000"})

    with pytest.raises(TopicConfigError) as caught:
        topics.check_topics(s, ["journal"])
    err = caught.value
    assert (err.topic, err.config, err.expected, err.observed) == (
        name,
        "retention.ms",
        "-1",
        "3600000",
    )
    assert f"{name}: retention.ms=3600000 would delete evidence" in str(err)


def test_check_topics_refuses_a_missing_topic(ledger_settings: LedgerSettings) -> None:
    s = ledger_settings
    name = s.topic("claims")
    admin = _admin(s)
    admin.delete_topics([name])[name].result(timeout=30)
    _until(lambda: name not in admin.list_topics(timeout=10).topics, f"{name} deleted")

    with pytest.raises(TopicConfigError) as caught:
        topics.check_topics(s)
    assert (caught.value.topic, caught.value.config) == (name, "existence")
    assert "ledger topics create" in str(caught.value)
    topics.check_topics(s, ["intents"])


def test_check_topics_refuses_broken_co_partitioning(ledger_settings: LedgerSettings) -> None:
    s = ledger_settings
    name = s.topic("receipts")
    admin = _admin(s)
    admin.create_partitions([NewPartitions(name, 4)])[name].result(timeout=30)
    _until(
        lambda: len(admin.list_topics(name, timeout=10).topics[name].partitions) == 4,
        "4 partitions",
    )

    with pytest.raises(TopicConfigError) as caught:
        topics.check_topics(s)
    err = caught.value
    assert (err.topic, err.config, err.expected, err.observed) == (name, "partitions", 3, 4)
    assert "co-partitioning" in str(err)


def _brokers(settings: LedgerSettings) -> int:
    return len(_admin(settings).list_topics(timeout=10).brokers)


def test_ledger_topics_create_replicates_and_forbids_unclean_election(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"t{uuid.uuid4().hex[:12]}"
    s = LedgerSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", prefix)
    # A fresh prefix: one line, not one per topic.
    with pytest.raises(TopicConfigError) as caught:
        topics.check_topics(s)
    assert str(caught.value).startswith("topics not created: run `ledger topics create`")
    assert "\n" not in str(caught.value)
    wanted = topics.replication_for(s, _brokers(s))
    try:
        result = CliRunner().invoke(main, ["topics", "create"])
        assert result.exit_code == 0, result.output
        assert f"created {len(TOPICS)} of {len(TOPICS)} topics" in result.output
        assert f"(replication factor {wanted.replication_factor}: " in result.output
        metadata = _admin(s).list_topics(timeout=10).topics
        for spec in TOPICS:
            name = s.topic(spec.name)
            assert all(
                len(p.replicas) == wanted.replication_factor
                for p in metadata[name].partitions.values()
            ), name
            cfg = _configs(s, name)
            for key, value in (
                ("unclean.leader.election.enable", "false"),
                ("min.insync.replicas", str(wanted.min_insync_replicas)),
            ):
                assert cfg[key].value == value, (name, key)
                # Set on the topic itself, not inherited from the broker.
                assert cfg[key].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, (name, key)
    finally:
        admin = _admin(s)
        doomed = [n for n in admin.list_topics(timeout=10).topics if n.startswith(prefix + ".")]
        if doomed:
            for future in admin.delete_topics(doomed, operation_timeout=30).values():
                future.result(timeout=30)


def test_check_topics_refuses_unclean_election_and_blocking_min_insync(
    ledger_settings: LedgerSettings,
) -> None:
    s = ledger_settings
    journal, state = s.topic("journal"), s.topic("state")
    factor = topics.replication_for(s, _brokers(s)).replication_factor
    _set_configs(s, journal, {"unclean.leader.election.enable": "true"})
    _set_configs(s, state, {"min.insync.replicas": str(factor + 1)})

    with pytest.raises(TopicConfigError) as caught:
        topics.check_topics(s)
    err = caught.value  # its fields name the first problem, in TOPICS order
    assert (err.topic, err.config, err.observed) == (state, "min.insync.replicas", factor + 1)
    message = str(err)
    assert f"{journal}: unclean.leader.election.enable=true" in message
    assert (
        f"kafka-configs.sh --bootstrap-server {s.bootstrap_servers} --alter --entity-type "
        f"topics --entity-name {journal} --add-config unclean.leader.election.enable=false"
    ) in message
    assert f"{state}: min.insync.replicas={factor + 1} with {factor} replicas" in message
    assert f"--entity-name {state} --add-config min.insync.replicas=" in message
    # Only those two topics are wrong.
    assert message.count("\n  - ") == 2
    topics.check_topics(s, ["intents", "receipts"])


def test_check_topics_refuses_a_factor_above_the_cluster_and_names_the_fix(
    ledger_settings: LedgerSettings,
) -> None:
    brokers = _brokers(ledger_settings)
    # On the single local broker: LEDGER_REPLICATION_FACTOR=2.
    s = ledger_settings.model_copy(update={"replication_factor": brokers + 1})
    with pytest.raises(TopicConfigError) as caught:
        topics.check_topics(s)
    err = caught.value
    assert (err.config, err.expected) == ("replication.factor", brokers + 1)
    message = str(err)
    for spec in TOPICS:
        assert f"{s.topic(spec.name)}: replication factor " in message, spec.name
    noun = "broker" if brokers == 1 else "brokers"
    assert f"the cluster has only {brokers} {noun}" in message
    assert f"set LEDGER_REPLICATION_FACTOR={brokers}" in message
    # Creating topics with that factor is refused before the broker is asked.
    fresh = s.model_copy(update={"topic_prefix": f"t{uuid.uuid4().hex[:12]}"})
    with pytest.raises(SettingsError, match=f"set LEDGER_REPLICATION_FACTOR={brokers}"):
        topics.create_topics(fresh)
    assert not any(
        n.startswith(fresh.topic_prefix + ".") for n in _admin(s).list_topics(timeout=10).topics
    )


def test_force_compaction_keeps_the_latest_value_per_key(ledger_settings: LedgerSettings) -> None:
    s = ledger_settings
    name = s.topic("state")
    producer = Producer({"bootstrap.servers": s.bootstrap_servers, "partitioner": "murmur2_random"})
    for i in range(200):
        producer.produce(name, key=f"op-{i % 5}", value=f"v{i}")
    assert producer.flush(30) == 0

    started = time.monotonic()
    results = force_compaction(s, timeout_s=60, names=["state"])
    took = time.monotonic() - started

    assert [(r.topic, r.records_before, r.records_after) for r in results] == [(name, 200, 5)]
    latest = {k: v for k, v in _read_all(s, name)}
    assert latest == {f"op-{k}".encode(): f"v{195 + k}".encode() for k in range(5)}
    assert len(_read_all(s, name)) == 5  # no duplicates left, no reserved key leaked
    cfg = _configs(s, name)  # configs restored
    assert cfg["segment.ms"].value == str(topics.COMPACTED_SEGMENT_MS)
    assert cfg["min.compaction.lag.ms"].value == "0"
    assert cfg["delete.retention.ms"].is_default
    assert cfg["min.cleanable.dirty.ratio"].is_default
    assert took < 30


def test_broker_status_reports_running_with_a_log_file(kafka: KafkaUnderTest) -> None:
    if kafka.source != "local" or kafka.settings is None:
        pytest.skip(f"the session broker is not managed by testbed.broker ({kafka.source})")
    st = broker.status(kafka.settings)
    assert st.running, st.message
    assert st.bootstrap == kafka.bootstrap
    assert st.data_dir.is_dir()
    if st.owned:
        assert st.pid is not None
        assert st.log_file.is_file() and st.log_file.stat().st_size > 0
        logs = st.log_file.parent.glob(st.log_file.name + "*")  # server.log, server.log.1 ...
        assert any("Kafka Server started" in f.read_text(errors="replace") for f in logs)
        assert st.stdout_file.is_file()
    again = broker.start(kafka.settings)  # idempotent: reuses, starts nothing
    assert (again.running, again.started, again.pid) == (True, False, st.pid)


def test_broker_restart_keeps_topics_and_records(
    private_broker: LedgerSettings, private_ledger_settings: LedgerSettings
) -> None:
    s = private_ledger_settings  # the broker restarted is this test process's own
    name = s.topic("journal")
    producer = Producer({"bootstrap.servers": s.bootstrap_servers, "partitioner": "murmur2_random"})
    producer.produce(name, key="op-1", value="before restart")
    assert producer.flush(30) == 0
    old_pid = broker.status(private_broker).pid

    st = broker.restart(private_broker)

    assert st.running and st.started and st.pid != old_pid
    topics.check_topics(s)
    assert _read_all(s, name) == [(b"op-1", b"before restart")]
