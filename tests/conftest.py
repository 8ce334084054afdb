"""Shared fixtures: one real Kafka broker per test session, isolated topics per test.

Broker, in this order (a missing broker is a failure, never a skip):

1. ``KAFKA_BOOTSTRAP_SERVERS`` is set: use it as is, start nothing.
2. The local broker (``testbed.broker``, Java 17 + Maven jars) with
   ``kafka_home=<project>/.cache/kafka`` on ``LEDGER_KAFKA_PORT`` (19092). If
   this session started it, it is stopped at the end; a broker that was
   already running is left running.
3. testcontainers, if it is installed and Docker answers.
4. Otherwise the session fails with instructions.

Every test gets its own topic prefix (uuid), and should use its own group and
transactional IDs (see :func:`unique`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from ledger import topics
from ledger.errors import BrokerError
from ledger.settings import LedgerSettings
from testbed import broker
from tests.helpers import PROJECT_ROOT

LOCAL_KAFKA_HOME = PROJECT_ROOT / ".cache" / "kafka"


@dataclass(frozen=True)
class KafkaUnderTest:
    """The session's broker.

    Attributes:
        bootstrap: bootstrap servers.
        source: ``env``, ``local`` or ``container``.
        settings: for ``local``, settings that address the local broker.
    """

    bootstrap: str
    source: str
    settings: LedgerSettings | None = None


def unique(kind: str) -> str:
    """A unique name for a group ID, transactional ID or topic suffix."""
    return f"test-{kind}-{uuid.uuid4().hex[:12]}"


def _warm_up(bootstrap: str) -> None:
    """Create __transaction_state once, so the first test is not slow to init."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": unique("warmup"),
            "logger": broker.CLIENT_LOGGER,
        }
    )
    producer.init_transactions(60)


def _local(reasons: list[str]) -> Iterator[KafkaUnderTest] | None:
    settings = LedgerSettings(kafka_home=LOCAL_KAFKA_HOME)
    settings = settings.model_copy(update={"bootstrap_servers": broker.local_bootstrap(settings)})
    if shutil.which("java") is None:
        reasons.append("local broker: `java` (17+) is not on PATH")
        return None
    have_jars = any((LOCAL_KAFKA_HOME / "libs").glob("kafka_2.13-*.jar"))
    if not have_jars and shutil.which("mvn") is None:
        reasons.append("local broker: no jars in .cache/kafka/libs and `mvn` is not on PATH")
        return None
    try:
        status = broker.start(settings)
    except BrokerError as exc:
        reasons.append(f"local broker: {exc.message}")
        return None

    def gen() -> Iterator[KafkaUnderTest]:
        try:
            yield KafkaUnderTest(status.bootstrap, "local", settings)
        finally:
            if status.started:
                broker.stop(settings)

    return gen()


def _container(reasons: list[str]) -> Iterator[KafkaUnderTest] | None:
    try:
        import docker
        from testcontainers.kafka import KafkaContainer
    except ImportError:
        reasons.append("testcontainers: not installed (pip install -e '.[dev]')")
        return None
    try:
        docker.from_env().ping()
    except Exception as exc:  # docker-py raises several unrelated types
        reasons.append(f"testcontainers: Docker does not answer ({exc})")
        return None
    container = (
        KafkaContainer("confluentinc/cp-kafka:7.6.0")
        .with_kraft()
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "1")
        .with_env("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_env("KAFKA_LOG_CLEANER_BACKOFF_MS", "500")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    )

    def gen() -> Iterator[KafkaUnderTest]:
        with container as running:
            yield KafkaUnderTest(running.get_bootstrap_server(), "container")

    return gen()


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaUnderTest]:
    """The session's Kafka broker (see the module docstring for the order)."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        _warm_up(env)
        yield KafkaUnderTest(env, "env")
        return
    reasons: list[str] = []
    for candidate in (_local, _container):
        gen = candidate(reasons)
        if gen is None:
            continue
        under_test = next(gen)
        try:
            _warm_up(under_test.bootstrap)
            yield under_test
        finally:
            gen.close()
        return
    pytest.fail(
        "no Kafka broker for the integration tests:\n  - "
        + "\n  - ".join(reasons)
        + "\nStart one of:\n"
        "  * local jars: install Java 17+ and Maven, then `make kafka` (the tests start it)\n"
        "  * Docker: `docker compose up -d` and export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092\n"
        "  * any broker: export KAFKA_BOOTSTRAP_SERVERS=host:port",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka: KafkaUnderTest) -> str:
    """Bootstrap servers of the session's broker."""
    return kafka.bootstrap


@pytest.fixture
def ledger_settings(kafka_bootstrap: str, tmp_path: Path) -> Iterator[LedgerSettings]:
    """Settings with a fresh topic prefix whose topics exist; deleted afterwards.

    partitions=3, run_dir=tmp_path/"run", clock="manual" and testbed=True
    (tests are a testbed: stages accept the manual clock).
    """
    settings = LedgerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:12]}",
        partitions=3,
        run_dir=tmp_path / "run",
        clock="manual",
        testbed=True,
        kafka_home=LOCAL_KAFKA_HOME,
    )
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    topics.create_topics(settings)
    yield settings
    # Keep the session broker small: drop this test's topics (best effort).
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap}, logger=broker.CLIENT_LOGGER)
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [n for n in existing if n.startswith(settings.topic_prefix + ".")]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            with contextlib.suppress(Exception):  # cleanup must not fail the test
                future.result(timeout=30)
