"""producers.integrations.langgraph on a real LangGraph graph, with a fake ledger.

The fake ledger keeps the properties the node relies on (one effect per
operation ID, an expired or missing approval answered with
``NeedsReauthorisation``, a settled operation answered with its outcome), so
these tests check the node's own logic: what it interrupts with, what it
does with the resume value, what goes into the checkpoint, and what a
re-run does. The real ledger is in tests/integration/test_langgraph_integration.py.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from ledger.errors import InputBoundsError, LedgerError
from ledger.events import Approval
from ledger.signing import ReviewerKey
from producers.integrations.langgraph import (
    REVIEW_KIND,
    LedgerCall,
    OutcomePendingError,
    Reviewer,
    ledger_node,
    merge_records,
    operation_id_for,
)
from producers.publisher import build_intent
from producers.sdk import Committed, NeedsReauthorisation, Outcome, Pending, Verified

PARAMS = {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}


class Case(TypedDict, total=False):
    case_id: str
    ledger: Annotated[dict[str, dict[str, Any]], merge_records]


def refund_call(state: Case) -> LedgerCall:
    return LedgerCall(
        operation_id=operation_id_for("refund", state["case_id"]),
        sink="payments",
        action="refund",
        params=PARAMS,
        subject="customer-1",
        purpose="fee-remediation",
    )


@dataclass
class FakeLedger:
    """The ledger's answers, kept in memory; ``now_ms`` is its clock."""

    actor: str = "svc"
    now_ms: int = 0
    grants: dict[str, Approval] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    settled: dict[str, Outcome] = field(default_factory=dict)
    calls: list[tuple[str, str | None]] = field(default_factory=list)
    #: answer Pending this many times before deciding
    pending: int = 0

    def perform(self, *, operation_id: str, approval_id: str | None = None, **_: Any) -> Outcome:
        self.calls.append((operation_id, approval_id))
        if self.pending:
            self.pending -= 1
            return Pending(operation_id, "NOT_ADMITTED", "waiting for the kernel")
        if operation_id in self.settled:
            return self.settled[operation_id]
        grant = self.grants.get(approval_id) if approval_id else None
        if grant is None:
            return NeedsReauthorisation(operation_id, "no approval", approval_id, None, "approve")
        if grant.scope_operation_id != operation_id:
            return NeedsReauthorisation(operation_id, "bound elsewhere", approval_id, 1, "approve")
        if grant.expires_at_ms <= self.now_ms:
            return NeedsReauthorisation(operation_id, "approval expired", approval_id, 1, "approve")
        self.effects[operation_id] = self.effects.get(operation_id, 0) + 1
        self.settled[operation_id] = Verified(operation_id, "eff-1", "gw: VERIFIED", 1, "verified")
        return self.settled[operation_id]


@dataclass
class Desk:
    """A publisher stand-in that delivers grants to the fake ledger."""

    ledger: FakeLedger
    settings: Any = field(default_factory=lambda: SimpleNamespace(ledger_identity="ledger-test"))

    def publish_approval(self, approval: Approval) -> None:
        self.ledger.grants[approval.approval_id] = approval


KEY = ReviewerKey.generate("alice")


def setup(ledger: FakeLedger, valid_for_s: float = 60.0) -> tuple[Any, Reviewer, dict[str, Any]]:
    graph = StateGraph(Case)
    graph.add_node("refund", ledger_node(ledger, refund_call, wait_s=5.0))
    graph.add_edge(START, "refund")
    graph.add_edge("refund", END)
    app = graph.compile(checkpointer=InMemorySaver())
    reviewer = Reviewer(
        Desk(ledger),  # type: ignore[arg-type]
        KEY,
        valid_for_s=valid_for_s,
        now_ms=lambda: ledger.now_ms,
    )
    return app, reviewer, {"configurable": {"thread_id": "case-1842"}}


def request_of(result: Mapping[str, Any]) -> dict[str, Any]:
    [pause] = result["__interrupt__"]
    return dict(pause.value)


