"""Shared fixtures: one real Kafka broker per test session, isolated topics per test.

Broker, in this order (a missing broker is a failure, never a skip):

1. ``KAFKA_BOOTSTRAP_SERVERS`` is set: use it as is, start nothing.
2. The local broker (``testbed.broker``, Java 17 + Maven jars) with
   ``kafka_home=<project>/.cache/kafka`` on ``LEDGER_KAFKA_PORT`` (19092). If
   this session started it, it is stopped at the end; a broker that was
   already running is left running. Under pytest-xdist (``make test``) the
   workers start it under a file lock and leave it running: a worker that
   finishes first must not stop it under the other (``make test`` stops it).
3. testcontainers, if it is installed and Docker answers.
4. Otherwise the session fails with instructions.

Every test gets its own topic prefix (uuid), and should use its own group and
transactional IDs (see :func:`unique`).

``private_broker`` and ``private_ledger_settings`` are a single-node broker
of the test process's own (one per pytest-xdist worker, started on first use,
in a folder of the session's temporary directory, on ``LEDGER_KAFKA_PORT + 40
+ 2 * worker``) for the tests that stop or restart their broker: they then run
in ``make test``'s parallel phase without taking the session's broker from the
others.

``secure_cluster`` (session-scoped, started only by the tests that ask for
it) is a second, separate Kafka: a three-node ``sasl_ssl`` cluster of
``testbed.cluster`` with SCRAM users and the ``StandardAuthorizer``, in its
own folder under the session's temporary directory, on ports
``LEDGER_KAFKA_PORT + 10`` upwards; see :class:`SecureCluster`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from hypothesis import settings as hypothesis_settings

from ledger import topics
from ledger.credentials import provision_keys
from ledger.errors import BrokerError
from ledger.settings import LedgerSettings
from testbed import broker
from testbed.cluster import Cluster, ClusterSpec
from tests.helpers import PROJECT_ROOT

LOCAL_KAFKA_HOME = PROJECT_ROOT / ".cache" / "kafka"

# Property tests are not timed: Hypothesis's default 200-ms deadline per example
# failed a pure test on a busy machine. Speed targets live in bench/.
hypothesis_settings.register_profile("ledger", deadline=None)
hypothesis_settings.load_profile("ledger")


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
    LOCAL_KAFKA_HOME.mkdir(parents=True, exist_ok=True)
    try:
        # Parallel workers: one starts the broker, the others wait and find it running.
        with (LOCAL_KAFKA_HOME / "start.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            status = broker.start(settings)
    except BrokerError as exc:
        reasons.append(f"local broker: {exc.message}")
        return None
    parallel_worker = os.environ.get("PYTEST_XDIST_WORKER") is not None

    def gen() -> Iterator[KafkaUnderTest]:
        try:
            yield KafkaUnderTest(status.bootstrap, "local", settings)
        finally:
            if status.started and not parallel_worker:
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


def _fresh_settings(base: LedgerSettings, tmp_path: Path) -> Iterator[LedgerSettings]:
    """Settings on ``base``'s broker with a fresh topic prefix whose topics exist.

    partitions=3, run_dir=tmp_path/"run", clock="manual" and testbed=True
    (tests are a testbed: stages accept the manual clock); its keys are
    provisioned (:func:`ledger.credentials.provision_keys`). The topics are
    deleted afterwards (best effort).
    """
    settings = base.model_copy(
        update={
            "topic_prefix": f"t{uuid.uuid4().hex[:12]}",
            "partitions": 3,
            "run_dir": tmp_path / "run",
            "clock": "manual",
            "testbed": True,
        }
    )
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    provision_keys(settings)  # the testbed provisions keys; stages never make them
    topics.create_topics(settings)
    yield settings
    # Keep the broker small: drop this test's topics (best effort).
    kafka_bootstrap = settings.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap}, logger=broker.CLIENT_LOGGER)
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [n for n in existing if n.startswith(settings.topic_prefix + ".")]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            with contextlib.suppress(Exception):  # cleanup must not fail the test
                future.result(timeout=30)


@pytest.fixture
def ledger_settings(kafka_bootstrap: str, tmp_path: Path) -> Iterator[LedgerSettings]:
    """Settings on the session's broker with a fresh topic prefix whose topics exist
    (see :func:`_fresh_settings`); deleted afterwards."""
    base = LedgerSettings(bootstrap_servers=kafka_bootstrap, kafka_home=LOCAL_KAFKA_HOME)
    yield from _fresh_settings(base, tmp_path)


def private_port() -> int:
    """The client port of this process's private broker (its controller takes the next).

    ``LEDGER_KAFKA_PORT + 40 + 2 * n`` for pytest-xdist worker ``gw<n>`` (``n = 0``
    outside xdist): clear of the session broker (``+0``, ``+1``), the secured
    cluster (``+10`` .. ``+15``) and the chaos mission's cluster (``+20`` ..).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return int(os.environ.get("LEDGER_KAFKA_PORT", "19092")) + 40 + 2 * index


