"""The sink port: adapters found by name, contracts that claim no more than the adapter can do."""

from __future__ import annotations

import pytest

from ledger.contracts import EffectContract
from ledger.errors import SinkConfigError
from sinks.client import SinkClient
from sinks.port import AdapterCapabilities, SinkPort, adapter_kinds, open_sink
from sinks.registry import SinkEndpoint


def test_the_http_adapter_is_the_default_and_is_a_sink_port() -> None:
    endpoint = SinkEndpoint(url="http://127.0.0.1:1/", contract=EffectContract(), token="t0ken")
    assert endpoint.adapter == "http"
    client = open_sink(endpoint, timeout_s=0.5)
    try:
        assert isinstance(client, SinkClient) and isinstance(client, SinkPort)
        assert client.token == "t0ken" and client.timeout_s == 0.5
    finally:
        client.close()
    assert {"http", "reference"} <= set(adapter_kinds())


def test_an_unknown_adapter_names_the_known_ones_and_the_remedy() -> None:
    endpoint = SinkEndpoint(url="x://y", contract=EffectContract(), adapter="carrier-pigeon")
    with pytest.raises(SinkConfigError) as caught:
        open_sink(endpoint, timeout_s=1.0)
    assert "carrier-pigeon" in caught.value.message and "http" in caught.value.message
    assert "entry point" in caught.value.message


def test_a_contract_may_claim_no_more_than_its_adapter_offers() -> None:
    mail = AdapterCapabilities()  # no idempotency, readback, postcondition, fencing
    honest = EffectContract(consequence="reversible-external", amount_field=None)
    assert mail.overclaims(honest) == []
    boastful = EffectContract(idempotent=True, readback=True, postcondition=True)
    assert mail.overclaims(boastful) == ["idempotent", "readback", "postcondition"]
    assert AdapterCapabilities(idempotent=True, readback=True).overclaims(boastful) == [
        "postcondition"
    ]
