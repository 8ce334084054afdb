"""A failure while the relay handles one dispatch stays with that operation.

A sink answering outside its protocol (or any other error while handling one
dispatch) must not stop the relay: the execution is held as ambiguous, a
readback or postcondition is observed UNKNOWN, and an operating event names
the error. Kafka errors still go to the stage loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.relay import Relay
from ledger.errors import SinkProtocolError
from ledger.events import Dispatch, EffectReceipt, OperatingEvent, Readback
from ledger.settings import LedgerSettings


def _dispatch(kind: str) -> Dispatch:
    return Dispatch(
        dispatch_id=f"refund:1:v1#1.{kind}",
        operation_id="refund:1:v1",
        kind=kind,  # type: ignore[arg-type]
        sink="payments",
        action="refund",
        params_json='{"amount_minor":1}',
        parameter_digest="0" * 64,
        fencing_token=3,
        state_version=2,
    )


def _failing_relay(tmp_path: Path, error: Exception) -> Relay:
    relay = Relay(LedgerSettings(run_dir=tmp_path))

    def perform(d: Dispatch, *, fresh: bool) -> list[object]:
        raise error

    relay._perform = perform  # type: ignore[method-assign,assignment]
    return relay


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
    outputs = relay._perform_safely(_dispatch(kind), fresh=True)
    (first_topic, key, outcome), (event_topic, _, event) = outputs
    assert (first_topic, key) == (topic, "refund:1:v1")
    assert isinstance(outcome, EffectReceipt | Readback) and outcome.status == status
    assert "SinkProtocolError" in (outcome.detail or "")
    assert event_topic == "operating-events" and isinstance(event, OperatingEvent)
    assert event.kind == "SINK_PROTOCOL_ERROR" and event.operation_id == "refund:1:v1"


def test_kafka_errors_still_reach_the_stage_loop(tmp_path: Path) -> None:
    relay = _failing_relay(tmp_path, KafkaException(KafkaError(KafkaError._TRANSPORT, "down")))
    with pytest.raises(KafkaException):
        relay._perform_safely(_dispatch("EXECUTE"), fresh=True)
