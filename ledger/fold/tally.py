"""The original's tally: one writer decides every compensation's claim on an effect.

A compensation is keyed by its own operation ID, so two compensations of one
original may be decided by two processors, each seeing the other not yet in
``ledger.state``. The claim on the effect is therefore decided where the
original lives, the way an approval's single use is decided on the
approval's partition:

1. A compensation that passes the checks of :mod:`ledger.fold.compensation`
   enters ``NOT_ADMITTED`` waiting (``tally`` ``REQUESTED``, no approval
   used) and writes a ``REQUEST`` keyed by the original on
   ``compensation-tally`` (:func:`await_tally`), with its subject, account
   and amount.
2. The original's owner folds the request against the original's state
   (:func:`_request`): granted when the subject and account are the
   original's and the compensations granted before it plus this one stay
   within the original's effect (its amount as the owner observed it,
   journaled); the grant is kept in the original's state
   (``compensations_granted``), a self-loop. Refused otherwise, naming the
   first compensation granted. A compensation that asks again gets its
   grant again, counted once.
3. The compensation's owner folds the verdict (keyed by the compensation,
   :func:`_verdict`): refused, it is ``ABANDONED`` with the reason; granted,
   it goes on as before (admission requested, or reauthorisation when the
   intent carried no approval).
4. A granted compensation that ends ``ABANDONED`` without effect (the sink
   refused it) writes a ``RELEASE`` keyed by the original
   (:func:`with_release`), which returns its share: the tally counts every
   compensation that may still take effect, or has. One abandoned from
   ``UNKNOWN_OUTCOME`` by a person's disposition may have acted: its share
   stays counted.

Every step is a decision of the fold, journaled with the facts it was made
with, so the auditor's replay reaches ``ledger.state`` exactly.
"""

from __future__ import annotations

import dataclasses
import json

from ledger.events import CompensationTally, Intent, OperationState, TallyKind
from ledger.fold.compensation import (
    SETTLED,
    CompensationFacts,
    PriorCompensation,
    account_of,
    amount_of,
    scope_refusal,
    total_refusal,
)
from ledger.fold.core import (
    STAY,
    Decision,
    Output,
    _admission_request,
    _move,
    _noop,
    _refuse,
    _replayed,
)
from ledger.states import RecoveryState as S
from ledger.topology import Topic

#: The topic of tally requests, verdicts and releases.
TOPIC = Topic.COMPENSATION_TALLY

#: A compensation's grant on its original: ``(operation ID, amount in minor
#: units or None for the whole effect)``.
Grant = tuple[str, int | None]


def grants_of(state: OperationState) -> tuple[Grant, ...]:
    """The compensations an original's tally granted and has not released, in grant order.

    Args:
        state: the original.

    Returns:
        ``(compensation ID, amount or None)`` pairs; empty when none (or
        when ``compensations_granted`` does not read as such pairs).
    """
    if not state.compensations_granted:
        return ()
    try:
        pairs = json.loads(state.compensations_granted)
        return tuple((str(op), amount if isinstance(amount, int) else None) for op, amount in pairs)
    except (ValueError, TypeError):
        return ()


def _grants_json(grants: tuple[Grant, ...]) -> str | None:
    return json.dumps([list(g) for g in grants], separators=(",", ":")) if grants else None


def _record(
    ref: str,
    kind: TallyKind,
    key: str,
    original: str,
    compensation: str,
    version: int,
    *,
    reason: str = "",
    subject: str | None = None,
    account: str | None = None,
    amount_minor: int | None = None,
) -> Output:
    return Output(
        TOPIC,
        key,
        CompensationTally(
            tally_id=f"tally:{ref}",
            operation_id=key,
            kind=kind,
            original=original,
            compensation=compensation,
            request_state_version=version,
            subject=subject,
            account=account,
            amount_minor=amount_minor,
            reason=reason,
        ),
    )


