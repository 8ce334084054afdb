"""Authentic records appended again name what they answer, on the real broker (issue 26).

An attacker who can write a topic (no ACLs) but holds no key copies a record
that was really written -- its key, value and headers as read -- to the end
of its topic, in a later moment of the same operation:

* a signed disposition ``ABSENT`` of an earlier unknown-outcome episode,
  appended in a later episode, must not execute (send an email) again;
* the kernel's ``ADMITTED`` decision, appended after a cancelled
  reservation sent the operation back for authority, must not admit it
  again (the kernel refuses its expired approval);
* an earlier state record of a settled operation, appended to
  ``ledger.state``, must not take it back on the processor's restore.

Each copy changes nothing and is reported (a ``REPLAYED`` operating event
naming its position).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Message

from consumers.auditor import run_audit
from consumers.reader import current_states, read_topic, wait_for_decision
from consumers.stage import Record, read_partition
from ledger.contracts import PAYMENT_GATEWAY, EffectContract
from ledger.events import (
    AdmissionDecision,
    Approval,
    Dispatch,
    Disposition,
    Event,
    JournalEntry,
    OperatingEvent,
    OperationState,
)
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher, build_disposition
from testbed.harness import Harness
from testbed.people import can_sign
from tests.helpers import replay
from tests.integration.test_stages import REVIEWER, approve, of_operation, publish

pytestmark = pytest.mark.integration


def _messages(settings: LedgerSettings, topic: str, op: str) -> list[tuple[Event, Message]]:
    """Every authentic record of ``op`` on ``topic``, with the message it came in."""
    found: list[tuple[Event, Message]] = []

    def keep(rec: Record | None, msg: Message) -> None:
        if rec is not None and getattr(rec.event, "operation_id", None) == op:
            found.append((rec.event, msg))

    read_partition(settings, topic, None, keep)
    return found


def _reported(settings: LedgerSettings, topic: str, at: tuple[int, int]) -> list[OperatingEvent]:
    """The operating events that name the record at ``topic:partition:offset``."""
    return [
        r.event
        for r in read_topic(settings, "operating-events")
        if isinstance(r.event, OperatingEvent)
        and (r.event.source_topic, r.event.source_partition, r.event.source_offset) == (topic, *at)
    ]


def _decided(settings: LedgerSettings, topic: str, at: tuple[int, int]) -> str:
    """Wait for the processor's journal entry on the input at ``at``; its outcome."""
    entry = wait_for_decision(settings, topic, at[0], at[1], 60)
    assert entry is not None, f"the processor did not decide on {topic}:{at[0]}:{at[1]}"
    return entry.outcome


MAIL = "notify:replayed-disposition:v1"


