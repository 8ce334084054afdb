"""A local single-node Kafka 4.x broker (KRaft, combined mode) run from Maven jars.

No tarball and no Docker: ``kafka/pom.xml`` resolves ``kafka_2.13`` and a
log4j2 binding, Maven copies the runtime closure into ``kafka_home/libs``, and
the broker runs as a detached ``java`` process that outlives the command that
started it. Everything lives under ``settings.kafka_home``::

    libs/                 jars (fetched once; refetched when kafka/pom.xml changes)
    config/server.properties, config/log4j2.properties   (rewritten on every start)
    data/                 the KRaft metadata log and topic data (kept across restarts)
    logs/server.log       the broker's own log (log4j2)
    logs/broker.out       the java process's stdout/stderr
    logs/mvn.log, logs/format.log
    broker.pid            PID of the broker *we* started (absent when none)

The broker listens on ``127.0.0.1:{kafka_port}`` (clients) and
``127.0.0.1:{kafka_port + 1}`` (KRaft controller). Only a broker whose PID is
recorded in ``broker.pid`` is ever stopped; a broker someone else runs on the
same port is reused but never touched.

A cluster of several nodes, or a secured one (``ledger broker start --brokers
3 --security sasl_ssl``), is :mod:`testbed.cluster`'s: it shares the jars and
the folder's lock, and keeps its nodes in ``kafka_home/node-<i>/``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from ledger.acl import ADMIN, ROLES
from ledger.errors import BrokerError, BrokerUnavailableError
from ledger.kafka import CLIENT_LOGGER as CLIENT_LOGGER  # re-exported: tests use it
from ledger.kafka import admin_config, bootstrap_servers
from ledger.settings import LedgerSettings
from testbed import launcher
from testbed.launcher import CLUSTER_ID as CLUSTER_ID  # re-exported: its old home
from testbed.launcher import JVM_HEAP as JVM_HEAP
from testbed.launcher import KafkaPaths
from testbed.launcher import format_command as format_command

# The node process's helpers live in testbed.launcher (shared with
# testbed.cluster); these are their former names here.
_Paths = KafkaPaths
_children = launcher.children
_require_tool = launcher.require_tool
_java_base = launcher.java_command
_read_pid_file = launcher.read_pid_file
_cmdline = launcher.cmdline
_alive = launcher.alive
_terminate = launcher.terminate
_wait_gone = launcher.wait_gone
_tail = launcher.tail

#: Maven project that resolves the broker's runtime jars.
POM_PATH = Path(__file__).resolve().parent / "kafka" / "pom.xml"
#: The SCRAM users of a secured local cluster (``ledger broker start --security
#: sasl_ssl``, see :mod:`testbed.cluster`): the super user ``admin`` (brokers,
#: controllers, topic and ACL administration) and one principal per role of
#: DESIGN.md "Trust boundary". Each gets ``kafka_home/clients/<user>.properties``.
PRINCIPALS: tuple[str, ...] = (ADMIN, *ROLES)

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerStatus:
    """What is known about the local broker.

    Attributes:
        running: a Kafka broker answers on ``bootstrap``.
        pid: PID of the broker we started and recorded, if it is alive.
        owned: ``pid`` is set, i.e. ``stop`` would stop this broker.
        started: this very call started the broker (so the caller may stop it).
        bootstrap: ``127.0.0.1:{kafka_port}``.
        kafka_home: the broker folder.
        log_file: the broker's log (``kafka_home/logs/server.log``).
        stdout_file: stdout/stderr of the java process (``logs/broker.out``).
        data_dir: the broker's data (``kafka_home/data``).
        message: one human sentence describing the state.
    """

    running: bool
    pid: int | None
    owned: bool
    started: bool
    bootstrap: str
    kafka_home: Path
    log_file: Path
    stdout_file: Path
    data_dir: Path
    message: str


def local_bootstrap(settings: LedgerSettings) -> str:
    """Return the bootstrap address of the local broker, ``127.0.0.1:{kafka_port}``."""
    return f"127.0.0.1:{settings.kafka_port}"


# --------------------------------------------------------------------------- jars


def fetch_jars(settings: LedgerSettings) -> Path:
    """Make sure the broker's jars are in ``settings.kafka_home/libs``.

    Runs ``mvn dependency:copy-dependencies`` (runtime scope) on
    ``kafka/pom.xml`` only when the jars are missing or were fetched for a
    different ``pom.xml``; otherwise returns at once. The download goes to a
    temporary folder that replaces ``libs`` only on success. Maven's output is
    in ``kafka_home/logs/mvn.log``. The first fetch downloads about 60 MB.

    Args:
        settings: uses ``kafka_home``.

    Returns:
        The ``libs`` folder.

    Raises:
        BrokerError: ``java`` or ``mvn`` is not on ``PATH``, ``kafka/pom.xml``
            is missing, or Maven failed (the message quotes its last lines).
    """
    paths = _Paths.of(settings)
    with _locked(paths):
        return _fetch_jars(paths)


def _jars_fetched(paths: _Paths) -> bool:
    """Tell whether the jars in ``paths.libs`` were fetched for this ``kafka/pom.xml``."""
    marker = paths.libs / ".fetched"
    try:
        pom_digest = hashlib.sha256(POM_PATH.read_bytes()).hexdigest()
        fetched = marker.is_file() and marker.read_text().strip() == pom_digest
    except OSError:
        return False
    return fetched and any(paths.libs.glob("kafka_2.13-*.jar"))


#: Where Linux keeps the range its ephemeral (client) ports are taken from.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The machine's ephemeral port range, ``(first, last)``; ``None`` where it cannot be read.

    Args:
        path: the file holding it (two whole numbers; default Linux's).
    """
    try:
        first, last = (int(x) for x in path.read_text().split()[:2])
    except (OSError, ValueError):
        return None
    return first, last


