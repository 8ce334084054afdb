"""The MCP gateway against the real ledger: the SDK's own client, a real broker, real stages.

A refund tool call needing approval comes back ``input_required`` and pays
nothing; the reviewer (played here) publishes a signed grant bound to the
operation the question names and answers with its ID; the retried call
returns the verified outcome with one effect at the sink. A restarted agent
calling again gets the same outcome and still one effect; a typo'd sink is
refused in seconds and bad parameters before anything is published. The
gateway's service holds only the outcome key's public half.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult, ElicitRequestFormParams, ElicitResult, InputRequiredResult

from ledger.contracts import PAYMENT_GATEWAY
from ledger.settings import LedgerSettings
from ledger.signing import trust
from producers.integrations.mcp_gateway import (
    APPROVAL_INPUT,
    LedgerGateway,
    build_server,
    pending_from_question,
)
from producers.publisher import LedgerPublisher, build_intent
from producers.review import grant_for
from producers.sdk import LedgerService
from testbed.harness import Harness, settings_env
from tests.integration.test_outcome_channel import service_settings
from tests.integration.test_stages import REVIEWER

pytestmark = pytest.mark.integration

REFUND = {"case_id": "1842", "account": "acct-1842", "amount_minor": 5000, "currency": "GBP"}


def reviewer(
    publisher: LedgerPublisher,
    expiring: list[Harness] | None = None,
    granted: list[str] | None = None,
) -> Any:
    """The reviewer's side: approve exactly the operation the question names.

    ``expiring``: for each harness in it (one per question, first first), the
    grant expires at ledger time 1 s and the harness's clock is moved past it
    before the answer. ``granted`` collects the approval IDs answered.
    """

    async def review(context: Any, params: ElicitRequestFormParams) -> ElicitResult:
        pending = pending_from_question(params.message)
        intent = build_intent(
            operation_id=pending["operation_id"],
            sink=pending["sink"],
            action=pending["action"],
            params=pending["params"],
            actor=pending["actor"],
            subject=pending["subject"],
            purpose=pending["purpose"],
            decision_version=pending["decision_version"],
        )
        # What the reviewer sees is what the ledger will check.
        assert intent.parameter_digest == pending["parameter_digest"]
        approval_id = pending["suggested_approval_id"]
        grant = grant_for(
            REVIEWER,
            intent,
            approval_id=approval_id,
            expires_at_ms=1_000 if expiring else 3_600_000,  # ledger time, from 0
            granted_at_ms=0,
            policy_version=1,
            ledger_id=publisher.settings.ledger_identity,
        )
        await anyio.to_thread.run_sync(publisher.publish_approval, grant)
        if expiring:
            expiring.pop(0).advance(5.0)
        if granted is not None:
            granted.append(approval_id)
        return ElicitResult(action="accept", content={"approval_id": approval_id})

    return review


def test_an_mcp_refund_waits_for_approval_then_pays_once(
    ledger_settings: LedgerSettings, tmp_path: Path
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    review_system = LedgerPublisher(settings)
    trust(settings.trusted_keys_path(), REVIEWER)
    review_system.credentials.add(REVIEWER)
    service = LedgerService(service_settings(settings, tmp_path), actor="mcp-gateway")
    gateway = LedgerGateway(service, refund_sink="payments", wait_s=30.0)
    op = "refund:1842:v1"

    async def agent() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        # A client that can ask its user (elicitation); the loop is driven by hand
        # here to see the input_required answer (``client.call_tool`` drives it).
        async with Client(
            build_server(gateway), elicitation_callback=reviewer(review_system)
        ) as client:
            first = await client.session.call_tool("refund", REFUND, allow_input_required=True)
            seen["first"] = first
            seen["effects_before"] = harness.effects("payments", op)
            assert isinstance(first, InputRequiredResult) and first.input_requests
            question = first.input_requests[APPROVAL_INPUT].params
            assert isinstance(question, ElicitRequestFormParams)
            seen["question"] = question.message
            answer = await reviewer(review_system)(None, question)
            seen["approved"] = await client.session.call_tool(
                "refund",
                REFUND,
                input_responses={APPROVAL_INPUT: answer},
                allow_input_required=True,
            )
        # A restarted agent calls again, through the gateway run as its own
        # process over stdio: no reviewer at hand, none needed.
        stdio = StdioServerParameters(
            command=sys.executable,
            args=["-m", "producers.integrations.mcp_gateway"],
            env=settings_env(service.settings),
        )
        async with Client(stdio) as again:
            seen["again"] = await again.call_tool("refund", REFUND)
        # A grant that expires before it is used: the call asks again, for a
        # fresh approval under a new ID, and pays once under that one.
        late = {**REFUND, "case_id": "1844"}
        async with Client(
            build_server(gateway),
            elicitation_callback=reviewer(review_system, [harness], seen.setdefault("asked", [])),
        ) as client:
            seen["late"] = await client.call_tool("refund", late)
        typo = LedgerGateway(service, refund_sink="paymnets", wait_s=30.0)
        async with Client(build_server(typo), elicitation_callback=reviewer(review_system)) as c:
            started = time.monotonic()
            seen["typo"] = await c.call_tool("refund", {**REFUND, "case_id": "1843"})
            seen["typo_s"] = time.monotonic() - started
            seen["bad"] = await c.call_tool("refund", {**REFUND, "currency": "pounds"})
        return seen

    try:
        harness.start_all()
        seen = anyio.run(agent)
        first = seen["first"]
        assert isinstance(first, InputRequiredResult), first
        assert op in seen["question"]
        assert seen["effects_before"] == 0

        approved = seen["approved"]
        assert isinstance(approved, CallToolResult) and not approved.is_error, approved
        body = approved.structured_content or {}
        assert body["status"] == "verified" and body["operation_id"] == op, body
        assert body["effect_id"] and "VERIFIED" in body["postcondition"]
        assert harness.effects("payments", op) == 1

        again = seen["again"]
        assert not again.is_error and again.structured_content == body
        assert harness.effects("payments", op) == 1

        typo = seen["typo"].structured_content or {}
        assert seen["typo"].is_error and typo["status"] == "refused", typo
        assert typo["kind"] == "UNKNOWN_SINK" and "paymnets" in typo["reason"] and typo["remedy"]
        assert seen["typo_s"] < 10.0, f"the refusal took {seen['typo_s']:.1f} s"

        late = seen["late"].structured_content or {}
        assert late["status"] == "verified", seen["late"]
        assert harness.effects("payments", "refund:1844:v1") == 1
        assert seen["asked"] == ["refund:1844:v1:review-1", "refund:1844:v1:review-2"]

        bad = seen["bad"]
        assert bad.is_error and "currency" in bad.content[0].text
        assert harness.effects("payments", "refund:1842:v1") == 1
        assert not harness.crashed() and not harness.failed()
    finally:
        service.close()
        review_system.close()
        harness.stop()