def test_a_disposition_appended_again_in_a_later_episode_sends_nothing(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    mailer = harness.start_sink("mailer", EffectContract(), hang_s=2 * settings.sink_timeout_s)
    pub = LedgerPublisher(settings)
    try:
        approve(pub)
        with mailer.client() as client:
            client.arm_fault(MAIL, "timeout_before_commit")
        pub.publish(
            operation_id=MAIL,
            sink="mailer",
            action="send_email",
            params={"to": "customer-1", "amount_minor": 0},
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id="ap-1",
        )
        harness.start_all()
        harness.wait_quiescent(90)
        first = current_states(settings)[MAIL]
        assert first.state == S.UNKNOWN_OUTCOME and harness.effects("mailer", MAIL) == 0

        # Episode 1: the operator finds no email and disposes ABSENT; the
        # re-execution sends it, and its answer is lost: episode 2.
        with mailer.client() as client:
            client.arm_fault(MAIL, "timeout_after_commit")
        can_sign(pub, settings, "operator-1")
        pub.publish_disposition(
            build_disposition(
                MAIL,
                "absent",
                "operator-1",
                "provider log: nothing sent",
                harness.clock.now_ms(),
                episode=first.entered_version,
            )
        )
        harness.wait_quiescent(90)
        second = current_states(settings)[MAIL]
        assert second.state == S.UNKNOWN_OUTCOME, second
        assert second.entered_version != first.entered_version
        assert harness.effects("mailer", MAIL) == 1
        executes = [d for d in of_operation(settings, MAIL, "dispatches", Dispatch)]

        # The attacker appends the signed disposition of episode 1 again.
        [(disposition, message)] = _messages(settings, "dispositions", MAIL)
        assert isinstance(disposition, Disposition) and disposition.decision == "ABSENT"
        at = replay(settings, "dispositions", message)
        outcome = _decided(settings, "dispositions", at)
        harness.wait_quiescent(90)

        # Nothing was sent again; the copy is refused and reported.
        assert harness.effects("mailer", MAIL) == 1
        assert outcome == "REFUSED"
        assert of_operation(settings, MAIL, "dispatches", Dispatch) == executes
        assert current_states(settings)[MAIL] == second
        [event] = _reported(settings, "dispositions", at)
        assert event.kind == "REPLAYED", event
        assert f"answers episode {first.entered_version}" in event.reason
        assert f"in episode {second.entered_version}" in event.reason
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()


BOOKINGS = EffectContract(
    idempotent=True,
    readback=True,
    postcondition=True,
    fencing=True,
    key_retention_s=604_800,
    reservation=True,
    reservation_hold_s=300,
    consequence="reversible-external",
)
BOOKING = "book:replayed-decision:v1"


def _grant(pub: LedgerPublisher, approval_id: str, expires_at_ms: int) -> None:
    """A reviewer's grant under policy 1 for the booking (signed by the test reviewer)."""
    pub.publish_approval(
        REVIEWER.sign(
            Approval(
                approval_id=approval_id,
                reviewer="rev",
                policy_version=1,
                expires_at_ms=expires_at_ms,
                scope_subject="customer-1",
                scope_max_amount_minor=9000,
                granted_at_ms=0,
            ),
            ledger_id=pub.settings.ledger_identity,
        )
    )


def _book(pub: LedgerPublisher, approval_id: str) -> tuple[int, int]:
    pub.publish(
        operation_id=BOOKING,
        sink="bookings",
        action="book_appointment",
        params={"account": "acct-1", "amount_minor": 5000, "currency": "GBP"},
        actor="svc",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
        approval_id=approval_id,
    )
    assert pub.last_position is not None
    _, partition, offset = pub.last_position
    return partition, offset


def test_an_admission_decision_appended_again_after_a_cancelled_reservation_admits_nothing(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("bookings", BOOKINGS)
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-unused")  # trusts the test reviewer
        can_sign(pub, settings, "ops")
        now = harness.clock.now_ms()
        pub.publish_policy(1, "ops", now)
        _grant(pub, "ap-1", now + 60_000)
        _grant(pub, "ap-2", now + 60_000)

        # Admitted under ap-1; the relay reserves and dies before confirming;
        # the policy changes meanwhile, so on resume the hold is cancelled.
        harness.arm("after_reserve_before_confirm", BOOKING)
        _book(pub, "ap-1")
        harness.start_all()
        harness.wait_quiescent(90)
        assert harness.crashed() == ["relay-0"]
        pub.publish_policy(2, "ops", now + 1_000)
        harness.restart("relay")
        harness.wait_quiescent(90)
        cancelled = current_states(settings)[BOOKING]
        assert cancelled.state == S.NEEDS_REAUTHORISATION, cancelled
        [(admitted, message)] = [
            (d, m)
            for d, m in _messages(settings, "admissions", BOOKING)
            if isinstance(d, AdmissionDecision) and d.admitted
        ]

        # ap-2 (granted under policy 1) is refused; the policy is set back to
        # 1 and ap-1 expires.
        _book(pub, "ap-2")
        harness.wait_quiescent(90)
        assert current_states(settings)[BOOKING].approval_id == "ap-2"
        pub.publish_policy(1, "ops", now + 2_000)
        harness.advance(120)
        harness.wait_quiescent(90)

        # The operation asks again under ap-1; before the kernel answers, the
        # attacker appends the kernel's first ADMITTED decision again.
        assert harness.pause("authority")
        asked = _book(pub, "ap-1")
        assert _decided(settings, "intents", asked) == "APPLIED"
        assert current_states(settings)[BOOKING].state == S.NOT_ADMITTED
        at = replay(settings, "admissions", message)
        outcome = _decided(settings, "admissions", at)
        harness.resume("authority")
        harness.wait_quiescent(90)

        # Nothing was booked; the copy was refused, and the kernel refused
        # the expired approval.
        assert harness.effects("bookings", BOOKING) == 0
        assert outcome == "REFUSED"
        final = current_states(settings)[BOOKING]
        assert final.state == S.NEEDS_REAUTHORISATION, final
        assert "expired" in final.reason
        assert harness.effects("bookings", BOOKING) == 0
        [event] = _reported(settings, "admissions", at)
        assert event.kind == "REPLAYED", event
        assert f"request of state version {admitted.request_state_version}" in event.reason
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()


REFUND = "refund:replayed-state:v1"


def test_an_old_state_record_appended_again_does_not_take_a_settled_refund_back(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        approve(pub)
        publish(pub, REFUND)
        harness.start_all()
        harness.wait_quiescent(90)
        verified = current_states(settings)[REFUND]
        assert verified.state == S.OUTCOME_VERIFIED
        assert harness.effects("payments", REFUND) == 1

        # The attacker appends the refund's EFFECT_PENDING state record again.
        [(pending, message)] = [
            (s, m)
            for s, m in _messages(settings, "state", REFUND)
            if isinstance(s, OperationState) and s.state == S.EFFECT_PENDING
        ]
        at = replay(settings, "state", message)

        # Every stage restarts: the processor restores the highest version.
        for component in ("processor", "relay", "authority"):
            harness.kill(component)
        harness.restart()
        harness.wait_quiescent(90)

        # An input for the refund now meets the settled state (a duplicate),
        # and no resume claimed it back to the sink.
        publish(pub, REFUND)
        harness.wait_quiescent(90)
        last = of_operation(settings, REFUND, "journal", JournalEntry)[-1]
        assert (last.kind, last.outcome, last.to_state) == ("Intent", "NOOP", "OUTCOME_VERIFIED")
        assert harness.effects("payments", REFUND) == 1
        sent = [
            d for d in of_operation(settings, REFUND, "dispatches", Dispatch) if d.kind != "VERIFY"
        ]
        assert len(sent) == 1, sent
        # The copy is reported.
        [event] = _reported(settings, "state", at)
        assert event.kind == "REPLAYED", event
        assert f"at version {pending.version}" in event.reason
        assert f"older than version {verified.version}" in event.reason

        # The auditor agrees: the refund's state is its highest version, and
        # the copy is listed.
        report = run_audit(settings, read_sinks=False)
        assert not [v for v in report.violations if v.operation_id == REFUND], report.violations
        assert [(r["topic"], r["partition"], r["offset"]) for r in report.replayed_records] == [
            ("state", *at)
        ]
        assert not harness.crashed() and not harness.failed()
    finally:
        pub.close()
        harness.stop()