def await_tally(
    new: OperationState, intent: Intent, facts: CompensationFacts, ref: str
) -> Decision:
    """Create a compensation waiting for its original's tally, and ask for it.

    Args:
        new: the compensation as its intent records it (version 1).
        intent: its intent (``compensates`` set).
        facts: what the processor observed (``tally`` true, the checks passed).
        ref: the intent's position.

    Returns:
        An ``APPLIED`` decision creating the operation ``NOT_ADMITTED`` with
        ``tally`` ``REQUESTED``, and the ``REQUEST`` keyed by the original.
    """
    original = intent.compensates or ""
    own, _ = amount_of(intent.params_json, facts.amount_field)
    request = _record(
        ref,
        "REQUEST",
        original,
        original,
        new.operation_id,
        new.version,
        subject=intent.subject,
        account=account_of(intent.params_json),
        amount_minor=own,
    )
    why = f"compensation of {original}: waiting for the original's tally"
    return _move(new, STAY, ref, why, (request,), created=True, tally="REQUESTED")


def decide_tally(
    state: OperationState | None,
    record: CompensationTally,
    ref: str,
    facts: CompensationFacts | None,
) -> Decision:
    """Fold one ``compensation-tally`` record into the operation it is keyed by.

    Args:
        state: the keyed operation: the original for a request or a
            release, the compensation for a verdict (``None``: unknown).
        record: the record.
        ref: its position.
        facts: for a request, the original as its owner observed it
            (``original_amount_minor`` is the effect's amount).

    Returns:
        The decision (see the module's steps).
    """
    if record.kind == "REQUEST":
        return _request(state, record, ref, facts)
    if record.kind == "RELEASE":
        return _release(state, record, ref)
    if state is None:
        return _refuse(
            None,
            ref,
            record.operation_id,
            "UNKNOWN_OPERATION",
            f"no operation {record.operation_id!r} is known to the ledger",
        )
    return _verdict(state, record, ref)


def _answer(
    state: OperationState | None, req: CompensationTally, ref: str, granted: bool, why: str
) -> Output:
    """The verdict on ``req``, keyed by the compensation."""
    return _record(
        ref,
        "GRANTED" if granted else "REFUSED",
        req.compensation,
        req.original,
        req.compensation,
        req.request_state_version,
        reason=why,
        amount_minor=req.amount_minor,
    )


def _request(
    state: OperationState | None,
    req: CompensationTally,
    ref: str,
    facts: CompensationFacts | None,
) -> Decision:
    """Grant a compensation's claim on the original's effect, or refuse it."""
    original, comp = req.original, req.compensation
    if req.operation_id != original:
        return _refuse(
            state,
            ref,
            req.operation_id,
            "BAD_INPUT",
            f"tally request keyed by {req.operation_id} names the original {original}",
        )
    if state is None:
        why = f"compensation refused: {original} is not known to the ledger"
        return Decision(None, "NOOP", None, None, why, (_answer(state, req, ref, False, why),))
    grants = grants_of(state)
    if any(op == comp for op, _ in grants):
        why = f"compensation {comp} of {original} asked again: granted before, counted once"
        return _noop(state, why, _answer(state, req, ref, True, why))
    refusal = _refusal(state, req, facts, grants)
    if refusal is not None:
        return _noop(state, refusal, _answer(state, req, ref, False, refusal))
    share = "the whole effect" if req.amount_minor is None else f"{req.amount_minor} minor units"
    why = f"compensation {comp} granted {share} of {original}'s effect by its tally"
    return _move(
        state,
        STAY,
        ref,
        why,
        (_answer(state, req, ref, True, why),),
        compensations_granted=_grants_json((*grants, (comp, req.amount_minor))),
        reason=state.reason,
    )


def _refusal(
    state: OperationState,
    req: CompensationTally,
    facts: CompensationFacts | None,
    grants: tuple[Grant, ...],
) -> str | None:
    """Why the original's tally refuses ``req`` (its checks in order), or ``None``."""
    original = state.operation_id
    if S(state.state) not in SETTLED:
        return (
            f"compensation refused: {original} has not settled (it is {state.state}; "
            "only OUTCOME_VERIFIED or EFFECT_COMMITTED can be compensated)"
        )
    if facts is None:
        return f"compensation refused: the amount of {original}'s effect was not observed"
    problem = scope_refusal(
        req.compensation,
        original,
        subject=req.subject,
        account=req.account,
        original_subject=state.subject,
        original_account=account_of(state.params_json),
    )
    if problem is not None:
        return problem
    live = [PriorCompensation(op, "granted", amount) for op, amount in grants]
    return total_refusal(
        req.compensation, original, facts.original_amount_minor, req.amount_minor, live
    )


