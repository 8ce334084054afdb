"""End to end through every stage and the reference payment gateway.

A :class:`Rig` is one benchmark ledger with real stage processes
(``ledger processor|authority|relay``, as in production), the reference
payment gateway (idempotent, readback, postcondition, fencing), and a
workflow driver in this process that publishes, for each operation, a
signed approval and then its refund intent, and follows ``ledger.state``
(``read_committed``) until the operation is ``OUTCOME_VERIFIED``: the
effect was performed and read back from the sink.

* **Throughput** (:meth:`Rig.run` without a rate): ``n`` operations
  published as fast as the driver can, without waiting for single
  acknowledgements (every approval queued, one flush, then every intent
  queued, one flush), timed from the first publish to the last
  ``OUTCOME_VERIFIED``.
* **Latency** (:meth:`Rig.run` with a rate): the approvals first, then the
  intents queued at a fixed rate (open loop); latency is the time from an
  intent's publish to its ``OUTCOME_VERIFIED`` being visible to the driver
  (which takes each state record as soon as it arrives).
* **Recovery** (:func:`recovery`): with the relay stopped (SIGSTOP), ``n``
  operations are published and wait in EFFECT_PENDING with their dispatch
  in the outbox; then every stage is SIGKILLed and restarted, and the clock
  runs from the restart to the last ``OUTCOME_VERIFIED``. The baseline is the
  time ``n`` fresh operations take on the same rig.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.common import (
    drop,
    percentile,
    sample_approval,
    sample_intent,
    sample_operation_id,
    settings_for,
)
from consumers.stages import STAGES
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import OperationState, decode_event
from ledger.kafka import consumer_config
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import RecoveryState
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from testbed.sinks.process import SinkProcess


def start_gateway(harness: Harness) -> SinkProcess:
    """Start the rig's reference payment gateway (``payments``) and register it.

    The sink-only limit (:mod:`bench.sinklimit`) starts its gateway here
    too, so both measure the same gateway: contract ``PAYMENT_GATEWAY``,
    fault injection on (timeout faults hang 1 s), the harness's clock and
    log level.

    Returns:
        The running gateway (its ``url`` and bearer ``token``).
    """
    return harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)


class Rig:
    """One benchmark ledger with its stage processes, gateway and driver.

    Args:
        base: settings to derive from (broker, run folder).
        name: short name (topic prefix and run folder).
        partitions: partitions of every operation-keyed topic.
        instances: processes per stage.
    """

    def __init__(
        self, base: LedgerSettings, name: str, *, partitions: int = 3, instances: int = 1
    ) -> None:
        self.settings = settings_for(base, name, partitions=partitions)
        self.instances = instances
        self.harness = Harness(self.settings)
        self.key = ReviewerKey.generate("bench-policy-engine")
        trust(self.settings.trusted_keys_path(), self.key)
        start_gateway(self.harness)
        for component in STAGES:
            for i in range(instances):
                self.harness.start(component, str(i))
        self.publisher = LedgerPublisher(self.settings, client_id="bench-driver")
        self.publisher.credentials.add(self.key)
        self.states: dict[str, str] = {}
        self.verified_at: dict[str, float] = {}
        self.next_op = 0
        self.consumer = Consumer(
            consumer_config(
                self.settings,
                f"{self.settings.topic_prefix}.driver",
                extra={"fetch.wait.max.ms": 10},
            )
        )
        self.consumer.assign(
            [
                TopicPartition(self.settings.topic("state"), p, OFFSET_BEGINNING)
                for p in range(partitions)
            ]
        )
        self.harness.wait_quiescent(timeout_s=180)

    # ------------------------------------------------------------------ driver

    def allocate(self, n: int) -> list[int]:
        """Numbers for ``n`` new operations of this rig."""
        first = self.next_op
        self.next_op += n
        return list(range(first, first + n))

    def publish(self, i: int) -> tuple[str, float]:
        """Publish operation ``i``'s signed approval, then its intent, each acknowledged.

        Returns:
            ``(operation ID, perf_counter seconds just before the intent's publish)``.
        """
        intent = sample_intent(i)
        now_ms = int(time.time() * 1000)
        self.publisher.publish_approval(
            self.key.sign(sample_approval(intent, now_ms), ledger_id=self.settings.ledger_identity)
        )
        at = time.perf_counter()
        self.publisher.publish_intent(intent)
        return intent.operation_id, at

    def poll(self, timeout_s: float = 0.05) -> None:
        """Read new ``ledger.state`` records; note when operations become verified.

        Waits at most ``timeout_s`` seconds for the first record, then takes
        what the consumer already holds without waiting, so a record is seen
        (and its verification time noted) as soon as it arrives.
        """
        msgs = self.consumer.consume(1, timeout_s)
        if msgs:
            msgs += self.consumer.consume(999, 0)
        for msg in msgs:
            if msg.error() is not None or not msg.value():
                continue
            try:
                event = decode_event(msg.value())
            except Exception:  # noqa: BLE001 - a control record or foreign bytes
                continue
            if isinstance(event, OperationState):
                self.states[event.operation_id] = str(event.state)
                if (
                    event.state == RecoveryState.OUTCOME_VERIFIED
                    and event.operation_id not in self.verified_at
                ):
                    self.verified_at[event.operation_id] = time.perf_counter()

    def wait_for(self, ops: list[str], state: str, timeout_s: float) -> None:
        """Follow the state until every op in ``ops`` is in ``state`` (or verified, for it).

        Raises:
            RuntimeError: on timeout (with how many are missing).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if state == "OUTCOME_VERIFIED":
                missing = [op for op in ops if op not in self.verified_at]
            else:
                missing = [op for op in ops if self.states.get(op) != state]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(missing)}/{len(ops)} operations not {state} after {timeout_s} s "
                    f"(e.g. {missing[0]}: {self.states.get(missing[0])}); logs in "
                    f"{self.settings.run_dir / 'logs'}"
                )
            self.poll()

    def _drive(self, numbers: list[int], rate: float | None, out: dict[str, float]) -> None:
        """Publish the operations' approvals, then their intents; one flush for each.

        Nothing waits for a single acknowledgement: records are queued with
        delivery callbacks (:meth:`LedgerPublisher.flush` reports a refusal).
        Every approval is acknowledged before the first intent is published,
        as a review system's grant precedes the work it allows. Each intent's
        publish time goes into ``out`` (operation ID -> ``perf_counter``
        seconds); with ``rate`` (per second) intents are paced open loop.
        """
        intents = [sample_intent(i) for i in numbers]
        now_ms = int(time.time() * 1000)
        for intent in intents:
            grant = self.key.sign(
                sample_approval(intent, now_ms), ledger_id=self.settings.ledger_identity
            )
            self.publisher.publish_approval(grant, wait=False)
        self.publisher.flush()
        started = time.perf_counter()
        for k, intent in enumerate(intents):
            if rate is not None:
                due = started + k / rate
                while (wait := due - time.perf_counter()) > 0:
                    time.sleep(min(wait, 0.01))  # pacing the open-loop publisher
            out[intent.operation_id] = time.perf_counter()
            self.publisher.publish_intent(intent, wait=False)
        self.publisher.flush()

    def run(self, n: int, rate: float | None, timeout_s: float = 300) -> dict[str, Any]:
        """Publish ``n`` operations (as fast as possible, or at ``rate`` per second).

        The clock starts before the first approval is published; the
        publishing is :meth:`_drive`'s (queued, one flush for the approvals
        and one for the intents).

        Returns:
            ``ops_per_s`` (first publish to last verified), latency percentiles
            in seconds (``p50_s``, ``p99_s``: an intent's publish to its
            OUTCOME_VERIFIED seen by the driver), ``publish_per_s`` (the
            operations' records all acknowledged: operations per second).
        """
        numbers = self.allocate(n)
        published: dict[str, float] = {}
        failed: list[Exception] = []

        def drive() -> None:
            try:
                self._drive(numbers, rate, published)
            except Exception as exc:  # noqa: BLE001 - raised again below, in this thread
                failed.append(exc)

        driver = threading.Thread(target=drive)
        start = time.perf_counter()
        driver.start()
        ops = [sample_operation_id(i) for i in numbers]
        deadline = time.monotonic() + timeout_s
        while driver.is_alive():
            self.poll()
            if time.monotonic() > deadline:
                raise RuntimeError("the driver did not finish publishing in time")
        publish_end = time.perf_counter()
        driver.join()
        if failed:
            raise RuntimeError(
                f"the driver failed after {len(published)} of {n} intents"
            ) from failed[0]
        self.wait_for(ops, "OUTCOME_VERIFIED", timeout_s)
        end = max(self.verified_at[op] for op in ops)
        latencies = [self.verified_at[op] - published[op] for op in ops]
        return {
            "operations": n,
            "target_rate": rate,
            "publish_per_s": n / (publish_end - start),
            "ops_per_s": n / (end - start),
            "seconds": end - start,
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
        }

    def close(self) -> None:
        """Stop every process and delete the rig's topics."""
        self.consumer.close()
        self.publisher.close()
        self.harness.stop()
        drop(self.settings)


