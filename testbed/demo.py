"""``ledger demo``: the article's four interruption cases on real Kafka.

Each case gets its own ledger (topic prefix and run folder) on the same
broker, its own reference sink, and the real stage processes. Crashes are
real: a fault hook makes the stage SIGKILL itself at the named seam. Every
reported value is read back from where it lives: effects from the sink,
phases from ``ledger.state``, claim outcomes from the processor's journal,
approval consumption from ``ledger.approvals``, and the resume time from the
recovery receipt.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from consumers.reader import current_states, latest_by_key, read_topic
from ledger.contracts import PAYMENT_GATEWAY, UNSAFE_SINK, EffectContract
from ledger.errors import LedgerError
from ledger.events import Approval, ApprovalUse, JournalEntry, RecoveryReceipt
from ledger.history import journal_move
from ledger.kafka import consumer_config
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import COMPLETE
from producers.publisher import LedgerPublisher
from testbed.harness import Harness, run_dir_for
from testbed.runs import RunLedger

Say = Callable[[str], None]


def _phase(state: str | None) -> str:
    if state is None:
        return "UNKNOWN_OPERATION"
    return "COMPLETE" if state in COMPLETE else str(state)


class JournalTail:
    """Prints the processor's transitions as they are committed (``--verbose``)."""

    def __init__(self, settings: LedgerSettings, say: Say) -> None:
        self.settings = settings
        self.say = say
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> JournalTail:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_flag.set()
        self.thread.join(5)

    def _run(self) -> None:
        from ledger.events import decode_event

        consumer = Consumer(
            consumer_config(
                self.settings, f"{self.settings.topic_prefix}.tail.{uuid.uuid4().hex[:6]}"
            )
        )
        consumer.subscribe([self.settings.topic("journal")])
        try:
            while not self.stop_flag.is_set():
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                try:
                    entry = decode_event(msg.value())
                except Exception:
                    continue
                if isinstance(entry, JournalEntry):
                    self.say(
                        f"    journal: {entry.operation_id}: {entry.kind} {entry.outcome} "
                        f"{journal_move(entry)} ({entry.reason})"
                    )
        finally:
            consumer.close()


class Case:
    """One demo case: its own ledger, sinks and processes."""

    def __init__(
        self,
        base: LedgerSettings,
        name: str,
        root: Path,
        say: Say,
        verbose: bool,
        relay_mode: str = "ledger",
        ledgers: list[RunLedger] | None = None,
    ) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.settings = base.model_copy(
            update={
                "topic_prefix": f"demo-{name}-{suffix}",
                "run_dir": run_dir_for(root, name),
                "clock": "manual",
                "relay_mode": relay_mode,
                "sinks_file": None,
            }
        )
        self.name = name
        self.say = say
        self.verbose = verbose
        self.harness = Harness(self.settings)
        self.reviewer = ReviewerKey.generate("reviewer-1")
        trust(self.settings.trusted_keys_path(), self.reviewer)
        self.publisher = LedgerPublisher(self.settings, client_id=f"demo-{name}")
        self.publisher.credentials.add(self.reviewer)
        self.tail: JournalTail | None = None
        self.ledger = RunLedger(f"case {name}", self.settings)
        if ledgers is not None:
            ledgers.append(self.ledger)

    def __enter__(self) -> Case:
        if self.verbose:
            self.tail = JournalTail(self.settings, self.say).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tail is not None:
            self.tail.__exit__()
        self.publisher.close()
        self.harness.stop()

    def sink(self, name: str, contract: EffectContract) -> None:
        self.harness.start_sink(name, contract, hang_s=3.0)

    def approve(
        self,
        approval_id: str,
        expires_at_s: int,
        subject: str,
        max_amount_minor: int,
        operation_id: str | None = None,
    ) -> None:
        self.publisher.publish_approval(
            self.reviewer.sign(
                Approval(
                    approval_id=approval_id,
                    reviewer="reviewer-1",
                    policy_version=self.settings.policy_version,
                    expires_at_ms=expires_at_s * 1000,
                    scope_subject=subject,
                    scope_max_amount_minor=max_amount_minor,
                    scope_operation_id=operation_id,
                    granted_at_ms=self.harness.clock.now_ms(),
                ),
                ledger_id=self.settings.ledger_identity,
            )
        )

    def refund(self, operation_id: str, sink: str, case: str, amount: int, approval: str) -> None:
        self.ledger.operation_ids.append(operation_id)
        self.publisher.publish(
            operation_id=operation_id,
            sink=sink,
            action="refund",
            params={"account": f"acct-{case}", "amount_minor": amount, "currency": "GBP"},
            actor="svc-remediation",
            subject=f"customer-{case}",
            purpose="fee-remediation",
            decision_version=1,
            approval_id=approval,
            published_at_ms=self.harness.clock.now_ms(),
        )

    def step(self, text: str) -> None:
        self.say(f"  [{self.name}] {text}")

    def run(self, timeout_s: float = 60.0) -> None:
        self.harness.start_all()
        try:
            self.harness.wait_quiescent(timeout_s)
        except LedgerError as exc:
            raise LedgerError(f"{exc}\n{self.harness.log_tail()}") from exc
        crashed = self.harness.crashed()
        if crashed:
            self.step(f"crashed (SIGKILL at a seam): {', '.join(crashed)}")

    def restart(self) -> None:
        restarted = self.harness.restart()
        self.step(f"restarted {', '.join(restarted) or 'nothing'}")

    def state_of(self, operation_id: str) -> Any:
        return current_states(self.settings).get(operation_id)


