"""An MCP tool gateway: consequential tools whose calls go through the ledger.

::

    service = LedgerService(LedgerSettings(), actor="mcp-gateway")
    server = build_server(LedgerGateway(service, refund_sink="payments"))
    server.run()  # stdio; or: python -m producers.integrations.mcp_gateway

Each tool call becomes one intent performed with
:meth:`producers.sdk.LedgerService.perform_async`. Its operation ID is
derived from the case (``refund:{case_id}:v{decision_version}``), so a
client that calls again (a retry, a restarted agent) reaches the same
operation: the ledger records it once and answers with its outcome, never
a second effect. Other parameters under the same case are refused
(``PARAMETER_DRIFT``): a different request needs a new decision version.

A call that needs approval neither fails nor pays. MCP 2.x (protocol
2026-07-28) has no Tasks in the core SDK (they moved to an extension the SDK
does not ship); its nearest equivalent is the multi-round-trip result
``input_required``: the tool answers with an :class:`mcp_types.InputRequiredResult`
that asks (elicitation) for the ID of an approval a reviewer has published,
bound to the operation and parameter digest the request names. The client
retries the same call with the answer and the gateway performs the same
operation again under that approval ID: the ledger's authority kernel, not
the gateway, checks the signed grant. On a client of an older protocol the
question is an elicitation during the call; a client without elicitation
gets a structured ``input_required`` result and calls the tool again with
``approval_id``. Nothing the gateway keeps or returns is authority: the
approval ID is a reference, useless without the reviewer's signed grant.

Results (``structuredContent``): ``status`` is ``verified`` (``effect_id``,
``postcondition``), ``pending`` (call again: safe), ``input_required``
(what to approve) or, as tool errors (``isError``), ``refused`` (``kind``),
``held``, ``abandoned``, ``declined``, ``delivery_unknown``; every one but
``verified`` names its ``remedy``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
    TextContent,
)
from pydantic import BaseModel, Field

from ledger.errors import DeliveryUnknownError, LedgerError
from ledger.events import Intent
from producers.publisher import build_intent
from producers.sdk import (
    Abandoned,
    AsyncPerformer,
    Held,
    NeedsReauthorisation,
    Outcome,
    Pending,
    Refused,
    Verified,
)

#: The key of the approval question in an ``input_required`` result.
APPROVAL_INPUT = "approval"

#: The first protocol revision whose tool calls carry questions in ``input_required``.
INPUT_REQUIRED_PROTOCOL = "2026-07-28"

#: A case ID: what the operation ID is derived from (printable, no separators to confuse).
CASE_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

CaseId = Annotated[str, Field(pattern=CASE_ID, description="the case (e.g. 1842)")]
Version = Annotated[int, Field(ge=1, description="the business decision's version")]


class ApprovalAnswer(BaseModel):
    """What the reviewer answers: the ID of the grant they published."""

    approval_id: str = Field(
        description="the ID of the signed grant you published for this operation"
    )


@dataclass(frozen=True)
class ToolCall:
    """One consequential tool call, as the ledger will record it.

    Attributes:
        tool: the tool (``refund``, ``notify``); also the action.
        case_id: the case it acts for.
        sink: the ledger sink that performs it.
        params: its semantic parameters (amounts in minor units).
        decision_version: the business decision's version.
    """

    tool: str
    case_id: str
    sink: str
    params: Mapping[str, Any]
    decision_version: int = 1

    @property
    def operation_id(self) -> str:
        """The stable operation ID: the same case and version give the same one."""
        return f"{self.tool}:{self.case_id}:v{self.decision_version}"


class LedgerGateway:
    """Turns tool calls into ledger operations and outcomes into tool results.

    Args:
        service: the service handle (a :class:`producers.sdk.LedgerService`).
        refund_sink: the sink ``refund`` pays through.
        notify_sink: the sink ``notify`` sends through.
        purpose: the declared purpose of every intent.
        wait_s: how long one call waits for the ledger's answer (seconds).
    """

    def __init__(
        self,
        service: AsyncPerformer,
        *,
        refund_sink: str = "payments",
        notify_sink: str = "notifications",
        purpose: str = "fee-remediation",
        wait_s: float = 30.0,
    ) -> None:
        self.service = service
        self.refund_sink = refund_sink
        self.notify_sink = notify_sink
        self.purpose = purpose
        self.wait_s = wait_s

    def intent(self, call: ToolCall, approval_id: str | None = None) -> Intent:
        """The intent a call publishes (what a reviewer approves, with its digest).

        Raises:
            LedgerError: parameters the ledger would refuse (e.g. an operation ID
                outside the grammar).
        """
        return build_intent(
            operation_id=call.operation_id,
            sink=call.sink,
            action=call.tool,
            params=call.params,
            actor=self.service.actor,
            subject=call.case_id,
            purpose=self.purpose,
            decision_version=call.decision_version,
            approval_id=approval_id,
        )

    async def perform(self, call: ToolCall, approval_id: str | None) -> Outcome:
        """Perform the call's operation (idempotent), under ``approval_id`` when given.

        Raises:
            DeliveryUnknownError: as :meth:`producers.sdk.LedgerService.perform`.
            LedgerError: invalid parameters.
        """
        return await self.service.perform_async(
            operation_id=call.operation_id,
            sink=call.sink,
            action=call.tool,
            params=call.params,
            subject=call.case_id,
            purpose=self.purpose,
            decision_version=call.decision_version,
            approval_id=approval_id,
            wait_s=self.wait_s,
        )

    async def handle(
        self, call: ToolCall, ctx: Context | None, approval_id: str | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Run one tool call to its MCP result.

        Args:
            call: the call.
            ctx: the MCP request context (``None``: no client to ask).
            approval_id: an approval ID the caller gave as an argument.

        Returns:
            A :class:`CallToolResult` (see the module docstring for its
            ``status``), or an :class:`InputRequiredResult` asking for approval.

        Raises:
            ToolError: invalid parameters (nothing was published).
        """
        try:
            intent = self.intent(call)
        except LedgerError as exc:
            raise ToolError(f"{call.tool} refused before publishing: {exc}") from exc
        answered = _answered(ctx)
        if isinstance(answered, ElicitResult) and answered.action != "accept":
            return _declined(call, answered.action)
        if isinstance(answered, ElicitResult):
            approval_id = _approval_id(answered) or approval_id
        try:
            outcome = await self.perform(call, approval_id)
        except DeliveryUnknownError as exc:
            return _error(call, "delivery_unknown", str(exc), _SAME_CALL_AGAIN)
        except LedgerError as exc:
            raise ToolError(f"{call.tool} refused: {exc}") from exc
        if not isinstance(outcome, NeedsReauthorisation):
            return result_for(call, outcome)
        if ctx is None or not _can_elicit(ctx):
            return result_for(call, outcome, intent)
        question = approval_question(call, outcome, intent)
        if _speaks_input_required(ctx):
            return InputRequiredResult(
                input_requests={APPROVAL_INPUT: question}, result_type="input_required"
            )
        # An older protocol: ask during the call, then perform under the answer.
        asked = await ctx.elicit(question.params.message, ApprovalAnswer)
        if asked.action != "accept":
            return _declined(call, asked.action)
        outcome = await self.perform(call, asked.data.approval_id)
        return result_for(call, outcome, intent)


