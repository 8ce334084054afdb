"""A stage whose consumer silently stopped fetching replaces it and reads on.

After a full-cluster restart in the three-broker chaos mission a consumer
kept its partitions and fetched nothing, with no error: the ledger stood
still while every stage looked idle (see :mod:`consumers.fetchwatch`).
Here a real consumer is made to behave so by pausing every partition it is
assigned (it then fetches nothing and reports nothing); the intent published
afterwards must still get its state, through a new consumer.
"""

from __future__ import annotations

import threading
import time

import pytest

from consumers.fetchwatch import FetchWatch
from consumers.processor import Processor
from consumers.reader import current_states
from consumers.runtime.clients import Clients
from consumers.runtime.watches import FetchCheck
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher

pytestmark = pytest.mark.integration


class SilentProcessor(Processor):
    """A processor whose first consumer stops fetching once it is idle and assigned."""

    def __init__(self, settings: LedgerSettings) -> None:
        clients = Clients(settings, self.component, "0")
        # Sampled every 0.2 s, a partition behind for 2 s is a stall (not 30 s).
        fetch = FetchCheck(clients, FetchWatch(2.0), every_s=0.2)
        super().__init__(settings, clients=clients, fetch=fetch)
        self.silenced = threading.Event()

    def idle(self) -> None:
        super().idle()
        if self.silenced.is_set() or self.consumer is None:
            return
        assignment = self.consumer.assignment()
        if assignment:
            self.consumer.pause(assignment)
            self.silenced.set()


def test_a_consumer_that_stopped_fetching_is_replaced_and_the_intent_processed(
    ledger_settings: LedgerSettings,
) -> None:
    stage = SilentProcessor(ledger_settings)
    thread = threading.Thread(target=stage.run, daemon=True)
    thread.start()
    pub = LedgerPublisher(ledger_settings)
    op = "refund:silent:v1"
    try:
        assert stage.silenced.wait(90), "the processor was never assigned its partitions"
        pub.publish(
            operation_id=op,
            sink="payments",
            action="refund",
            params={"account": "acct-1", "amount_minor": 5000, "currency": "GBP"},
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id="ap-silent",
        )
        deadline = time.monotonic() + 90
        states = current_states(ledger_settings)
        while op not in states and time.monotonic() < deadline:
            time.sleep(0.2)  # the pace of the reads, not a synchronisation
            states = current_states(ledger_settings)
    finally:
        pub.close()
        stage.stopping = True
        thread.join(30)
    assert op in states, "the silenced consumer was never replaced: the intent has no state"
    assert stage.fetch_stalls >= 1  # a loaded machine may need a second replacement
