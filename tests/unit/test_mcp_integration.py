"""The MCP gateway's logic, with the SDK's own client and a fake ledger service (no Kafka).

The fake admits an operation only under an approval ID a "reviewer" granted
for that operation, and after that answers every perform of it with the same
``Verified`` (as the ledger does): what is checked here is what the gateway
asks, retries and returns, not the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult

from ledger.errors import DeliveryUnknownError
from producers.integrations.mcp_gateway import (
    APPROVAL_INPUT,
    LedgerGateway,
    ToolCall,
    build_server,
    next_approval_id,
    pending_from_question,
)
from producers.sdk import Held, NeedsReauthorisation, Outcome, Pending, Refused, Verified

REFUND = {"case_id": "1842", "account": "acct-1842", "amount_minor": 5000, "currency": "GBP"}


class FakeService:
    """Answers performs like the ledger would, counting effects per operation."""

    actor = "svc-test"

    def __init__(self) -> None:
        self.granted: dict[str, str] = {}  # approval ID -> operation ID
        self.performed: list[dict[str, Any]] = []
        self.effects: dict[str, int] = {}
        self.scripted: list[Outcome | Exception] = []

    async def perform_async(self, **kwargs: Any) -> Outcome:
        self.performed.append(kwargs)
        op, approval = kwargs["operation_id"], kwargs["approval_id"]
        if self.scripted:
            next_up = self.scripted.pop(0)
            if isinstance(next_up, Exception):
                raise next_up
            return next_up
        if op in self.effects:
            return Verified(op, f"eff-{op}", "readback: VERIFIED", 1, "verified")
        if approval is not None and self.granted.get(approval) == op:
            self.effects[op] = 1
            return Verified(op, f"eff-{op}", "readback: VERIFIED", 1, "verified")
        reason = "no approval supplied with the intent" if approval is None else "not found"
        return NeedsReauthorisation(op, reason, approval, None, "ask a reviewer")


def reviewer(service: FakeService, *, grant: bool = True) -> Any:
    """An elicitation callback playing the reviewer: grants the suggested approval ID."""

    async def answer(context: Any, params: Any) -> ElicitResult:
        pending = pending_from_question(params.message)
        assert pending["operation_id"] in params.message
        assert pending["parameter_digest"] in params.message
        if not grant:
            return ElicitResult(action="decline")
        service.granted[pending["suggested_approval_id"]] = pending["operation_id"]
        return ElicitResult(
            action="accept", content={"approval_id": pending["suggested_approval_id"]}
        )

    return answer


def run(coro_fn: Any) -> Any:
    return anyio.run(coro_fn)


def test_a_call_needing_approval_is_input_required_and_pays_nothing() -> None:
    service = FakeService()
    gateway = LedgerGateway(service)
    server = build_server(gateway)

    async def go() -> CallToolResult | InputRequiredResult:
        async with Client(server, elicitation_callback=reviewer(service)) as client:
            return await client.session.call_tool("refund", REFUND, allow_input_required=True)

    first = run(go)
    assert isinstance(first, InputRequiredResult)
    question = first.input_requests[APPROVAL_INPUT]  # type: ignore[index]
    pending = pending_from_question(question.params.message)  # type: ignore[union-attr]
    call = ToolCall(
        "refund",
        "1842",
        "payments",
        {k: REFUND[k] for k in ("account", "amount_minor", "currency")},
    )
    assert pending["operation_id"] == "refund:1842:v1" == call.operation_id
    assert pending["parameter_digest"] == gateway.intent(call).parameter_digest
    assert pending["suggested_approval_id"] == "refund:1842:v1:review-1"
    assert service.effects == {}
    assert [p["approval_id"] for p in service.performed] == [None]


def test_approved_then_called_again_one_effect_the_same_outcome() -> None:
    service = FakeService()
    server = build_server(LedgerGateway(service))

    async def go() -> tuple[CallToolResult, CallToolResult]:
        async with Client(server, elicitation_callback=reviewer(service)) as client:
            approved = await client.call_tool("refund", REFUND)
        async with Client(server) as again:  # a restarted agent, no reviewer at hand
            return approved, await again.call_tool("refund", REFUND)

    approved, repeated = run(go)
    assert not approved.is_error, approved
    assert approved.structured_content["status"] == "verified"
    assert approved.structured_content["effect_id"] == "eff-refund:1842:v1"
    assert repeated.structured_content == approved.structured_content
    assert service.effects == {"refund:1842:v1": 1}
    assert {p["operation_id"] for p in service.performed} == {"refund:1842:v1"}
    assert [p["approval_id"] for p in service.performed] == [
        None,
        "refund:1842:v1:review-1",
        None,
    ]


def test_a_declined_review_is_an_error_that_pays_nothing() -> None:
    service = FakeService()
    server = build_server(LedgerGateway(service))

    async def go() -> CallToolResult:
        async with Client(server, elicitation_callback=reviewer(service, grant=False)) as client:
            return await client.call_tool("notify", {"case_id": "7", "to": "a@example.com"})

    result = run(go)
    assert result.is_error and result.structured_content["status"] == "declined"
    assert "remedy" in result.structured_content
    assert service.effects == {}


def test_a_client_that_cannot_elicit_gets_what_to_approve_and_passes_the_approval_id() -> None:
    service = FakeService()
    server = build_server(LedgerGateway(service))

    async def go() -> tuple[CallToolResult, CallToolResult]:
        async with Client(server) as client:
            first = await client.call_tool("refund", REFUND)
            pending = first.structured_content or {}
            service.granted[pending["suggested_approval_id"]] = pending["operation_id"]
            args = {**REFUND, "approval_id": pending["suggested_approval_id"]}
            return first, await client.call_tool("refund", args)

    first, second = run(go)
    assert not first.is_error
    assert first.structured_content["status"] == "input_required"
    assert "approval_id" in first.structured_content["remedy"]
    assert second.structured_content["status"] == "verified"
    assert service.effects == {"refund:1842:v1": 1}


def test_an_older_protocol_client_is_asked_during_the_call() -> None:
    service = FakeService()
    server = build_server(LedgerGateway(service))

    async def go() -> CallToolResult:
        async with Client(server, elicitation_callback=reviewer(service), mode="legacy") as client:
            return await client.call_tool("refund", REFUND)

    result = run(go)
    assert result.structured_content["status"] == "verified", result
    assert service.effects == {"refund:1842:v1": 1}


@pytest.mark.parametrize(
    "bad",
    [
        {"amount_minor": 0},
        {"amount_minor": -5},
        {"currency": "pounds"},
        {"case_id": "18 42"},
        {"case_id": ""},
        {"decision_version": 0},
    ],
)
def test_bad_params_are_refused_before_anything_is_published(bad: Mapping[str, Any]) -> None:
    service = FakeService()
    server = build_server(LedgerGateway(service))

    async def go() -> CallToolResult:
        async with Client(server) as client:
            return await client.call_tool("refund", {**REFUND, **bad})

    result = run(go)
    assert result.is_error
    assert service.performed == []


@pytest.mark.parametrize(
    ("outcome", "status", "is_error"),
    [
        (
            Refused("refund:1842:v1", "UNKNOWN_SINK", "no sink paymnets", "register it"),
            "refused",
            True,
        ),
        (Held("refund:1842:v1", "reconciliation", "a readback", "timed out", "e-1"), "held", True),
        (Pending("refund:1842:v1", "EFFECT_PENDING", "still going"), "pending", False),
        (DeliveryUnknownError("may still be delivered"), "delivery_unknown", True),
    ],
)
def test_other_outcomes_name_their_remedy(outcome: Any, status: str, is_error: bool) -> None:
    service = FakeService()
    service.scripted.append(outcome)
    server = build_server(LedgerGateway(service, refund_sink="paymnets"))

    async def go() -> CallToolResult:
        async with Client(server) as client:
            return await client.call_tool("refund", REFUND)

    result = run(go)
    body = result.structured_content or {}
    assert result.is_error is is_error
    assert body["status"] == status and body["remedy"], body
    assert service.performed[0]["sink"] == "paymnets"
    if status == "refused":
        assert body["kind"] == "UNKNOWN_SINK"


def test_the_suggested_approval_id_is_one_not_yet_relied_on() -> None:
    op = "refund:9:v2"
    assert next_approval_id(op, None) == f"{op}:review-1"
    assert next_approval_id(op, f"{op}:review-1") == f"{op}:review-2"
    assert next_approval_id(op, "ap-from-elsewhere") == f"{op}:review-2"
    assert ToolCall("notify", "9", "email", {"to": "x@y.z"}, 2).operation_id == "notify:9:v2"
