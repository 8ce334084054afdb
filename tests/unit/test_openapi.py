"""The sink protocol's OpenAPI document, the toolkit that serves it, and what it answers.

The document (``sinks/openapi.json``) must be valid OpenAPI 3.1, name exactly
the routes the toolkit serves, and describe every answer: the reference
gateway's and those of a sink written in a few lines against the toolkit
alone are validated against the document's schema for their status.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from starlette.applications import Starlette
from starlette.exceptions import StarletteDeprecationWarning
from starlette.routing import Route

from ledger.cli import main
from ledger.clock import ManualClock
from ledger.contracts import PAYMENT_GATEWAY, EffectContract
from ledger.identity import parameter_digest
from sinks.client import Credit, SinkClient
from sinks.toolkit import (
    Absent,
    Committed,
    OperationFound,
    SubmitRequest,
    create_sink_app,
    fence,
    replay,
)
from testbed.sinks.gateway import create_app

with warnings.catch_warnings():  # starlette would rather have httpx2; httpx is what we ship
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

DOC: dict[str, Any] = json.loads(files("sinks").joinpath("openapi.json").read_text("utf-8"))
TOKEN = "openapi-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PARAMS = {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}
INPUTS: dict[str, Any] = {
    "action": "refund",
    "subject": "customer-1",
    "purpose": "fee-remediation",
    "decision_version": 1,
}
RESERVING = EffectContract(**{**PAYMENT_GATEWAY.model_dump(), "reservation": True})


class DictSink:
    """A conformant sink kept in dicts, written against :mod:`sinks.toolkit` alone."""

    def __init__(self) -> None:
        self.now_ms = 1_000
        self.highest: dict[str, int] = {}
        self.keys: dict[str, tuple[int, Committed]] = {}
        self.made: dict[str, list[tuple[Committed, dict[str, Any]]]] = {}

    def _fenced(self, operation_id: str, token: int | None) -> Any:
        verdict = fence(token, self.highest.get(operation_id))
        if verdict.highest is not None:
            self.highest[operation_id] = verdict.highest
        return verdict.refusal

    def submit(self, request: SubmitRequest) -> Any:
        op, key = request.operation_id, request.idempotency_key
        refused = self._fenced(op, request.fencing_token)
        if refused is not None:
            return refused
        if key is not None and key in self.keys:
            first_seen_ms, prior = self.keys[key]
            again = replay(
                prior,
                first_seen_ms=first_seen_ms,
                parameter_digest=request.parameter_digest,
                now_ms=self.now_ms,
                retention_s=PAYMENT_GATEWAY.key_retention_s,
            )
            if again is not None:
                return again
        effect = Committed(f"fx-{sum(map(len, self.made.values())) + 1}", self.now_ms,
                           parameter_digest=request.parameter_digest)  # fmt: skip
        self.made.setdefault(op, []).append((effect, dict(request.params)))
        if key is not None:
            self.keys[key] = (self.now_ms, effect)
        return effect

    def readback(self, operation_id: str, fencing_token: int | None) -> Any:
        refused = self._fenced(operation_id, fencing_token)
        if refused is not None or operation_id not in self.made:
            return refused or Absent()
        first = self.made[operation_id][0][0]
        digest = first.parameter_digest or ""
        count = len(self.made[operation_id])
        return OperationFound(first.effect_id, first.committed_ms, digest, effects=count)

    def account(self, account: str) -> list[Credit]:
        return [
            Credit(op, params["amount_minor"], effect.effect_id)
            for op, made in self.made.items()
            for effect, params in made
            if params.get("account") == account
        ]


# --- checking an answer against the document ------------------------------------------------


def _pointer(*parts: str) -> str:
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def conforms(method: str, template: str, answer: httpx.Response) -> httpx.Response:
    """Assert ``answer`` is documented for its status and valid against its schema."""
    responses = DOC["paths"][template][method.lower()]["responses"]
    status = str(answer.status_code)
    assert status in responses, f"{method} {template} answered {status}: not documented"
    where: tuple[str, ...] = ("paths", template, method.lower(), "responses", status)
    if "$ref" in responses[status]:
        where = tuple(responses[status]["$ref"].removeprefix("#/").split("/"))
    root = {**DOC, "$ref": _pointer(*where, "content", "application/json", "schema")}
    errors = [e.message for e in Draft202012Validator(root).iter_errors(answer.json())]
    assert not errors, (method, template, status, answer.json(), errors)
    return answer


def digest(sink: str, params: dict[str, Any] = PARAMS) -> str:
    return parameter_digest(params=params, sink=sink, **INPUTS)


def submit_body(sink: str, op: str, token: int = 1, **over: Any) -> dict[str, Any]:
    body = {"operation_id": op, "parameter_digest": digest(sink), "params": PARAMS}
    return {**body, "fencing_token": token, "attempt_id": "a1", **INPUTS, **over}


Make = Callable[[str], TestClient]


@pytest.fixture(params=["reference-gateway", "dict-backend"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    """The reference gateway, or the dict backend behind the toolkit (sink ``payments``)."""
    if request.param == "reference-gateway":
        clock = ManualClock(tmp_path / "clock")
        app = create_app("payments", RESERVING, tmp_path / "db", clock, token=TOKEN)
    else:
        app = create_sink_app(DictSink(), name="payments", token=TOKEN, contract=PAYMENT_GATEWAY)
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client


# --- the document ------------------------------------------------------------------------------


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(DOC)  # raises on any violation of the 3.1 schema
    assert DOC["openapi"].startswith("3.1.")
    assert "admin" not in json.dumps(DOC).lower()  # the testbed's own routes are no part of it


def _served(app: Starlette) -> set[tuple[str, str]]:
    return {
        (re.sub(r":\w+}", "}", route.path), method)
        for route in app.routes
        if isinstance(route, Route)
        for method in (route.methods or set()) - {"HEAD"}
    }


def test_the_toolkit_serves_exactly_the_documented_routes(tmp_path: Path) -> None:
    documented = {(path, method.upper()) for path, ops in DOC["paths"].items() for method in ops}
    toolkit = create_sink_app(DictSink(), name="s", token=TOKEN, contract=PAYMENT_GATEWAY)
    assert _served(toolkit) == documented
    gateway = create_app("s", RESERVING, tmp_path / "db", ManualClock(tmp_path / "c"), token=TOKEN)
    served = _served(gateway)
    assert {r for r in served if not r[0].startswith("/admin/")} == documented
    gateway.state.store.close()


def test_ledger_sink_openapi_prints_the_document(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["sink", "openapi"])
    assert result.exit_code == 0 and json.loads(result.output) == DOC
    out = tmp_path / "sink-protocol.json"
    result = CliRunner().invoke(main, ["sink", "openapi", "--output", str(out)])
    assert result.exit_code == 0 and json.loads(out.read_text()) == DOC


def test_what_the_http_adapter_sends_is_what_the_document_asks_for() -> None:
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(503, json={"status": "unavailable", "error": "down"})

    with SinkClient("http://sink.test", transport=httpx.MockTransport(answer)) as client:
        client.submit("refund:1", digest("payments"), PARAMS, 3, "a1", True, **INPUTS)
        client.reserve("refund:1", digest("payments"), PARAMS, 3, "a1", **INPUTS)
        client.confirm("refund:1", 3)
    schemas = {"/operations": "SubmitBody", "/reservations": "SubmitBody"}
    for request in sent:
        name = schemas.get(request.url.path, "HoldBody")
        root = {**DOC, "$ref": _pointer("components", "schemas", name)}
        assert not list(Draft202012Validator(root).iter_errors(json.loads(request.content)))


# --- the answers of a real sink ----------------------------------------------------------------


def test_submit_replay_conflicts_readback_and_account_answer_as_documented(
    sink: TestClient,
) -> None:
    op, post = "refund:1", "/operations"
    key = {**AUTH, "Idempotency-Key": op}
    new = conforms("POST", post, sink.post(post, json=submit_body("payments", op), headers=key))
    assert new.status_code == 201 and new.json()["replayed"] is False
    again = conforms("POST", post, sink.post(post, json=submit_body("payments", op), headers=key))
    assert again.status_code == 200 and again.json()["effect_id"] == new.json()["effect_id"]
    other = submit_body("payments", op, params={**PARAMS, "amount_minor": 1})
    other["parameter_digest"] = digest("payments", other["params"])
    reused = conforms("POST", post, sink.post(post, json=other, headers=key))
    assert reused.status_code == 409 and reused.json()["error"] == "idempotency_key_reused"
    assert sink.post(post, json=submit_body("payments", op, 3), headers=key).status_code == 200
    stale = conforms("POST", post, sink.post(post, json=submit_body("payments", op), headers=key))
    assert stale.status_code == 409 and stale.json()["highest"] == 3
    lie = submit_body("payments", op, 3, subject="someone-else")
    refused = conforms("POST", post, sink.post(post, json=lie, headers=key))
    assert refused.json()["error"] == "parameter_digest_mismatch"
    conforms("POST", post, sink.post(post, json=submit_body("payments", op)))  # 401

    read = "/operations/{operation_id}"
    found = conforms("GET", read, sink.get(f"/operations/{op}?fencing_token=3", headers=AUTH))
    assert found.status_code == 200 and found.json()["effects"] == 1
    absent = conforms("GET", read, sink.get("/operations/refund:2", headers=AUTH))
    assert absent.status_code == 404
    old = conforms("GET", read, sink.get(f"/operations/{op}?fencing_token=2", headers=AUTH))
    assert old.status_code == 409
    account = conforms("GET", "/accounts/{account}", sink.get("/accounts/acct-1", headers=AUTH))
    assert account.json()["credited_minor"] == 5000
    assert conforms("GET", "/health", sink.get("/health")).json()["name"] == "payments"


def test_reservation_answers_are_as_documented(sink: TestClient) -> None:
    op, hold = "refund:9", "/reservations/{operation_id}"
    body, key = submit_body("payments", op), {**AUTH, "Idempotency-Key": op}
    taken = conforms("POST", "/reservations", sink.post("/reservations", json=body, headers=key))
    if taken.status_code == 501:  # the dict backend declares no reservations
        return
    assert taken.status_code == 201 and taken.json()["status"] == "held"
    again = conforms("POST", "/reservations", sink.post("/reservations", json=body, headers=key))
    assert again.status_code == 200
    assert conforms("GET", hold, sink.get(f"/reservations/{op}", headers=AUTH)).status_code == 200
    settle = {"operation_id": op, "fencing_token": 1}
    done = sink.post("/reservations/confirm", json=settle, headers=AUTH)
    assert conforms("POST", "/reservations/confirm", done).json()["status"] == "confirmed"
    late = sink.post("/reservations/cancel", json=settle, headers=AUTH)
    assert conforms("POST", "/reservations/cancel", late).status_code == 409
    none = sink.get("/reservations/refund:10", headers=AUTH)
    assert conforms("GET", hold, none).status_code == 404


def test_a_backend_without_a_declared_part_cannot_be_served() -> None:
    class SubmitOnly:
        def submit(self, request: SubmitRequest) -> Any:
            return Absent()

    with pytest.raises(ValueError, match="readback"):
        create_sink_app(SubmitOnly(), name="s", token=TOKEN, contract=PAYMENT_GATEWAY)
    app = create_sink_app(SubmitOnly(), name="s", token=TOKEN, contract=EffectContract())
    with TestClient(app) as client:
        unsupported = client.get("/operations/refund:1", headers=AUTH)
        assert conforms("GET", "/operations/{operation_id}", unsupported).status_code == 501
        wrong = client.post("/operations", json=submit_body("s", "refund:1"), headers=AUTH)
        assert conforms("POST", "/operations", wrong).status_code == 500  # not a submit outcome
