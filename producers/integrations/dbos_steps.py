"""Ledger operations as DBOS steps: a workflow that crashes anywhere resumes into the same one.

Inside a ``@DBOS.workflow()``, :meth:`LedgerSteps.perform` runs one DBOS step
(named ``ledger:<name>``) that performs one operation through
:meth:`producers.sdk.LedgerService.perform` and returns its typed outcome::

    steps = LedgerSteps(LedgerService(LedgerSettings(), actor="svc-remediation"))

    @DBOS.workflow()
    def remediate(case_id: str) -> str:
        outcome = steps.perform(
            "refund", sink="payments", action="refund",
            params={"account": "acct-1842", "amount_minor": 5000, "currency": "GBP"},
            subject="customer-1842", purpose="fee-remediation",
            approval_id="review-1842",
        )
        match outcome:
            case Verified(): return "refunded"
            case NeedsReauthorisation(): return "ask a reviewer again"
            case _: return type(outcome).__name__

The operation ID is ``<name>:<workflow ID>:v<decision version>``
(:func:`operation_id_for`): chosen from the workflow's identity before the
first attempt, never random, so every execution of the workflow -- the
first, and each one DBOS recovers after a crash -- performs the same
operation. A crash before the publish, after it, or after the answer but
before DBOS recorded the step makes the recovered workflow perform that
operation again: the ledger records the intent once and answers with the
operation's outcome, and the sink holds one effect.

DBOS's checkpoint holds the step's result: the outcome (operation ID,
approval ID, effect ID, reasons), never a grant or a key. Authority stays in
the ledger: a recovered workflow whose approval has expired meanwhile gets
:class:`~producers.sdk.NeedsReauthorisation`, not an effect.

Needs the ``dbos`` extra (``pip install 'kafka-recovery-ledger[dbos]'``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledger.errors import DeliveryUnknownError, InvalidInputError
from ledger.identity import operation_id_problem
from producers.sdk import Outcome, Pending, Performer

try:
    from dbos import DBOS
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "producers.integrations.dbos_steps needs DBOS: pip install 'kafka-recovery-ledger[dbos]'"
    ) from exc

__all__ = ["LedgerSteps", "Performer", "operation_id_for"]


def operation_id_for(workflow_id: str, name: str, decision_version: int = 1) -> str:
    """The operation ID a workflow's step performs: ``<name>:<workflow ID>:v<decision version>``.

    A review system uses it to bind an approval to the operation before the
    workflow reaches it (:func:`producers.review.grant`).

    Args:
        workflow_id: the DBOS workflow ID (choose it from the case, e.g. with
            ``SetWorkflowID(f"remediation-{case_id}")``, so that starting the
            same case twice is one workflow).
        name: the operation's name within the workflow (``refund``,
            ``notify-2``): unique per operation, no ``:``.
        decision_version: version of the business decision (a new decision
            is a new operation).

    Returns:
        The operation ID, e.g. ``refund:remediation-1842:v1``.

    Raises:
        LedgerError: a name that is empty or holds ``:``, or an ID outside the
            operation-ID grammar (printable ASCII without spaces, at most 200
            characters); the message says which.
    """
    if not name or ":" in name:
        raise InvalidInputError(
            f"ledger step name {name!r}: give each operation of the workflow a non-empty name "
            "without ':' (e.g. 'refund', 'notify-2')",
            observed=name,
        )
    operation_id = f"{name}:{workflow_id}:v{decision_version}"
    problem = operation_id_problem(operation_id)
    if problem is not None:
        raise InvalidInputError(
            f"{problem}: the operation ID {operation_id!r} is made of the step's name and the "
            "workflow ID; choose a workflow ID of printable ASCII without spaces (SetWorkflowID)",
            operation_id=operation_id,
        )
    return operation_id


@dataclass(frozen=True)
class LedgerSteps:
    """Consequential operations of DBOS workflows, performed through the ledger.

    Args:
        service: a :class:`producers.sdk.LedgerService` (or anything with its
            ``perform``); built once per process, before ``DBOS.launch()``.
        wait_s: how long each publish waits for an outcome (seconds).
        settle_s: how long one step keeps performing an operation whose
            outcome is not final yet (seconds). Past it the step returns
            :class:`~producers.sdk.Pending`; perform the same name again
            later to learn more.
    """

    service: Performer
    wait_s: float = 30.0
    settle_s: float = 300.0

    def perform(
        self,
        name: str,
        *,
        sink: str,
        action: str,
        params: Mapping[str, Any],
        subject: str,
        purpose: str,
        decision_version: int = 1,
        approval_id: str | None = None,
        compensates: str | None = None,
    ) -> Outcome:
        """Perform one operation as a DBOS step of the running workflow; return its outcome.

        Call it from a ``@DBOS.workflow()`` function. The step is named
        ``ledger:<name>`` in DBOS; its result (the outcome) is checkpointed,
        so a recovered workflow replays it without asking the ledger. A
        crash before DBOS recorded it makes the recovered workflow perform
        the same operation again, which is always safe.

        Calling it again with the same name in the same workflow performs the
        same operation (a new DBOS step, the same operation ID): the way to
        ask again after :class:`~producers.sdk.Pending`, or to rely on a new
        approval after :class:`~producers.sdk.NeedsReauthorisation`.

        Args:
            name: the operation's name within the workflow (see
                :func:`operation_id_for`).
            sink: the sink (as :meth:`producers.sdk.LedgerService.perform`, as
                are the arguments below). Derive all of them from the
                workflow's inputs and recorded steps, so that a recovered
                workflow passes the same ones (others under the same ID are
                refused as parameter drift).
            action: the action.
            params: the parameters (amounts in minor units).
            subject: the subject.
            purpose: the purpose.
            decision_version: the decision version.
            approval_id: the approval it rests on, if any.
            compensates: the operation it compensates, if any.

        Returns:
            The outcome: :class:`~producers.sdk.Verified` (the effect was
            made once and read back), or, as values to branch on (never
            retried here): :class:`~producers.sdk.NeedsReauthorisation`,
            :class:`~producers.sdk.Held`, :class:`~producers.sdk.Refused`,
            :class:`~producers.sdk.Abandoned`; :class:`~producers.sdk.Pending`
            when ``settle_s`` ran out first.

        Raises:
            LedgerError: called outside a DBOS workflow or inside a step, a
                bad name or workflow ID, invalid parameters, or the broker
                refused the intent (DBOS records the error for the step).
        """
        workflow_id = DBOS.workflow_id
        if workflow_id is None:
            raise InvalidInputError(
                f"ledger step {name!r} called outside a DBOS workflow: call "
                "LedgerSteps.perform from a @DBOS.workflow() function (the operation ID is "
                "derived from the workflow ID)"
            )
        if DBOS.step_id is not None:
            raise InvalidInputError(
                f"ledger step {name!r} called inside a DBOS step: call LedgerSteps.perform from "
                "the workflow function itself, so that DBOS checkpoints its outcome"
            )
        operation_id = operation_id_for(workflow_id, name, decision_version)
        return DBOS.run_step(
            {"name": f"ledger:{name}"},
            self.settle,
            operation_id=operation_id,
            sink=sink,
            action=action,
            params=dict(params),
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
            approval_id=approval_id,
            compensates=compensates,
        )

    def settle(
        self,
        *,
        operation_id: str,
        sink: str,
        action: str,
        params: Mapping[str, Any],
        subject: str,
        purpose: str,
        decision_version: int = 1,
        approval_id: str | None = None,
        compensates: str | None = None,
    ) -> Outcome:
        """The step's body: perform the operation until its outcome is final or ``settle_s`` ends.

        A :class:`~producers.sdk.Pending` answer or a publish whose delivery
        is unknown is performed again (the same intent: recorded once);
        every other outcome is returned at once.

        Args:
            operation_id: the operation (:func:`operation_id_for`).
            sink: as :meth:`perform`.
            action: as :meth:`perform`.
            params: as :meth:`perform`.
            subject: as :meth:`perform`.
            purpose: as :meth:`perform`.
            decision_version: as :meth:`perform`.
            approval_id: as :meth:`perform`.
            compensates: as :meth:`perform`.

        Returns:
            The final outcome, or the last :class:`~producers.sdk.Pending`
            (its reason says the delivery was unknown, when it was).

        Raises:
            LedgerError: as :meth:`producers.sdk.LedgerService.perform`,
                except :class:`~ledger.errors.DeliveryUnknownError`.
        """
        deadline = time.monotonic() + self.settle_s
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            try:
                outcome = self.service.perform(
                    operation_id=operation_id,
                    sink=sink,
                    action=action,
                    params=params,
                    subject=subject,
                    purpose=purpose,
                    decision_version=decision_version,
                    approval_id=approval_id,
                    compensates=compensates,
                    wait_s=min(self.wait_s, remaining),
                )
            except DeliveryUnknownError as exc:
                outcome = Pending(
                    operation_id,
                    None,
                    f"the intent's delivery is unknown ({exc.message}); perform the same "
                    "operation again to find out",
                )
            if not isinstance(outcome, Pending) or time.monotonic() >= deadline:
                return outcome
