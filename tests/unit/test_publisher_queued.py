"""Publishing without waiting (``wait=False``) and one :meth:`LedgerPublisher.flush`.

A driver that publishes in bulk queues its records and waits once; each
record is the one a waited-for publish sends (same topic, key, value and
seal), and ``flush`` reports a record the broker refused or did not
acknowledge. The broker is a fake producer that acknowledges when told to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from ledger.errors import LedgerError
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from tests import helpers

TRACE_HEADERS = ("traceparent", "tracestate")


@dataclass
class _Message:
    _topic: str
    _offset: int

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


@dataclass
class FakeProducer:
    """Queues what is produced; delivers it on ``poll``/``flush`` once the broker acks."""

    acks: bool = True
    refuse: KafkaError | None = None
    records: list[tuple[str, bytes, bytes, list[Any]]] = field(default_factory=list)
    queued: list[tuple[Any, _Message]] = field(default_factory=list)

    def produce(
        self, topic: str, *, key: bytes, value: bytes, headers: Any, on_delivery: Any
    ) -> None:
        headers = [h for h in headers or [] if h[0] not in TRACE_HEADERS]
        self.records.append((topic, key, value, headers))
        self.queued.append((on_delivery, _Message(topic, len(self.records) - 1)))

    def poll(self, timeout: float) -> int:
        if not self.acks:
            return 0
        done, self.queued = self.queued, []
        for callback, msg in done:
            callback(self.refuse, msg)
        return len(done)

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return len(self.queued)


def _publisher(tmp_path: Path, producer: FakeProducer) -> LedgerPublisher:
    settings = LedgerSettings(bootstrap_servers="127.0.0.1:1", run_dir=tmp_path)
    pub = LedgerPublisher(settings, send_timeout_s=1.0)
    pub.producer = producer  # type: ignore[assignment]
    return pub


def test_a_queued_record_is_the_record_a_waited_for_publish_sends(tmp_path: Path) -> None:
    waited, queued = FakeProducer(), FakeProducer(acks=False)
    intent, grant = helpers.intent(), helpers.approval()
    pub = _publisher(tmp_path, waited)
    pub.publish_approval(grant)
    assert pub.publish_intent(intent).operation_id == intent.operation_id
    later = _publisher(tmp_path, queued)
    later.publish_approval(grant, wait=False)
    assert later.publish_intent(intent, wait=False) is None  # returned with nothing acked
    assert queued.records == waited.records
    assert [r[0].rsplit(".", 1)[-1] for r in queued.records] == ["approvals", "intents"]


def test_flush_waits_for_every_queued_record_and_names_what_is_missing(tmp_path: Path) -> None:
    broker = FakeProducer(acks=False)
    pub = _publisher(tmp_path, broker)
    for i in range(3):
        pub.publish_intent(helpers.intent(op=f"refund:c{i}:v1"), wait=False)
    with pytest.raises(LedgerError, match="3 record"):
        pub.flush(timeout_s=0)
    broker.acks = True
    pub.flush()
    assert pub.last_position == ("intents", 0, 2)


def test_flush_reports_a_refused_record_once(tmp_path: Path) -> None:
    broker = FakeProducer(refuse=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    pub = _publisher(tmp_path, broker)
    pub.publish_intent(helpers.intent(), wait=False)
    with pytest.raises(LedgerError, match="1 record.*intents"):
        pub.flush()
    pub.flush()  # reported; nothing else is pending