@pytest.fixture(scope="session")
def private_broker_home(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LedgerSettings]:
    """Settings of this process's private broker (see :func:`private_broker`), which
    may not be running yet: ``testbed.broker.start`` it. Stopped at the session's end."""
    if kafka.source != "local":
        pytest.skip(f"private brokers are started from the local jars only ({kafka.source})")
    home = tmp_path_factory.mktemp("private-broker")
    (home / "libs").symlink_to(LOCAL_KAFKA_HOME / "libs", target_is_directory=True)
    port = private_port()
    settings = LedgerSettings(kafka_home=home, kafka_port=port)
    settings = settings.model_copy(update={"bootstrap_servers": broker.local_bootstrap(settings)})
    try:
        yield settings
    finally:
        broker.stop(settings)


@pytest.fixture
def private_broker(private_broker_home: LedgerSettings) -> LedgerSettings:
    """Settings addressing this test process's own single-node broker, running.

    For tests that stop or restart their broker (``testbed.broker.stop``,
    ``restart``, a game day's ``broker_restart``): the broker is this
    process's alone, so they run beside the rest of the suite. Started on
    first use and stopped at the end of the session; a test that left it
    stopped finds it started again.
    """
    settings = private_broker_home
    status = broker.start(settings)
    if not status.owned:
        pytest.fail(
            f"port {settings.kafka_port} answers, but not with this session's private "
            "broker: stop whatever listens there, or set LEDGER_KAFKA_PORT to move the range",
            pytrace=False,
        )
    if status.started:
        _warm_up(settings.bootstrap_servers)
    return settings


@pytest.fixture
def private_ledger_settings(
    private_broker: LedgerSettings, tmp_path: Path
) -> Iterator[LedgerSettings]:
    """:func:`ledger_settings` on :func:`private_broker` (its ``kafka_home`` and
    ``kafka_port`` are the private broker's, so ``broker.restart`` restarts it)."""
    yield from _fresh_settings(private_broker, tmp_path)


@dataclass(frozen=True)
class SecureCluster:
    """The session's secured three-node cluster (fixture ``secure_cluster``).

    Attributes:
        cluster: the running :class:`testbed.cluster.Cluster`: its fault
            primitives (``kill_node``, ``start_node``, ``leader_of``,
            ``active_controller``, ``wait_fully_replicated`` ...) and an
            ``admin()`` client. A test that kills or stops a node must start
            it again (``cluster.start_node(i)``) before it ends.
        bootstrap: every node's ``127.0.0.1:port``, comma-separated.
        ca_file: the cluster's CA certificate (PEM).
        client_files: principal -> its librdkafka client properties file
            (what ``LEDGER_KAFKA_CONFIG_FILE`` takes), for every name in
            :data:`testbed.broker.PRINCIPALS`.
    """

    cluster: Cluster
    bootstrap: str
    ca_file: Path
    client_files: Mapping[str, Path]

    @property
    def admin_file(self) -> Path:
        """The super user's client properties file (topic and ACL administration)."""
        return self.client_files["admin"]

    def settings_for(
        self, principal: str, run_dir: Path | None = None, **overrides: Any
    ) -> LedgerSettings:
        """Settings of a ledger process that connects as ``principal``.

        Args:
            principal: one of :data:`testbed.broker.PRINCIPALS`.
            run_dir: the run folder (created); default none is made, the
                settings' default applies.
            **overrides: further fields, e.g. ``topic_prefix=...`` to share
                one prefix among several principals' settings.

        Returns:
            Settings with the cluster's bootstrap list, the principal's
            client file as ``kafka_config_file``, a fresh ``topic_prefix``,
            ``partitions=3``, ``clock="manual"`` and ``testbed=True``. No
            topics are created: create them with :meth:`admin_settings`.
        """
        fields: dict[str, Any] = {
            "topic_prefix": f"t{uuid.uuid4().hex[:12]}",
            "partitions": 3,
            "clock": "manual",
            "testbed": True,
        }
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            fields["run_dir"] = run_dir
        fields.update(overrides)
        return self.cluster.client_settings(principal, **fields)

    def admin_settings(self, **overrides: Any) -> LedgerSettings:
        """:meth:`settings_for` the super user ``admin``."""
        return self.settings_for("admin", **overrides)

    def env_for(self, principal: str) -> dict[str, str]:
        """Environment variables for a ledger subprocess that connects as ``principal``.

        Returns:
            ``LEDGER_KAFKA_CONFIG_FILE``, ``LEDGER_BOOTSTRAP_SERVERS``,
            ``KAFKA_BOOTSTRAP_SERVERS``, ``LEDGER_KAFKA_HOME``,
            ``LEDGER_KAFKA_PORT`` (and the cluster's ``LEDGER_BROKERS``,
            ``LEDGER_BROKER_SECURITY``): merge them over ``os.environ``.
        """
        return self.cluster.client_env(principal)


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    """A three-node ``sasl_ssl`` cluster for the session, on ``LEDGER_KAFKA_PORT + 10``..+15.

    Started on first use (about a minute on a loaded machine), stopped at
    the end of the session; its folder (CA, users, client files, data) is
    under the session's temporary directory. The jars are the checkout's
    (``.cache/kafka/libs``, fetched if missing).
    """
    base = LedgerSettings(kafka_home=LOCAL_KAFKA_HOME)
    try:
        broker.fetch_jars(base)
        spec = ClusterSpec.build(
            tmp_path_factory.mktemp("secure-cluster"),
            base.kafka_port + 10,
            brokers=3,
            security="sasl_ssl",
            libs=LOCAL_KAFKA_HOME / "libs",
        )
        running = Cluster(spec, base)
        running.start(wait_s=240)
    except BrokerError as exc:
        pytest.fail(f"the secured three-node cluster did not start: {exc.message}", pytrace=False)
    try:
        yield SecureCluster(
            cluster=running,
            bootstrap=spec.bootstrap,
            ca_file=spec.ca_file,
            client_files={p: spec.client_file(p) for p in broker.PRINCIPALS},
        )
    finally:
        running.stop()


