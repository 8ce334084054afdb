"""What became of an operation, as the service that asked sees it (pure: no clock, no I/O).

The processor publishes an :class:`~ledger.events.Outcome` on the
``outcomes`` topic in the transaction that decides it (see
:func:`decided_outcome` for when), signed with its outcome key, so a
service learns the outcome from a record it may read and can verify
without any secret. The kind is a function of the operation's recovery
state:

==========================  ==========================
state                       outcome kind
==========================  ==========================
OUTCOME_VERIFIED            ``VERIFIED``
EFFECT_COMMITTED            ``COMMITTED``
NEEDS_REAUTHORISATION       ``NEEDS_REAUTHORISATION``
UNKNOWN_OUTCOME             ``HELD``
ABANDONED                   ``ABANDONED``
any other (in flight)       ``PENDING``
==========================  ==========================

``COMMITTED`` is final for a waiter: the sink's receipt says the effect was
made once, and nothing independent has verified it -- the sink offers no
postcondition (an e-mail relay), or the one it offers has not confirmed it
yet (the operation then waits in reconciliation and, once read back, is
announced again as ``VERIFIED``). Reporting it as pending would send a
service waiting for something that may never come; reporting it as
verified would claim evidence the ledger does not hold.

An intent the processor refuses (unknown sink, bad input, parameter
drift) is ``REFUSED`` with the operating event's kind, whatever the state.
"""

from __future__ import annotations

from collections.abc import Mapping

from ledger.events import Event, Intent, OperatingEvent, OperationState, Outcome
from ledger.fold import Decision
from ledger.states import RecoveryState as S

#: Outcome kinds a waiter stops at: everything but ``PENDING``.
FINAL_KINDS: frozenset[str] = frozenset(
    {"VERIFIED", "COMMITTED", "NEEDS_REAUTHORISATION", "HELD", "REFUSED", "ABANDONED"}
)

#: The outcome kind of each recovery state (absent: ``PENDING``).
KIND_OF_STATE: Mapping[S, str] = {
    S.OUTCOME_VERIFIED: "VERIFIED",
    S.EFFECT_COMMITTED: "COMMITTED",
    S.NEEDS_REAUTHORISATION: "NEEDS_REAUTHORISATION",
    S.UNKNOWN_OUTCOME: "HELD",
    S.ABANDONED: "ABANDONED",
}

#: What a held operation waits for (``release_condition`` of a ``HELD`` outcome).
HELD_RELEASE = (
    "a new observation of the effect (a readback by the relay or a reconciler) or an "
    "operator's attributable disposition (`ledger reconcile dispose`); never a timer"
)

#: The remedy of each outcome kind (refusals: see :data:`REFUSAL_REMEDY`).
REMEDY: Mapping[str, str] = {
    "VERIFIED": "",
    "COMMITTED": (
        "nothing to redo: the effect was made once by the sink's own receipt; where an "
        "independent check matters, `ledger history OPERATION` shows whether the sink offers "
        "a postcondition and what reconciliation awaits"
    ),
    "NEEDS_REAUTHORISATION": (
        "ask a reviewer for a new approval bound to this operation, then publish the same "
        "intent again with its approval ID"
    ),
    "HELD": (
        "do not retry under a new operation ID: the effect may have been made; the ledger "
        "releases the operation on a new observation or an operator's disposition"
    ),
    "ABANDONED": "the operation is closed; a new request needs a new operation ID",
    "PENDING": "publish the same operation again later (always safe) to learn its outcome",
}

#: The remedy of a refused intent, by the operating event's kind.
REFUSAL_REMEDY: Mapping[str, str] = {
    "UNKNOWN_SINK": (
        "register the sink (`ledger sink register`) or correct its name, then publish again; no "
        "approval was used"
    ),
    "PARAMETER_DRIFT": (
        "this operation ID is bound to other parameters: use a new operation ID (e.g. a new "
        "decision version) for a different request"
    ),
    "BAD_INPUT": "correct the intent (operation ID grammar, parameters, digest), then publish it",
}

#: The remedy of a refusal whose kind :data:`REFUSAL_REMEDY` does not name.
REFUSAL_REMEDY_DEFAULT = "`ledger history OPERATION` says why; correct the intent and publish it"


def kind_of(state: OperationState) -> str:
    """The outcome kind of an operation's state (see the module's table)."""
    return KIND_OF_STATE.get(S(state.state), "PENDING")


