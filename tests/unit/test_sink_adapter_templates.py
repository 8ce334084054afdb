"""What the configurable adapters send: templates filled, keys and IDs encoded (no server)."""

from __future__ import annotations

import json

import httpx
import pytest

from ledger.errors import SinkConfigError
from sinks.adapters.idempotency_key import KeyedApiAdapter, KeyedApiConfig
from sinks.adapters.smtp import message_id, operation_id_of


def test_a_body_template_keeps_types_and_the_key_header_is_sent() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"refund_id": "rf_1"})

    config = KeyedApiConfig.model_validate(
        {
            "submit": {
                "method": "PUT",
                "path": "/accounts/{account}/refunds",
                "body": {"amount": "{amount_minor}", "memo": "op {operation_id}", "fixed": 3},
            },
            "effect_id_field": "refund_id",
        }
    )
    sink = KeyedApiAdapter(
        "http://api.invalid", config, timeout_s=1.0, transport=httpx.MockTransport(answer)
    )
    params = {"account": "acct 1/2", "amount_minor": 750}
    result = sink.submit("refund:1:v2", "d", params, None, "a", True, idempotency_key="k-1")
    assert (result.status, result.effect_id) == ("committed", "rf_1")
    [request] = seen
    assert request.method == "PUT"
    assert request.url.raw_path == b"/accounts/acct%201%2F2/refunds"
    assert request.headers["Idempotency-Key"] == "k-1"
    assert json.loads(request.content) == {"amount": 750, "memo": "op refund:1:v2", "fixed": 3}


def test_a_template_naming_an_absent_value_sends_nothing() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing may be sent")

    config = KeyedApiConfig.model_validate(
        {"submit": {"path": "/refunds", "body": {"amount": "{amount}"}}}
    )
    sink = KeyedApiAdapter(
        "http://api.invalid", config, timeout_s=1.0, transport=httpx.MockTransport(answer)
    )
    with pytest.raises(SinkConfigError, match="config.submit"):
        sink.submit("refund:2:v1", "d", {"amount_minor": 1}, None, "a", True)


@pytest.mark.parametrize("operation_id", ["notify:1842:v3", "a.b/c d", "x=3A", "ü:ß"])
def test_a_message_id_carries_the_operation_id_both_ways(operation_id: str) -> None:
    value = message_id(operation_id)
    assert value.startswith("<") and value.endswith("@ledger>")
    assert all(ch.isalnum() or ch in "-_=" for ch in value[1:-8])
    assert operation_id_of(value) == operation_id


def test_an_unknown_message_id_names_no_operation() -> None:
    assert operation_id_of("<abc@example.invalid>") is None
    assert operation_id_of("<a=ZZ@ledger>") is None
