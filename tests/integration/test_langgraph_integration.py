"""A LangGraph agent's refund through the real ledger (real broker, stages, reference sink).

The graph runs as a service would: it holds only the outcome key's public
half. The review system holds the reviewer's key and publishes grants bound
to one operation. On three threads (three cases):

1. the first run interrupts for approval; the resume with the approval ends
   ``VERIFIED`` with one effect, and no checkpoint holds the grant;
2. a resume whose approval expired (the ledger clock moved past its
   ``expires_at_ms``) interrupts again for fresh authority, with no effect;
3. a worker that dies after the effect, before the node's result is saved,
   is resumed by a new worker from the checkpoint: the operation's outcome
   is read back, still one effect.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from consumers.reader import read_topic
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Approval
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from producers.integrations.langgraph import (
    LedgerCall,
    Performer,
    Reviewer,
    ledger_node,
    merge_records,
    operation_id_for,
)
from producers.publisher import LedgerPublisher
from producers.sdk import LedgerService, Outcome, Verified
from testbed.harness import Harness
from tests.integration.test_outcome_channel import service_settings, service_settings_again

pytestmark = pytest.mark.integration


class Case(TypedDict, total=False):
    case_id: str
    ledger: Annotated[dict[str, dict[str, Any]], merge_records]


def refund_call(state: Case) -> LedgerCall:
    return LedgerCall(
        operation_id=operation_id_for("refund", state["case_id"]),
        sink="payments",
        action="refund",
        params={"account": f"acct-{state['case_id']}", "amount_minor": 5000, "currency": "GBP"},
        subject="customer-1",
        purpose="fee-remediation",
    )


def agent(service: Performer, saver: InMemorySaver) -> Any:
    graph = StateGraph(Case)
    graph.add_node("refund", ledger_node(service, refund_call, wait_s=30.0))
    graph.add_edge(START, "refund")
    graph.add_edge("refund", END)
    return graph.compile(checkpointer=saver)


def thread(case_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": f"case-{case_id}"}}


def request_of(result: dict[str, Any]) -> dict[str, Any]:
    assert "__interrupt__" in result, f"expected a review request, got {result}"
    [pause] = result["__interrupt__"]
    return dict(pause.value)


class Crash(Exception):
    """The worker dies after the ledger answered, before the node's result is saved."""


@dataclass
class DiesAfterTheEffect:
    service: LedgerService

    @property
    def actor(self) -> str:
        return self.service.actor

    def perform(self, **kwargs: Any) -> Outcome:
        outcome = self.service.perform(**kwargs)
        if isinstance(outcome, Verified):
            raise Crash(outcome.operation_id)
        return outcome


def test_a_langgraph_refund_asks_a_reviewer_then_verifies_once_and_resumes_safely(
    ledger_settings: LedgerSettings, tmp_path: Path
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    key = ReviewerKey.generate("reviewer-lg")
    trust(settings.trusted_keys_path(), key)
    desk = LedgerPublisher(settings)
    reviewer = Reviewer(desk, key, valid_for_s=60.0, now_ms=harness.clock.now_ms)
    service = LedgerService(service_settings(settings, tmp_path), actor="svc-agent")
    saver = InMemorySaver()
    app = agent(service, saver)
    try:
        harness.start_all()

        # 1. Interrupt, approve, resume: verified, one effect, no grant in the checkpoints.
        request = request_of(app.invoke({"case_id": "1"}, thread("1")))
        assert request["operation_id"] == "refund:1:v1" and request["asked"] == 0
        assert request["refused_approval_id"] is None and "no approval" in request["reason"]
        assert harness.effects("payments", "refund:1:v1") == 0
        decision = reviewer.approve(request)
        final = app.invoke(Command(resume=decision), thread("1"))
        record = final["ledger"]["refund:1:v1"]
        assert record["outcome"] == "VERIFIED", record
        assert record["approval_id"] == decision["approval_id"] and record["effect_id"]
        assert harness.effects("payments", "refund:1:v1") == 1
        [grant] = [
            r.event
            for r in read_topic(settings, "approvals")
            if isinstance(r.event, Approval) and r.event.approval_id == decision["approval_id"]
        ]
        assert grant.scope_operation_id == "refund:1:v1" and grant.signature
        assert grant.scope_parameter_digest == request["parameter_digest"]
        stored = repr(list(saver.list(thread("1"))))
        assert decision["approval_id"] in stored and "VERIFIED" in stored
        for secret in (grant.signature.hex(), base64.b64encode(grant.signature).decode()):
            assert secret not in stored
        assert repr(grant.signature) not in stored and "signature" not in stored

        # 2. The approval expires before the resume reaches the ledger: asked again.
        first = reviewer.approve(request_of(app.invoke({"case_id": "2"}, thread("2"))))
        harness.advance(120)  # past the grant's 60 s on the ledger clock
        again = request_of(app.invoke(Command(resume=first), thread("2")))
        assert again["operation_id"] == "refund:2:v1" and again["asked"] == 1
        assert again["refused_approval_id"] == first["approval_id"]
        assert "expired" in again["reason"], again
        assert harness.effects("payments", "refund:2:v1") == 0

        # 3. The worker dies after the effect; a new worker resumes the thread.
        dying = agent(DiesAfterTheEffect(service), saver)
        decision = reviewer.approve(request_of(dying.invoke({"case_id": "3"}, thread("3"))))
        with pytest.raises(Crash):
            dying.invoke(Command(resume=decision), thread("3"))
        assert harness.effects("payments", "refund:3:v1") == 1
        assert not dying.get_state(thread("3")).values["ledger"]
        restarted = LedgerService(service_settings_again(settings, tmp_path), actor="svc-agent")
        try:
            final = agent(restarted, saver).invoke(None, thread("3"))
        finally:
            restarted.close()
        assert final["ledger"]["refund:3:v1"]["outcome"] == "VERIFIED", final
        assert harness.effects("payments", "refund:3:v1") == 1
        assert not harness.crashed() and not harness.failed()
    finally:
        service.close()
        desk.close()
        harness.stop()
