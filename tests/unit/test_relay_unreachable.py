"""The relay's handling of a request that never reached its sink (no broker).

A refused connection or a sink missing from the registry parks the dispatch
for another try (no outputs, the offset held back at it); the budget spent,
the relay records the request as never delivered with an operating event.
What is retried is what could not be sent: after an ambiguous send only the
readback, never a second send.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from consumers.relay import Relay
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Dispatch, EffectReceipt, OperatingEvent, Readback
from ledger.settings import LedgerSettings
from sinks.client import SinkClient
from sinks.registry import RegistryFile, SinkEndpoint, save_sinks
from tests.helpers import keyed

URL = "http://127.0.0.1:9"


def _dispatch(sink: str = "payments", kind: str = "EXECUTE") -> Dispatch:
    return Dispatch(
        dispatch_id="refund:1:v1#1.1",
        operation_id="refund:1:v1",
        kind=kind,  # type: ignore[arg-type]
        sink=sink,
        action="refund",
        params_json='{"account":"a","amount_minor":1}',
        parameter_digest="0" * 64,
        fencing_token=1,
        state_version=2,
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
    )


class Sink:
    """A mock transport: refuses connections, or times out after sending a submit."""

    def __init__(self, submit: str = "refuse", readback: str = "refuse") -> None:
        self.submit, self.readback = submit, readback
        self.posts = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        mode = self.submit if request.method == "POST" else self.readback
        if request.method == "POST":
            self.posts += 1
        if mode == "refuse":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if mode == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(404, json={"status": "absent"})


def _relay(tmp_path: Path, sink: Sink, attempts: int = 3) -> Relay:
    settings = keyed(
        LedgerSettings(run_dir=tmp_path, sink_retry_attempts=attempts, sink_retry_backoff_s=0.0)
    )
    save_sinks(settings.sinks_path(), {"payments": SinkEndpoint(url=URL, contract=PAYMENT_GATEWAY)})
    relay = Relay(settings)
    relay.sinks.clients["payments"] = SinkClient(URL, transport=httpx.MockTransport(sink))
    return relay


def test_a_refused_connection_parks_the_dispatch_and_holds_its_offset(tmp_path: Path) -> None:
    relay = _relay(tmp_path, Sink())
    d = _dispatch()
    assert relay.parking.attempt(d, 0, 5, fresh=True) == []
    parked = relay.parking.parked[d.dispatch_id]
    assert parked.fresh and parked.failures == 1 and parked.readback_on_resume is None
    topic = relay.settings.topic("dispatches")
    held = relay.parking.held_back(
        [TopicPartition(topic, 0, 9), TopicPartition(topic, 1, 9)], topic
    )
    assert [(tp.partition, tp.offset) for tp in held] == [(0, 5), (1, 9)]


def test_the_spent_budget_records_the_request_as_never_delivered(tmp_path: Path) -> None:
    sink = Sink()
    relay = _relay(tmp_path, sink, attempts=3)
    d = _dispatch()
    for _ in range(2):
        relay.retries.run(commit_offsets=False)  # a new pass (no producer: tries nothing)
        assert relay.parking.attempt(d, 0, 5, fresh=True) == []
        assert relay.parking.parked[d.dispatch_id].fresh  # nothing left: still a first send
    relay.retries.run(commit_offsets=False)
    (_, _, receipt), (topic, _, event) = relay.parking.attempt(d, 0, 5, fresh=True)
    assert isinstance(receipt, EffectReceipt) and receipt.status == "UNREACHABLE"
    assert "Connection refused" in receipt.detail and "tried 3 times" in receipt.detail
    assert topic == "operating-events" and isinstance(event, OperatingEvent)
    assert event.kind == "SINK_UNREACHABLE" and "never reached sink payments" in event.reason
    assert relay.parking.parked == {} and sink.posts == 3
    assert relay.parking.held_back([TopicPartition("x", 0, 9)], topic)[0].offset == 9


def test_a_sink_missing_from_the_registry_is_retried_then_named(tmp_path: Path) -> None:
    relay = _relay(tmp_path, Sink(), attempts=2)
    d = _dispatch(sink="paymnets")
    assert relay.parking.attempt(d, 0, 1, fresh=True) == []
    (_, _, receipt), (_, _, event) = relay.parking.attempt(d, 0, 1, fresh=True)
    assert isinstance(receipt, EffectReceipt) and receipt.status == "UNREACHABLE"
    assert isinstance(event, OperatingEvent) and event.kind == "UNKNOWN_SINK"
    assert "'paymnets' is not registered" in event.reason
    assert str(relay.settings.sinks_path()) in event.reason


def test_after_an_ambiguous_send_only_the_readback_is_retried(tmp_path: Path) -> None:
    sink = Sink(submit="timeout", readback="refuse")
    relay = _relay(tmp_path, sink)
    d = _dispatch()
    assert relay.parking.attempt(d, 0, 3, fresh=True) == []
    parked = relay.parking.parked[d.dispatch_id]
    assert not parked.fresh and parked.readback_on_resume is False
    sink.readback = "absent"  # the sink is back
    relay.retries.run(commit_offsets=False)
    (topic, _, readback), *_ = relay.parking.attempt(
        d, 0, 3, fresh=parked.fresh, readback_on_resume=parked.readback_on_resume
    )
    assert topic == "readbacks" and isinstance(readback, Readback)
    assert readback.status == "ABSENT" and not readback.on_resume
    assert sink.posts == 1  # never sent a second time


@pytest.mark.parametrize("kind", ["READBACK", "VERIFY"])
def test_an_observation_that_cannot_be_asked_ends_unknown(tmp_path: Path, kind: str) -> None:
    relay = _relay(tmp_path, Sink(), attempts=1)
    outputs = relay.parking.attempt(_dispatch(kind=kind), 0, 3, fresh=False)
    (topic, _, readback), (_, _, event) = outputs
    assert topic == "readbacks" and isinstance(readback, Readback)
    assert readback.status == "UNKNOWN" and "Connection refused" in readback.detail
    assert isinstance(event, OperatingEvent) and event.kind == "SINK_UNREACHABLE"


def test_the_registry_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "sinks.json"
    registry = RegistryFile(path)
    assert registry.current() == {} and registry.problem("payments") is not None
    save_sinks(path, {"payments": SinkEndpoint(url=URL, contract=PAYMENT_GATEWAY)})
    assert registry.problem("payments") is None
    assert "registered: payments" in (registry.problem("paymnets") or "")
    path.write_text("{not json")
    os.utime(path, ns=(1, 1))  # a change, whatever the clock's resolution
    problem = registry.problem("payments") or ""
    assert "unreadable" in problem and str(path) in problem


def test_a_sink_that_does_not_answer_is_asked_once_per_pass(tmp_path: Path) -> None:
    sink = Sink()
    relay = _relay(tmp_path, sink, attempts=3)
    first = _dispatch()
    second = first.model_copy(
        update={"dispatch_id": "refund:2:v1#1.1", "operation_id": "refund:2:v1"}
    )
    relay.retries.run(commit_offsets=False)  # a new pass
    assert relay.parking.attempt(first, 0, 1, fresh=True) == []
    assert relay.parking.attempt(second, 0, 2, fresh=True) == []
    assert sink.posts == 1  # the second was parked without a request
    parked = relay.parking.parked[second.dispatch_id]
    assert parked.fresh and "not tried" in parked.last.detail
    relay.retries.run(commit_offsets=False)  # the next pass asks again
    assert relay.parking.attempt(second, 0, 2, fresh=True) == []
    assert sink.posts == 2


class FakeProducer:
    """Records transactions: each a list of (topic, key) produced in it."""

    def __init__(self) -> None:
        self.transactions: list[list[tuple[str, bytes]]] = []

    def begin_transaction(self) -> None:
        self.transactions.append([])

    def produce(self, topic: str, key: bytes, value: bytes | None, headers: object = None) -> None:
        assert headers, "every record a stage writes is sealed"
        self.transactions[-1].append((topic, key))

    def poll(self, timeout: float) -> int:
        return 0

    def send_offsets_to_transaction(
        self, offsets: list[Any], metadata: object, timeout: float
    ) -> None:
        if self.refuse_offsets:
            raise KafkaException(KafkaError(KafkaError.FENCED_INSTANCE_ID))
        self.transactions[-1] += [
            ("offsets", f"{tp.partition}@{tp.offset}".encode()) for tp in offsets
        ]

    def commit_transaction(self, timeout: float) -> None:
        pass

    #: the group coordinator refuses this member's offsets (a zombie)
    refuse_offsets = False


class FakeMember:
    """The relay's consumer as far as a membership proof needs it."""

    def consumer_group_metadata(self) -> object:
        return object()