#: Test files whose tests pytest-xdist may hand to different workers one by one
#: (no fixture of theirs is wider than a test); every other file's tests stay on
#: one worker, so that a module's fixtures (a mission, a PostgreSQL server) run once.
SPREAD_FILES = ("tests/testbed/test_gameday.py",)


#: Test files whose tests use the session's secured cluster: one worker runs them
#: all (its ports are fixed, ``LEDGER_KAFKA_PORT + 10`` upwards, so a second
#: worker would start a second cluster on them).
SECURE_CLUSTER_FILES = ("tests/integration/test_acl.py", "tests/integration/test_cluster.py")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Refuse a test that uses the secured cluster from a file not in SECURE_CLUSTER_FILES.

    Raises:
        pytest.UsageError: naming the file to add.
    """
    path = item.nodeid.split("::", 1)[0]
    if "secure_cluster" in getattr(item, "fixturenames", ()) and path not in SECURE_CLUSTER_FILES:
        raise pytest.UsageError(
            f"{item.nodeid} uses the secured cluster: add {path} to SECURE_CLUSTER_FILES in "
            "tests/conftest.py, so that `make test`'s workers do not start two on its ports"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How ``pytest -n N`` (``make test``) hands tests to its workers: by file, with exceptions.

    The tests of one file run on one worker, so that a module's fixtures (a
    mission, a PostgreSQL server) run once; the tests of
    :data:`SECURE_CLUSTER_FILES` run on one worker together; the tests of
    :data:`SPREAD_FILES` go one by one. This is a scheduler of our own
    (pytest-xdist's ``LoadScopeScheduling`` with its documented scope
    split) rather than ``--dist loadgroup`` with ``xdist_group`` marks:
    with pytest 9.2 loadgroup silently stops grouping, the node-ID suffix
    it relies on no longer takes effect (pytest-dev/pytest-xdist#1386).
    """
    from xdist.scheduler import LoadScopeScheduling  # only under pytest-xdist

    class _ByFile(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path in SECURE_CLUSTER_FILES:
                return "secure-cluster"
            return nodeid if path in SPREAD_FILES else path

    return _ByFile(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the slow files first; move the chaos mission's tests to the end and start it now.

    Files marked ``slow`` (a minute or more) go first, in their order, so
    that ``make test``'s workers do not end on one of them alone while the
    other worker idles (the scheduler hands out files in this order).

    The chaos mission (``tests/integration/test_chaos_mission.py``) runs its
    own three-node cluster in a process of its own for about six minutes;
    started at collection, it runs beside the rest of the suite instead of
    after it. Its tests, moved last, then only wait for its report.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first
    chaos = [i for i in items if i.nodeid.startswith("tests/integration/test_chaos_mission.py")]
    if not chaos or config.option.collectonly:
        return
    items[:] = [i for i in items if i not in chaos] + chaos
    from tests.integration.test_chaos_mission import start_early

    start_early(config)
