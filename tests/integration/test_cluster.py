"""The local three-node cluster (testbed.cluster) on real processes.

One cluster per session, started once by the ``secure_cluster`` fixture
(``tests/conftest.py``) and shared with every test that needs it: the nodes
answer, an RF-3 topic survives SIGKILL of its leader under a transactional
producer and a ``read_committed`` consumer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ledger.kafka import admin_config, consumer_config, producer_config
from ledger.settings import LedgerSettings
from testbed.cluster import Cluster, ClusterSpec
from tests.conftest import LOCAL_KAFKA_HOME

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plain_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A plaintext three-node cluster on LEDGER_KAFKA_PORT+10.., stopped afterwards."""
    base = LedgerSettings()
    home = tmp_path_factory.mktemp("plain-cluster")
    spec = ClusterSpec.build(home, base.kafka_port + 10, brokers=3, libs=LOCAL_KAFKA_HOME / "libs")
    running = Cluster(spec, base)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def _create(settings: LedgerSettings, topic: str) -> None:
    admin = AdminClient(admin_config(settings))
    futures = admin.create_topics(
        [NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})], operation_timeout=60
    )
    futures[topic].result(timeout=60)


def _produce(producer: Producer, topic: str, values: list[str]) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, key=value.encode(), value=value.encode())
    producer.commit_transaction(60)


def _read_all(settings: LedgerSettings, topic: str, expected: int) -> list[str]:
    consumer = Consumer(consumer_config(settings, f"test-read-{uuid.uuid4().hex[:8]}"))
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[str] = []
    try:
        for _ in range(600):
            if len(seen) >= expected:
                break
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                seen.append(bytes(msg.value() or b"").decode())
    finally:
        consumer.close()
    return seen


def test_three_nodes_answer(plain_cluster: Cluster) -> None:
    st = plain_cluster.status()
    assert [n.node_id for n in st.nodes] == [1, 2, 3]
    assert all(n.alive and n.registered for n in st.nodes), st
    assert st.controller in (1, 2, 3)
    for node in plain_cluster.spec.nodes:  # each node answers on its own port
        md = plain_cluster.metadata(10, bootstrap=node.bootstrap)
        assert set(md.brokers) == {1, 2, 3}


def test_rf3_topic_survives_sigkill_of_its_leader(plain_cluster: Cluster) -> None:
    settings = plain_cluster.client_settings()
    topic = f"test-cluster-{uuid.uuid4().hex[:8]}"
    _create(settings, topic)
    producer = Producer(
        producer_config(settings, **{"transactional.id": f"test-tx-{uuid.uuid4().hex[:8]}"})
    )
    producer.init_transactions(60)
    _produce(producer, topic, [f"before-{i}" for i in range(5)])
    leader = plain_cluster.leader_of(topic, 0)
    plain_cluster.kill_node(leader)
    try:
        _produce(producer, topic, [f"after-{i}" for i in range(5)])
        assert plain_cluster.leader_of(topic, 0) != leader
        seen = _read_all(settings, topic, 10)
    finally:
        plain_cluster.start_node(leader)
    assert seen == [f"before-{i}" for i in range(5)] + [f"after-{i}" for i in range(5)]
    plain_cluster.wait_fully_replicated(120)
    producer.flush(10)
