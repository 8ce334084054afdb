"""A failure while the relay handles one dispatch stays with that operation.

A sink answering outside its protocol (or any other error while handling one
dispatch) must not stop the relay: the execution is held as ambiguous, a
readback or postcondition is observed UNKNOWN, and an operating event names
the error. Kafka errors still go to the stage loop. A sink that refuses the
relay's bearer token made no effect: the execution is UNAVAILABLE (retried),
never REJECTED, with a SINK_AUTH_FAILED operating event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.relay import Relay
from ledger.contracts import PAYMENT_GATEWAY
from ledger.errors import SinkProtocolError
from ledger.events import Dispatch, EffectReceipt, OperatingEvent, Readback
from ledger.settings import LedgerSettings
from sinks.client import SinkClient
from sinks.registry import SinkEndpoint, load_sinks, save_sinks
from tests.helpers import keyed


def _dispatch(kind: str) -> Dispatch:
    return Dispatch(
        dispatch_id=f"refund:1:v1#1.{kind}",
        operation_id="refund:1:v1",
        kind=kind,  # type: ignore[arg-type]
        sink="payments",
        action="refund",
        params_json='{"account":"acct-1","amount_minor":1}',
        parameter_digest="0" * 64,
        fencing_token=3,
        state_version=2,
    )


class _Failing:
    """A sink adapter whose every request fails with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        if name == "close":
            return lambda: None

        def fail(*args: object, **kwargs: object) -> object:
            raise self.error

        return fail


def _failing_relay(tmp_path: Path, error: Exception) -> Relay:
    """A relay whose 'payments' adapter (given through its constructor) raises ``error``."""
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    save_sinks(
        settings.sinks_path(),
        {"payments": SinkEndpoint(url="http://sink.test", contract=PAYMENT_GATEWAY)},
    )
    return Relay(settings, open_client=lambda name, endpoint: _Failing(error))


@pytest.mark.parametrize(
    "kind, topic, status",
    [
        ("EXECUTE", "receipts", "AMBIGUOUS"),
        ("READBACK", "readbacks", "UNKNOWN"),
        ("VERIFY", "readbacks", "UNKNOWN"),
    ],
)
def test_a_protocol_error_is_held_for_its_operation(
    tmp_path: Path, kind: str, topic: str, status: str
) -> None:
    error = SinkProtocolError("GET", "/operations/x", 404, "not json")
    relay = _failing_relay(tmp_path, error)
    outputs = relay.dispatcher.perform_safely(_v2_dispatch(kind), fresh=True)
    (first_topic, key, outcome), (event_topic, _, event) = outputs
    assert (first_topic, key) == (topic, "refund:1:v1")
    assert isinstance(outcome, EffectReceipt | Readback) and outcome.status == status
    assert "SinkProtocolError" in (outcome.detail or "")
    assert event_topic == "operating-events" and isinstance(event, OperatingEvent)
    assert event.kind == "SINK_PROTOCOL_ERROR" and event.operation_id == "refund:1:v1"


def test_kafka_errors_still_reach_the_stage_loop(tmp_path: Path) -> None:
    relay = _failing_relay(tmp_path, KafkaException(KafkaError(KafkaError._TRANSPORT, "down")))
    with pytest.raises(KafkaException):
        relay.dispatcher.perform_safely(_v2_dispatch("EXECUTE"), fresh=True)


# --- a sink that refuses the relay's token -----------------------------------------------------

GOOD_TOKEN = "the-sinks-token-0123456789"


def _v2_dispatch(kind: str) -> Dispatch:
    return _dispatch(kind).model_copy(
        update={"subject": "customer-1", "purpose": "fee-remediation", "decision_version": 1}
    )