def checkpoint_only_negative(
    base: LedgerSettings,
    root: Path,
    say: Say,
    verbose: bool,
    ledgers: list[RunLedger] | None = None,
) -> dict[str, Any]:
    """Crash after the effect committed; a checkpoint-only resumer and an unsafe sink."""
    op = "refund:case-unsafe"
    with Case(base, "checkpoint-only", root, say, verbose, "checkpoint-only", ledgers) as c:
        c.sink("unsafe", UNSAFE_SINK)
        c.approve("approval-unsafe", 1000, "customer-unsafe", 5000)
        c.harness.arm("after_sink_commit_before_receipt", op)
        c.refund(op, "unsafe", "unsafe", 5000, "approval-unsafe")
        c.step("intent published; relay will die after the sink commits")
        c.run()
        c.restart()
        c.run()
        state = c.state_of(op)
        return {
            "external_effects": c.harness.effects("unsafe", op),
            "workflow_phase": _phase(state.state if state else None),
        }


def consume_once_claim(
    base: LedgerSettings,
    root: Path,
    say: Say,
    verbose: bool,
    ledgers: list[RunLedger] | None = None,
) -> dict[str, Any]:
    """Two resumers read the same version and claim one operation at once."""
    op = "refund:case-race:v1"
    with Case(base, "race", root, say, verbose, ledgers=ledgers) as c:
        c.sink("payments", PAYMENT_GATEWAY)
        c.approve("approval-race", 1000, "customer-race", 2500)
        c.harness.arm("after_dispatch_before_send", op)
        c.refund(op, "payments", "race", 2500, "approval-race")
        c.run()
        state = c.state_of(op)
        if state is None:
            raise LedgerError(f"{op} has no state after the first run")
        version = state.version
        c.step(f"both resumers read version {version}; both claim it")
        for worker in ("worker-a", "worker-b"):
            c.publisher.publish_claim(op, worker, version)
        c.restart()
        c.run()
        claims = [
            rec.event
            for rec in read_topic(c.settings, "journal")
            if isinstance(rec.event, JournalEntry)
            and rec.event.kind == "Claim"
            and rec.event.operation_id == op
        ]
        return {
            "accepted_resumers": sum(1 for e in claims if e.outcome == "APPLIED"),
            "rejected_resumers": sum(1 for e in claims if e.outcome == "REFUSED"),
        }