def ephemeral_port_warning(port: int, span: tuple[int, int] | None) -> str | None:
    """A warning when the broker's ports lie in the ephemeral range, else ``None``.

    A client that connects to a port in that range while nothing listens on
    it can be given that very port as its own source port and connect to
    itself (TCP simultaneous open): it then talks to itself instead of
    failing, and a broker started later cannot bind the port.

    Args:
        port: the client port (``LEDGER_KAFKA_PORT``); the controller uses ``port + 1``.
        span: :func:`ephemeral_range`'s answer.

    Returns:
        One line naming the port, the range, the file and the remedy, or ``None``.
    """
    if span is None:
        return None
    first, last = span
    hit = [p for p in (port, port + 1) if first <= p <= last]
    if not hit:
        return None
    return (
        f"warning: LEDGER_KAFKA_PORT={port} puts the broker's port {hit[0]} in this machine's "
        f"ephemeral port range {first}-{last} ({EPHEMERAL_RANGE_FILE}): while the broker is "
        "down, a client connecting to it can connect to itself; choose a port below "
        f"{first} (e.g. LEDGER_KAFKA_PORT=19092)"
    )


def _port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Tell whether another socket holds ``port`` on ``host`` (binding it fails).

    Unlike connecting, binding cannot be fooled by a self-connect; sockets
    left in TIME_WAIT do not count (``SO_REUSEADDR``, as Kafka binds).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def _port_in_use_error(port: int, what: str, variable: str) -> BrokerError:
    """The error for a broker port another process holds (the client or controller port).

    Args:
        port: the port held.
        what: ``port`` (clients) or ``controller port``.
        variable: the setting it comes from (``LEDGER_KAFKA_PORT`` or ``LEDGER_KAFKA_PORT + 1``).
    """
    answer = " and does not answer as Kafka" if what == "port" else ""
    return BrokerError(
        f"{what} 127.0.0.1:{port} ({variable}) is in use by another process{answer}, so the "
        "broker cannot listen there; stop that process, or set LEDGER_KAFKA_PORT to a free "
        "port (the controller takes the next one), e.g. `export LEDGER_KAFKA_PORT=19192` "
        "(clients follow it)",
        expected="free port or a Kafka broker",
        observed=f"127.0.0.1:{port} busy",
    )