def next_approval_id(operation_id: str, refused: str | None) -> str:
    """The approval ID to suggest after ``refused`` (``None``: none given yet).

    An operation waiting for reauthorisation is admitted by a grant under an
    approval ID it has not relied on before, so the suggestion counts up:
    ``{operation_id}:review-1``, ``-2`` ...
    """
    prefix = f"{operation_id}:review-"
    if refused is not None and refused.startswith(prefix) and refused[len(prefix) :].isdigit():
        return f"{prefix}{int(refused[len(prefix) :]) + 1}"
    return f"{prefix}{2 if refused is not None else 1}"


def pending_operation(
    call: ToolCall, outcome: NeedsReauthorisation, intent: Intent
) -> dict[str, Any]:
    """What a reviewer needs to approve the call: the operation, its digest, its intent."""
    return {
        "operation_id": call.operation_id,
        "parameter_digest": intent.parameter_digest,
        "sink": intent.sink,
        "action": intent.action,
        "params": json.loads(intent.params_json),
        "subject": intent.subject,
        "actor": intent.actor,
        "purpose": intent.purpose,
        "decision_version": intent.decision_version,
        "reason": outcome.reason,
        "refused_approval_id": outcome.approval_id,
        "suggested_approval_id": next_approval_id(call.operation_id, outcome.approval_id),
    }