def effect_readback_positive(
    base: LedgerSettings,
    root: Path,
    say: Say,
    verbose: bool,
    ledgers: list[RunLedger] | None = None,
) -> dict[str, Any]:
    """Crash after the effect committed; resume after the approval expired; readback."""
    op = "refund:case-safe:v1"
    with Case(base, "readback", root, say, verbose, ledgers=ledgers) as c:
        c.sink("payments", PAYMENT_GATEWAY)
        c.approve("approval-safe", 10, "customer-safe", 5000, operation_id=op)
        c.harness.advance(5)
        c.harness.arm("after_sink_commit_before_receipt", op)
        c.refund(op, "payments", "safe", 5000, "approval-safe")
        c.step("intent published at t=5 s; approval expires at t=10 s")
        c.run()
        now = c.harness.advance(15)
        c.step(f"clock advanced to t={now / 1000:.0f} s; resuming")
        c.restart()
        c.run()
        state = c.state_of(op)
        approvals = latest_by_key(read_topic(c.settings, "approvals"))
        approval = approvals["approval-safe"].event
        assert isinstance(approval, Approval)
        uses = latest_by_key(read_topic(c.settings, "approval-uses"))
        use = uses["approval-safe"].event if "approval-safe" in uses else None
        receipts = [
            r.event
            for r in read_topic(c.settings, "recovery-receipts")
            if isinstance(r.event, RecoveryReceipt) and r.event.operation_id == op
        ]
        return {
            "approval_consumed": isinstance(use, ApprovalUse) and use.operation_id == op,
            "external_effects": c.harness.effects("payments", op),
            "resumed_after_expiry": bool(receipts)
            and all(r.observed_at_ms > approval.expires_at_ms for r in receipts),
            "workflow_phase": _phase(state.state if state else None),
        }


def expired_authority_boundary(
    base: LedgerSettings,
    root: Path,
    say: Say,
    verbose: bool,
    ledgers: list[RunLedger] | None = None,
) -> dict[str, Any]:
    """Crash before admission; resume after the approval expired."""
    op = "refund:case-expired:v1"
    with Case(base, "expired", root, say, verbose, ledgers=ledgers) as c:
        c.sink("payments", PAYMENT_GATEWAY)
        c.approve("approval-expired", 10, "customer-expired", 7500)
        c.harness.arm("before_admission", op)
        c.refund(op, "payments", "expired", 7500, "approval-expired")
        c.step("intent published; the authority kernel will die before admission")
        c.run()
        c.harness.advance(20)
        c.step("clock advanced to t=20 s; resuming")
        c.restart()
        c.run()
        state = c.state_of(op)
        return {
            "external_effects": c.harness.effects("payments", op),
            "reason": state.reason if state else "no state",
            "workflow_phase": _phase(state.state if state else None),
        }


CASES = (
    ("checkpoint_only_negative", checkpoint_only_negative),
    ("consume_once_claim", consume_once_claim),
    ("effect_readback_positive", effect_readback_positive),
    ("expired_authority_boundary", expired_authority_boundary),
)

EXPECTED: dict[str, dict[str, object]] = {
    "checkpoint_only_negative": {"external_effects": 2, "workflow_phase": "COMPLETE"},
    "consume_once_claim": {"accepted_resumers": 1, "rejected_resumers": 1},
    "effect_readback_positive": {
        "approval_consumed": True,
        "external_effects": 1,
        "resumed_after_expiry": True,
        "workflow_phase": "COMPLETE",
    },
    "expired_authority_boundary": {
        "external_effects": 0,
        "reason": "approval has expired",
        "workflow_phase": "NEEDS_REAUTHORISATION",
    },
}


def run_demo(
    settings: LedgerSettings,
    say: Say,
    verbose: bool = False,
    ledgers: list[RunLedger] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run the four cases and return the observed report (same shape as :data:`EXPECTED`).

    Args:
        settings: the broker's settings; each case gets its own topic prefix
            and run folder under ``settings.run_dir / "demo"``.
        say: progress lines.
        verbose: also say each journaled transition.
        ledgers: when given, each case's ledger (:class:`RunLedger`) is
            appended to it, so that the caller can say how to inspect it.
    """
    root = settings.run_dir / "demo"
    report: dict[str, dict[str, Any]] = {}
    for name, fn in CASES:
        started = time.monotonic()
        say(f"case {name} ...")
        made = len(ledgers) if ledgers is not None else 0
        report[name] = fn(settings, root, say, verbose, ledgers)
        for run in (ledgers or [])[made:]:
            run.label = f"case {name}"  # as the report names it
        say(f"case {name} done in {time.monotonic() - started:.1f} s: {report[name]}")
    return report
