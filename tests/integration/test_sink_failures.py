"""Per-operation sink failures on the real broker (issue 11, item 6).

* An intent for a sink the registry does not name is refused before
  admission: no state, the approval unused, the operation ID still free.
* A sink that refuses connections never received the request: the relay
  retries it with backoff without holding up a live sink's operations, then
  holds the operation (UNKNOWN_OUTCOME, admission intact) for a person.
* A relay that dies on an operation every time is not restarted into an
  endless ABSENT -> re-dispatch loop: the re-execution budget holds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from consumers.reader import current_states, read_topic, wait_for_decision
from consumers.reconciler import reconcile_once
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import ApprovalUse, Disposition, OperatingEvent, OperationState
from ledger.fold import MAX_ABSENT_RETRIES
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from testbed.people import can_sign
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration

PARAMS = {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}


def publish(pub: LedgerPublisher, op: str, sink: str, approval: str) -> tuple[str, int, int]:
    """Publish a refund intent to ``sink``; returns its position (topic, partition, offset)."""
    pub.publish(
        operation_id=op,
        sink=sink,
        action="refund",
        params=PARAMS,
        actor="svc",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
        approval_id=approval,
    )
    assert pub.last_position is not None
    return pub.last_position


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # polling a condition read from Kafka


def state_of(settings: LedgerSettings, op: str) -> OperationState | None:
    return current_states(settings).get(op)


def events(settings: LedgerSettings, kind: str, op: str) -> list[OperatingEvent]:
    return [
        r.event
        for r in read_topic(settings, "operating-events")
        if isinstance(r.event, OperatingEvent) and r.event.kind == kind and r.key == op
    ]


def uses(settings: LedgerSettings, approval: str) -> list[ApprovalUse]:
    return [
        r.event
        for r in read_topic(settings, "approval-uses")
        if isinstance(r.event, ApprovalUse) and r.event.approval_id == approval
    ]


@pytest.fixture
def quick_retries(ledger_settings: LedgerSettings) -> LedgerSettings:
    """Settings whose relay gives up on an unreachable sink after 4 tries (about 3.5 s)."""
    return ledger_settings.model_copy(
        update={"sink_retry_attempts": 4, "sink_retry_backoff_s": 0.5}
    )


@pytest.fixture
def ledger(quick_retries: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher]]:
    harness = Harness(quick_retries, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(quick_retries)
    try:
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def test_an_intent_for_an_unregistered_sink_is_refused_before_admission(ledger) -> None:
    harness, pub = ledger
    settings = harness.settings
    harness.start_all()
    approve(pub, "ap-typo")
    op = "refund:typo:v1"
    decision = wait_for_decision(settings, *publish(pub, op, "paymnets", "ap-typo"), 60)
    assert decision is not None and decision.outcome == "REFUSED"
    assert decision.sink_problem is not None and "'paymnets' is not registered" in (
        decision.sink_problem
    )
    assert "approval ap-typo was not used" in decision.reason
    (event,) = events(settings, "UNKNOWN_SINK", op)
    assert "paymnets" in event.reason and str(settings.sinks_path()) in event.reason
    assert state_of(settings, op) is None  # nothing bound to the operation ID
    assert uses(settings, "ap-typo") == []  # the approval was not consumed

    # The corrected intent, same operation ID and same approval, goes through.
    fixed = wait_for_decision(settings, *publish(pub, op, "payments", "ap-typo"), 60)
    assert fixed is not None and fixed.outcome == "APPLIED"
    wait_until(
        f"{op} verified",
        lambda: getattr(state_of(settings, op), "state", None) == "OUTCOME_VERIFIED",
    )
    assert [u.operation_id for u in uses(settings, "ap-typo")] == [op]
    assert harness.effects("payments", op) == 1

    # A sink registered after the refusal: the same intent, published again, works.
    approve(pub, "ap-late")
    late = "refund:late-sink:v1"
    first = wait_for_decision(settings, *publish(pub, late, "ledgerbank", "ap-late"), 60)
    assert first is not None and first.outcome == "REFUSED"
    harness.start_sink("ledgerbank", PAYMENT_GATEWAY, hang_s=1.0)
    again = wait_for_decision(settings, *publish(pub, late, "ledgerbank", "ap-late"), 60)
    assert again is not None and again.outcome == "APPLIED"
    wait_until(
        f"{late} verified",
        lambda: getattr(state_of(settings, late), "state", None) == "OUTCOME_VERIFIED",
    )
    assert harness.effects("ledgerbank", late) == 1
    harness.wait_quiescent(60)
    assert harness.failed() == {}


def test_a_stopped_sink_is_retried_then_held_while_a_live_sink_keeps_moving(
    ledger_settings: LedgerSettings,
) -> None:
    # Six tries, waits of 1 + 2 + 4 + 8 + 16 = 31 s: the live sink's operations
    # must finish while the dead sink's one is still being retried (a loaded CI
    # machine once took longer than the default budget's 15.5 s to verify them).
    settings = ledger_settings.model_copy(
        update={"sink_retry_attempts": 6, "sink_retry_backoff_s": 1.0}
    )
    harness = Harness(settings, create=False)
    pub = LedgerPublisher(settings)
    try:
        harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
        harness.start_sink("ledgerbank", PAYMENT_GATEWAY, hang_s=1.0)
        harness.sinks["ledgerbank"].stop()  # its URL stays registered
        harness.start_all()
        harness.wait_quiescent(90)
        dead = "refund:dead-sink:v1"
        live = [f"refund:live{n}:v1" for n in range(3)]
        for approval in ["ap-dead", *(f"ap-{op}" for op in live)]:
            approve(pub, approval)
        publish(pub, dead, "ledgerbank", "ap-dead")
        for op in live:
            publish(pub, op, "payments", f"ap-{op}")

        def live_verified() -> bool:
            states = current_states(settings)
            return all(getattr(states.get(op), "state", None) == S.OUTCOME_VERIFIED for op in live)

        wait_until("the live sink's operations", live_verified, 90)
        held = state_of(settings, dead)
        assert held is not None and held.state == S.EFFECT_PENDING  # still being retried
        assert all(harness.effects("payments", op) == 1 for op in live)

        wait_until(
            f"{dead} held",
            lambda: getattr(state_of(settings, dead), "state", None) == S.UNKNOWN_OUTCOME,
            90,
        )
        held = state_of(settings, dead)
        assert held is not None
        assert "ledgerbank could not be reached" in held.reason
        assert "ConnectError" in held.reason and "the request never left" in held.reason
        assert held.observation_status == "UNREACHABLE"
        (event,) = events(settings, "SINK_UNREACHABLE", dead)
        assert "ledgerbank" in event.reason and "tried 6 times" in event.reason
        assert not events(settings, "SINK_UNAVAILABLE", dead)
        assert held.admitted_approval_id == "ap-dead"  # the admission stands
        assert harness.alive("relay")

        # The sink comes back: the held operation completes under its admission,
        # with no new approval; the approval was used by this operation only.
        harness.start_sink("ledgerbank", PAYMENT_GATEWAY, hang_s=1.0)
        (result,) = reconcile_once(settings)
        assert result["observed"] == "ABSENT"
        wait_until(
            f"{dead} verified",
            lambda: getattr(state_of(settings, dead), "state", None) == S.OUTCOME_VERIFIED,
        )
        assert harness.effects("ledgerbank", dead) == 1
        assert [u.operation_id for u in uses(settings, "ap-dead")] == [dead]
        harness.wait_quiescent(60)
        assert harness.failed() == {}
    finally:
        pub.close()
        harness.stop()


def test_a_sink_back_within_the_budget_gets_the_request_once(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings.model_copy(
        update={"sink_retry_attempts": 6, "sink_retry_backoff_s": 0.5}
    )
    harness = Harness(settings, create=False)
    pub = LedgerPublisher(settings)
    try:
        harness.start_sink("ledgerbank", PAYMENT_GATEWAY, hang_s=1.0)
        harness.sinks["ledgerbank"].stop()
        harness.start_all()
        op = "refund:sink-restart:v1"
        approve(pub, "ap-restart")
        publish(pub, op, "ledgerbank", "ap-restart")
        relay_log = settings.run_dir / "logs" / "relay-0.log"
        wait_until(
            "the relay's first failed try",
            lambda: "did not reach ledgerbank" in relay_log.read_text(errors="replace"),
            60,
        )
        # The sink restarts on another port; the registry says so and the
        # relay's next try reaches it there.
        harness.start_sink("ledgerbank", PAYMENT_GATEWAY, hang_s=1.0)
        wait_until(
            f"{op} verified",
            lambda: getattr(state_of(settings, op), "state", None) == S.OUTCOME_VERIFIED,
            60,
        )
        assert harness.effects("ledgerbank", op) == 1
        hops = [
            hop
            for r in read_topic(settings, "journal")
            if r.key == op
            for hop in (getattr(r.event, "hops", None) or ())
        ]
        assert "EFFECT_PENDING->UNKNOWN_OUTCOME" not in hops
        assert not events(settings, "SINK_UNREACHABLE", op)
        harness.wait_quiescent(60)
        assert harness.failed() == {}
    finally:
        pub.close()
        harness.stop()


def test_a_relay_that_dies_on_an_operation_every_time_is_held_by_the_budget(ledger) -> None:
    harness, pub = ledger
    settings = harness.settings
    op = "refund:crash-loop:v1"
    approve(pub, "ap-loop")
    # The relay dies before each send of this operation: the first and every
    # re-execution the budget allows. Each restart reads the effect back
    # (ABSENT) and the processor dispatches the same operation again.
    sends = MAX_ABSENT_RETRIES + 1
    harness.arm("after_dispatch_before_send", op, times=sends)
    publish(pub, op, "payments", "ap-loop")
    harness.start_all()
    restarts = 0
    deadline = time.monotonic() + 240
    while getattr(state_of(settings, op), "state", None) != S.UNKNOWN_OUTCOME:
        assert time.monotonic() < deadline, f"not held after {restarts} relay restarts"
        assert restarts <= sends, "the relay was restarted past the budget"
        if not harness.alive("relay"):
            harness.restart("relay")
            restarts += 1
        time.sleep(0.2)  # polling a condition read from Kafka
    held = state_of(settings, op)
    assert held is not None and held.absent_retries == MAX_ABSENT_RETRIES
    assert restarts == sends
    assert f"observed absent again after {MAX_ABSENT_RETRIES} re-executions" in held.reason
    (event,) = events(settings, "ABSENT_RETRIES_EXHAUSTED", op)
    assert "reconcile dispose" in event.reason and "payments" in event.reason
    assert harness.effects("payments", op) == 0

    # Held, not spinning: a readback that finds it absent does not release it.
    (result,) = reconcile_once(settings)
    assert result["observed"] == "ABSENT"
    harness.wait_quiescent(60)
    still = state_of(settings, op)
    assert still is not None and still.state == S.UNKNOWN_OUTCOME
    assert still.version == held.version

    # An attributable disposition releases it, with a new budget, and the
    # approval's one admission still carries it (no new approval).
    can_sign(pub, settings, "operator-1")
    pub.publish_disposition(
        Disposition(
            disposition_id="d-loop",
            operation_id=op,
            decision="ABSENT",
            by="operator-1",
            evidence="relay fixed",
            disposed_at_ms=harness.clock.now_ms(),
            episode=still.entered_version,  # the unknown outcome it answers
        )
    )
    wait_until(
        f"{op} verified",
        lambda: getattr(state_of(settings, op), "state", None) == S.OUTCOME_VERIFIED,
    )
    done = state_of(settings, op)
    assert done is not None and done.absent_retries == 0
    assert harness.effects("payments", op) == 1
    assert [u.operation_id for u in uses(settings, "ap-loop")] == [op]
    assert harness.failed() == {}