def approval_question(
    call: ToolCall, outcome: NeedsReauthorisation, intent: Intent
) -> ElicitRequest:
    """The elicitation that asks a reviewer for an approval bound to the operation.

    Its message names the operation, its parameter digest and the intent as
    JSON on its last line (:func:`pending_from_question` reads it back).
    """
    pending = pending_operation(call, outcome, intent)
    message = (
        f"{call.tool} for case {call.case_id} needs approval ({outcome.reason}). Publish a "
        f"signed grant bound to operation {call.operation_id} and parameter digest "
        f"{intent.parameter_digest} (producers.review.grant_for), e.g. as approval "
        f"{pending['suggested_approval_id']}, then answer with its approval ID; an ID "
        "answered before its grant is published is refused and cannot be used again for "
        "this operation.\noperation: " + json.dumps(pending, sort_keys=True)
    )
    return ElicitRequest(
        method="elicitation/create",
        params=ElicitRequestFormParams(
            message=message,
            requested_schema={
                "type": "object",
                "properties": {
                    "approval_id": {
                        "type": "string",
                        "description": "the ID of the signed grant you published",
                    }
                },
                "required": ["approval_id"],
            },
        ),
    )


def pending_from_question(message: str) -> dict[str, Any]:
    """The pending operation an approval question names (see :func:`pending_operation`).

    Args:
        message: the elicitation's message.

    Returns:
        The operation: ``operation_id``, ``parameter_digest``, the intent's
        fields and ``suggested_approval_id``.

    Raises:
        ValueError: the message is not one of this gateway's approval questions.
    """
    head, sep, tail = message.rpartition("\noperation: ")
    if not sep:
        raise ValueError("not an approval question from the ledger gateway")
    found = json.loads(tail)
    if not isinstance(found, dict) or "operation_id" not in found:
        raise ValueError("the approval question names no operation")
    return found


def result_for(call: ToolCall, outcome: Outcome, intent: Intent | None = None) -> CallToolResult:
    """The tool result for an outcome (``intent``: names what to approve).

    Args:
        call: the call.
        outcome: the ledger's typed outcome.
        intent: the call's intent, for :class:`NeedsReauthorisation`.

    Returns:
        A result whose ``structuredContent["status"]`` names the outcome;
        refusals, held and abandoned operations are tool errors naming the remedy.
    """
    op = call.operation_id
    match outcome:
        case Verified():
            body: dict[str, Any] = {
                "status": "verified",
                "operation_id": op,
                "effect_id": outcome.effect_id,
                "postcondition": outcome.postcondition,
                "policy_version": outcome.policy_version,
            }
            return _result(body, f"{call.tool} {op} verified: effect {outcome.effect_id}", False)
        case NeedsReauthorisation():
            named = pending_operation(call, outcome, intent) if intent else {"operation_id": op}
            body = {
                "status": "input_required",
                **named,
                "remedy": (
                    "ask a reviewer to publish a grant bound to this operation and digest, then "
                    "call the tool again with the same arguments and approval_id set to its ID"
                ),
            }
            return _result(body, f"{call.tool} {op} needs approval: {outcome.reason}", False)
        case Pending():
            body = {
                "status": "pending",
                "operation_id": op,
                "state": outcome.state,
                "reason": outcome.reason,
                "remedy": _SAME_CALL_AGAIN,
            }
            return _result(body, f"{call.tool} {op} not settled yet ({outcome.state})", False)
        case Refused():
            return _error(call, "refused", outcome.reason, outcome.remedy, kind=outcome.kind)
        case Held():
            return _error(
                call,
                "held",
                outcome.reason,
                outcome.release_condition or "wait for the ledger's reconciliation",
                owner=outcome.owner,
                effect_id=outcome.effect_id,
            )
        case Abandoned():
            return _error(call, "abandoned", outcome.reason, outcome.remedy)
    raise AssertionError(f"unknown outcome {outcome!r}")  # pragma: no cover


_SAME_CALL_AGAIN = (
    "call the same tool again with the same arguments (always safe: the same case is the "
    "same operation, never a second effect)"
)


def _result(body: dict[str, Any], text: str, is_error: bool) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text + "\n" + json.dumps(body, sort_keys=True))],
        structured_content=body,
        is_error=is_error,
    )


