"""Use the ledger from LangGraph: a node whose consequential call goes through the ledger.

The graph names the operation (its ID derived from the case, never random);
the ledger decides whether it may happen and reports what happened. When the
ledger needs authority, the node pauses the graph with ``interrupt()`` and
shows the reviewer exactly that operation; a review system (:class:`Reviewer`)
signs and publishes an approval bound to it and resumes the graph with the
approval's ID. The checkpoint keeps a reference and an observation (operation
ID, approval ID, outcome), never a grant or a key::

    class Case(TypedDict, total=False):
        case_id: str
        ledger: Annotated[dict[str, dict[str, Any]], merge_records]

    def refund_call(state: Case) -> LedgerCall:
        return LedgerCall(
            operation_id=operation_id_for("refund", state["case_id"]),
            sink="payments", action="refund",
            params={"account": "acct-1", "amount_minor": 5000, "currency": "GBP"},
            subject="customer-1", purpose="fee-remediation",
        )

    graph = StateGraph(Case)
    graph.add_node("refund", ledger_node(service, refund_call))
    ...
    app = graph.compile(checkpointer=InMemorySaver())
    app.invoke({"case_id": "1842"}, config)          # pauses: __interrupt__ holds the request
    decision = reviewer.approve(request)             # the review system publishes the grant
    app.invoke(Command(resume=decision), config)     # performs it with that approval

Resuming is safe whatever happened meanwhile: LangGraph runs the node again
from its start, and the node performs the same operation again (same ID),
which the ledger records once and answers with the operation's outcome. An
approval that expired before the resume reached the ledger yields a second
interrupt (fresh authority), not an effect; a node re-run after the effect
reads the effect back (``VERIFIED``) instead of making it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langgraph.types import interrupt

from ledger.clock import SystemClock
from ledger.errors import InvalidInputError, LedgerError
from ledger.events import Intent
from ledger.identity import check_operation_id
from ledger.signing import ReviewerKey
from producers.publisher import LedgerPublisher, build_intent
from producers.review import grant_for
from producers.sdk import (
    Abandoned,
    Committed,
    Held,
    NeedsReauthorisation,
    Outcome,
    Pending,
    Performer,
    Refused,
    Verified,
)

__all__ = [
    "REVIEW_KIND",
    "LedgerCall",
    "OutcomePendingError",
    "Performer",
    "Reviewer",
    "ledger_node",
    "merge_records",
    "operation_id_for",
    "perform_with_review",
]

#: The ``kind`` of every review request this module interrupts with.
REVIEW_KIND = "ledger.review"


@dataclass(frozen=True)
class LedgerCall:
    """One consequential operation, as the graph decides it from its state.

    Attributes:
        operation_id: stable ID derived from the case (:func:`operation_id_for`).
        sink: the sink that performs the effect.
        action: the action (``refund`` ...).
        params: semantic parameters (JSON values; amounts in minor currency units).
        subject: the represented subject.
        purpose: the declared purpose.
        decision_version: the business decision's version (a new decision,
            a new operation ID).
    """

    operation_id: str
    sink: str
    action: str
    params: Mapping[str, Any] = field(default_factory=dict)
    subject: str = ""
    purpose: str = ""
    decision_version: int = 1

    def intent(self, actor: str) -> Intent:
        """The intent a perform of this call publishes (for its parameter digest).

        Raises:
            InputBoundsError: the operation ID is outside the grammar.
            LedgerError: an empty field or parameters that are not JSON values.
        """
        return build_intent(
            operation_id=self.operation_id,
            sink=self.sink,
            action=self.action,
            params=self.params,
            actor=actor,
            subject=self.subject,
            purpose=self.purpose,
            decision_version=self.decision_version,
        )


class OutcomePendingError(LedgerError):
    """The ledger did not settle the operation within the node's wait.

    Nothing is recorded in the graph's state; invoke the graph again on the
    same thread (``app.invoke(None, config)``) to perform the same operation
    again and learn its outcome. ``observed`` is the state last seen.
    """

    retryable = True


def operation_id_for(step: str, case_id: str, decision_version: int = 1) -> str:
    """The operation ID of ``step`` for ``case_id`` (``refund:1842:v1``): the same on every resume.

    Args:
        step: what the operation does (``refund``, ``notify`` ...).
        case_id: the case (the graph's thread or business key).
        decision_version: the decision's version.

    Raises:
        InputBoundsError: the result is outside the operation ID grammar.
    """
    operation_id = f"{step}:{case_id}:v{decision_version}"
    check_operation_id(operation_id)
    return operation_id


def merge_records(
    old: Mapping[str, dict[str, Any]] | None, new: Mapping[str, dict[str, Any]] | None
) -> dict[str, dict[str, Any]]:
    """LangGraph reducer for the ``ledger`` state key: records by operation ID, newest wins."""
    return {**(old or {}), **(new or {})}


def _record(outcome: Outcome, approval_id: str | None) -> dict[str, Any]:
    """What the checkpoint keeps of an outcome: a reference and an observation, no authority."""
    record: dict[str, Any] = {
        "operation_id": outcome.operation_id,
        "approval_id": approval_id,
        "reason": outcome.reason,
    }
    if isinstance(outcome, Verified):
        return {
            **record,
            "outcome": "VERIFIED",
            "effect_id": outcome.effect_id,
            "postcondition": outcome.postcondition,
        }
    if isinstance(outcome, Committed):
        return {**record, "outcome": "COMMITTED", "effect_id": outcome.effect_id}
    if isinstance(outcome, Held):
        return {
            **record,
            "outcome": "HELD",
            "owner": outcome.owner,
            "release_condition": outcome.release_condition,
            "effect_id": outcome.effect_id,
        }
    if isinstance(outcome, Refused):
        return {**record, "outcome": "REFUSED", "kind": outcome.kind, "remedy": outcome.remedy}
    if isinstance(outcome, Abandoned):
        return {**record, "outcome": "ABANDONED", "remedy": outcome.remedy}
    if isinstance(outcome, NeedsReauthorisation):
        return {**record, "outcome": "NEEDS_REAUTHORISATION", "remedy": outcome.remedy}
    raise InvalidInputError(
        f"no record for {type(outcome).__name__}", operation_id=outcome.operation_id
    )


def review_request(
    call: LedgerCall, actor: str, needs: NeedsReauthorisation, asked: int
) -> dict[str, Any]:
    """The interrupt's value: exactly the operation a reviewer is asked to approve.

    Returns:
        A JSON object: ``kind`` (:data:`REVIEW_KIND`), ``operation_id``,
        ``parameter_digest``, ``sink``, ``action``, ``params``, ``subject``,
        ``purpose``, ``decision_version``, ``actor``, ``amount_minor`` (minor
        units), ``reason`` and ``refused_approval_id`` (why the ledger wants
        authority, and the approval it refused, if any), ``asked`` (0 for
        the first request in this node run, 1 for the next ...), and
        ``problem`` when the last resume value was not a decision about it.
    """
    intent = call.intent(actor)
    return {
        "kind": REVIEW_KIND,
        "operation_id": call.operation_id,
        "parameter_digest": intent.parameter_digest,
        "sink": call.sink,
        "action": call.action,
        "params": dict(call.params),
        "subject": call.subject,
        "purpose": call.purpose,
        "decision_version": call.decision_version,
        "actor": actor,
        "amount_minor": intent.amount_minor,
        "reason": needs.reason,
        "refused_approval_id": needs.approval_id,
        "asked": asked,
    }


def _decision(value: object, operation_id: str) -> tuple[bool, str | None, str] | str:
    """(approved, approval ID, reason) of a resume value, or what is wrong with it.

    A wrong value is not raised: LangGraph keeps a resume value on the thread
    even when the node fails, so raising would make every later resume of the
    thread fail the same way. The node asks again instead.
    """
    expected = (
        "resume with Command(resume=reviewer.approve(request)) or reviewer.reject(request, "
        "reason) for this request"
    )
    if not isinstance(value, Mapping) or not isinstance(value.get("approved"), bool):
        return f"the last resume value ({value!r:.80}) was not a review decision: {expected}"
    if value.get("operation_id") != operation_id:
        return (
            f"the last resume value decided {value.get('operation_id')!r}, not "
            f"{operation_id!r}: {expected}"
        )
    approval_id = value.get("approval_id")
    if value["approved"] and (not isinstance(approval_id, str) or not approval_id.strip()):
        return f"the last resume value approved without an approval_id: {expected}"
    return (
        value["approved"],
        approval_id if value["approved"] else None,
        str(value.get("reason", "")),
    )


def perform_with_review(
    service: Performer, call: LedgerCall, *, wait_s: float = 30.0
) -> dict[str, Any]:
    """Perform ``call`` through the ledger, interrupting for a reviewer while it needs authority.

    A resume value that is not a decision about this operation (another
    operation's, or no decision at all) is not acted on: the node interrupts
    again with the same request and a ``problem`` saying what was wrong.

    Call it inside a LangGraph node or tool (``interrupt()`` needs a
    running graph with a checkpointer). Each ``NeedsReauthorisation`` (no
    approval, or the one given expired, was revoked or consumed) interrupts
    with :func:`review_request`; the resume value is a decision from
    :class:`Reviewer`, and an approval performs the same operation again with
    its approval ID. On a re-run the node repeats its earlier performs, each
    of which the ledger answers from the operation's record.

    Args:
        service: a :class:`producers.sdk.LedgerService` (or anything with its ``perform``).
        call: the operation.
        wait_s: each perform's bounded wait (seconds).

    Returns:
        The record for the state (:func:`merge_records`): ``operation_id``,
        ``approval_id``, ``outcome`` (``VERIFIED``, ``COMMITTED``, ``HELD``, ``REFUSED``,
        ``ABANDONED``, or ``REJECTED`` when the reviewer said no), ``reason``
        and the outcome's own fields (``effect_id`` ...). Never a grant.

    Raises:
        OutcomePendingError: the wait ran out (invoke the graph again).
        DeliveryUnknownError: the intent's delivery is unknown (invoke again).
    """
    approval_id: str | None = None
    asked = 0
    while True:
        outcome = service.perform(
            operation_id=call.operation_id,
            sink=call.sink,
            action=call.action,
            params=call.params,
            subject=call.subject,
            purpose=call.purpose,
            decision_version=call.decision_version,
            approval_id=approval_id,
            wait_s=wait_s,
        )
        if isinstance(outcome, Pending):
            raise OutcomePendingError(
                f"{call.operation_id} did not settle within {wait_s:.0f} s ({outcome.reason}); "
                "invoke the graph again on the same thread to perform it again and learn its "
                "outcome",
                operation_id=call.operation_id,
                observed=outcome.state,
            )
        if not isinstance(outcome, NeedsReauthorisation):
            return _record(outcome, approval_id)
        problem: str | None = None
        while True:
            request = review_request(call, service.actor, outcome, asked)
            if problem is not None:
                request["problem"] = problem
            decided = _decision(interrupt(request), call.operation_id)
            asked += 1
            if not isinstance(decided, str):
                break
            problem = decided
        approved, approval_id, reason = decided
        if not approved:
            return {
                "operation_id": call.operation_id,
                "approval_id": None,
                "outcome": "REJECTED",
                "reason": reason or "the reviewer did not approve it",
            }


def ledger_node(
    service: Performer,
    call_for: Callable[[Any], LedgerCall],
    *,
    key: str = "ledger",
    wait_s: float = 30.0,
) -> Callable[[Any], dict[str, Any]]:
    """A LangGraph node that performs the operation ``call_for(state)`` names.

    Args:
        service: the ledger service.
        call_for: the operation for a state (a pure function of the state:
            its ID must come out the same on every run of the node).
        key: the state key the record goes under (annotate it with
            :func:`merge_records`).
        wait_s: each perform's bounded wait (seconds).

    Returns:
        ``node(state) -> {key: {operation_id: record}}`` (see
        :func:`perform_with_review` for the record and the errors).
    """

    def node(state: Any) -> dict[str, Any]:
        call = call_for(state)
        return {key: {call.operation_id: perform_with_review(service, call, wait_s=wait_s)}}

    return node


class Reviewer:
    """A review system's side: turns a reviewer's decision into a signed, operation-bound grant.

    It runs where the reviewer's key is (never in the graph's process) and
    publishes on ``approvals`` (the review system's topic). Its decisions
    are the graph's resume values; they carry the approval's ID, not the grant.

    Args:
        publisher: publishes the grant (``LedgerPublisher(settings)``).
        key: the reviewer's signing key (trusted by the ledger as a reviewer).
        policy_version: the policy the grants are made under.
        valid_for_s: how long a grant admits (seconds of ledger time).
        now_ms: the ledger's time in ms (default: the wall clock).
    """

    def __init__(
        self,
        publisher: LedgerPublisher,
        key: ReviewerKey,
        *,
        policy_version: int = 1,
        valid_for_s: float = 3600.0,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self.publisher = publisher
        self.key = key
        self.policy_version = policy_version
        self.valid_for_s = valid_for_s
        self.now_ms = now_ms if now_ms is not None else SystemClock().now_ms

    def approve(
        self, request: Mapping[str, Any], *, approval_id: str | None = None
    ) -> dict[str, Any]:
        """Grant exactly the operation ``request`` describes and publish the grant.

        Args:
            request: the graph's interrupt value (:func:`review_request`).
            approval_id: the grant's ID (default: a fresh one naming the operation).

        Returns:
            The resume value: ``{"operation_id", "approved": True,
            "approval_id", "reviewer", "expires_at_ms"}``.

        Raises:
            LedgerError: the request is not a review request, its parameter
                digest does not match its parameters (altered on the way), or
                the broker did not accept the grant.
        """
        intent = self.intent_of(request)
        now = self.now_ms()
        expires_at_ms = now + int(self.valid_for_s * 1000)
        approval_id = approval_id or f"review:{intent.operation_id}:{uuid.uuid4().hex[:12]}"
        grant = grant_for(
            self.key,
            intent,
            approval_id=approval_id,
            expires_at_ms=expires_at_ms,
            granted_at_ms=now,
            policy_version=self.policy_version,
            ledger_id=self.publisher.settings.ledger_identity,
        )
        self.publisher.publish_approval(grant)
        return {
            "operation_id": intent.operation_id,
            "approved": True,
            "approval_id": approval_id,
            "reviewer": self.key.key_id,
            "expires_at_ms": expires_at_ms,
        }

    def reject(self, request: Mapping[str, Any], reason: str) -> dict[str, Any]:
        """The resume value of a refusal (nothing is published; the operation stays unadmitted)."""
        return {
            "operation_id": str(request.get("operation_id")),
            "approved": False,
            "approval_id": None,
            "reviewer": self.key.key_id,
            "reason": reason,
        }

    @staticmethod
    def intent_of(request: Mapping[str, Any]) -> Intent:
        """The intent a review request describes, its digest checked against its parameters.

        Raises:
            LedgerError: not a review request, or a digest that does not match.
        """
        if request.get("kind") != REVIEW_KIND:
            raise InvalidInputError(
                f"not a ledger review request (kind {request.get('kind')!r}): pass the value "
                "the graph interrupted with (result['__interrupt__'][0].value)"
            )
        intent = build_intent(
            operation_id=request["operation_id"],
            sink=request["sink"],
            action=request["action"],
            params=request["params"],
            actor=request["actor"],
            subject=request["subject"],
            purpose=request["purpose"],
            decision_version=request["decision_version"],
        )
        if intent.parameter_digest != request["parameter_digest"]:
            raise InvalidInputError(
                "the request's parameter digest does not match its parameters: it was altered "
                "after the graph made it; review the request the graph interrupted with",
                operation_id=intent.operation_id,
                expected=intent.parameter_digest,
                observed=request["parameter_digest"],
            )
        return intent