def test_the_first_run_asks_for_exactly_the_operation_and_the_resume_performs_it() -> None:
    ledger = FakeLedger()
    app, reviewer, config = setup(ledger)
    request = request_of(app.invoke({"case_id": "1842"}, config))
    intent = build_intent(
        operation_id="refund:1842:v1",
        sink="payments",
        action="refund",
        params=PARAMS,
        actor="svc",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
    )
    assert request["kind"] == REVIEW_KIND
    assert request["operation_id"] == "refund:1842:v1"
    assert request["parameter_digest"] == intent.parameter_digest
    assert (request["sink"], request["action"], request["params"]) == ("payments", "refund", PARAMS)
    assert request["reason"] == "no approval" and request["asked"] == 0
    assert ledger.effects == {}

    decision = reviewer.approve(request)
    [grant] = ledger.grants.values()
    assert grant.scope_operation_id == "refund:1842:v1"
    assert grant.scope_parameter_digest == intent.parameter_digest
    final = app.invoke(Command(resume=decision), config)
    record = final["ledger"]["refund:1842:v1"]
    assert record["outcome"] == "VERIFIED" and record["effect_id"] == "eff-1"
    assert record["approval_id"] == grant.approval_id
    assert ledger.effects == {"refund:1842:v1": 1}
    # The same operation ID every time; the approval only on the last perform.
    assert ledger.calls == [
        ("refund:1842:v1", None),
        ("refund:1842:v1", None),
        ("refund:1842:v1", grant.approval_id),
    ]
    # The checkpoints hold the reference and the observation, never the grant.
    assert grant.signature
    stored = repr(list(app.checkpointer.list(config)))  # type: ignore[union-attr]
    for secret in (
        grant.signature.hex(),
        base64.b64encode(grant.signature).decode(),
        repr(grant.signature),
    ):
        assert secret not in stored
    assert "signature" not in stored
    assert grant.approval_id in stored


def test_an_approval_that_expired_before_the_resume_asks_again() -> None:
    ledger = FakeLedger()
    app, reviewer, config = setup(ledger, valid_for_s=60.0)
    decision = reviewer.approve(request_of(app.invoke({"case_id": "1842"}, config)))
    ledger.now_ms += 61_000
    again = request_of(app.invoke(Command(resume=decision), config))
    assert again["reason"] == "approval expired"
    assert again["refused_approval_id"] == decision["approval_id"]
    assert again["asked"] == 1
    assert ledger.effects == {}

    fresh = reviewer.approve(again)
    assert fresh["approval_id"] != decision["approval_id"]
    final = app.invoke(Command(resume=fresh), config)
    assert final["ledger"]["refund:1842:v1"]["approval_id"] == fresh["approval_id"]
    assert ledger.effects == {"refund:1842:v1": 1}


class Crash(Exception):
    """The worker dies after the ledger answered, before the node's result is saved."""


@dataclass
class CrashOnceAfterEffect:
    ledger: FakeLedger
    crashed: bool = False

    @property
    def actor(self) -> str:
        return self.ledger.actor

    def perform(self, **kwargs: Any) -> Outcome:
        outcome = self.ledger.perform(**kwargs)
        if isinstance(outcome, Verified) and not self.crashed:
            self.crashed = True
            raise Crash
        return outcome


def test_a_node_run_again_after_the_effect_reads_it_back() -> None:
    ledger = FakeLedger()
    crashing = CrashOnceAfterEffect(ledger)
    saver = InMemorySaver()
    graph = StateGraph(Case)
    graph.add_node("refund", ledger_node(crashing, refund_call))
    graph.add_edge(START, "refund")
    graph.add_edge("refund", END)
    app = graph.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "case-7"}}
    reviewer = Reviewer(Desk(ledger), KEY, now_ms=lambda: ledger.now_ms)  # type: ignore[arg-type]
    decision = reviewer.approve(request_of(app.invoke({"case_id": "7"}, config)))
    with pytest.raises(Crash):
        app.invoke(Command(resume=decision), config)
    assert ledger.effects == {"refund:7:v1": 1}
    assert not app.get_state(config).values["ledger"]  # the result was not saved

    final = app.invoke(None, config)  # the restarted worker resumes the thread
    assert final["ledger"]["refund:7:v1"]["outcome"] == "VERIFIED"
    assert ledger.effects == {"refund:7:v1": 1}
    assert "__interrupt__" not in final