def _fetch_jars(paths: _Paths) -> Path:
    _require_tool(
        "java", "install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless)"
    )
    if not POM_PATH.is_file():
        raise BrokerError(
            f"{POM_PATH} is missing: run the ledger from a checkout of the project "
            "(pip install -e .) so the broker's Maven project is available",
            expected=str(POM_PATH),
            observed="missing",
        )
    if _jars_fetched(paths):
        return paths.libs
    pom_digest = hashlib.sha256(POM_PATH.read_bytes()).hexdigest()
    mvn = _require_tool("mvn", "install Apache Maven 3.6+ (e.g. apt-get install maven)")
    paths.logs.mkdir(parents=True, exist_ok=True)
    staging = paths.home / f"libs.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    mvn_log = paths.logs / "mvn.log"
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(POM_PATH),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    _log.info("fetching Kafka jars into %s (mvn log: %s)", paths.libs, mvn_log)
    with mvn_log.open("wb") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if rc != 0 or not any(staging.glob("kafka_2.13-*.jar")):
        shutil.rmtree(staging, ignore_errors=True)
        raise BrokerError(
            f"Maven could not fetch the Kafka jars (exit {rc}); check network access to "
            f"Maven Central and {mvn_log}:\n{_tail(mvn_log)}",
            expected="kafka_2.13 jars",
            observed=f"mvn exit {rc}",
        )
    (staging / ".fetched").write_text(pom_digest + "\n")
    shutil.rmtree(paths.libs, ignore_errors=True)
    staging.rename(paths.libs)
    return paths.libs


# --------------------------------------------------------------------------- lifecycle


#: What starting the broker says before it fetches the jars (only when they are missing).
FETCHING_JARS = (
    "fetching the broker's jars with Maven first (about 60 MB, once; log in "
    "LEDGER_KAFKA_HOME/logs/mvn.log) ..."
)


def start(
    settings: LedgerSettings, wait_s: float = 90, say: Callable[[str], None] | None = None
) -> BrokerStatus:
    """Start the local broker, or reuse the one already answering.

    Safe to call any number of times, also from several processes at once (a
    file lock serialises them):

    * our recorded broker is alive: wait until it answers, then reuse it;
    * a broker we did not start answers on the port: reuse it (the status
      message says so; ``stop`` will leave it alone);
    * otherwise fetch the jars (if needed), write ``server.properties`` and
      ``log4j2.properties``, format the storage (only once per data dir),
      launch ``java kafka.Kafka`` detached in its own session (it survives the
      caller), record its PID in ``broker.pid`` and poll
      ``AdminClient.list_topics`` until the broker answers.

    Args:
        settings: uses ``kafka_home`` and ``kafka_port`` (the controller uses
            ``kafka_port + 1``).
        wait_s: how long to wait for the broker to answer (seconds).
        say: where to say :data:`FETCHING_JARS` when the jars must be
            fetched first (only then; ``None``: nowhere).

    Returns:
        The status; ``started`` is true only if this call launched the broker.

    Raises:
        BrokerError: java/mvn missing or Java older than 17, Maven or the
            storage format failed, the port is taken by something that is not
            Kafka, the broker exited during start-up, or it did not answer
            within ``wait_s`` (a :class:`BrokerUnavailableError`, retryable;
            the broker is then stopped again). Messages quote the
            log tail and name the log files.
    """
    paths = _Paths.of(settings)
    bootstrap = local_bootstrap(settings)
    deadline = time.monotonic() + wait_s
    with _locked(paths):
        pid = _recorded_pid(paths)
        if pid is not None:
            _wait_ready(settings, paths, bootstrap, deadline, pid)
            return _status(settings, paths, pid, True, False, "reused the broker we started")
        # Bind, not connect, says whether a port is held: a connect to a port in
        # the ephemeral range can reach itself while nothing listens there.
        if _port_taken(settings.kafka_port):
            if _port_open(settings.kafka_port) and _kafka_answers(
                settings, bootstrap, timeout_s=min(10.0, max(1.0, wait_s))
            ):
                return _status(
                    settings,
                    paths,
                    None,
                    True,
                    False,
                    f"a Kafka broker not started by ledger already answers on {bootstrap}; "
                    "reusing it (ledger broker stop will not stop it)",
                )
            raise _port_in_use_error(settings.kafka_port, "port", "LEDGER_KAFKA_PORT")
        if _port_taken(settings.kafka_port + 1):
            raise _port_in_use_error(
                settings.kafka_port + 1, "controller port", "LEDGER_KAFKA_PORT + 1"
            )
        if say is not None and not _jars_fetched(paths):
            say(FETCHING_JARS)
        _fetch_jars(paths)
        _check_java()
        _write_configs(settings, paths)
        _format_storage(paths)
        pid = _launch(paths)
        try:
            _wait_ready(settings, paths, bootstrap, deadline, pid)
        except BrokerError:
            _terminate(pid, timeout_s=15)
            paths.pid_file.unlink(missing_ok=True)
            raise
        return _status(settings, paths, pid, True, True, f"started the broker (pid {pid})")


