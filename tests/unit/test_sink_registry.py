"""The sink registry file: old files still load, new ones round-trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.contracts import ACCOUNT_CREDITS, PAYMENT_GATEWAY, UNSAFE_SINK, PostconditionQuery
from ledger.errors import LocalFileError
from sinks.registry import SinkEndpoint, load_sinks, save_sinks

#: A registry as ``ledger sink serve`` wrote it before postcondition queries were declared.
OLD_REGISTRY = {
    "payments": {
        "url": "http://127.0.0.1:8123",
        "contract": {
            "idempotent": True,
            "readback": True,
            "postcondition": True,
            "fencing": True,
            "key_retention_s": 604800,
            "consequence": "irreversible",
            "compensable": False,
            "reservation": False,
        },
    },
    "unsafe": {"url": "http://127.0.0.1:8124", "contract": {"consequence": "irreversible"}},
}


def test_a_missing_registry_is_empty(tmp_path: Path) -> None:
    assert load_sinks(tmp_path / "nowhere" / "sinks.json") == {}


def test_an_old_registry_loads_and_postcondition_true_is_the_account_credit_query(
    tmp_path: Path,
) -> None:
    path = tmp_path / "sinks.json"
    path.write_text(json.dumps(OLD_REGISTRY))

    sinks = load_sinks(path)

    assert sinks["payments"] == SinkEndpoint(url="http://127.0.0.1:8123", contract=PAYMENT_GATEWAY)
    assert sinks["payments"].contract.postcondition_query() == ACCOUNT_CREDITS
    assert sinks["unsafe"].contract == UNSAFE_SINK
    # written back, the file says what it said before (and the amount field
    # contracts name since, and the reservation hold, at their defaults)
    save_sinks(path, sinks)
    old = OLD_REGISTRY["payments"]
    assert json.loads(path.read_text()) == {
        "payments": {
            **old,
            "contract": {
                **old["contract"],
                "amount_field": "amount_minor",
                "reservation_hold_s": 300,
            },
        },
        "unsafe": {
            "url": "http://127.0.0.1:8124",
            "contract": UNSAFE_SINK.model_dump(),
        },
    }


def test_a_declared_postcondition_query_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "run" / "sinks.json"
    query = PostconditionQuery(subject_field="iban", amount_field="cents")
    endpoint = SinkEndpoint(
        url="http://127.0.0.1:9000",
        contract=PAYMENT_GATEWAY.model_copy(update={"postcondition": query}),
    )

    save_sinks(path, {"bank": endpoint})

    assert load_sinks(path) == {"bank": endpoint}
    assert load_sinks(path)["bank"].contract.postcondition_query() == query


def test_a_token_round_trips_and_the_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sinks.json"
    endpoint = SinkEndpoint(url="http://127.0.0.1:9000", contract=PAYMENT_GATEWAY, token="t" * 32)

    save_sinks(path, {"payments": endpoint})

    assert load_sinks(path) == {"payments": endpoint}
    assert json.loads(path.read_text())["payments"]["token"] == "t" * 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert "t" * 32 not in repr(endpoint)  # not in logs or tracebacks


def test_an_empty_token_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sinks.json"
    path.write_text(json.dumps({"payments": {"url": "http://x", "contract": {}, "token": ""}}))
    with pytest.raises(LocalFileError, match="sinks.json"):
        load_sinks(path)