def test_a_reviewer_who_says_no_ends_the_node_without_an_effect() -> None:
    ledger = FakeLedger()
    app, reviewer, config = setup(ledger)
    request = request_of(app.invoke({"case_id": "9"}, config))
    final = app.invoke(Command(resume=reviewer.reject(request, "over the limit")), config)
    record = final["ledger"]["refund:9:v1"]
    assert record == {
        "operation_id": "refund:9:v1",
        "approval_id": None,
        "outcome": "REJECTED",
        "reason": "over the limit",
    }
    assert ledger.grants == {} and ledger.effects == {}


def test_a_resume_value_that_is_not_this_operations_decision_asks_again() -> None:
    ledger = FakeLedger()
    app, reviewer, config = setup(ledger)
    request = request_of(app.invoke({"case_id": "9"}, config))
    other = {"operation_id": "refund:10:v1", "approved": True, "approval_id": "ap-x"}
    again = request_of(app.invoke(Command(resume=other), config))
    assert again["operation_id"] == "refund:9:v1" and "refund:10:v1" in again["problem"]
    third = request_of(app.invoke(Command(resume="yes"), config))
    assert "not a review decision" in third["problem"] and third["asked"] == 2
    assert all(approval is None for _, approval in ledger.calls)
    # The thread is not spoiled: the right decision still performs it.
    final = app.invoke(Command(resume=reviewer.approve(request)), config)
    assert final["ledger"]["refund:9:v1"]["outcome"] == "VERIFIED"
    assert ledger.effects == {"refund:9:v1": 1}


def test_a_wait_that_runs_out_saves_nothing_and_the_next_invoke_performs_again() -> None:
    ledger = FakeLedger(pending=1)
    app, reviewer, config = setup(ledger)
    with pytest.raises(OutcomePendingError, match="invoke the graph again"):
        app.invoke({"case_id": "3"}, config)
    assert not app.get_state(config).values["ledger"]
    request = request_of(app.invoke(None, config))
    assert request["operation_id"] == "refund:3:v1"


def test_an_altered_request_is_not_granted() -> None:
    ledger = FakeLedger()
    app, reviewer, config = setup(ledger)
    request = request_of(app.invoke({"case_id": "5"}, config))
    redirected = {**request, "params": {**PARAMS, "account": "acct-attacker"}}
    with pytest.raises(LedgerError, match="altered"):
        reviewer.approve(redirected)
    with pytest.raises(LedgerError, match="not a ledger review request"):
        reviewer.approve({"operation_id": "refund:5:v1"})
    assert ledger.grants == {}


def test_operation_ids_come_from_the_case_and_keep_to_the_grammar() -> None:
    assert operation_id_for("refund", "1842") == operation_id_for("refund", "1842")
    assert operation_id_for("refund", "1842", 3) == "refund:1842:v3"
    with pytest.raises(InputBoundsError):
        operation_id_for("refund", "case with spaces\n")


def test_an_effect_committed_without_a_postcondition_is_recorded_as_committed() -> None:
    # A sink with no readback (an e-mail relay): the ledger answers Committed.
    ledger = FakeLedger()
    op = "refund:1842:v1"
    ledger.settled[op] = Committed(op, "mail-7", 1, "receipt from the relay", "read its log")
    app, _, config = setup(ledger)
    record = app.invoke({"case_id": "1842"}, config)["ledger"][op]
    assert record["outcome"] == "COMMITTED" and record["effect_id"] == "mail-7", record
    assert ledger.calls == [(op, None)]