def outcome_of(state: OperationState, outcome_id: str, at_ms: int) -> Outcome:
    """The outcome an operation's state stands for.

    Args:
        state: the operation's state after the decided input.
        outcome_id: the outcome's ID (derived from the input's position).
        at_ms: the input's Kafka timestamp (Unix ms), not a clock read.

    Returns:
        The :class:`~ledger.events.Outcome`: ``VERIFIED`` with the effect ID
        and the postcondition that verified it; ``NEEDS_REAUTHORISATION``
        with the approval and policy version; ``HELD`` with the owner and
        release condition; ``ABANDONED``; or ``PENDING`` with the state.
    """
    kind = kind_of(state)
    postcondition = (
        f"{state.observation_source}: {state.observation_status}"
        if kind == "VERIFIED" and state.observation_source
        else None
    )
    return Outcome(
        outcome_id=outcome_id,
        operation_id=state.operation_id,
        kind=kind,  # type: ignore[arg-type]  # a value of OutcomeKind (KIND_OF_STATE)
        state=str(state.state),
        state_version=state.version,
        reason=state.reason,
        remedy=REMEDY[kind],
        parameter_digest=state.parameter_digest,
        effect_id=(
            state.effect_id if kind in ("VERIFIED", "COMMITTED", "HELD", "ABANDONED") else None
        ),
        postcondition=postcondition,
        approval_id=state.approval_id if kind == "NEEDS_REAUTHORISATION" else None,
        policy_version=(
            state.admitted_policy_version
            if kind in ("VERIFIED", "COMMITTED", "NEEDS_REAUTHORISATION")
            else None
        ),
        owner=(state.owner or "reconciliation") if kind == "HELD" else None,
        release_condition=HELD_RELEASE if kind == "HELD" else None,
        at_ms=at_ms,
    )


def refusal_of(
    intent: Intent,
    state: OperationState | None,
    refusal: OperatingEvent | None,
    reason: str,
    outcome_id: str,
    at_ms: int,
) -> Outcome:
    """The ``REFUSED`` outcome of an intent the processor refused.

    Args:
        intent: the refused intent.
        state: the operation's state, unchanged by the refusal (``None``:
            the operation does not exist).
        refusal: the operating event that says why (its ``kind`` becomes
            ``refusal_kind``), if the decision wrote one.
        reason: the decision's reason.
        outcome_id: the outcome's ID.
        at_ms: the input's Kafka timestamp (Unix ms).

    Returns:
        The outcome, bound to the refused intent's parameter digest (a
        drifted intent's refusal does not answer the operation's own
        request).
    """
    kind = refusal.kind if refusal is not None else "REFUSED"
    return Outcome(
        outcome_id=outcome_id,
        operation_id=intent.operation_id,
        kind="REFUSED",
        state=str(state.state) if state is not None else None,
        state_version=state.version if state is not None else 0,
        reason=refusal.reason if refusal is not None else reason,
        remedy=REFUSAL_REMEDY.get(kind, REFUSAL_REMEDY_DEFAULT),
        refusal_kind=kind,
        parameter_digest=intent.parameter_digest,
        at_ms=at_ms,
    )


def decided_outcome(
    before: OperationState | None, decision: Decision, event: Event, ref: str, at_ms: int
) -> Outcome | None:
    """The outcome the processor publishes with a decision, or ``None``.

    One is published

    * for every intent: a refusal as ``REFUSED`` (with the operating
      event's kind), else the operation's outcome as it now stands
      (``PENDING`` with its state while it is in flight). A service that
      publishes the same operation again thus always gets an answer newer
      than its publish (bounded waits, :mod:`producers.outcomes`);
    * for any other input that moves the operation into another recovery
      state (a self-loop, a no-op and a refusal leave it where it was): a
      final kind, or ``PENDING`` with the new state, so that a wait that
      runs out reports the state the operation is really in.

    Args:
        before: the operation's state before the input (``None``: unknown).
        decision: what the fold decided (:func:`ledger.fold.decide`).
        event: the decided input.
        ref: the input's position (``topic:partition:offset``).
        at_ms: the input's Kafka timestamp (Unix ms), the outcome's time.

    Returns:
        The outcome to write on ``outcomes`` (key: the operation ID), or ``None``.
    """
    outcome_id = f"processor:{ref}"
    if isinstance(event, Intent):
        if decision.outcome == "REFUSED":
            refusal = next(
                (o.event for o in decision.outputs if isinstance(o.event, OperatingEvent)),
                None,
            )
            return refusal_of(event, decision.state, refusal, decision.reason, outcome_id, at_ms)
        if decision.state is None:
            return None
        return outcome_of(decision.state, outcome_id, at_ms)
    new = decision.state
    if decision.outcome != "APPLIED" or new is None:
        return None
    if before is not None and before.state == new.state:
        return None  # a self-loop (a claim, a re-dispatch): nothing new for the service
    return outcome_of(new, outcome_id, at_ms)