def stop(settings: LedgerSettings, timeout_s: float = 30) -> str:
    """Stop the broker whose PID we recorded; leave every other process alone.

    Sends SIGTERM (Kafka then shuts down cleanly), waits up to ``timeout_s``,
    sends SIGKILL if it is still alive, and removes ``broker.pid``. When no
    broker is recorded (or the recorded PID is dead or belongs to another
    program) nothing is killed and the message says so.

    Args:
        settings: uses ``kafka_home``.
        timeout_s: how long to wait after SIGTERM before SIGKILL (seconds).

    Returns:
        A one-line description of what was done.

    Raises:
        BrokerError: the process survived SIGKILL (should not happen).
    """
    paths = _Paths.of(settings)
    with _locked(paths):
        raw = _read_pid_file(paths)
        if raw is None:
            return f"no broker recorded in {paths.pid_file}; nothing to stop"
        pid = _recorded_pid(paths)
        if pid is None:
            paths.pid_file.unlink(missing_ok=True)
            return (
                f"recorded broker pid {raw} is not running (or is not our broker); "
                "removed the stale pid file"
            )
        how = _terminate(pid, timeout_s=timeout_s)
        paths.pid_file.unlink(missing_ok=True)
        return f"stopped the broker (pid {pid}, {how})"


def status(settings: LedgerSettings) -> BrokerStatus:
    """Report on the local broker without changing anything.

    Args:
        settings: uses ``kafka_home`` and ``kafka_port``.

    Returns:
        The status; ``running`` means a broker answers on the port, ``pid``
        is set only for the broker we started.
    """
    paths = _Paths.of(settings)
    bootstrap = local_bootstrap(settings)
    pid = _recorded_pid(paths)
    answers = _port_open(settings.kafka_port) and _kafka_answers(settings, bootstrap, timeout_s=5)
    if pid is not None and answers:
        msg = f"running (pid {pid}) on {bootstrap}"
    elif pid is not None:
        msg = f"pid {pid} is alive but does not answer on {bootstrap} yet (starting or stuck?)"
    elif answers:
        msg = f"a broker not started by ledger answers on {bootstrap}"
    else:
        msg = f"not running (nothing answers on {bootstrap})"
    return _status(settings, paths, pid, answers, False, msg)


def status_pid(settings: LedgerSettings) -> int | None:
    """PID of the single-node broker we started in ``settings.kafka_home``, if it is alive."""
    return _recorded_pid(_Paths.of(settings))


#: Seconds a restarted broker may take to answer: it recovers the log of every
#: partition it holds first (the state "RECOVERY"), which on a test session's
#: broker is thousands of partitions and, on a loaded 2-core machine, minutes.
RESTART_WAIT_S = 300.0


def restart(
    settings: LedgerSettings, wait_s: float = RESTART_WAIT_S, timeout_s: float = 30
) -> BrokerStatus:
    """Stop our broker and start it again on the same data dir (for game days).

    Topics, records, committed offsets and transactions survive; clients see
    the broker disappear for a few seconds.

    Args:
        settings: uses ``kafka_home`` and ``kafka_port``.
        wait_s: how long to wait for the restarted broker to answer (seconds).
        timeout_s: how long to wait for the old broker to exit (seconds).

    Returns:
        The status of the restarted broker.

    Raises:
        BrokerError: a broker answers on the port that we did not start (we
            cannot restart it), or :func:`start` / :func:`stop` failed.
    """
    paths = _Paths.of(settings)
    if _recorded_pid(paths) is None and _port_open(settings.kafka_port):
        raise BrokerError(
            f"the broker on {local_bootstrap(settings)} was not started by ledger "
            f"(no live pid in {paths.pid_file}); restart it where it was started",
            expected="a broker started by `ledger broker start`",
            observed="foreign broker",
        )
    stop(settings, timeout_s=timeout_s)
    return start(settings, wait_s=wait_s)


