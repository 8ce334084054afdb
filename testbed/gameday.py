"""``ledger gameday run``: game-day scenarios on the real ledger (SCENARIOS.md).

Each scenario gets its own ledger (topic prefix, run folder, ledger clock
starting at 0), its declared reference sinks, and the real stage processes.
Faults are real SIGKILLs at the named seams; ``pause`` and ``resume`` are
real SIGSTOP and SIGCONT (a stalled owner, then a zombie), ``scale`` starts
or stops instances so that a consumer group rebalances; ``broker_restart``
restarts the local broker; ``compact`` forces log compaction; ``audit``
replays the whole ledger. Format v3's ``wait`` lets wall-clock time pass
(broker-side timers run), ``offsets_reset`` and ``topic_config`` are Kafka
admin requests (:mod:`testbed.kafkafaults`), and ``skew`` shifts the ledger
clock one component reads (:func:`testbed.faults.set_skew`). The report
counts effects from the sinks themselves.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from consumers.auditor import run_audit
from consumers.reader import current_states, policy_effective_at, read_topic
from ledger.errors import LedgerError
from ledger.events import (
    Approval,
    Claim,
    Disposition,
    JournalEntry,
    OperatingEvent,
    OperationState,
    RecoveryReceipt,
    decode_event,
)
from ledger.fold import compensation_counts
from ledger.kafka import bootstrap_servers
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed import broker, faults, kafkafaults
from testbed.compaction import force_compaction
from testbed.errors import ScenarioError
from testbed.forge import forge
from testbed.harness import Harness, run_dir_for, stale_dispatch
from testbed.kafkafaults import topic_layout_problems
from testbed.people import can_sign
from testbed.runs import RunLedger
from testbed.scenario import (
    TOTALS,
    Advance,
    Approve,
    Bound,
    ClaimStep,
    Dispose,
    Fault,
    Forge,
    IntentStep,
    OffsetsReset,
    Pause,
    Policy,
    Race,
    Restart,
    Resume,
    Revoke,
    Run,
    Scale,
    Scenario,
    SinkFault,
    Skew,
    StaleDispatch,
    TopicConfigStep,
    Upgrade,
    Wait,
)

Say = Callable[[str], None]

#: The repository's release manifest: which in-flight operations may resume
#: under a sink's new contract version (the ``upgrade`` step).
RELEASE_MANIFEST = Path(__file__).resolve().parents[1] / "deploy" / "release-manifest.json"

#: Steps before which the runner waits for quiescence.
SETTLE_FIRST = {"claim", "race", "stale_dispatch", "dispose", "compact", "audit", "forge"}


class GameDay:
    """Runs one scenario and builds its report.

    Args:
        scenario: the parsed scenario.
        base: settings of the broker to use (bootstrap, kafka home).
        root: folder under which the scenario's run folder is made.
        say: progress callback.
    """

    def __init__(self, scenario: Scenario, base: LedgerSettings, root: Path, say: Say) -> None:
        self.scenario = scenario
        self.base = base
        self.say = say
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in scenario.name)
        self.settings = base.model_copy(
            update={
                "topic_prefix": f"gameday-{safe}-{uuid.uuid4().hex[:6]}",
                "run_dir": run_dir_for(root, safe),
                "clock": "manual",
                "relay_mode": scenario.mode,
                "relay_inline_verify": scenario.inline_verify,
                "policy_version": scenario.policy_version,
                "sinks_file": None,
                "trusted_keys_file": None,
                "release_manifest_file": RELEASE_MANIFEST,
            }
        )
        self.harness = Harness(self.settings)
        #: this scenario's ledger, as a person inspects it afterwards
        self.ledger = RunLedger(f"scenario {scenario.name}", self.settings)
        self.publisher = LedgerPublisher(self.settings, client_id=f"gameday-{safe}")
        self.reviewers: dict[str, ReviewerKey] = {}
        self.approvals: dict[str, Approval] = {}
        self.claims: list[dict[str, Any]] = []
        self.audit_violations: int | None = None
        self.audit_unauthenticated: int | None = None
        self.audit_details: list[str] = []
        self.started = False
        #: component -> instances that run (``scale``); 1 for a component not named.
        self.instances: dict[str, int] = {}

    # ------------------------------------------------------------------ helpers

    def _reviewer(self, name: str) -> ReviewerKey:
        key = self.reviewers.get(name)
        if key is None:
            key = ReviewerKey.generate(f"{name}-key")
            trust(self.settings.trusted_keys_path(), key)
            self.publisher.credentials.add(key)
            self.reviewers[name] = key
        return key

    def settle(self, timeout_s: float = 60.0) -> None:
        """Wait until every live stage has caught up.

        Raises:
            LedgerError: not quiescent in time, or a stage died of an error
                (not of a fault hook's SIGKILL); the message has the log tails.
        """
        if not self.started:
            return
        try:
            self.harness.wait_quiescent(timeout_s)
        except LedgerError as exc:
            raise LedgerError(f"{exc}\n{self.harness.log_tail()}") from exc
        failed = self.harness.failed()
        if failed:
            raise LedgerError(
                "stage(s) died of an error, not of a fault hook: "
                + ", ".join(f"{name} (exit status {code})" for name, code in failed.items())
                + f"\n{self.harness.log_tail()}"
            )

    def state(self, operation_id: str) -> OperationState:
        st = current_states(self.settings).get(operation_id)
        if st is None:
            raise LedgerError(
                f"scenario {self.scenario.name}: operation {operation_id!r} is not in the ledger"
            )
        return st

    def _claim_results(self, claim_ids: list[str]) -> dict[str, bool]:
        results: dict[str, bool] = {}
        for rec in read_topic(self.settings, "journal"):
            entry = rec.event
            if not isinstance(entry, JournalEntry) or entry.kind != "Claim":
                continue
            claim = decode_event(entry.input_event)
            if isinstance(claim, Claim) and claim.claim_id in claim_ids:
                results[claim.claim_id] = entry.outcome == "APPLIED"
        return results

    def _record_claims(self, claims: list[tuple[str, str]]) -> None:
        self.settle()
        results = self._claim_results([cid for _, cid in claims])
        for worker, cid in claims:
            if cid not in results:
                raise LedgerError(
                    f"claim {cid} by {worker} was not decided; is the processor running "
                    "(a 'run' step must come first)?"
                )
            self.claims.append({"worker": worker, "accepted": results[cid]})
            self.say(f"    claim by {worker}: {'accepted' if results[cid] else 'rejected'}")

    # ------------------------------------------------------------------ steps

    def step(self, kind: str, args: Any) -> None:
        """Carry out one step."""
        if kind in SETTLE_FIRST:
            self.settle()
        handler = getattr(self, f"_step_{kind}")
        handler(args)

    def _step_approve(self, a: Approve) -> None:
        approval = self._reviewer(a.reviewer).sign(
            Approval(
                approval_id=a.approval_id,
                reviewer=a.reviewer,
                policy_version=a.policy_version,
                expires_at_ms=int(a.expires_at * 1000),
                scope_subject=a.scope.subject,
                scope_max_amount_minor=a.scope.max_amount_minor,
                scope_operation_id=a.scope.operation_id,
                granted_at_ms=self.harness.clock.now_ms(),
                scope_action=a.scope.action,
                scope_sink=a.scope.sink,
                scope_currency=a.scope.currency,
                scope_account=a.scope.account,
                scope_purpose=a.scope.purpose,
                scope_parameter_digest=a.scope.parameter_digest,
            ),
            ledger_id=self.settings.ledger_identity,
        )
        self.approvals[a.approval_id] = approval
        self.publisher.publish_approval(approval)

    def _step_revoke(self, r: Revoke) -> None:
        grant = self.approvals.get(r.approval_id)
        if grant is None:
            raise LedgerError(f"revoke: approval {r.approval_id!r} was not approved earlier")
        can_sign(self.publisher, self.settings, r.by)
        self.publisher.publish_approval(
            grant.model_copy(update={"status": "REVOKED", "revoked_by": r.by})
        )

    def _step_policy(self, p: Policy) -> None:
        can_sign(self.publisher, self.settings, "gameday")
        at_ms, _ = policy_effective_at(self.settings, self.harness.clock.now_ms())
        self.publisher.publish_policy(p.version, "gameday", at_ms)

    def _step_intent(self, i: IntentStep) -> None:
        if i.operation_id not in self.ledger.operation_ids:
            self.ledger.operation_ids.append(i.operation_id)
        self.publisher.publish(
            operation_id=i.operation_id,
            sink=i.sink,
            action=i.action,
            params=i.params,
            actor=i.actor,
            subject=i.subject,
            purpose=i.purpose,
            decision_version=i.decision_version,
            approval_id=i.approval_id,
            published_at_ms=self.harness.clock.now_ms(),
            compensates=i.compensates,
        )

    def _step_fault(self, f: Fault) -> None:
        self.harness.arm(f.seam, f.operation_id or "*", f.times)

    def _step_sink_fault(self, f: SinkFault) -> None:
        real = self.harness.real_sinks.get(f.sink)
        if real is not None:
            real.arm(f.operation_id, f.mode, f.latency_ms)
            return
        if f.mode in ("reset", "slow"):  # the parser allows them only on real systems
            raise ScenarioError(f"sink_fault {f.mode!r} needs a sink with an adapter")
        with self.harness.sinks[f.sink].client() as client:
            client.arm_fault(f.operation_id, f.mode)  # type: ignore[arg-type]

    def _step_run(self, r: Run) -> None:
        self.harness.start_all(self.instances)
        self.started = True
        self.settle(r.timeout_s)
        crashed = self.harness.crashed()
        if crashed:
            self.say(f"    crashed at a seam: {', '.join(crashed)}")

    def _step_restart(self, r: Restart) -> None:
        restarted = self.harness.restart(r.component)
        self.say(f"    restarted: {', '.join(restarted) or 'nothing had crashed'}")

    def _step_pause(self, p: Pause) -> None:
        name = f"{p.component}-{p.instance}"
        if p.seam is not None and p.operation_id is not None:
            self.harness.arm_pause(p.component, str(p.instance), p.seam, p.operation_id)
            self.say(f"    {name} stops itself at {p.seam} for {p.operation_id}")
            return
        if not self.harness.pause(p.component, str(p.instance)):
            raise LedgerError(
                f"pause: {name} is not running (a 'run' step starts the stages; 'scale' "
                "starts instances beyond 0)"
            )
        self.say(f"    {name} paused (SIGSTOP)")

    def _step_resume(self, r: Resume) -> None:
        name = f"{r.component}-{r.instance}"
        self.harness.self_paused()
        if name not in self.harness.paused:
            raise LedgerError(
                f"resume: {name} is not paused (no 'pause' step stopped it, or its pause "
                f"hook has not fired: did it reach the seam?)"
            )
        self.harness.resume(r.component, str(r.instance))
        self.say(f"    {name} resumed (SIGCONT)")

    def _step_scale(self, s: Scale) -> None:
        self.instances[s.component] = s.instances
        if not self.started:
            self.say(f"    {s.component}: {s.instances} instance(s) from the first 'run'")
            return
        started, stopped = self.harness.scale(s.component, s.instances)
        self.say(
            f"    {s.component}: {s.instances} instance(s); started {', '.join(started) or '-'}, "
            f"stopped {', '.join(stopped) or '-'}"
        )

    def _step_advance(self, a: Advance) -> None:
        now = self.harness.advance(a.seconds)
        self.say(f"    clock at {now / 1000:g} s")

    def _step_wait(self, w: Wait) -> None:
        """Let wall-clock time pass; nothing is restarted, resumed or settled meanwhile."""
        time.sleep(w.seconds)
        self.harness.self_paused()  # a pause hook that fired meanwhile is known as paused
        self.say(f"    waited {w.seconds:g} s (wall clock)")

    def _step_offsets_reset(self, o: OffsetsReset) -> None:
        """Reset (or delete) the committed offsets of a component whose instances are all down."""
        live = [
            f"{o.component}-{n}"
            for n in self.harness.instances(o.component)
            if self.harness.alive(o.component, n)
        ]
        if live:
            raise LedgerError(
                f"offsets_reset: {', '.join(live)} still run (a paused one too: it keeps its "
                "group membership); let a 'fault' step kill the component first, and "
                "'restart' it after the reset"
            )
        done = kafkafaults.reset_offsets(self.settings, o.component, o.to)
        self.say(f"    {o.component}'s offsets {o.to}" + (f": {done}" if done else ""))

    def _step_topic_config(self, t: TopicConfigStep) -> None:
        values = kafkafaults.alter_topic_config(self.settings, t.topic, t.config)
        self.say(f"    {t.topic}: {values}")

    def _step_skew(self, k: Skew) -> None:
        faults.set_skew(self.settings.run_dir, k.component, k.seconds)
        self.say(f"    {k.component} reads the ledger clock {k.seconds:+g} s off")

    def _step_upgrade(self, u: Upgrade) -> None:
        """Release a new contract of the sink: restart it with it, then register the version."""
        self.harness.upgrade_sink(u.sink, u.contract, u.contract_version)

    def _step_claim(self, c: ClaimStep) -> None:
        version = (
            self.state(c.operation_id).version
            if c.expected_version == "current"
            else int(c.expected_version)
        )
        cid = self.publisher.publish_claim(c.operation_id, c.worker, version)
        self._record_claims([(c.worker, cid)])

    def _step_race(self, r: Race) -> None:
        version = self.state(r.operation_id).version
        claims = [(w, self.publisher.publish_claim(r.operation_id, w, version)) for w in r.workers]
        self._record_claims(claims)

    def _step_stale_dispatch(self, s: StaleDispatch) -> None:
        state = self.state(s.operation_id)
        sink = self.harness.sinks.get(state.sink)
        if sink is None:
            raise LedgerError(
                f"stale_dispatch: sink {state.sink!r} is not a running reference sink "
                "(a real system behind an adapter cannot take it yet)"
            )
        token = state.epoch - 1
        with sink.client() as client:
            result = stale_dispatch(client, sink.contract, state, token, s.worker, self.publisher)
        self.say(f"    stale dispatch by {s.worker} with token {token}: {result.status}")

    def _step_dispose(self, d: Dispose) -> None:
        can_sign(self.publisher, self.settings, d.by)
        # The episode the operation is in now, as 'ledger reconcile dispose' fills it in.
        state = current_states(self.settings).get(d.operation_id)
        self.publisher.publish_disposition(
            Disposition(
                disposition_id=f"disposition:{d.by}:{uuid.uuid4().hex[:8]}",
                operation_id=d.operation_id,
                decision=d.decision.upper(),  # type: ignore[arg-type]
                by=d.by,
                evidence=d.evidence,
                disposed_at_ms=self.harness.clock.now_ms(),
                episode=state.entered_version if state is not None else None,
            )
        )

    def _step_forge(self, f: Forge) -> None:
        forged = forge(
            self.settings,
            f.record,
            operation_id=f.operation_id,
            approval_id=f.approval_id,
            topic=f.topic,
            fields=f.fields,
            now_ms=self.harness.clock.now_ms(),
        )
        self.say(
            f"    forged {forged.record} on {forged.topic}:{forged.partition}:{forged.offset} "
            f"(key {forged.key})"
        )

    def _step_broker_restart(self, _: object) -> None:
        status = broker.status(self.settings)
        if not status.owned:
            raise LedgerError(
                "broker_restart needs the local broker started by 'ledger broker start'; "
                f"this run uses {bootstrap_servers(self.settings)} ({status.message})"
            )
        broker.restart(self.settings)

    def _step_compact(self, _: object) -> None:
        force_compaction(self.settings)

    def _step_audit(self, _: object) -> None:
        """Audit as ``ledger audit`` does: the topic layout first, then every invariant.

        ``ledger audit`` refuses to run on an unsafe topic layout (a retention
        on an audited topic, a wrong cleanup policy ...), naming each problem;
        here each problem counts as one violation (``TOPIC_LAYOUT``), and the
        invariants are audited all the same.
        """
        layout = topic_layout_problems(self.settings)
        report = run_audit(self.settings)
        self.audit_violations = len(report.violations) + len(layout)
        self.audit_unauthenticated = len(report.unauthenticated_records)
        self.audit_details = [f"TOPIC_LAYOUT: {line}" for line in layout] + [
            f"{v.invariant} {v.operation_id or ''}: {v.evidence}" for v in report.violations
        ]
        self.say(
            f"    audit: {self.audit_violations} violation(s), "
            f"{self.audit_unauthenticated} unauthenticated record(s)"
        )
        for line in self.audit_details:
            self.say(f"      {line}")

    # ------------------------------------------------------------------ report

    def observe(self) -> dict[str, Any]:
        """What happened, in the shape of ``expect``."""
        self.settle()
        states = current_states(self.settings)
        effects: dict[str, int] = {}
        stale = 0
        released = 0
        holds: dict[str, str] = {}
        for real in self.harness.real_sinks.values():
            for op, n in real.effects().items():
                effects[op] = effects.get(op, 0) + n
        for sink in self.harness.sinks.values():
            with sink.client() as client:
                for op, n in client.effects().items():
                    effects[op] = effects.get(op, 0) + n
                stats = client.stats()
                stale += stats.get("stale_rejections", 0)
                released += stats.get("reservations_released", 0)
                if sink.contract.reservation:
                    for op in sorted(set(states) | set(self.scenario.expect.operations)):
                        hold = client.read_hold(op)
                        if hold.status in ("held", "confirmed", "released"):
                            holds[op] = hold.status
        operating = [
            r.event
            for r in read_topic(self.settings, "operating-events")
            if isinstance(r.event, OperatingEvent)
        ]
        ops = sorted(set(states) | set(self.scenario.expect.operations) | set(effects))
        operations = {}
        # Several readers may refuse one record (each rebuild of a table reports
        # it again): an operating event counts once per (kind, source position).
        distinct: dict[tuple[str, str | None, int | None, int | None, str | None], Any] = {}
        for e in operating:
            where = (e.kind, e.source_topic, e.source_partition, e.source_offset, e.operation_id)
            distinct.setdefault(
                where if e.source_topic else (e.event_id, None, None, None, None), e
            )
        by_op: dict[str, dict[str, int]] = {}
        by_kind: dict[str, int] = {}
        for e in distinct.values():
            by_kind[e.kind] = by_kind.get(e.kind, 0) + 1
            if e.operation_id:
                kinds = by_op.setdefault(e.operation_id, {})
                kinds[e.kind] = kinds.get(e.kind, 0) + 1
        latest_receipt: dict[str, dict[str, Any]] = {}
        for r in read_topic(self.settings, "recovery-receipts"):
            if isinstance(r.event, RecoveryReceipt):
                latest_receipt[r.key] = r.event.model_dump()
        compensations = compensation_counts(states)
        for op in ops:
            st = states.get(op)
            operations[op] = {
                "recovery_receipt": latest_receipt.get(op),
                "compensated_by": compensations.compensated_by.get(op),
                "state": str(st.state) if st else None,
                "effects": effects.get(op, 0),
                "reason": st.reason if st else "",
                "recovery_receipts": st.recovery_receipts if st else 0,
                "operating_events": by_op.get(op, {}),
                "reservation": holds.get(op),
            }
        totals = {
            "duplicate_effects": sum(max(0, n - 1) for n in effects.values()),
            "unknown_outcomes_open": sum(
                1 for st in states.values() if st.state == S.UNKNOWN_OUTCOME
            ),
            "stale_rejections": stale,
            "reauthorisations": sum(1 for st in states.values() if st.reauthorisations > 0),
            "accepted_claims": sum(1 for c in self.claims if c["accepted"]),
            "rejected_claims": sum(1 for c in self.claims if not c["accepted"]),
            "drift_rejections": sum(1 for e in operating if e.kind == "PARAMETER_DRIFT"),
            "postcondition_mismatches": sum(
                1 for e in operating if e.kind == "POSTCONDITION_MISMATCH"
            ),
            "operating_events": len(operating),
            "forgeries_refused": by_kind.get("UNAUTHENTICATED", 0),
            "reservations_released": released,
            "operating_events_by_kind": by_kind,
            "compensations": compensations.settled,
            "compensation_failures": compensations.failures,
            "compensation_attempts": compensations.attempts,
        }
        return {
            "operations": operations,
            "claims": list(self.claims),
            "totals": totals,
            "audit": {
                "violations": self.audit_violations,
                "unauthenticated_records": self.audit_unauthenticated,
                "details": self.audit_details,
            },
        }

    def run(self) -> dict[str, Any]:
        """Run every step, then observe and check the expectations."""
        started = time.monotonic()
        try:
            if self.scenario.policy_version != 1:
                can_sign(self.publisher, self.settings, "gameday")
                self.publisher.publish_policy(self.scenario.policy_version, "gameday", 0)
            for name, spec in self.scenario.sinks.items():
                if spec.adapter == "reference":
                    self.harness.start_sink(
                        name, spec.contract, hang_s=2 * self.settings.sink_timeout_s
                    )
                else:
                    self.harness.start_real_sink(name, spec.adapter, spec.contract, spec.config)
            for n, step in enumerate(self.scenario.steps):
                self.say(f"  step {n}: {step.kind}")
                self.step(step.kind, step.args)
            observed = self.observe()
        finally:
            self.publisher.close()
            self.harness.stop()
        failures = check(self.scenario, observed)
        return {
            "name": self.scenario.name,
            "topic_prefix": self.settings.topic_prefix,
            "run_dir": str(self.settings.run_dir),
            **observed,
            "passed": not failures,
            "failures": failures,
            "wall_s": round(time.monotonic() - started, 1),
        }


def _matches(expected: int | Bound, observed: int | None) -> bool:
    if observed is None:
        return False
    if isinstance(expected, Bound):
        return (expected.min is None or observed >= expected.min) and (
            expected.max is None or observed <= expected.max
        )
    return observed == expected


def _show(expected: int | Bound) -> Any:
    return expected.model_dump(exclude_none=True) if isinstance(expected, Bound) else expected


def _check_receipt(
    base: str,
    want: dict[str, Any] | None,
    got: dict[str, Any] | None,
    fail: Callable[[str, Any, Any], None],
) -> None:
    """``recovery_receipt``: each field of the latest receipt, or that there is none.

    Strings match as case-insensitive substrings of the observed value;
    other values (numbers, ``null``) must be equal.
    """
    path = f"{base}.recovery_receipt"
    if want is None:
        if got is not None:
            fail(path, None, got)
        return
    if got is None:
        fail(path, want, None)
        return
    for field, value in want.items():
        seen = got.get(field)
        if isinstance(value, str):
            ok = seen is not None and value.lower() in str(seen).lower()
        else:
            ok = seen == value
        if not ok:
            fail(f"{path}.{field}", value, seen)


def check(scenario: Scenario, observed: dict[str, Any]) -> list[dict[str, Any]]:
    """Compare observations with ``expect``; one failure per path that differs."""
    failures: list[dict[str, Any]] = []

    def fail(path: str, expected: Any, got: Any) -> None:
        failures.append({"path": path, "expected": expected, "observed": got})

    exp = scenario.expect
    for op, want in exp.operations.items():
        got = observed["operations"].get(op, {})
        base = f"operations.{op}"
        if want.state is not None and got.get("state") != want.state:
            fail(f"{base}.state", want.state, got.get("state"))
        if want.effects is not None and not _matches(want.effects, got.get("effects")):
            fail(f"{base}.effects", _show(want.effects), got.get("effects"))
        if want.reason_contains and (
            want.reason_contains.lower() not in (got.get("reason") or "").lower()
        ):
            fail(f"{base}.reason_contains", want.reason_contains, got.get("reason"))
        if want.recovery_receipts_min is not None and (
            got.get("recovery_receipts", 0) < want.recovery_receipts_min
        ):
            fail(
                f"{base}.recovery_receipts_min",
                want.recovery_receipts_min,
                got.get("recovery_receipts"),
            )
        if "reservation" in want.model_fields_set and got.get("reservation") != want.reservation:
            fail(f"{base}.reservation", want.reservation, got.get("reservation"))
        if want.checks_recovery_receipt:
            _check_receipt(base, want.recovery_receipt, got.get("recovery_receipt"), fail)
        if want.checks_compensated_by() and got.get("compensated_by") != want.compensated_by:
            fail(f"{base}.compensated_by", want.compensated_by, got.get("compensated_by"))
        for kind, want_n in (want.operating_events or {}).items():
            got_n = got.get("operating_events", {}).get(kind, 0)
            if not _matches(want_n, got_n):
                fail(f"{base}.operating_events.{kind}", _show(want_n), got_n)
    if exp.claims is not None:
        want_claims = [c.model_dump() for c in exp.claims]
        if want_claims != observed["claims"]:
            fail("claims", want_claims, observed["claims"])
    for name in TOTALS:
        want_total = getattr(exp.totals, name)
        if want_total is not None and not _matches(want_total, observed["totals"].get(name)):
            fail(f"totals.{name}", _show(want_total), observed["totals"].get(name))
    for kind, want_n in (exp.totals.operating_events_by_kind or {}).items():
        got_n = observed["totals"].get("operating_events_by_kind", {}).get(kind, 0)
        if not _matches(want_n, got_n):
            fail(f"totals.operating_events_by_kind.{kind}", _show(want_n), got_n)
    if exp.audit is not None:
        for name in ("violations", "unauthenticated_records"):
            want_audit = getattr(exp.audit, name)
            got_audit = observed["audit"].get(name)
            if want_audit is not None and not _matches(want_audit, got_audit):
                fail(f"audit.{name}", _show(want_audit), got_audit)
    return failures


def run_files(
    paths: list[Path],
    base: LedgerSettings,
    say: Say,
    ledgers: list[RunLedger] | None = None,
) -> list[dict[str, Any]]:
    """Run scenario files one after another; returns one report per file.

    Args:
        paths: scenario files (JSON or YAML).
        base: the broker's settings; each scenario gets its own topic prefix
            and run folder under ``base.run_dir / "gameday"``.
        say: progress lines.
        ledgers: when given, each scenario's ledger (:class:`RunLedger`) is
            appended to it, so that the caller can say how to inspect it.

    Returns:
        One report per file: ``name``, ``topic_prefix``, ``run_dir``, the
        observations, ``passed``, ``failures``, ``wall_s`` and ``file`` (a
        scenario that could not run has only ``name``, ``passed``,
        ``failures`` and ``file``, and its ledger too when it was made).
    """
    from testbed.scenario import load

    scenarios = [(path, load(path)) for path in paths]  # fail fast on malformed files
    reports = []
    root = base.run_dir / "gameday"
    for path, scenario in scenarios:
        say(f"scenario {scenario.name} ({path.name})")
        game: GameDay | None = None
        try:
            game = GameDay(scenario, base, root, say)
            if ledgers is not None:
                ledgers.append(game.ledger)
            report = game.run()
        except LedgerError as exc:
            report = {
                "name": scenario.name,
                **(
                    {
                        "topic_prefix": game.settings.topic_prefix,
                        "run_dir": str(game.settings.run_dir),
                    }
                    if game is not None
                    else {}
                ),
                "passed": False,
                "failures": [
                    {"path": "(run)", "expected": "the scenario runs", "observed": exc.message}
                ],
            }
        report["file"] = str(path)
        verdict = "PASS" if report["passed"] else "FAIL"
        say(f"{verdict} {scenario.name} in {report.get('wall_s', '?')} s")
        for f in report["failures"]:
            say(f"  {f['path']}: expected {f['expected']!r}, observed {f['observed']!r}")
        reports.append(report)
    return reports
