"""The local secured three-node cluster (testbed.cluster) on real processes.

One cluster per session, started once by the ``secure_cluster`` fixture
(``tests/conftest.py``): every node answers; an RF-3 topic survives SIGKILL
of its leader under a transactional producer and a ``read_committed``
consumer; SCRAM authenticates a user, refuses a wrong password, and the
authorizer refuses a user without ACLs; a plaintext client cannot connect.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ledger.kafka import CLIENT_LOGGER, admin_config, consumer_config, producer_config
from ledger.settings import LedgerSettings
from tests.conftest import SecureCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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
    producer.commit_transaction(120)


def _read_all(settings: LedgerSettings, topic: str, expected: int) -> list[str]:
    consumer = Consumer(consumer_config(settings, f"test-read-{uuid.uuid4().hex[:8]}"))
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[str] = []
    deadline = time.monotonic() + 120  # a loaded machine: leader moves take seconds
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.append(bytes(msg.value() or b"").decode())
    finally:
        consumer.close()
    return seen


def test_three_nodes_answer(secure_cluster: SecureCluster) -> None:
    cluster = secure_cluster.cluster
    st = cluster.status()
    assert [n.node_id for n in st.nodes] == [1, 2, 3]
    assert all(n.alive and n.registered for n in st.nodes), st
    assert st.controller in (1, 2, 3)
    assert st.security == "sasl_ssl"
    for node in cluster.spec.nodes:  # each node answers on its own port, over TLS + SCRAM
        assert set(cluster.metadata(10, bootstrap=node.bootstrap).brokers) == {1, 2, 3}


def test_rf3_topic_survives_sigkill_of_its_leader(secure_cluster: SecureCluster) -> None:
    cluster = secure_cluster.cluster
    settings = secure_cluster.admin_settings()
    topic = f"test-cluster-{uuid.uuid4().hex[:8]}"
    _create(settings, topic)
    producer = Producer(
        producer_config(settings, **{"transactional.id": f"test-tx-{uuid.uuid4().hex[:8]}"})
    )
    producer.init_transactions(60)
    _produce(producer, topic, [f"before-{i}" for i in range(5)])
    leader = cluster.leader_of(topic, 0)
    cluster.kill_node(leader)
    try:
        _produce(producer, topic, [f"after-{i}" for i in range(5)])
        new_leader = cluster.leader_of(topic, 0)
        seen = _read_all(settings, topic, 10)
    finally:
        cluster.start_node(leader)
    assert new_leader != leader
    assert seen == [f"before-{i}" for i in range(5)] + [f"after-{i}" for i in range(5)]
    cluster.wait_fully_replicated(120)


def test_scram_authenticates_users_and_acls_decide(secure_cluster: SecureCluster) -> None:
    admin = secure_cluster.admin_settings()
    topic = f"test-acl-{uuid.uuid4().hex[:8]}"
    _create(admin, topic)
    processor = secure_cluster.settings_for("processor")
    # Authenticated: the cluster answers a SCRAM user ...
    md = AdminClient(admin_config(processor)).list_topics(timeout=30)
    assert set(md.brokers) == {1, 2, 3}
    assert topic not in md.topics  # ... but without an ACL it may not even see the topic
    outcomes: list[KafkaError | None] = []
    producer = Producer(producer_config(processor))
    producer.produce(topic, b"x", on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(30)
    assert [e.code() if e else None for e in outcomes] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

    errors: list[KafkaError] = []
    wrong = AdminClient(
        admin_config(processor, **{"sasl.password": "not-the-password", "error_cb": errors.append})
    )
    with pytest.raises(KafkaException):
        wrong.list_topics(timeout=5)
    wrong.poll(1)  # serves error_cb
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}, errors


def test_plaintext_client_cannot_connect(secure_cluster: SecureCluster) -> None:
    errors: list[KafkaError] = []
    config: dict[str, Any] = {
        "bootstrap.servers": secure_cluster.bootstrap,
        "error_cb": errors.append,
        "logger": CLIENT_LOGGER,
    }
    plain = AdminClient(config)
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    plain.poll(1)
    assert any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors), errors