def throughput_and_latency(
    base: LedgerSettings, burst: int, paced_s: float, runs: int
) -> dict[str, Any]:
    """Highest sustainable rate (median of ``runs`` bursts), then latency at 0.5× and 0.9×.

    Returns:
        ``bursts`` (each :meth:`Rig.run`'s result), ``sustainable_ops_per_s``
        (their median, operations per second), ``paced`` (fraction -> runs)
        and ``relay_instances`` (relay processes of the rig).
    """
    rig = Rig(base, "e2e")
    try:
        rig.run(min(100, burst), None)  # warm-up: connections, JIT-free but caches
        bursts = [rig.run(burst, None) for _ in range(runs)]
        best = sorted(b["ops_per_s"] for b in bursts)[len(bursts) // 2]
        paced: dict[str, list[dict[str, Any]]] = {}
        for fraction in (0.5, 0.9):
            rate = best * fraction
            n = max(20, int(rate * paced_s))
            paced[str(fraction)] = [rig.run(n, rate) for _ in range(runs)]
        return {
            "bursts": bursts,
            "sustainable_ops_per_s": best,
            "paced": paced,
            "relay_instances": rig.instances,
        }
    finally:
        rig.close()


def kill_every_stage_and_recover(rig: Rig, n: int, timeout_s: float) -> tuple[float, float]:
    """Put ``n`` operations in EFFECT_PENDING, SIGKILL every stage, restart, time the recovery.

    The relay is paused (SIGSTOP) while the operations are published, so
    each is admitted and dispatched but not performed; then every instance
    of every stage is killed and all are started again.

    Args:
        rig: a running rig.
        n: operations to leave in flight.
        timeout_s: how long each wait (in flight, then verified) may take.

    Returns:
        ``(recovery_s, restarted_at)``: seconds from the restart to the last
        operation verified, and the wall-clock time (epoch seconds) of the
        restart, for reading the stages' logs.
    """
    rig.harness.pause("relay")
    ops = []
    for i in rig.allocate(n):
        op, _ = rig.publish(i)
        ops.append(op)
        rig.poll(0)
    rig.wait_for(ops, "EFFECT_PENDING", timeout_s)
    for component in STAGES:
        for i in range(rig.instances):
            rig.harness.kill(component, str(i))
    rig.harness.paused.clear()
    wall = time.time()
    started = time.perf_counter()
    rig.harness.restart()
    rig.wait_for(ops, "OUTCOME_VERIFIED", timeout_s)
    return max(rig.verified_at[op] for op in ops) - started, wall


def recovery(
    base: LedgerSettings,
    n: int,
    after: Callable[[LedgerSettings], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Time to resolve ``n`` in-flight operations after SIGKILL of every stage.

    Args:
        base: settings to derive the rig from.
        n: operations in flight at the kill.
        after: called with the rig's settings once every operation is
            verified (the auditor replay runs there); its result is
            returned under ``replay``.

    Returns:
        ``fresh_s`` (``n`` fresh operations, publish to last verified),
        ``recovery_s`` (restart to last verified) and their ``ratio``.
    """
    rig = Rig(base, "recovery")
    try:
        fresh = rig.run(n, None)
        recovery_s, _ = kill_every_stage_and_recover(rig, n, 600)
        result: dict[str, Any] = {
            "operations": n,
            "fresh_s": fresh["seconds"],
            "recovery_s": recovery_s,
            "ratio": recovery_s / fresh["seconds"],
        }
        if after is not None:
            result["replay"] = after(rig.settings)
        return result
    finally:
        rig.close()


def lost_response(base: LedgerSettings, n: int, every: int = 10) -> dict[str, Any]:
    """The article's lost-response crash against the ledger: duplicate effects.

    For every ``every``-th of ``n`` operations the relay SIGKILLs itself after
    the gateway committed the refund and before the receipt is recorded (the
    ``after_sink_commit_before_receipt`` seam); crashed relays are restarted
    until every operation is verified. Effects are counted by the gateway.

    Returns:
        ``operations``, ``crashes`` (relay deaths), ``duplicate_ops`` (operations
        with more than one effect at the gateway) and ``extra_effects``.
    """
    rig = Rig(base, "lostresponse")
    try:
        numbers = rig.allocate(n)
        ops = [sample_operation_id(i) for i in numbers]
        for k, op in enumerate(ops):
            if k % every == 0:
                rig.harness.arm("after_sink_commit_before_receipt", op)
        crashes = 0
        for i in numbers:
            rig.publish(i)
            rig.poll(0)
        deadline = time.monotonic() + 300
        while len([op for op in ops if op in rig.verified_at]) < n:
            if time.monotonic() > deadline:
                raise RuntimeError("lost-response run did not finish in 300 s")
            restarted = rig.harness.restart()
            crashes += len(restarted)
            rig.poll()
        with rig.harness.sinks["payments"].client() as client:
            effects = client.effects()
        per_op = [effects.get(op, 0) for op in ops]
        return {
            "operations": n,
            "crashes": crashes,
            "duplicate_ops": sum(1 for e in per_op if e > 1),
            "extra_effects": sum(max(0, e - 1) for e in per_op),
            "missing_effects": sum(1 for e in per_op if e == 0),
        }
    finally:
        rig.close()
