"""``ledger mission run``: the fee-remediation mission, on the real ledger, under faults.

A :class:`Mission` plays the remediation workflow for every case of
:func:`testbed.mission.plan.plan` against its own ledger (topic prefix, run
folder, reference sinks, stage processes). The workflow itself only reacts to
what ``ledger.state`` says (it follows the topic ``read_committed``): it
publishes each operation's approval and intent, reauthorises an operation the
authority kernel refused, publishes the notification once the refund is
``OUTCOME_VERIFIED``, and leaves an unknown outcome held.

While it runs, faults are injected at the rates of
:class:`~testbed.mission.plan.MissionOptions`: stage processes SIGKILL
themselves at the named seams (fault hooks armed per operation), the sinks
answer with every fault mode, two resumers race to claim in-flight refunds,
the broker restarts once, the policy version changes half-way, and at
arbitrary moments a stage process is SIGKILLed or (with two instances) paused
past its session timeout so that its partitions move and it wakes up a zombie.
Crashed stages are restarted - with several instances, sometimes only after
the partner took over their partitions.

At the end the reconciler reads back what can be read back, the auditor
replays the whole ledger before and after forced compaction, and
:func:`testbed.mission.report.build` turns what the sinks and the ledger hold
into the report.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from confluent_kafka import Consumer, KafkaException, TopicPartition

from consumers.auditor import run_audit
from consumers.reader import current_states, policy_effective_at
from consumers.reconciler import reconcile_once
from consumers.stage import FENCED_MARKER, Record, read_partition
from consumers.stages import STAGES
from consumers.tables import TableFollower
from ledger.errors import LedgerError
from ledger.events import Approval, OperatingEvent, OperationState
from ledger.kafka import consumer_config
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import RecoveryState as S
from ledger.topics import partitions_for
from ledger.topology import TOPICS
from producers.publisher import LedgerPublisher
from testbed import broker, faults
from testbed.compaction import force_compaction
from testbed.gameday import RELEASE_MANIFEST
from testbed.harness import Harness, run_dir_for, stale_dispatch
from testbed.mission.chaos import BrokerChaos, ClusterControl
from testbed.mission.plan import (
    CALLBACKS,
    GATEWAY_UPGRADE_VERSION,
    GOODWILL_MINOR,
    MISSION_SINKS,
    PAYMENT_GATEWAY_V4,
    REAL_SINK_TIMEOUT_S,
    REAL_SINKS,
    UPGRADE_AT,
    Case,
    MissionOptions,
    OpFaults,
    eligible,
    plan,
)
from testbed.mission.report import JournalRow, MissionFacts, build
from testbed.netns import NetworkSpec
from testbed.people import can_sign
from testbed.sinks.admin import ReferenceSinkClient
from testbed.sinks.store import FaultMode

log = logging.getLogger(__name__)

Say = Callable[[str], None]
Progress = Callable[[int, int, str], None]

#: Stage session timeout (ms) set in ``consumers/stage.py``; a partner takes
#: over a silent instance's partitions after it.
SESSION_TIMEOUT_S = 10.0
#: Reauthorisations per operation before the workflow gives up on it.
MAX_REAUTHORISATIONS = 3
#: Times the workflow nudges a stuck operation (a claim) before giving up.
MAX_NUDGES = 3
#: Seconds without any state change before the workflow checks for stuck work.
STALL_S = 15.0
#: Seconds without any state change after which the mission gives up (a stage
#: is stuck: the error names where the logs are instead of hanging).
NO_PROGRESS_S = 300.0

#: Seconds a publish of the workflow waits for its acknowledgement under broker chaos.
CHAOS_SEND_TIMEOUT_S = 300.0
#: Seconds to wait for the broker faults still due at the end of the cases.
HEAL_WAIT_S = 900.0

SETTLED = {S.OUTCOME_VERIFIED, S.ABANDONED, S.UNKNOWN_OUTCOME}
#: States in which a goodwill credit may be compensated (its effect is settled).
COMPENSABLE_STATES = {S.OUTCOME_VERIFIED, S.EFFECT_COMMITTED}


@dataclass
class CaseRun:
    """The workflow's own progress on one case (its checkpoint)."""

    case: Case
    phase: str = "waiting"  # waiting | refund | notify | done
    outcome: str | None = None
    held: bool = False
    approvals: int = 0
    reauths: Counter[str] = field(default_factory=Counter)
    nudges: Counter[str] = field(default_factory=Counter)
    reacted: dict[str, int] = field(default_factory=dict)
    raced: bool = False
    #: Side operations published and not yet settled (goodwill credit, its
    #: reversal, callback booking): operation ID -> sink.
    side_open: dict[str, str] = field(default_factory=dict)
    #: Side operation -> how it ended (``verified``, ``held``, ``abandoned: ...``).
    side_end: dict[str, str] = field(default_factory=dict)
    #: The refund was refused: the goodwill credit is to be compensated once settled.
    reversal_due: bool = False

    @property
    def settled(self) -> bool:
        """True when the case needs nothing more from the workflow (done, or held).

        The refund's path is done or held, and every side operation has settled.
        """
        return (self.phase == "done" or self.held) and not self.side_open and not self.reversal_due


@dataclass
class Race:
    """Two resumers racing to claim one in-flight operation."""

    operation_id: str
    epoch: int
    claims: dict[str, str]  # worker -> claim ID


