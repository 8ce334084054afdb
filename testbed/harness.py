"""Running the ledger's stages as real processes, for demos, game days and tests.

A :class:`Harness` owns one ledger (one topic prefix and run folder): it
starts the reference sinks and the stage processes (``ledger processor``,
``ledger authority``, ``ledger relay``), arms fault hooks, restarts crashed
stages, and waits until the ledger is quiescent.

Quiescence is read from Kafka, not from timers: for every live stage's
consumer group, the committed offset of every input partition has reached
that partition's last stable offset. Committed offsets move only with the
transaction that also wrote the stage's outputs, so when every live group has
caught up (committed offsets read first, end offsets second), no live stage
holds work it can still progress.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from consumers.stages import STAGES
from ledger.clock import ManualClock
from ledger.contracts import EffectContract
from ledger.credentials import provision_keys
from ledger.errors import LedgerError
from ledger.events import OperatingEvent, OperationState
from ledger.kafka import classify, consumer_config, kafka_error
from ledger.settings import LedgerSettings
from ledger.topics import create_topics
from producers.publisher import LedgerPublisher
from sinks.client import SinkClient, SubmitResult
from sinks.registry import SinkEndpoint, load_sinks, save_sinks
from testbed import faults
from testbed.realsinks import RealSink
from testbed.sinks.process import SinkProcess

log = logging.getLogger(__name__)


#: Seconds a watermark query rides out answers Kafka marks retriable.
WATERMARK_RETRY_S = 30.0


def watermarks(
    consumer: Consumer, tp: TopicPartition, timeout_s: float, retry_s: float = WATERMARK_RETRY_S
) -> tuple[int, int]:
    """``(low, high)`` of a partition, asked again while Kafka's answer is retriable.

    Just after a topic is created, or under load, the broker can answer
    ``NOT_LEADER_FOR_PARTITION`` while the partition's leadership settles (a
    test suite went red on it once); such answers are asked again, with a
    short pause, for up to ``retry_s`` seconds.

    Args:
        consumer: the client that asks (its isolation level decides the end).
        tp: the partition.
        timeout_s: each query's timeout (seconds).
        retry_s: how long retriable answers are asked again (0: raised at
            once, for a caller that retries itself, as :meth:`Harness.wait_quiescent`
            does: blocking there during a broker fault stalled the chaos
            mission's driver).

    Raises:
        KafkaException: a non-retriable answer, or retriable ones past the bound.
    """
    deadline = time.monotonic() + retry_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            err = kafka_error(exc)
            if err is None or classify(err) != "retriable" or time.monotonic() > deadline:
                raise
            log.info("watermarks of %s[%d]: %s; asking again", tp.topic, tp.partition, err)
            time.sleep(0.2)


def settings_env(settings: LedgerSettings) -> dict[str, str]:
    """Environment that gives a child process the same settings (``LEDGER_*``)."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"LEDGER_{name.upper()}"] = str(value)
    return env


class Harness:
    """One ledger's processes.

    The testbed provisions the ledger's keys (:func:`ledger.credentials.provision_keys`)
    when its keys folder has none: stages never create keys themselves.

    Args:
        settings: the ledger's settings (its own ``topic_prefix`` and
            ``run_dir``).
        create: create the ledger's topics first.
    """

    def __init__(self, settings: LedgerSettings, *, create: bool = True) -> None:
        self.settings = settings
        self.run_dir = settings.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self.clock = ManualClock(self.run_dir / "clock")
        if not (self.run_dir / "clock").exists():
            self.clock.set_ms(0)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: Stage processes stopped by :meth:`pause` or by a pause hook (names).
        self.paused: set[str] = set()
        self._pause_firings_seen = 0
        self._logs: dict[str, IO[bytes]] = {}
        self.sinks: dict[str, SinkProcess] = {}
        #: Real systems behind adapters (game-day format v3), by sink name.
        self.real_sinks: dict[str, RealSink] = {}
        self._group_consumers: dict[str, Consumer] = {}
        self._lso_consumer: Consumer | None = None
        #: component -> environment variables of its processes on top of the
        #: settings' (e.g. its own ``LEDGER_KAFKA_CONFIG_FILE``: one principal per stage).
        self.stage_env: dict[str, dict[str, str]] = {}
        provision_keys(settings)
        if create:
            create_topics(settings)

    # ------------------------------------------------------------------ sinks

    def start_sink(self, name: str, contract: EffectContract, hang_s: float = 5.0) -> SinkProcess:
        """Start a reference sink (fault injection on) and register it for the relay.

        The sink's random bearer token is registered with it in the sink registry.
        """
        sink = SinkProcess(
            name, contract, self.run_dir, clock="manual", hang_s=hang_s, fault_injection=True
        )
        sink.start()
        self.sinks[name] = sink
        registry = load_sinks(self.settings.sinks_path())
        registry[name] = SinkEndpoint(url=sink.url, contract=contract, token=sink.token)
        save_sinks(self.settings.sinks_path(), registry)
        return sink

    def start_real_sink(
        self,
        name: str,
        adapter: str,
        contract: EffectContract,
        config: dict[str, Any] | None,
        timeout_s: float | None = None,
    ) -> RealSink:
        """Start the real system behind adapter ``adapter`` and register it (through its
        fault proxy) for the relay; see :mod:`testbed.realsinks`.

        ``timeout_s`` is the deadline of every call to it, in seconds (default:
        the settings' ``sink_timeout_s``), kept in its registry entry."""
        deadline_s = timeout_s if timeout_s is not None else self.settings.sink_timeout_s
        sink = RealSink(name, adapter, contract, config, self.run_dir, deadline_s)
        self.real_sinks[name] = sink
        endpoint = sink.start()
        registry = load_sinks(self.settings.sinks_path())
        registry[name] = endpoint
        save_sinks(self.settings.sinks_path(), registry)
        return sink

    def upgrade_sink(
        self, name: str, contract: EffectContract, contract_version: int | None = None
    ) -> int:
        """Release a new contract of a running reference sink (the game day's ``upgrade``).

        The sink restarts on its database with the new contract (it behaves
        as the contract says from now on), and its registry entry gets the
        contract and version, so the stages see the change.

        Args:
            name: a sink started by :meth:`start_sink`.
            contract: the new contract.
            contract_version: the new version (default: the registry's plus one).

        Returns:
            The version now registered.
        """
        sink = self.sinks[name]
        sink.contract = contract
        sink.restart()
        registry = load_sinks(self.settings.sinks_path())
        old = registry.get(name)
        version = contract_version or ((old.contract_version if old else 1) + 1)
        registry[name] = SinkEndpoint(
            url=sink.url, contract=contract, token=sink.token, contract_version=version
        )
        save_sinks(self.settings.sinks_path(), registry)
        return version

    def effects(self, sink: str, operation_id: str) -> int:
        """How many effects a sink itself holds for an operation."""
        with self.sinks[sink].client() as client:
            return client.effects().get(operation_id, 0)

    # ------------------------------------------------------------------ stages

    def start(self, component: str, instance: str = "0") -> None:
        """Start one stage process with armed fault hooks (``python -m testbed.stage``).

        The process runs in a testbed (``testbed.stage`` sets ``LEDGER_TESTBED=true``),
        so it accepts the manual ledger clock the harness moves.
        """
        if component not in STAGES:
            raise LedgerError(f"unknown component {component!r}; one of {sorted(STAGES)}")
        name = f"{component}-{instance}"
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            return
        self.paused.discard(name)  # a new process under the name runs
        old = self._logs.get(name)
        if old is not None:
            old.close()
        log = open(self.run_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        self._logs[name] = log
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "testbed.stage", component, "--instance", instance],
            env={**settings_env(self.settings), **self.stage_env.get(component, {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def start_all(self, instances: dict[str, int] | None = None) -> None:
        """Start every stage instance never started (crashed ones wait for :meth:`restart`).

        Args:
            instances: component -> how many instances (``0`` .. ``n-1``); 1 for
                a component not named.
        """
        for component in STAGES:
            for n in range((instances or {}).get(component, 1)):
                if f"{component}-{n}" not in self.procs:
                    self.start(component, str(n))

    def instances(self, component: str) -> list[str]:
        """Instance names of the component's processes the harness runs (live or crashed)."""
        names = [n.rpartition("-")[2] for n in self.procs if n.rpartition("-")[0] == component]
        return sorted(names, key=lambda i: (len(i), i))

    def retire(self, component: str, instance: str, timeout_s: float = 15.0) -> None:
        """Stop one stage process for good (SIGTERM, then SIGKILL): it is no longer restarted.

        A paused process is continued after the SIGTERM, so that it sees it.
        """
        name = f"{component}-{instance}"
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # held while it is stopped, delivered on SIGCONT
            if name in self.paused:
                proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.paused.discard(name)

    def scale(self, component: str, count: int) -> tuple[list[str], list[str]]:
        """Run ``count`` instances of the component from now on (``0`` .. ``count-1``).

        Missing instances are started; instances numbered ``count`` or higher
        are retired (:meth:`retire`), highest first. Crashed instances below
        ``count`` are left for :meth:`restart`.

        Returns:
            ``(started, stopped)``: process names.

        Raises:
            LedgerError: for an unknown component or a count below 1.
        """
        if component not in STAGES:
            raise LedgerError(f"unknown component {component!r}; one of {sorted(STAGES)}")
        if count < 1:
            raise LedgerError(f"scale {component}: at least 1 instance, not {count}")
        started = []
        for n in range(count):
            if f"{component}-{n}" not in self.procs:
                self.start(component, str(n))
                started.append(f"{component}-{n}")
        stopped = []
        for instance in reversed(self.instances(component)):
            if not (instance.isdigit() and int(instance) < count):
                self.retire(component, instance)
                stopped.append(f"{component}-{instance}")
        return started, stopped

    def alive(self, component: str, instance: str = "0") -> bool:
        """True while that stage process runs."""
        proc = self.procs.get(f"{component}-{instance}")
        return proc is not None and proc.poll() is None

    def kill(self, component: str, instance: str = "0") -> None:
        """SIGKILL one stage process (a crash at an arbitrary point)."""
        proc = self.procs.get(f"{component}-{instance}")
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def pause(self, component: str, instance: str = "0") -> bool:
        """SIGSTOP one stage process: it keeps its sockets but stops heartbeating.

        Once its session times out, its partitions move to the other instances;
        on :meth:`resume` it is a zombie that Kafka (consumer-group generation,
        transactional fencing) and the sinks' fencing tokens must refuse.

        Returns:
            True if a live process was paused.
        """
        proc = self.procs.get(f"{component}-{instance}")
        if proc is None or proc.poll() is not None:
            return False
        proc.send_signal(signal.SIGSTOP)
        self.paused.add(f"{component}-{instance}")
        return True

    def resume(self, component: str, instance: str = "0") -> None:
        """SIGCONT a stage process paused by :meth:`pause` or a pause hook.

        A process that logged a pause hook's firing is first waited for until
        it has actually stopped (up to 10 s), so that the SIGCONT cannot
        arrive before its own SIGSTOP.
        """
        name = f"{component}-{instance}"
        proc = self.procs.get(name)
        was_paused = name in self.paused
        self.paused.discard(name)
        if proc is not None and proc.poll() is None:
            deadline = time.monotonic() + 10
            while (
                was_paused
                and not _stopped(proc.pid)
                and proc.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
            proc.send_signal(signal.SIGCONT)

    def arm_pause(self, component: str, instance: str, seam: str, operation_id: str) -> None:
        """Arm a pause hook: that instance stops itself (SIGSTOP) at the seam for the operation."""
        faults.arm_pause(self.run_dir, f"{component}-{instance}", seam, operation_id)

    def self_paused(self) -> set[str]:
        """Stage processes that stopped themselves at a pause hook (added to :attr:`paused`).

        Read from the hooks' firing log (``faults/fired.jsonl``): a firing with
        ``action: pause`` by the pid of a live process the harness started.
        """
        by_pid = {proc.pid: name for name, proc in self.procs.items() if proc.poll() is None}
        found = set()
        for firing in faults.fired(self.run_dir)[self._pause_firings_seen :]:
            self._pause_firings_seen += 1
            name = by_pid.get(int(str(firing.get("pid", -1))))
            if firing.get("action") == "pause" and name is not None:
                found.add(name)
        self.paused |= found
        return found

    def crashed(self) -> list[str]:
        """Stages whose process has ended."""
        return [name for name, proc in self.procs.items() if proc.poll() is not None]

    def failed(self) -> dict[str, int]:
        """Stages that ended other than by SIGKILL (an error, not a fault hook): name -> status."""
        return {
            name: code
            for name, proc in self.procs.items()
            if (code := proc.poll()) is not None and code != -signal.SIGKILL
        }

    def restart(self, component: str | None = None) -> list[str]:
        """Restart crashed stages (all, or one component); returns what was restarted."""
        restarted = []
        for name in self.crashed():
            comp, _, instance = name.rpartition("-")
            if component is None or comp == component:
                self.start(comp, instance)
                restarted.append(name)
        return restarted

    def arm(self, seam: str, operation_id: str = faults.ANY, times: int = 1) -> None:
        """Arm a fault hook: the stage reaching ``seam`` for that operation dies."""
        faults.arm(self.run_dir, seam, operation_id, times)

    def advance(self, seconds: float) -> int:
        """Move the ledger clock forward; returns the new time (ms)."""
        return self.clock.advance(seconds)

    # ------------------------------------------------------------------ quiescence

    def _committed(self, component: str, tps: list[TopicPartition]) -> list[TopicPartition]:
        group = f"{self.settings.topic_prefix}.{component}"
        consumer = self._group_consumers.get(group)
        if consumer is None:
            consumer = Consumer(consumer_config(self.settings, group))
            self._group_consumers[group] = consumer
        result: list[TopicPartition] = consumer.committed(tps, timeout=30)
        return result

    def _ends(self, tps: list[TopicPartition], retry_s: float = 0.0) -> dict[tuple[str, int], int]:
        if self._lso_consumer is None:
            self._lso_consumer = Consumer(
                consumer_config(self.settings, f"{self.settings.topic_prefix}.harness")
            )
        ends = {}
        for tp in tps:
            _, high = watermarks(self._lso_consumer, tp, 30, retry_s)
            ends[(tp.topic, tp.partition)] = high
        return ends

    def _ready(self, name: str, pid: int) -> bool:
        path = self.run_dir / "status" / f"{name}.json"
        try:
            status = json.loads(path.read_text())
            return int(status.get("pid", -1)) == pid and status.get("ready", True) is True
        except (OSError, ValueError, AttributeError):
            return False

    def lagging(self) -> dict[str, int]:
        """Records each live stage has yet to commit past (empty when quiescent).

        A stage that has not yet said it is ready (partitions assigned,
        start-up work such as resume claims done) counts as one behind. A
        paused process (:meth:`pause`, or a pause hook) progresses nothing:
        it is left out, and so is the lag of a component whose every live
        process is paused (its work waits for a resume, or for another
        instance to take its partitions over).
        """
        self.self_paused()
        behind: dict[str, int] = {}
        for name, proc in self.procs.items():
            if proc.poll() is not None or name in self.paused:
                continue
            component = name.rpartition("-")[0]
            if not self._ready(name, proc.pid):
                behind[component] = behind.get(component, 0) + 1
                continue
            tps = [
                TopicPartition(self.settings.topic(t), p)
                for t in STAGES[component].inputs
                for p in range(self.settings.partitions)
            ]
            committed = self._committed(component, tps)
            ends = self._ends(tps)
            lag = sum(
                max(0, ends[(tp.topic, tp.partition)] - max(tp.offset, 0)) for tp in committed
            )
            if lag:
                behind[component] = behind.get(component, 0) + lag
        return behind

    def wait_quiescent(self, timeout_s: float = 60.0, poll_s: float = 0.1) -> None:
        """Block until no live stage has uncommitted input.

        Raises:
            LedgerError: if the ledger is not quiescent within ``timeout_s``
                (the message says which stage is behind, and by how much).
        """
        deadline = time.monotonic() + timeout_s
        stable = 0
        behind: dict[str, int] = {}
        while time.monotonic() < deadline:
            try:
                behind = self.lagging()
            except KafkaException as exc:  # e.g. NOT_COORDINATOR just after a broker restart
                behind = {"(broker)": 1}
                log.info("quiescence check failed (%s); retrying", exc)
                self._drop_clients()
            stable = stable + 1 if not behind else 0
            if stable >= 2:
                return
            time.sleep(poll_s)
        try:
            held: object = self.held_back(
                [self.settings.topic(t) for c in behind if c in STAGES for t in STAGES[c].inputs]
            )
        except KafkaException as exc:
            held = f"(not read: {exc})"
        raise LedgerError(
            f"ledger {self.settings.topic_prefix} not quiescent after {timeout_s} s; "
            f"behind: {behind}; held back by an open transaction: {held or 'none'}; "
            f"logs in {self.run_dir / 'logs'}\n{self.log_tail(20)}"
        )

    def held_back(self, topics: list[str]) -> dict[str, tuple[int, int]]:
        """Partitions whose last stable offset is below their high watermark.

        An open (or hanging) transaction holds a partition's last stable
        offset back: no ``read_committed`` reader sees past it, so every
        stage looks quiet while nothing moves. For the error a stalled run
        reports (one try; the stable ends are asked as :meth:`lagging` asks them).

        Args:
            topics: full topic names.

        Returns:
            ``"topic[p]" -> (last stable offset, high watermark)`` for each
            partition held back.

        Raises:
            KafkaException: an end could not be read.
        """
        tps = [TopicPartition(t, p) for t in topics for p in range(self.settings.partitions)]
        stable = self._ends(tps, WATERMARK_RETRY_S)
        high_reader = Consumer(
            consumer_config(
                self.settings, f"{self.settings.topic_prefix}.harness", isolation="read_uncommitted"
            )
        )
        held: dict[str, tuple[int, int]] = {}
        try:
            for tp in tps:
                _, high = watermarks(high_reader, tp, 10)
                if stable[(tp.topic, tp.partition)] < high:
                    held[f"{tp.topic}[{tp.partition}]"] = (stable[(tp.topic, tp.partition)], high)
        finally:
            high_reader.close()
        return held

    def _drop_clients(self) -> None:
        for consumer in self._group_consumers.values():
            consumer.close()
        self._group_consumers.clear()
        if self._lso_consumer is not None:
            self._lso_consumer.close()
            self._lso_consumer = None

    # ------------------------------------------------------------------ teardown

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop every stage (SIGTERM, then SIGKILL) and every sink."""
        for name in list(self.paused):
            self.resume(*name.rsplit("-", 1))
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs.values():
            log.close()
        for sink in self.sinks.values():
            sink.stop()
        for real in self.real_sinks.values():
            real.stop()
        self._drop_clients()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of every stage log (for error reports)."""
        parts = []
        for path in sorted((self.run_dir / "logs").glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stopped(pid: int) -> bool:
    """True if the process is stopped by a signal (Linux ``/proc/PID/stat`` state ``T``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


def run_dir_for(base: Path, name: str) -> Path:
    """A fresh run folder ``base/name`` (emptied if it exists)."""
    import shutil

    path = base / name
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def stale_dispatch(
    client: SinkClient,
    contract: EffectContract,
    state: OperationState,
    token: int,
    worker: str,
    publisher: LedgerPublisher,
) -> SubmitResult:
    """What a losing resumer does: dispatch to the sink with the token it held.

    Args:
        client: the operation's sink.
        contract: the sink's contract (the idempotency key is sent if it has one).
        state: the operation's current state (parameters, digest, sink).
        token: the fencing token the resumer held (lower than the winner's).
        worker: the resumer's name.
        publisher: where a refusal is recorded as a ``STALE_TOKEN`` operating event.

    Returns:
        The sink's answer (``stale_token`` when fencing worked).
    """
    op = state.operation_id
    result = client.submit(
        op,
        state.parameter_digest,
        json.loads(state.params_json),
        token,
        f"{worker}:{uuid.uuid4().hex[:6]}",
        use_key=contract.idempotent,
        action=state.action,
        subject=state.subject,
        purpose=state.purpose,
        decision_version=state.decision_version,
    )
    if result.status == "stale_token":
        publisher.publish_operating_event(
            OperatingEvent(
                event_id=f"{worker}:{op}:stale:{token}",
                operation_id=op,
                component=worker,
                kind="STALE_TOKEN",
                reason=f"{state.sink} refused fencing token {token}: {result.detail}",
            )
        )
    return result