# --------------------------------------------------------------------------- helpers


def _status(
    settings: LedgerSettings,
    paths: _Paths,
    pid: int | None,
    running: bool,
    started: bool,
    message: str,
) -> BrokerStatus:
    bootstrap = local_bootstrap(settings)
    if running and settings.bootstrap_servers != bootstrap:
        message += (
            f" (note: settings.bootstrap_servers is {settings.bootstrap_servers!r}, "
            "not this broker)"
        )
    return BrokerStatus(
        running=running,
        pid=pid,
        owned=pid is not None,
        started=started,
        bootstrap=bootstrap,
        kafka_home=paths.home,
        log_file=paths.log_file,
        stdout_file=paths.stdout_file,
        data_dir=paths.data,
        message=message,
    )


@contextlib.contextmanager
def _locked(paths: _Paths) -> Iterator[None]:
    """Hold an exclusive lock on ``kafka_home/broker.lock`` (blocks)."""
    paths.home.mkdir(parents=True, exist_ok=True)
    with paths.lock_file.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _check_java() -> None:
    java = _require_tool("java", "install a Java 17+ runtime")
    out = subprocess.run(
        [java, "-version"], capture_output=True, text=True, check=False, timeout=60
    ).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if match is None:
        return  # unknown vendor format: let the broker itself complain
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        major = int(match.group(2))
    if major < 17:
        raise BrokerError(
            f"the Kafka 4 broker needs Java 17+, but `java` is Java {major}; install Java 17+ "
            "and put it first on PATH",
            expected="Java >= 17",
            observed=f"Java {major}",
        )


def _server_properties(settings: LedgerSettings, paths: _Paths) -> str:
    port = settings.kafka_port
    ctl = port + 1
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{ctl}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctl}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(paths.data),
        # One broker: every internal topic has one replica.
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # Speed: no rebalance delay, small internal topics, a busy log cleaner.
        "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
        "log.cleaner.backoff.ms": "500",
        # A crashed producer's open transaction holds read_committed readers
        # at its first offset until it is aborted: check for timed-out ones
        # every second (default ten), so a dead stage's transaction is
        # aborted soon after transaction.timeout.ms.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        # Ledger topics are created explicitly, never by a typo.
        "auto.create.topics.enable": "false",
    }
    lines = [
        "# Written by testbed.broker on every start; edits are overwritten.",
        *(f"{k}={v}" for k, v in props.items()),
    ]
    return "\n".join(lines) + "\n"


_LOG4J2 = """\
# Written by testbed.broker on every start. The broker logs to
# ${sys:kafka.logs.dir}/server.log (rolled at 20 MB, 3 kept), never to the console.
status = warn
name = ledger-kafka

appender.server.type = RollingFile
appender.server.name = server
appender.server.fileName = ${sys:kafka.logs.dir}/server.log
appender.server.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.server.policies.type = Policies
appender.server.policies.size.type = SizeBasedTriggeringPolicy
appender.server.policies.size.size = 20MB
appender.server.strategy.type = DefaultRolloverStrategy
appender.server.strategy.max = 3

rootLogger.level = INFO
rootLogger.appenderRef.server.ref = server

logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN

# Tests create and delete hundreds of topics; at INFO these loggers write
# megabytes per minute. Set them back to INFO to debug topic/partition state.
logger.controller.name = org.apache.kafka.controller
logger.controller.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.dynconfig.name = kafka.server.metadata.DynamicConfigPublisher
logger.dynconfig.level = WARN
logger.logmanager.name = kafka.log.LogManager
logger.logmanager.level = WARN
logger.partition.name = kafka.cluster.Partition
logger.partition.level = WARN
logger.unifiedlog.name = org.apache.kafka.storage.internals.log.UnifiedLog
logger.unifiedlog.level = WARN
logger.producerstate.name = org.apache.kafka.storage.internals.log.ProducerStateManager
logger.producerstate.level = WARN
logger.snapshot.name = org.apache.kafka.storage.internals.log.SnapshotFile
logger.snapshot.level = WARN
"""