class Mission:
    """One mission run on its own ledger.

    Args:
        options: what to run.
        base: settings of the broker to use (bootstrap, kafka home, run folder).
        say: one-line progress messages.
        progress: ``(cases settled, cases, status line)`` after each step.
        cluster: the local cluster, for ``options.broker_chaos``.
        network: the cluster nodes' network namespaces (for the partition
            fault), or ``None``.
        no_network: why there is no network (recorded when the partition
            fault is skipped).

    Raises:
        ValueError: ``options.broker_chaos`` without a ``cluster``.
    """

    def __init__(
        self,
        options: MissionOptions,
        base: LedgerSettings,
        say: Say = lambda _: None,
        progress: Progress = lambda _d, _t, _s: None,
        *,
        cluster: ClusterControl | None = None,
        network: NetworkSpec | None = None,
        no_network: str = "the nodes have no network namespaces",
    ) -> None:
        if options.broker_chaos and cluster is None:
            raise ValueError("broker chaos needs the local cluster to control")
        self.options = options
        self.say = say
        self.progress = progress
        name = f"{options.mode}-seed{options.seed}-{options.cases}c-{options.instances}i"
        self.settings = base.model_copy(
            update={
                "topic_prefix": f"mission-{name}-{uuid.uuid4().hex[:6]}",
                "run_dir": run_dir_for(base.run_dir / "missions", name).resolve(),
                "clock": "manual",
                "relay_mode": options.mode,
                "policy_version": 1,
                "sink_timeout_s": 0.5,
                "sinks_file": None,
                "trusted_keys_file": None,
                "release_manifest_file": RELEASE_MANIFEST,
            }
        )
        self.cases = plan(options)
        self.runs = [CaseRun(c) for c in self.cases]
        self.op_case: dict[str, int] = {}
        for run in self.runs:
            for op in run.case.operations():
                self.op_case[op] = run.case.number
        self.rng = random.Random(options.seed + 1)
        self.harness = Harness(self.settings)
        # Under broker chaos a publish waits out a full-cluster restart (the
        # producer's own delivery timeout, 300 s) instead of failing the mission.
        self.publisher = LedgerPublisher(
            self.settings,
            client_id="mission-workflow",
            send_timeout_s=CHAOS_SEND_TIMEOUT_S if options.broker_chaos else 30.0,
        )
        self.reviewer = ReviewerKey.generate("reviewer-alex-key")
        self.engine = ReviewerKey.generate("policy-engine-key")
        self.policy_version = 1
        self.states: dict[str, OperationState] = {}
        self.started_cases = 0
        self.eligibility_evaluations = 0
        self.races: list[Race] = []
        self.nudge_claims: list[str] = []
        self.reauth_reasons: Counter[str] = Counter()
        self.chaos_kills: Counter[str] = Counter()
        self.zombie_pauses: Counter[str] = Counter()
        self.restarts = 0
        self.broker_restarts = 0
        self.broker_restart_note = ""
        self.policy_changed_at: int | None = None
        #: The gateway upgrade: ``{"at_case", "from_version", "to_version",
        #: "in_flight": {op: state}}`` once released.
        self.upgrade: dict[str, Any] | None = None
        self.reservation_expiries = 0
        self._booking_kills_seen = 0
        self.pending_restarts: dict[str, float] = {}
        self.paused_until: dict[str, float] = {}
        self.timeline: list[dict[str, Any]] = []
        self.peak_rss_kb = 0
        self.stale_dispatches: list[dict[str, Any]] = []
        self.reconciled: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.t0_unix = time.time()
        self.chaos: BrokerChaos | None = None
        if options.broker_chaos and cluster is not None:
            self.chaos = BrokerChaos(
                cluster,
                network,
                self._busiest,
                [self.settings.topic(t.name) for t in TOPICS],
                say=say,
                unavailable=no_network,
            )
        self._offsets: Consumer | None = None
        self.last_change = self.last_state_at = self.t0
        self._next_sample = self.t0
        self._follower: TableFollower | None = None
        self._changed = 0
        self._sinks: dict[str, ReferenceSinkClient] = {}
        self._next_case = 0
        self._fired = 0
        self._stop_requested = False
        self._chaos_done = 0
        self.stage_errors: Counter[str] = Counter()
        #: (Unix time, stage process name) of every stage (re)start.
        self.process_starts: list[tuple[float, str]] = []
        #: Faults the mission injects itself, for the report's timeline:
        #: ``{"kind", "at", "end", "target"}`` (Unix seconds).
        self.fault_events: list[dict[str, Any]] = []
        self._paused_event: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ set-up

    def _start(self) -> None:
        trust(self.settings.trusted_keys_path(), self.reviewer)
        trust(self.settings.trusted_keys_path(), self.engine)
        self.publisher.credentials.add(self.reviewer)
        self.publisher.credentials.add(self.engine)
        for sink, contract in MISSION_SINKS.items():
            if self.options.real_sinks and sink in REAL_SINKS:
                config = {"to_template": "{to}"} if REAL_SINKS[sink] == "smtp" else None
                real = self.harness.start_real_sink(
                    sink, REAL_SINKS[sink], contract, config, timeout_s=REAL_SINK_TIMEOUT_S
                )
                self._sinks[sink] = real.client()  # type: ignore[assignment]
                continue
            self.harness.start_sink(sink, contract, hang_s=1.0)
            self._sinks[sink] = self.harness.sinks[sink].client()
        for component in STAGES:
            for instance in range(self.options.instances):
                self._start_stage(f"{component}-{instance}")
        # A table follower, not a bare consumer: after a broker restart a
        # consumer's fetch can stay stuck, and the follower replaces its
        # reader when a catch-up makes no progress.
        follower = TableFollower(self.settings, "state", self._apply_state)
        follower.follow(set(range(self.settings.partitions)))
        self._follower = follower
        self._sample()  # the timeline starts before the first case

    def request_stop(self) -> None:
        """Ask the mission to stop at its next step (safe from a signal handler)."""
        self._stop_requested = True

    def _check_stop(self) -> None:
        if self._stop_requested:
            raise LedgerError("mission interrupted (SIGTERM); its stages and sinks are stopped")

    def _start_stage(self, name: str) -> None:
        self.harness.start(*name.rsplit("-", 1))
        self.process_starts.append((time.time(), name))

    def close(self) -> None:
        """Stop every process of the mission and close its clients."""
        if self.chaos is not None:
            self.chaos.join(HEAL_WAIT_S)  # a fault in progress heals what it broke
        if self._follower is not None:
            self._follower.close()
            self._follower = None
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None
        for client in self._sinks.values():
            client.close()
        self.publisher.close()
        self.harness.stop()

    # ------------------------------------------------------------------ the workflow

    def _approve(self, run: CaseRun, op: str, amount: int, human: bool) -> str:
        run.approvals += 1
        key, reviewer = (
            (self.reviewer, "reviewer-alex") if human else (self.engine, "policy-engine")
        )
        now = self.harness.clock.now_ms()
        expiring = run.case.expiring and run.approvals == 1 and op == run.case.refund_op
        approval_id = f"{'review' if human else 'auto'}:{op}:{run.approvals}"
        self.publisher.publish_approval(
            key.sign(
                Approval(
                    approval_id=approval_id,
                    reviewer=reviewer,
                    policy_version=self.policy_version,
                    expires_at_ms=now + (1_000 if expiring else 86_400_000),
                    scope_subject=run.case.customer,
                    scope_max_amount_minor=amount,
                    scope_operation_id=op,
                    granted_at_ms=now,
                ),
                ledger_id=self.settings.ledger_identity,
            )
        )
        if expiring:
            # The review sat in a queue: the approval has lapsed by the time
            # the intent reaches the authority kernel.
            self.harness.advance(2)
        return approval_id

    def _arm(self, op: str, sink: str, case_faults: OpFaults) -> None:
        if case_faults.seam is not None:
            self.harness.arm(case_faults.seam, op)
        if case_faults.sink_fault is not None:
            self._sinks[sink].arm_fault(op, cast("FaultMode", case_faults.sink_fault))

    def _publish(self, run: CaseRun, op: str, first: bool) -> None:
        """Request the review of one of the case's operations, then publish its intent."""
        case = run.case
        compensates: str | None = None
        params: dict[str, object]
        if op == case.refund_op:
            sink, action, amount, planned = "payments", "refund", case.fee_minor, case.refund
            params = {"account": case.account, "amount_minor": case.fee_minor, "currency": "GBP"}
        elif op in (case.goodwill_op, case.reversal_op):
            sink, amount = "credits", GOODWILL_MINOR
            params = {"account": case.account, "amount_minor": GOODWILL_MINOR, "currency": "GBP"}
            if op == case.goodwill_op:
                action, planned = "apply_credit", case.goodwill or OpFaults()
            else:
                # A reversible-internal effect is compensated under a standing
                # policy approval: the policy engine's, below the review threshold.
                action, planned, compensates = "reverse_credit", case.reversal, case.goodwill_op
        elif op == case.callback_op:
            sink, action, amount = "callbacks", "book_callback", 0
            planned = case.callback or OpFaults()
            params = {
                "account": case.account,
                "topic": "fee-refund",
                "refund_operation_id": case.refund_op,
            }
        else:
            sink, action, amount, planned = "mailer", "send_email", 0, case.notify
            params = {
                "to": case.customer,
                "template": "fee-refund-confirmation",
                "refund_operation_id": case.refund_op,
                "refund_amount_minor": case.fee_minor,
            }
        if sink != "payments" and op != case.notify_op:
            run.side_open[op] = sink
        human = amount >= self.options.review_threshold_minor
        approval_id = self._approve(run, op, amount, human)
        if first:
            self._arm(op, sink, planned)
        self.publisher.publish(
            operation_id=op,
            sink=sink,
            action=action,
            params=params,
            actor="svc-remediation",
            subject=case.customer,
            purpose="fee-remediation",
            decision_version=1,
            approval_id=approval_id,
            published_at_ms=self.harness.clock.now_ms(),
            compensates=compensates,
        )

    def _begin(self, run: CaseRun) -> None:
        self.started_cases += 1
        self.eligibility_evaluations += 1
        if not eligible(run.case):
            run.phase, run.outcome = "done", "not eligible"
            return
        run.phase = "refund"
        if run.case.goodwill is not None:
            self._publish(run, run.case.goodwill_op, first=True)
        self._publish(run, run.case.refund_op, first=True)

    def _finish(self, run: CaseRun, outcome: str, held: bool = False) -> None:
        run.outcome = outcome
        run.held = held
        if not held:
            run.phase = "done"

    def _refund_refused(self, run: CaseRun) -> None:
        """The refund will not be paid: compensate the case's goodwill credit, if it has one."""
        if run.case.goodwill is None or run.case.reversal_op in run.side_end:
            return
        if run.case.reversal_op in run.side_open or run.reversal_due:
            return
        run.reversal_due = True
        self._compensate_when_settled(run)

    def _compensate_when_settled(self, run: CaseRun) -> None:
        """Publish the credit's reversal once the credit has settled (or give it up)."""
        if not run.reversal_due:
            return
        credit = run.case.goodwill_op
        if credit in run.side_open:
            return  # the credit is still on its way: wait for it to settle
        run.reversal_due = False
        st = self.states.get(credit)
        if st is not None and S(st.state) in COMPENSABLE_STATES:
            self._publish(run, run.case.reversal_op, first=True)
        else:
            why = st.state if st is not None else "never recorded"
            run.side_end[run.case.reversal_op] = f"not compensated: the credit is {why}"

    def _side_state(self, run: CaseRun, st: OperationState) -> None:
        """A side operation moved: settle it, reauthorise it, or go on waiting."""
        op = st.operation_id
        if op not in run.side_open:
            return
        state = S(st.state)
        end: str | None = None
        if state == S.OUTCOME_VERIFIED:
            end = "verified"
        elif state == S.EFFECT_COMMITTED and not MISSION_SINKS[run.side_open[op]].postcondition:
            end = "committed"
        elif state == S.UNKNOWN_OUTCOME:
            end = "held (unknown outcome)"
        elif state == S.ABANDONED:
            end = f"abandoned: {st.reason}"
        elif state == S.NEEDS_REAUTHORISATION:
            if run.reauths[op] >= MAX_REAUTHORISATIONS:
                end = "not authorised"
            else:
                self._reauthorise(run, st)
        if end is None:
            return
        del run.side_open[op]
        run.side_end[op] = end
        if op == run.case.goodwill_op:
            self._compensate_when_settled(run)

    def _reauthorise(self, run: CaseRun, st: OperationState) -> None:
        reason = st.reason.lower()
        kind = (
            "approval expired"
            if "expired" in reason
            else "policy version changed"
            if "policy" in reason
            else "other refusal"
        )
        if run.reauths[st.operation_id] >= MAX_REAUTHORISATIONS:
            which = "refund" if st.operation_id == run.case.refund_op else "notification"
            self._finish(run, f"{which} not authorised")
            if which == "refund":
                self._refund_refused(run)
            return
        run.reauths[st.operation_id] += 1
        self.reauth_reasons[kind] += 1
        self._publish(run, st.operation_id, first=False)

    def _on_state(self, st: OperationState) -> None:
        number = self.op_case.get(st.operation_id)
        if number is None:
            return
        run = self.runs[number]
        if run.reacted.get(st.operation_id, -1) >= st.version:
            return
        run.reacted[st.operation_id] = st.version
        state = S(st.state)
        if st.operation_id in run.side_open:
            self._side_state(run, st)
            return
        if (
            st.operation_id == run.case.goodwill_op
            and state in COMPENSABLE_STATES
            and run.side_end.get(run.case.reversal_op, "").startswith("not compensated")
        ):
            # The credit settled late (released from an unknown outcome by a
            # readback): its compensation is due after all.
            del run.side_end[run.case.reversal_op]
            run.side_end[st.operation_id] = "verified"
            run.reversal_due = True
            self._compensate_when_settled(run)
            return
        if st.operation_id == run.case.refund_op:
            if run.phase != "refund":
                return
            if state != S.UNKNOWN_OUTCOME:
                run.held = False  # released: by a readback or a disposition
            if state == S.OUTCOME_VERIFIED:
                run.held = False
                run.phase = "notify"
                self._publish(run, run.case.notify_op, first=True)
                if run.case.callback is not None:
                    self._publish(run, run.case.callback_op, first=True)
            elif state == S.NEEDS_REAUTHORISATION:
                self._reauthorise(run, st)
            elif state == S.ABANDONED:
                rejected = "rejected" in st.reason
                self._finish(
                    run, "refund rejected by the gateway" if rejected else "refund abandoned"
                )
                self._refund_refused(run)
            elif state == S.UNKNOWN_OUTCOME:
                self._finish(run, "refund held (unknown outcome)", held=True)
            elif (
                state in (S.EFFECT_PENDING, S.EFFECT_COMMITTED)
                and run.case.refund.race
                and not run.raced
            ):
                run.raced = True
                self._race(st)
        elif st.operation_id == run.case.notify_op and run.phase == "notify":
            if state in (S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED):
                self._finish(run, "refunded and notified")
            elif state == S.UNKNOWN_OUTCOME:
                self._finish(run, "notification held (unknown outcome)", held=True)
            elif state == S.ABANDONED:
                self._finish(run, "notification rejected by the mail sink")
            elif state == S.NEEDS_REAUTHORISATION:
                self._reauthorise(run, st)

    def _race(self, st: OperationState) -> None:
        workers = [f"resumer-a:{st.operation_id}", f"resumer-b:{st.operation_id}"]
        claims = {w: self.publisher.publish_claim(st.operation_id, w, st.version) for w in workers}
        self.races.append(Race(st.operation_id, st.epoch, claims))

    # ------------------------------------------------------------------ the loop

    def _apply_state(self, key: str, rec: Record | None) -> None:
        if rec is None or not isinstance(rec.event, OperationState):
            return  # a tombstone or a record that does not decode
        self.states[rec.event.operation_id] = rec.event
        self._on_state(rec.event)
        self._changed += 1

    def _drain(self, timeout_s: float = 0.1) -> int:
        """Apply every new ``ledger.state`` record; returns how many there were.

        Waits ``timeout_s`` seconds when there was nothing new (the loop's pace).
        """
        assert self._follower is not None
        self._changed = 0
        try:
            self._follower.catch_up(timeout_s=30)
        except LedgerError as exc:  # e.g. the broker is restarting: try again next step
            log.info("mission: following ledger.state: %s", exc)
        changed = self._changed
        if changed:
            self.last_change = self.last_state_at = time.monotonic()
        else:
            time.sleep(timeout_s)
        return changed

    def _settled(self) -> int:
        return sum(1 for r in self.runs if r.settled)

    def _inject(self) -> None:
        """Faults and changes tied to how far the mission has got."""
        n, total = self.started_cases, self.options.cases
        if self.upgrade is None and not self.options.real_sinks and n >= int(total * UPGRADE_AT):
            self._upgrade_gateway(n)
        if self.policy_changed_at is None and n >= total // 2:
            self.policy_version = 2
            can_sign(self.publisher, self.settings, "mission")
            at_ms, _ = policy_effective_at(self.settings, self.harness.clock.now_ms())
            self.publisher.publish_policy(2, "mission", at_ms)
            self.policy_changed_at = n
            self.say(f"policy version 2 in force after {n} cases")
        if (
            self.options.broker_restart
            and not self.options.broker_chaos  # the chaos restarts the whole cluster instead
            and not self.broker_restarts
            and n >= (total * 3) // 5
        ):
            self.broker_restarts = -1  # tried (even if it cannot be done)
            status = broker.status(self.settings)
            if not status.owned:
                self.broker_restart_note = (
                    "skipped: the broker was not started by 'ledger broker start'"
                )
                self.say(f"broker restart {self.broker_restart_note}")
            else:
                self.say(f"restarting the broker after {n} cases ...")
                event = {"kind": "broker restart", "at": time.time(), "end": None}
                event["target"] = f"local broker :{self.settings.kafka_port}"
                self.fault_events.append(event)
                broker.restart(self.settings)
                event["end"] = time.time()
                self.broker_restarts = 1
        every = self.options.chaos_every
        if every and n and n % every == 0 and n // every > self._chaos_done:
            self._chaos_done = n // every
            self._chaos()

    def _upgrade_gateway(self, n: int) -> None:
        """Release the payment gateway's contract version 4 while refunds are in flight.

        The release is deployed with a restart of the relays (SIGKILL; the
        supervisor restarts them). The refunds in flight at that moment
        (published, or in any state but the settled ones and those waiting
        for authority) cross the upgrade: each of their next steps is taken
        under version 4, as far as the release manifest allows.
        """
        in_flight: dict[str, str] = {}
        for run in self.runs:
            if run.phase != "refund":
                continue
            op = run.case.refund_op
            st = self.states.get(op)
            if st is None:
                in_flight[op] = "published"  # its intent is on its way
            elif S(st.state) not in (S.OUTCOME_VERIFIED, S.ABANDONED, S.NEEDS_REAUTHORISATION):
                in_flight[op] = str(st.state)
        at = time.time()
        # Deployed with a restart of the relays: each resumes what it had
        # taken on under the new contract (the supervisor restarts them).
        for instance in range(self.options.instances):
            name = f"relay-{instance}"
            if name not in self.harness.paused and self.harness.alive("relay", str(instance)):
                self.harness.kill("relay", str(instance))
        version = self.harness.upgrade_sink("payments", PAYMENT_GATEWAY_V4, GATEWAY_UPGRADE_VERSION)
        old = self._sinks.pop("payments")
        old.close()
        self._sinks["payments"] = self.harness.sinks["payments"].client()
        self.upgrade = {
            "at_case": n,
            "from_version": 1,
            "to_version": version,
            "in_flight": in_flight,
        }
        self.fault_events.append(
            {"kind": "gateway upgrade", "at": at, "end": time.time(), "target": "payments"}
        )
        self.say(
            f"payment gateway upgraded to contract version {version} after {n} cases; "
            f"{len(in_flight)} refund(s) in flight cross it"
        )

    def _expire_holds(self) -> None:
        """Every other crash between reserve and confirm keeps the relay down past the hold.

        The ledger clock moves beyond the booking sink's ``reservation_hold_s``
        before the relay restarts, so the sink releases the unconfirmed hold by
        itself and the resume finds it released (and reserves again).
        """
        kills = sum(
            1
            for x in faults.fired(self.settings.run_dir)
            if x.get("seam") == "after_reserve_before_confirm"
        )
        while self._booking_kills_seen < kills:
            self._booking_kills_seen += 1
            if self._booking_kills_seen % 2 == 1:
                self.harness.advance(CALLBACKS.reservation_hold_s + 1)
                self.reservation_expiries += 1

    def _chaos(self) -> None:
        # Among the stage processes running now: one a seam has just killed
        # (not restarted yet) or a zombie already paused is not a target.
        running = [
            (component, str(i))
            for component in STAGES
            for i in range(self.options.instances)
            if f"{component}-{i}" not in self.harness.paused
            and self.harness.alive(component, str(i))
        ]
        if not running:
            return
        component, instance = self.rng.choice(running)
        name = f"{component}-{instance}"
        # With several instances every other chaos event makes a zombie.
        if self.options.instances > 1 and self._chaos_done % 2 == 0:
            at = time.time()
            if self.harness.pause(component, instance):
                self.zombie_pauses[component] += 1
                self.paused_until[name] = time.monotonic() + SESSION_TIMEOUT_S + 3
                event = {"kind": "zombie pause", "at": at, "end": None, "target": name}
                self.fault_events.append(event)
                self._paused_event[name] = event
        else:
            self.fault_events.append({"kind": "chaos kill", "at": time.time(), "target": name})
            self.harness.kill(component, instance)
            self.chaos_kills[component] += 1

    def _wake(self, name: str) -> None:
        """Resume a paused stage process (a zombie now) and close its pause on the timeline."""
        self.harness.resume(*name.rsplit("-", 1))
        event = self._paused_event.pop(name, None)
        if event is not None:
            event["end"] = time.time()

    def _supervise(self) -> None:
        """Restart crashed stages and wake paused ones when their time has come."""
        now = time.monotonic()
        for name, until in list(self.paused_until.items()):
            if now >= until:
                del self.paused_until[name]
                self._wake(name)
        crashed = self.harness.crashed()
        if any(name.startswith("relay-") for name in crashed):
            self._expire_holds()
        for name in crashed:
            if name in self.pending_restarts:
                continue
            code = self.harness.procs[name].returncode
            if code != -signal.SIGKILL:
                log.warning("mission: %s ended with status %s; restarting it", name, code)
                self.stage_errors[name] += 1
            delay = 0.0
            if self.options.instances > 1 and self.rng.random() < 1 / 3:
                delay = SESSION_TIMEOUT_S + 1  # the partner takes its partitions first
            self.pending_restarts[name] = now + delay
        for name, due in list(self.pending_restarts.items()):
            if now >= due:
                del self.pending_restarts[name]
                self._start_stage(name)
                self.restarts += 1

    def _sample(self) -> None:
        now = time.monotonic()
        if now < self._next_sample:
            return
        self._next_sample = now + 1.0
        counts = Counter(str(st.state) for st in self.states.values())
        # Unix clock, like the faults, the journal's timestamps and the broker windows.
        self.timeline.append({"t_s": round(time.time() - self.t0_unix, 1), "states": dict(counts)})
        self._fired = len(faults.fired(self.settings.run_dir))  # once a second, not every step
        self.peak_rss_kb = max(self.peak_rss_kb, self._rss_kb())

    def _rss_kb(self) -> int:
        pids = [os.getpid()]
        pids += [p.pid for p in self.harness.procs.values() if p.poll() is None]
        pids += [pid for s in self.harness.sinks.values() if (pid := s.pid) is not None]
        total = 0
        for pid in pids:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except (OSError, ValueError):
                continue
        return total

    def _status(self) -> str:
        fired = self._fired
        held = sum(1 for r in self.runs if r.held)
        return (
            f"started {self.started_cases} · kills {fired + sum(self.chaos_kills.values())}"
            f" · restarts {self.restarts} · held {held}"
        )

    def _nudge(self) -> bool:
        """Claim operations that stopped moving; False when nothing is left to nudge."""
        nudged = False
        for run in self.runs:
            if run.settled or run.phase == "waiting":
                continue
            ops = list(run.side_open)
            if run.phase in ("refund", "notify") and not run.held:
                ops.insert(0, run.case.refund_op if run.phase == "refund" else run.case.notify_op)
            for op in ops:
                nudged = self._nudge_one(run, op) or nudged
        return nudged

    def _nudge_one(self, run: CaseRun, op: str) -> bool:
        """Claim one operation that stopped moving, or give it up after :data:`MAX_NUDGES`."""
        st = self.states.get(op)
        side = op in run.side_open
        if run.nudges[op] >= MAX_NUDGES:
            if side:
                del run.side_open[op]
                run.side_end[op] = f"stuck in {st.state if st else 'no state'}"
                if op == run.case.goodwill_op:
                    self._compensate_when_settled(run)
            elif st is not None and st.state == S.EFFECT_COMMITTED and op == run.case.refund_op:
                # Verified only by a matching postcondition; the case may not go on.
                self._finish(run, "refund not verified (postcondition not confirmed)")
            else:
                self._finish(run, f"stuck in {st.state if st else 'no state'}")
            return False
        run.nudges[op] += 1
        if st is None:
            log.warning("mission: %s has no state; publishing its intent again", op)
            self._publish(run, op, first=False)
        else:
            self.nudge_claims.append(
                self.publisher.publish_claim(op, "mission-resumer", st.version)
            )
        return True

    def _quiet(self) -> bool:
        try:
            return not self.harness.lagging()
        except Exception as exc:  # noqa: BLE001 - e.g. during a broker restart
            log.info("mission: lag check failed: %s", exc)
            return False

    def _loop(self, deadline: float) -> None:
        total = self.options.cases
        while True:
            self._check_stop()
            if time.monotonic() > deadline:
                raise LedgerError(
                    f"mission did not finish in time: {self._settled()} of {total} cases settled; "
                    f"logs in {self.settings.run_dir / 'logs'}"
                )
            self._drain()
            if time.monotonic() - self.last_state_at > NO_PROGRESS_S:
                try:
                    behind = str(self.harness.lagging())
                except Exception as exc:  # noqa: BLE001 - the message must still be given
                    behind = f"unknown ({exc})"
                raise LedgerError(
                    f"no operation changed state for {NO_PROGRESS_S:.0f} s with "
                    f"{total - self._settled()} cases open; stages behind: {behind}; "
                    f"{self._stall_report()}\n"
                    f"{self.harness.log_tail(10)}"
                )
            in_flight = self.started_cases - self._settled()
            budget = 50
            while self._next_case < total and in_flight < self.options.window and budget:
                run = self.runs[self._next_case]
                self._next_case += 1
                self._begin(run)
                self._inject()
                in_flight += 0 if run.settled else 1
                budget -= 1
            exhausted = self._next_case >= total
            if self.chaos is not None:
                self.chaos.poke(self.started_cases, total)
            self._supervise()
            self._sample()
            settled = self._settled()
            self.progress(settled, total, self._status())
            if exhausted and settled == total and self._chaos_over():
                return
            if time.monotonic() - self.last_change > STALL_S and self._quiet():
                self.last_change = time.monotonic()
                if (
                    not self._nudge()
                    and exhausted
                    and self._settled() == total
                    and self._chaos_over()
                ):
                    return

    def _stall_report(self) -> str:
        """What a stalled run looks like from outside the stages (for its error)."""
        parts = []
        try:
            held = self.harness.held_back([self.settings.topic(t.name) for t in TOPICS])
            parts.append(f"partitions held back by open transactions: {held or 'none'}")
        except Exception as exc:  # noqa: BLE001 - the report must still be given
            parts.append(f"open transactions unknown ({exc})")
        follower = self._follower
        if follower is not None:
            try:
                parts.append(f"mission's state reader at {follower._positions()}")
            except Exception as exc:  # noqa: BLE001
                parts.append(f"mission's state reader position unknown ({exc})")
        open_cases = [r.case.refund_op for r in self.runs[: self._next_case] if not r.settled]
        parts.append(f"open cases: {open_cases[:10]}")
        return "; ".join(parts)

    def _chaos_over(self) -> bool:
        """True when no broker fault is due any more (every one has run and healed)."""
        if self.chaos is None or self.chaos.done:
            return True
        # Every case is settled: the faults still due run now, one after another,
        # while the loop goes on following the ledger (resumes still happen).
        self.chaos.poke(self.options.cases, self.options.cases)
        return False

    def _busiest(self) -> tuple[str, int]:
        """The partition of the mission's topics with the most records: ``(topic, partition)``.

        Called from the chaos thread only (its consumer is its own).
        """
        if self._offsets is None:
            self._offsets = Consumer(
                consumer_config(self.settings, f"{self.settings.topic_prefix}.chaos")
            )
        best, most = (self.settings.topic("journal"), 0), -1
        try:
            for t in TOPICS:
                for p in range(partitions_for(self.settings, t)):
                    tp = TopicPartition(self.settings.topic(t.name), p)
                    _low, high = self._offsets.get_watermark_offsets(tp, timeout=10, cached=False)
                    if high > most:
                        best, most = (tp.topic, p), high
        except KafkaException:
            self._offsets.close()  # its metadata may be stale (a restart): a new one next time
            self._offsets = None
            raise
        return best

    def _settle(self, timeout_s: float = 180.0) -> None:
        """Every crashed stage restarted, every zombie woken, every stage caught up."""
        self._check_stop()
        for name in list(self.paused_until):
            self._wake(name)
        self.paused_until.clear()
        for name, _ in list(self.pending_restarts.items()):
            self._start_stage(name)
            self.restarts += 1
        self.pending_restarts.clear()
        for name in self.harness.crashed():
            self._start_stage(name)
            self.restarts += 1
        try:
            self.harness.wait_quiescent(timeout_s)
        except LedgerError as exc:
            raise LedgerError(f"{exc}\n{self.harness.log_tail()}") from exc
        while self._drain(0.2):
            pass

    def _stale_dispatches(self) -> None:
        """Each race's loser tries the gateway with the token it held: it must be refused.

        Not for a refund held because of the gateway upgrade in
        ``UNKNOWN_OUTCOME``: its winner never reached the gateway with its
        newer token (every step after the hold is held too), so the gateway
        cannot know the loser's token is stale. Such a race is recorded as
        not probed, with why.
        """
        won = self._claim_outcomes()
        held = {str(h.get("operation_id")) for h in self._upgrade_holds()}
        for race in self.races:
            winners = [w for w, cid in race.claims.items() if won.get(cid)]
            if len(winners) != 1:
                continue
            st = self.states.get(race.operation_id)
            if race.operation_id in held and st is not None and st.state == S.UNKNOWN_OUTCOME:
                self.stale_dispatches.append(
                    {
                        "operation_id": race.operation_id,
                        "token": race.epoch,
                        "refused": None,
                        "skipped": "held by the gateway upgrade: the winner's newer token "
                        "never reached the gateway",
                    }
                )
                continue
            loser = next(w for w in race.claims if w not in winners)
            result = stale_dispatch(
                self._sinks["payments"],
                MISSION_SINKS["payments"],
                self.states[race.operation_id],
                race.epoch,
                loser,
                self.publisher,
            )
            self.stale_dispatches.append(
                {
                    "operation_id": race.operation_id,
                    "token": race.epoch,
                    "refused": result.status == "stale_token",
                }
            )

    def _kafka_fenced(self) -> dict[str, int]:
        """Zombie transactions Kafka refused, per stage process (from the stage logs)."""
        counts: dict[str, int] = {}
        for path in sorted((self.settings.run_dir / "logs").glob("*.log")):
            n = path.read_text(errors="replace").count(FENCED_MARKER)
            if n:
                counts[path.stem] = n
        return counts

    def _claim_outcomes(self) -> dict[str, bool]:
        return {r.claim_id: r.entry.outcome == "APPLIED" for r in self._journal() if r.claim_id}

    def _journal(self) -> list[JournalRow]:
        rows: list[JournalRow] = []

        def keep(rec: Any, msg: Any) -> None:
            if rec is not None:
                rows.append(JournalRow.of(rec.event, msg.timestamp()[1] / 1000.0))

        read_partition(self.settings, "journal", None, keep, timeout_s=120)
        return rows

    def _upgrade_holds(self) -> list[dict[str, Any]]:
        """Every ``CONTRACT_UPGRADE_HOLD`` operating event: ``{"operation_id", "reason"}``."""
        holds: list[dict[str, Any]] = []

        def keep(rec: Any, _msg: Any) -> None:
            event = rec.event if rec is not None else None
            if isinstance(event, OperatingEvent) and event.kind == "CONTRACT_UPGRADE_HOLD":
                holds.append({"operation_id": event.operation_id, "reason": event.reason})

        read_partition(self.settings, "operating-events", None, keep, timeout_s=120)
        return holds

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        """Run the mission and return its report (see :func:`testbed.mission.report.build`).

        Raises:
            LedgerError: the mission could not finish (the message says where
                it stopped and where the logs are).
        """
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.say(
            f"mission: {self.options.cases} cases, mode {self.options.mode}, "
            f"{self.options.instances} instance(s) per stage, crash rate "
            f"{self.options.crash_rate}, seed {self.options.seed}; "
            f"ledger {self.settings.topic_prefix}"
        )
        self._start()
        deadline = time.monotonic() + 120 + 1.0 * self.options.cases
        if self.chaos is not None:
            deadline += HEAL_WAIT_S  # the broker faults take their time
        self._loop(deadline)
        self.say(
            "every case has an outcome or is held; restarting what crashed and "
            "letting the stages catch up"
        )
        self._settle()
        self.say("reconciler: reading back the unknown outcomes that can be read back")
        for _ in range(3):
            results = reconcile_once(self.settings)
            self.reconciled.extend(results)
            if not any(r["observed"] in ("COMMITTED", "ABSENT") for r in results):
                break
            self._settle()
            self._loop(deadline)  # a refund released from UNKNOWN goes on to its notification
            self._settle()
        self._stale_dispatches()
        self._settle()
        wall_s = time.monotonic() - self.t0
        self._check_stop()
        self.say("auditing the ledger (before compaction) ...")
        before = run_audit(self.settings)
        self.say("forcing compaction and auditing again ...")
        force_compaction(self.settings)
        after = run_audit(self.settings)
        effects: dict[str, dict[str, int]] = {}
        gateway_stats: dict[str, dict[str, int]] = {}
        for sink, client in self._sinks.items():
            effects[sink] = client.effects()
            gateway_stats[sink] = client.stats()
        self.peak_rss_kb = max(self.peak_rss_kb, self._rss_kb())
        as_of = time.time()
        states = current_states(self.settings)
        facts = MissionFacts(
            options=self.options,
            ledger=self.settings.topic_prefix,
            started_at=started_at,
            wall_s=wall_s,
            peak_rss_mb=self.peak_rss_kb / 1024,
            driver_peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            cases=self.cases,
            outcomes={r.case.number: r.outcome or f"unfinished ({r.phase})" for r in self.runs},
            eligibility_evaluations=self.eligibility_evaluations,
            states=states,
            effects=effects,
            sink_stats=gateway_stats,
            journal=self._journal(),
            fired=faults.fired(self.settings.run_dir),
            armed=faults.armed(self.settings.run_dir),
            chaos_kills=dict(self.chaos_kills),
            zombie_pauses=dict(self.zombie_pauses),
            restarts=self.restarts,
            broker_restarts=max(0, self.broker_restarts),
            broker_restart_note=self.broker_restart_note,
            races=[(r.operation_id, list(r.claims.values())) for r in self.races],
            nudge_claims=self.nudge_claims,
            stale_dispatches=self.stale_dispatches,
            reauth_reasons=dict(self.reauth_reasons),
            reconciled=self.reconciled,
            timeline=self.timeline,
            audit_before=before,
            audit_after=after,
            policy_changed_at=self.policy_changed_at,
            stage_errors=dict(self.stage_errors),
            kafka_fenced=self._kafka_fenced(),
            process_starts=self.process_starts,
            failovers=self.chaos.report(self.t0_unix) if self.chaos is not None else (),
            t0_unix=self.t0_unix,
            as_of_unix=as_of,
            fault_events=self.fault_events,
            upgrade=self.upgrade,
            upgrade_holds=self._upgrade_holds(),
            side_ends={op: end for r in self.runs for op, end in r.side_end.items()},
            reservation_expiries=self.reservation_expiries,
        )
        return build(facts)
