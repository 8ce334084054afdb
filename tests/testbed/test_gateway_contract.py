"""The reference gateway honours its own contract against a hostile caller.

Each test drives the gateway app in this process (starlette's ``TestClient``;
no socket) as a caller who may hold no token, send no key, lie about the
digest, send absurd tokens or bad bytes. Every refusal is a JSON answer with
a named ``error`` and leaves no effect; none is a 500. The last test runs the
real process to show that fault injection is off unless the testbed asks.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from ledger.clock import ManualClock
from ledger.contracts import PAYMENT_GATEWAY, UNSAFE_SINK, EffectContract
from ledger.identity import parameter_digest
from testbed.sinks.gateway import (
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    MAX_TOKEN_STEP,
    create_app,
)
from testbed.sinks.process import SinkProcess

with warnings.catch_warnings():  # starlette would rather have httpx2; httpx is what we ship
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "gateway-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PARAMS: dict[str, Any] = {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}
INPUTS: dict[str, Any] = {
    "action": "refund",
    "subject": "customer-1",
    "purpose": "fee-remediation",
    "decision_version": 1,
}

Make = Callable[..., TestClient]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    """Build gateway apps (token :data:`TOKEN`) and enter their test clients."""
    clients: list[TestClient] = []

    def build(
        contract: EffectContract = PAYMENT_GATEWAY,
        *,
        name: str = "payments",
        fault_injection: bool = False,
    ) -> TestClient:
        app = create_app(
            name,
            contract,
            tmp_path / f"{name}.sqlite",
            ManualClock(tmp_path / "clock"),
            token=TOKEN,
            fault_injection=fault_injection,
        )
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.__exit__(None, None, None)


def digest(params: dict[str, Any] = PARAMS, sink: str = "payments", version: int = 2) -> str:
    return parameter_digest(params=params, sink=sink, version=version, **INPUTS)


def body(op: str = "refund:1", **over: Any) -> dict[str, Any]:
    """A well-formed submit of ``op`` for the payments sink."""
    return {
        "operation_id": op,
        "parameter_digest": digest(),
        "params": PARAMS,
        "fencing_token": 1,
        "attempt_id": "a1",
        **INPUTS,
        **over,
    }


def post(
    client: TestClient,
    payload: dict[str, Any],
    *,
    key: str | None = "refund:1",
    auth: dict[str, str] | None = None,
) -> Any:
    headers = dict(AUTH if auth is None else auth)
    if key is not None:
        headers["Idempotency-Key"] = key
    return client.post("/operations", json=payload, headers=headers)


def effects(client: TestClient) -> dict[str, int]:
    answer = client.get("/admin/effects", headers=AUTH)
    assert answer.status_code == 200
    counts: dict[str, int] = answer.json()["effects"]
    return counts


# --- 1. authentication ------------------------------------------------------------------------


ROUTES = [
    ("POST", "/operations"),
    ("GET", "/operations/refund:1"),
    ("GET", "/accounts/acct-1"),
    ("GET", "/admin/effects"),
    ("GET", "/admin/stats"),
    ("POST", "/admin/faults"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({}, "unauthenticated"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "unauthenticated"),
        ({"Authorization": "Bearer "}, "unauthenticated"),
        ({"Authorization": "Bearer wrong-token-0123456789"}, "invalid_token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "invalid_token"),
        ({"Authorization": "Bearer t\u00e9st".encode()}, "invalid_token"),
    ],
)
def test_every_route_but_health_refuses_a_caller_without_the_token(
    make: Make, method: str, path: str, headers: dict[str, Any], error: str
) -> None:
    client = make(fault_injection=True)
    payload = body() if path == "/operations" else {"operation_id": "refund:1", "mode": "reject"}
    answer = client.request(
        method, path, json=payload if method == "POST" else None, headers=headers
    )

    assert answer.status_code == 401
    assert answer.json()["error"] == error and "sinks.json" in answer.json()["detail"]
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert effects(client) == {}
    assert client.get("/admin/stats", headers=AUTH).json()["faults_fired"] == 0


def test_health_needs_no_token_and_the_token_opens_every_route(make: Make) -> None:
    client = make()
    assert client.get("/health").json()["status"] == "ok"
    assert post(client, body()).status_code == 201
    assert client.get("/operations/refund:1", headers=AUTH).status_code == 200
    assert client.get("/accounts/acct-1", headers=AUTH).json()["credited_minor"] == 5000
    assert effects(client) == {"refund:1": 1}


def test_a_gateway_cannot_start_with_a_short_or_odd_token(tmp_path: Path) -> None:
    clock = ManualClock(tmp_path / "clock")
    for token in ("", "short", "x" * 20 + " y"):
        with pytest.raises(ValueError, match="token"):
            create_app("payments", PAYMENT_GATEWAY, tmp_path / "db", clock, token=token)


# --- 2. the key and the token the contract promises ---------------------------------------------


def test_an_idempotent_sink_refuses_a_submit_without_a_key(make: Make) -> None:
    client = make()
    answer = post(client, body(), key=None)
    assert answer.status_code == 400 and answer.json()["error"] == "idempotency_key_required"
    assert effects(client) == {}
    bad_key = post(client, body(), key="refund 1")
    assert bad_key.status_code == 400 and "Idempotency-Key" in bad_key.json()["detail"]
    assert effects(client) == {}


def test_a_fencing_sink_refuses_a_submit_without_a_token(make: Make) -> None:
    client = make()
    for payload in (
        body(fencing_token=None),
        {k: v for k, v in body().items() if k != "fencing_token"},
    ):
        answer = post(client, payload)
        assert answer.status_code == 400 and answer.json()["error"] == "fencing_token_required"
    assert effects(client) == {}


def test_a_sink_that_promises_neither_takes_a_submit_without_them(make: Make) -> None:
    client = make(UNSAFE_SINK, name="unsafe")
    payload = body(fencing_token=None, parameter_digest=digest(sink="unsafe"))
    assert post(client, payload, key=None).status_code == 201
    assert post(client, payload, key=None).status_code == 201  # no key: a second effect
    assert effects(client) == {"refund:1": 2}


# --- 3. the digest is checked against the params ----------------------------------------------


@pytest.mark.parametrize(
    "lie",
    [
        {"params": {**PARAMS, "amount_minor": 999_999}},  # params changed, digest kept
        {"params": {**PARAMS, "account": "acct-attacker"}},
        {"subject": "customer-2"},
        {"action": "charge"},
        {"decision_version": 2},
        {"parameter_digest": digest(sink="refunds")},  # a digest for another sink
        {"parameter_digest": "v2:" + "0" * 64},
        {"parameter_digest": "0" * 64},
    ],
)
def test_a_digest_that_does_not_match_the_request_is_refused(
    make: Make, lie: dict[str, Any]
) -> None:
    client = make()
    answer = post(client, body(**lie))
    assert answer.status_code == 400
    assert answer.json()["error"] == "parameter_digest_mismatch"
    assert "payments" in answer.json()["detail"]
    assert effects(client) == {}


def test_a_version_1_digest_of_an_earlier_release_is_still_accepted(make: Make) -> None:
    client = make()
    assert post(client, body(parameter_digest=digest(version=1))).status_code == 201


@pytest.mark.parametrize("missing", ["action", "subject", "purpose", "decision_version"])
def test_a_submit_without_a_digest_input_is_refused(make: Make, missing: str) -> None:
    client = make()
    payload = {k: v for k, v in body().items() if k != missing}
    answer = post(client, payload)
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_request"
    assert missing in json.dumps(answer.json()["detail"])
    assert effects(client) == {}


# --- 4. fencing tokens are bounded --------------------------------------------------------------


@pytest.mark.parametrize("token", [MAX_TOKEN_STEP + 1, 10**18, 2**63 - 1])
def test_an_absurd_fencing_token_is_refused_and_parks_nothing(make: Make, token: int) -> None:
    client = make()
    answer = post(client, body(fencing_token=token))
    assert answer.status_code == 400 and answer.json()["error"] == "fencing_token_out_of_range"
    readback = client.get(f"/operations/refund:1?fencing_token={token}", headers=AUTH)
    assert readback.status_code == 400
    # The operation's own token still works: nothing was raised.
    assert post(client, body(fencing_token=1)).status_code == 201
    # Within the step above the highest seen is a normal resume.
    assert post(client, body(fencing_token=1 + MAX_TOKEN_STEP)).status_code == 200


@pytest.mark.parametrize("token", [-1, 2**63, 2**200])
def test_a_token_outside_the_integer_range_is_a_400_not_a_500(make: Make, token: int) -> None:
    client = make()
    assert post(client, body(fencing_token=token)).status_code == 400
    assert client.get(f"/operations/refund:1?fencing_token={token}", headers=AUTH).status_code == (
        400
    )
    assert effects(client) == {}


# --- 5. fault injection only when the testbed asks ----------------------------------------------


def test_fault_injection_is_absent_unless_enabled_and_then_needs_the_token(make: Make) -> None:
    plain = make()
    fault = {"operation_id": "refund:1", "mode": "reject"}
    assert plain.post("/admin/faults", json=fault, headers=AUTH).status_code == 404
    assert post(plain, body()).status_code == 201  # no fault fired

    testbed = make(name="refunds", fault_injection=True)
    assert testbed.post("/admin/faults", json=fault).status_code == 401
    assert testbed.post("/admin/faults", json=fault, headers=AUTH).status_code == 200
    rejected = post(testbed, body(parameter_digest=digest(sink="refunds")))
    assert rejected.status_code == 422


def test_the_testbed_process_starts_fault_injection_only_when_asked(tmp_path: Path) -> None:
    fault = {"operation_id": "refund:1", "mode": "reject"}
    with SinkProcess("payments", PAYMENT_GATEWAY, tmp_path / "plain") as sink:
        auth = {"Authorization": f"Bearer {sink.token}"}
        assert httpx.post(f"{sink.url}/admin/faults", json=fault, headers=auth).status_code == 404
    with SinkProcess("payments", PAYMENT_GATEWAY, tmp_path / "on", fault_injection=True) as sink:
        assert httpx.post(f"{sink.url}/admin/faults", json=fault).status_code == 401
        with sink.client() as client:
            client.arm_fault("refund:1", "reject")  # the testbed's client holds the token
        other = SinkProcess("payments", PAYMENT_GATEWAY, tmp_path / "x")
        assert other.token != sink.token  # a random token per sink


# --- 6. bounded, well-formed bodies ---------------------------------------------------------------


def raw_post(client: TestClient, content: bytes, path: str = "/operations") -> Any:
    headers = {**AUTH, "Idempotency-Key": "refund:1", "Content-Type": "application/json"}
    return client.post(path, content=content, headers=headers)


def test_a_body_over_the_limit_is_413(make: Make) -> None:
    client = make(fault_injection=True)
    padded = body(attempt_id="a1", params={**PARAMS, "note": "x" * MAX_BODY_BYTES})
    for path in ("/operations", "/admin/faults"):
        answer = raw_post(client, json.dumps(padded).encode(), path)
        assert answer.status_code == 413 and answer.json()["error"] == "body_too_large"
    # Without a Content-Length (chunked), the limit holds as well.
    chunks = iter([b"{" + b" " * 65536] * (MAX_BODY_BYTES // 65536 + 2))
    answer = client.post("/operations", content=chunks, headers=AUTH)
    assert answer.status_code == 413
    assert effects(client) == {}


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00garbage",
        b"not json",
        b"",
        b"[1, 2]",
        b'"a string"',
        b'{"operation_id": NaN}',
        b'{"operation_id": "refund:1", "params": Infinity}',
        json.dumps(body(params="not an object")).encode(),
        json.dumps(body(params={**PARAMS, "amount_minor": "5000"})).encode(),
        json.dumps(body(params={**PARAMS, "amount_minor": 2**64})).encode(),
        json.dumps(body(params={**PARAMS, "amount_minor": 50.5})).encode(),
        json.dumps(body(fencing_token="1")).encode(),
        json.dumps(body(operation_id=7)).encode(),
        json.dumps(body(operation_id="refund\n1")).encode(),
        json.dumps(body(operation_id="r\u00e9fund:1")).encode(),
        json.dumps(body(attempt_id="\ud800")).encode(),
        json.dumps(body(params={**PARAMS, "account": "\udfff"})).encode(),
        json.dumps(body(extra_field=1)).encode(),
        b"[" * 100_000 + b"]" * 100_000,
        b'{"params": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001,
        json.dumps(
            body(params={**PARAMS, "deep": json.loads("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)})
        ).encode(),
    ],
)
def test_bad_bytes_json_and_types_are_400_with_a_message_never_500(
    make: Make, content: bytes
) -> None:
    client = make(fault_injection=True)
    for path in ("/operations", "/admin/faults"):
        answer = raw_post(client, content, path)
        assert answer.status_code == 400, (path, answer.text[:300])
        assert answer.json()["error"] == "invalid_request" and answer.json()["detail"]
    assert effects(client) == {}
    assert post(client, body()).status_code == 201  # and the gateway still works


def test_nesting_up_to_the_limit_is_accepted(make: Make) -> None:
    client = make()
    nested: Any = 1
    for _ in range(MAX_JSON_DEPTH - 2):  # the body and params are two levels
        nested = [nested]
    params = {**PARAMS, "deep": nested}
    answer = post(client, body(params=params, parameter_digest=digest(params)))
    assert answer.status_code == 201, answer.text[:300]