def _write_configs(settings: LedgerSettings, paths: _Paths) -> None:
    for folder in (paths.config_dir, paths.data, paths.logs):
        folder.mkdir(parents=True, exist_ok=True)
    paths.server_properties.write_text(_server_properties(settings, paths))
    paths.log4j_config.write_text(_LOG4J2)


def _format_storage(paths: _Paths) -> None:
    """Format the KRaft storage once (``-g`` also tolerates a formatted dir)."""
    if (paths.data / "meta.properties").is_file():
        return
    format_log = paths.logs / "format.log"
    with format_log.open("wb") as out:
        rc = subprocess.call(
            format_command(paths),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=paths.home,
        )
    if rc != 0:
        raise BrokerError(
            f"formatting the broker storage in {paths.data} failed (exit {rc}); see "
            f"{format_log}. If the data dir is corrupt, stop the broker and delete it:\n"
            f"{_tail(format_log)}",
            expected="formatted storage",
            observed=f"StorageTool exit {rc}",
        )


def _launch(paths: _Paths) -> int:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    pid = launcher.launch(paths, banner=f"testbed.broker start {stamp}", heap=JVM_HEAP)
    _log.info("started Kafka broker pid %d (log %s)", pid, paths.log_file)
    return pid


def _wait_ready(
    settings: LedgerSettings, paths: _Paths, bootstrap: str, deadline: float, pid: int
) -> None:
    port = int(bootstrap.rsplit(":", 1)[1])
    while True:
        if not _alive(pid):
            paths.pid_file.unlink(missing_ok=True)
            raise BrokerError(
                f"the broker (pid {pid}) exited during start-up; see {paths.log_file} and "
                f"{paths.stdout_file}:\n{_tail(paths.stdout_file)}\n{_tail(paths.log_file)}",
                expected="running broker",
                observed="exited",
            )
        remaining = deadline - time.monotonic()
        if _port_open(port) and _kafka_answers(
            settings, bootstrap, timeout_s=max(0.5, min(5.0, remaining))
        ):
            return
        if time.monotonic() >= deadline:
            raise BrokerUnavailableError(
                f"the broker (pid {pid}) did not answer on {bootstrap} in time; see "
                f"{paths.log_file}; raise the wait (ledger broker start --wait) on slow machines:"
                f"\n{_tail(paths.log_file)}",
                expected="broker answering",
                observed="no answer",
            )
        time.sleep(0.2)


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _kafka_answers(settings: LedgerSettings, bootstrap: str, timeout_s: float) -> bool:
    """Tell whether Kafka answers at ``bootstrap`` (with the process's client properties)."""
    admin = AdminClient(admin_config(settings, **{"bootstrap.servers": bootstrap}))
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return True


def _recorded_pid(paths: _Paths) -> int | None:
    """Return the recorded PID if that process is alive and is our broker."""
    pid = _read_pid_file(paths)
    if pid is None or not _alive(pid):
        return None
    cmdline = _cmdline(pid)
    if cmdline is None or ("kafka.Kafka" in cmdline and str(paths.server_properties) in cmdline):
        return pid
    return None


@contextlib.contextmanager
def running_broker(
    settings: LedgerSettings, say: Callable[[str], None], keep: bool = False
) -> Iterator[LedgerSettings]:
    """Settings for a running broker: the configured one, or the local one started now.

    Args:
        settings: the caller's settings; a bootstrap list other than the local
            broker's (e.g. ``KAFKA_BOOTSTRAP_SERVERS``, or ``bootstrap.servers``
            in ``LEDGER_KAFKA_CONFIG_FILE``) is used as it is.
        say: where progress lines go ("starting the local Kafka broker ...").
        keep: leave a broker started here running afterwards.

    Yields:
        The settings, pointing at the running broker.

    Raises:
        BrokerError: when the local broker cannot be started.
    """
    if bootstrap_servers(settings) != local_bootstrap(settings):
        yield settings
        return
    started = False
    try:
        current = status(settings)
        if not current.running:
            say("starting the local Kafka broker ...")
            warning = ephemeral_port_warning(settings.kafka_port, ephemeral_range())
            if warning:
                say(warning)
            current = start(settings, say=say)
            started = True
        yield settings.model_copy(update={"bootstrap_servers": current.bootstrap})
    finally:
        if started and not keep:
            stop(settings)