def _error(call: ToolCall, status: str, reason: str, remedy: str, **extra: Any) -> CallToolResult:
    body = {"status": status, "operation_id": call.operation_id, "reason": reason, **extra}
    body["remedy"] = remedy
    return _result(body, f"{call.tool} {call.operation_id} {status}: {reason}; {remedy}", True)


def _declined(call: ToolCall, action: str) -> CallToolResult:
    return _error(
        call,
        "declined",
        f"the reviewer did not approve ({action}); nothing was paid or sent",
        "the operation waits for an approval: call again with the same arguments when one "
        "is published",
    )


def _answered(ctx: Context | None) -> ElicitResult | None:
    """The client's answer to the approval question, on a retried call."""
    if ctx is None or not ctx.input_responses:
        return None
    answer = ctx.input_responses.get(APPROVAL_INPUT)
    return answer if isinstance(answer, ElicitResult) else None


def _approval_id(answer: ElicitResult) -> str | None:
    value = (answer.content or {}).get("approval_id")
    return value.strip() if isinstance(value, str) and value.strip() else None


def _speaks_input_required(ctx: Context) -> bool:
    version = ctx.protocol_version or ""
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", version)) and version >= INPUT_REQUIRED_PROTOCOL


def _can_elicit(ctx: Context) -> bool:
    capabilities = ctx.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


def build_server(gateway: LedgerGateway, name: str = "ledger-gateway") -> MCPServer:
    """An MCP server exposing ``refund`` and ``notify`` through ``gateway``.

    Args:
        gateway: the ledger gateway.
        name: the server's name.

    Returns:
        The server (``run()`` serves stdio; tests connect ``mcp.Client`` to it).
    """
    server = MCPServer(
        name,
        instructions=(
            "Consequential tools recorded by a recovery ledger. Calling a tool again with the "
            "same case is safe: it returns the same operation's outcome, never a second effect."
        ),
    )

    @server.tool()
    async def refund(
        case_id: CaseId,
        account: Annotated[str, Field(min_length=1, max_length=128)],
        amount_minor: Annotated[int, Field(gt=0, description="minor currency units")],
        currency: Annotated[str, Field(pattern=r"^[A-Z]{3}$", description="ISO 4217")],
        ctx: Context,
        decision_version: Version = 1,
        approval_id: str | None = None,
    ) -> CallToolResult | InputRequiredResult:
        """Refund a case once: pays amount_minor to account through the ledger.

        Needs a reviewer's approval bound to the operation; the result says
        what to approve. Calling again with the same case is safe.
        """
        call = ToolCall(
            "refund",
            case_id,
            gateway.refund_sink,
            {"account": account, "amount_minor": amount_minor, "currency": currency},
            decision_version,
        )
        return await gateway.handle(call, ctx, approval_id)

    @server.tool()
    async def notify(
        case_id: CaseId,
        to: Annotated[str, Field(min_length=3, max_length=254, description="recipient")],
        ctx: Context,
        decision_version: Version = 1,
        approval_id: str | None = None,
    ) -> CallToolResult | InputRequiredResult:
        """Notify a case's customer once, through the ledger.

        Calling again with the same case is safe: never a second message.
        """
        call = ToolCall("notify", case_id, gateway.notify_sink, {"to": to}, decision_version)
        return await gateway.handle(call, ctx, approval_id)

    return server


def main() -> None:
    """Serve the gateway over stdio with the ledger's settings (``LEDGER_*``).

    ``LEDGER_MCP_REFUND_SINK`` and ``LEDGER_MCP_NOTIFY_SINK`` name the sinks
    (default ``payments`` and ``notifications``); ``LEDGER_MCP_ACTOR`` the
    actor (default ``mcp-gateway``).
    """
    import os

    from ledger.settings import LedgerSettings
    from producers.sdk import LedgerService

    service = LedgerService(
        LedgerSettings(), actor=os.environ.get("LEDGER_MCP_ACTOR", "mcp-gateway")
    )
    gateway = LedgerGateway(
        service,
        refund_sink=os.environ.get("LEDGER_MCP_REFUND_SINK", "payments"),
        notify_sink=os.environ.get("LEDGER_MCP_NOTIFY_SINK", "notifications"),
    )
    try:
        build_server(gateway).run()
    finally:
        service.close()


if __name__ == "__main__":
    main()