def _relay_with_sink(tmp_path: Path, registered_token: str) -> tuple[Relay, list[str | None]]:
    """A relay whose 'payments' sink answers 401 unless it is sent :data:`GOOD_TOKEN`."""
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    save_sinks(
        settings.sinks_path(),
        {
            "payments": SinkEndpoint(
                url="http://sink.test", contract=PAYMENT_GATEWAY, token=registered_token
            )
        },
    )
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != f"Bearer {GOOD_TOKEN}":
            return httpx.Response(401, json={"error": "invalid_token"})
        if request.method == "POST":
            body = {"status": "committed", "effect_id": "e-1", "committed_ms": 0}
            return httpx.Response(201, json=body)
        return httpx.Response(404, json={"status": "absent"})

    def client(name: str, endpoint: SinkEndpoint) -> SinkClient:
        return SinkClient(endpoint.url, token=endpoint.token, transport=httpx.MockTransport(answer))

    relay = Relay(settings, open_client=client)
    return relay, seen


@pytest.mark.parametrize(
    "kind, topic, status",
    [("EXECUTE", "receipts", "UNAVAILABLE"), ("READBACK", "readbacks", "UNKNOWN")],
)
def test_a_refused_token_is_an_outage_with_an_operating_event_never_a_rejection(
    tmp_path: Path, kind: str, topic: str, status: str
) -> None:
    relay, seen = _relay_with_sink(tmp_path, registered_token="an-old-token-0123456789")
    (first_topic, key, outcome), (event_topic, _, event) = relay.dispatcher.perform_safely(
        _v2_dispatch(kind), fresh=True
    )
    assert seen == ["Bearer an-old-token-0123456789"]
    assert (first_topic, key) == (topic, "refund:1:v1")
    assert isinstance(outcome, EffectReceipt | Readback) and outcome.status == status
    assert isinstance(event, OperatingEvent) and event_topic == "operating-events"
    assert event.kind == "SINK_AUTH_FAILED"
    assert "payments" in event.reason and "sinks.json" in event.reason and "token" in event.reason


def test_a_refused_token_after_a_send_that_may_have_arrived_is_held_ambiguous(
    tmp_path: Path,
) -> None:
    """A resume reads back first: a 401 there says nothing about the earlier send."""
    relay, seen = _relay_with_sink(tmp_path, registered_token="an-old-token-0123456789")
    relay.book.attempts["refund:1:v1#1.EXECUTE"] = 0  # an earlier run marked it attempted
    (_, _, receipt), (_, _, event) = relay.dispatcher.perform_safely(
        _v2_dispatch("EXECUTE"), fresh=False
    )
    assert len(seen) == 1  # one request, refused
    assert isinstance(receipt, EffectReceipt) and receipt.status == "AMBIGUOUS"
    assert "may have reached payments" in receipt.detail
    assert isinstance(event, OperatingEvent) and event.kind == "SINK_AUTH_FAILED"


def test_a_corrected_token_in_the_registry_is_used_without_a_restart(tmp_path: Path) -> None:
    relay, seen = _relay_with_sink(tmp_path, registered_token="an-old-token-0123456789")
    refused = relay.dispatcher.perform_safely(_v2_dispatch("EXECUTE"), fresh=True)
    assert refused[0][2].status == "UNAVAILABLE"  # type: ignore[attr-defined]

    registry = relay.settings.sinks_path()
    endpoint = load_sinks(registry)["payments"]
    save_sinks(registry, {"payments": endpoint.model_copy(update={"token": GOOD_TOKEN})})
    (topic, _, receipt), *_ = relay.dispatcher.perform_safely(_v2_dispatch("EXECUTE"), fresh=True)

    assert seen[-1] == f"Bearer {GOOD_TOKEN}"
    assert topic == "receipts" and isinstance(receipt, EffectReceipt)
    assert receipt.status == "COMMITTED"


def test_a_dispatch_without_the_digest_inputs_is_held_not_sent(tmp_path: Path) -> None:
    relay, seen = _relay_with_sink(tmp_path, registered_token=GOOD_TOKEN)
    (topic, _, receipt), (_, _, event) = relay.dispatcher.perform_safely(
        _dispatch("EXECUTE"), fresh=True
    )
    assert seen == []  # never sent
    assert isinstance(receipt, EffectReceipt) and receipt.status == "AMBIGUOUS"
    assert isinstance(event, OperatingEvent) and "schema version 2" in event.reason
