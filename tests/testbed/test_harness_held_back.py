"""The harness names the partitions an open transaction holds back (a stalled run's report)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from testbed.harness import Harness

pytestmark = pytest.mark.integration


def test_an_open_transaction_is_named_until_it_commits(ledger_settings: LedgerSettings) -> None:
    harness = Harness(ledger_settings, create=False)
    topic = ledger_settings.topic("intents")
    producer = Producer(
        producer_config(ledger_settings, **{"transactional.id": f"{topic}.held-back-test"})
    )
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=b"v", partition=1)
        producer.flush(30)
        held = harness.held_back([topic])
        assert list(held) == [f"{topic}[1]"]
        stable, high = held[f"{topic}[1]"]
        assert stable < high
        producer.commit_transaction(30)
        # The commit markers are written after EndTxn is answered: poll briefly.
        deadline = time.monotonic() + 30
        while (held := harness.held_back([topic])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert held == {}
    finally:
        harness.stop()