def _release(state: OperationState | None, rel: CompensationTally, ref: str) -> Decision:
    """Return an abandoned compensation's share of the original's effect."""
    grants = grants_of(state) if state is not None else ()
    kept = tuple(g for g in grants if g[0] != rel.compensation)
    if state is None or kept == grants:
        why = f"release of {rel.compensation}: no grant of it on {rel.original} to return"
        if state is None:
            return Decision(None, "NOOP", None, None, why)
        return _noop(state, why)
    return _move(
        state,
        STAY,
        ref,
        f"compensation {rel.compensation} abandoned without effect: its share of "
        f"{rel.original}'s effect returned to the tally",
        compensations_granted=_grants_json(kept),
        reason=state.reason,
    )


def _verdict(state: OperationState, v: CompensationTally, ref: str) -> Decision:
    """Abandon the waiting compensation, or let it go on to admission."""
    op = state.operation_id
    if v.compensation != op or v.original != state.compensates:
        return _refuse(
            state,
            ref,
            op,
            "BAD_INPUT",
            f"tally verdict for {v.compensation} of {v.original} does not match {op} "
            f"(which compensates {state.compensates})",
        )
    if state.tally != "REQUESTED" or state.state != S.NOT_ADMITTED:
        return _noop(
            state,
            f"tally verdict ignored: {op} is {state.state} and not waiting for its "
            f"original's tally ({state.tally or 'no tally'})",
        )
    if v.request_state_version != state.entered_version:
        return _replayed(
            state,
            ref,
            f"tally verdict ({v.kind}) of {v.original}",
            f"the request of state version {v.request_state_version}",
            "The pending request waits for the verdict of the original's owner",
        )
    if v.kind == "REFUSED":
        return _move(state, S.ABANDONED, ref, v.reason, tally="REFUSED")
    granted = f"granted by the tally of {v.original}"
    approval_id = state.approval_id
    if approval_id is None:
        return _move(
            state,
            S.NEEDS_REAUTHORISATION,
            ref,
            f"{granted}; no approval supplied with the intent",
            tally="GRANTED",
            reauthorisations=state.reauthorisations + 1,
        )
    return _move(
        state,
        STAY,
        ref,
        f"{granted}; admission requested",
        tally="GRANTED",
        after=lambda new: (_admission_request(new, approval_id),),
    )


def with_release(before: OperationState | None, decision: Decision, ref: str) -> Decision:
    """A granted compensation that ends ``ABANDONED`` returns its share of the effect.

    Args:
        before: the operation's state before the input.
        decision: the fold's decision on the input.
        ref: the input's position.

    Returns:
        ``decision`` itself, or, when it abandons a compensation whose claim
        was granted and whose effect is known absent (the sink refused it),
        the decision with ``tally`` ``RELEASED`` and a ``RELEASE`` keyed by
        the original. A compensation abandoned from ``UNKNOWN_OUTCOME`` (a
        person accepted not knowing whether it acted) keeps its share.
    """
    new = decision.state
    if (
        before is None
        or before.tally != "GRANTED"
        or before.compensates is None
        or before.state == S.UNKNOWN_OUTCOME  # abandoned not knowing: it may have acted
        or decision.outcome != "APPLIED"
        or new is None
        or new.state != S.ABANDONED
    ):
        return decision
    release = _record(
        ref,
        "RELEASE",
        before.compensates,
        before.compensates,
        before.operation_id,
        new.version,
    )
    return dataclasses.replace(
        decision,
        state=new.model_copy(update={"tally": "RELEASED"}),
        outputs=(*decision.outputs, release),
    )
