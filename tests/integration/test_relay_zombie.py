"""A relay that lost its partitions while paused (a zombie) sends nothing its successor sent.

The zombie holds a batch with a dispatch to a sink that has neither
idempotency keys nor readback (a mailer): the only thing that stops a second
email is the ``ATTEMPTED`` marker committed before the send. Its successor
took over the partitions, read no marker and sent the email. When the zombie
wakes up, its own marker's transaction must fail (it carries the group's
offsets, which the coordinator refuses from a member that is no longer in
the group, KIP-447), so it sends nothing. The zombie's producer has its own
transactional ID, as a second live instance's has: nothing fences it but
the group.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaException

from consumers.reader import read_topic
from consumers.relay import Relay
from ledger.contracts import EffectContract
from ledger.events import Dispatch
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration

#: No idempotency key, no readback: a resend is a second email.
MAILER = EffectContract(consequence="reversible-external", amount_field=None)


def _wait(condition, what: str, timeout_s: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)  # polling for a condition


def test_a_zombie_relay_cannot_mark_and_send_what_its_successor_sent(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    op = "notify:zombie:v1"
    harness = Harness(settings, create=False)
    harness.start_sink("mailer", MAILER)
    pub = LedgerPublisher(settings)
    zombie = Relay(settings, instance="z")
    successor = Relay(settings, instance="z")
    thread = threading.Thread(target=successor.run, daemon=True)
    try:
        approve(pub, "ap-mail")
        pub.publish(
            operation_id=op,
            sink="mailer",
            action="send_email",
            params={"to": "customer-1", "template": "fee-refund-confirmation"},
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id="ap-mail",
        )
        harness.start("processor")
        harness.start("authority")

        # The zombie joins the relay's group and takes the batch holding the dispatch.
        zombie.transactional_id += ".zombie"  # its own, as another instance's would be
        zombie.txn.new_producer()
        zombie.consumer = zombie.assignment.new_member()
        zombie.assignment.subscribe()
        batch = []
        deadline = time.monotonic() + 90
        while not any(m.error() is None and m.key() == op.encode() and m.value() for m in batch):
            assert time.monotonic() < deadline, "the zombie never received the dispatch"
            batch += [m for m in zombie.consumer.consume(10, 0.5) if m.error() is None]
        assert zombie.assigned, "the zombie holds the dispatches' partitions"

        # Paused past its session: its successor (the same static member, a new
        # process) takes the partitions and sends the email, once.
        thread.start()
        _wait(lambda: harness.effects("mailer", op) == 1, "the successor never sent the email")

        # The zombie wakes up and goes on with its batch: its marker cannot commit.
        with pytest.raises(KafkaException):
            zombie.loop.process(batch)
        assert harness.effects("mailer", op) == 1, "the zombie sent the email again"
        dispatches = [
            r.event for r in read_topic(settings, "dispatches") if isinstance(r.event, Dispatch)
        ]
        assert [d.operation_id for d in dispatches] == [op]
    finally:
        successor.stopping = True
        if thread.is_alive():
            thread.join(60)
        zombie.close()
        pub.close()
        harness.stop()