def test_due_retries_commit_their_outcomes(tmp_path: Path) -> None:
    from ledger.contracts import EffectContract

    relay = _relay(tmp_path, Sink(), attempts=3)
    unsafe = EffectContract()  # no readback: its receipt is committed just after its send
    registry = {
        "payments": SinkEndpoint(url=URL, contract=PAYMENT_GATEWAY),
        "mailer": SinkEndpoint(url=URL, contract=unsafe),
    }
    save_sinks(relay.settings.sinks_path(), registry)

    def committed(request: httpx.Request) -> httpx.Response:
        body = {"status": "committed", "effect_id": "e-1", "committed_ms": 0}
        return httpx.Response(201, json=body)

    refund = _dispatch()
    mail = _dispatch(sink="mailer").model_copy(
        update={"dispatch_id": "mail:1:v1#1.1", "operation_id": "mail:1:v1"}
    )
    for n, d in enumerate([refund, mail]):
        relay.retries.run(commit_offsets=False)
        relay.sinks.clients[d.sink] = SinkClient(URL, transport=httpx.MockTransport(Sink()))
        assert relay.parking.attempt(d, n, 7, fresh=True) == []
    for name in ("payments", "mailer"):
        relay.sinks.clients[name] = SinkClient(URL, transport=httpx.MockTransport(committed))
    for p in relay.parking.parked.values():
        p.next_at = 0.0  # due now
    fake = FakeProducer()
    relay.producer = fake  # type: ignore[assignment]
    relay.consumer = FakeMember()  # type: ignore[assignment]
    relay.batch_starts = [TopicPartition(relay.settings.topic("dispatches"), 0, 9)]
    relay.retries.run(commit_offsets=False)
    assert relay.parking.parked == {}
    assert {refund.dispatch_id, mail.dispatch_id} <= relay.book.completed
    receipts = relay.settings.topic("receipts")
    # First the proof that the relay is still in its group (the batch's start,
    # held back at the parked dispatch's offset), then the mail's receipt
    # alone in its own transaction, then the refund's.
    assert fake.transactions == [
        [("offsets", b"0@7")],
        [(receipts, b"mail:1:v1")],
        [(receipts, b"refund:1:v1")],
    ]


def test_a_zombie_tries_no_parked_dispatch_again(tmp_path: Path) -> None:
    calls: list[str] = []

    def committed(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        return httpx.Response(
            201, json={"status": "committed", "effect_id": "e", "committed_ms": 0}
        )

    relay = _relay(tmp_path, Sink(), attempts=3)
    d = _dispatch()
    assert relay.parking.attempt(d, 0, 7, fresh=True) == []
    relay.sinks.clients["payments"] = SinkClient(URL, transport=httpx.MockTransport(committed))
    relay.parking.parked[d.dispatch_id].next_at = 0.0
    fake = FakeProducer()
    fake.refuse_offsets = True  # the group moved on while this relay was paused
    relay.producer = fake  # type: ignore[assignment]
    relay.consumer = FakeMember()  # type: ignore[assignment]
    relay.batch_starts = [TopicPartition(relay.settings.topic("dispatches"), 0, 7)]
    with pytest.raises(KafkaException):
        relay.retries.run(commit_offsets=False)
    assert calls == [] and d.dispatch_id in relay.parking.parked
