"""Intents: a service asks for one operation; the fold creates it or refuses drift."""

from __future__ import annotations

import json
from functools import lru_cache

from ledger.events import Intent, OperationState
from ledger.fold.compensation import CompensationFacts, compensation_refusal
from ledger.fold.core import STAY, Decision, _admission_request, _move, _noop, _refuse
from ledger.fold.tally import await_tally
from ledger.identity import amount_of, digest_version, operation_id_problem, parameter_digest
from ledger.states import ENTRY
from ledger.states import RecoveryState as S


def intent_digest_problem(intent: Intent) -> str | None:
    """Why an intent's digest or amount does not match its fields.

    The digest is recomputed in the version it names
    (:func:`~ledger.identity.digest_version`): version 2 binds the sink,
    version 1 (intents of earlier releases) does not. The answer is a pure
    function of those fields, kept for the last :data:`DIGEST_CHECKS_KEPT`
    intents checked in this process: an intent seen again (a re-published
    duplicate, a replay of the journal) is not digested again.

    Args:
        intent: the intent as published.

    Returns:
        ``None`` when ``parameter_digest`` and ``amount_minor`` agree with
        the parameters, else the problem in words (bad JSON, a parameter
        the digest refuses, a digest or amount that differs).
    """
    return _digest_problem(
        intent.params_json,
        intent.action,
        intent.subject,
        intent.purpose,
        intent.decision_version,
        intent.sink,
        intent.parameter_digest,
        intent.amount_minor,
    )


#: How many intents' digest checks :func:`intent_digest_problem` keeps.
DIGEST_CHECKS_KEPT = 4096


@lru_cache(maxsize=DIGEST_CHECKS_KEPT)
def _digest_problem(
    params_json: str,
    action: str,
    subject: str,
    purpose: str,
    decision_version: int,
    sink: str,
    claimed: str,
    amount_minor: int,
) -> str | None:
    try:
        params = json.loads(params_json)
        if not isinstance(params, dict):
            return "params_json is not a JSON object"
        digest = parameter_digest(
            action=action,
            params=params,
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
            sink=sink,
            version=digest_version(claimed),
            params_checked=True,  # straight from json.loads
        )
        amount = amount_of(params)
    except Exception as exc:
        return f"parameters are not valid: {exc}"
    if digest != claimed:
        return f"parameter_digest {claimed} does not match the parameters ({digest})"
    if amount != amount_minor:
        return f"amount_minor {amount_minor} differs from params amount {amount}"
    return None


def _unknown_sink(
    state: OperationState | None, intent: Intent, ref: str, sink_problem: str
) -> Decision:
    """Refuse an intent whose sink cannot be used, before any approval is consumed."""
    op = intent.operation_id
    used = (
        f"approval {intent.approval_id} was not used"
        if intent.approval_id is not None
        else "no approval was involved"
    )
    after = (
        "publish the intent again (the operation ID is still free)"
        if state is None
        else "publish the intent with its new approval again"
    )
    return _refuse(
        state,
        ref,
        op,
        "UNKNOWN_SINK",
        f"intent for {op} refused before admission: {sink_problem}; {used}. "
        f"Register the sink or correct its name, then {after}",
    )


def _intent(
    state: OperationState | None,
    intent: Intent,
    ref: str,
    sink_problem: str | None = None,
    compensation: CompensationFacts | None = None,
) -> Decision:
    """Create the operation, reauthorise it with a new approval, or refuse drift.

    ``sink_problem`` is what the processor observed of the intent's sink (not
    registered, registry unreadable): an intent that would create the
    operation or request its admission is then refused with an
    ``UNKNOWN_SINK`` operating event, so no approval is consumed and nothing
    is bound to the operation ID; a duplicate of a known operation stays a
    no-op.

    ``compensation`` is what the processor observed of the original an
    intent ``compensates`` (see :mod:`ledger.fold.compensation`): a
    compensation that may not proceed is created ``ABANDONED`` with the
    reason, before any approval is consumed.
    """
    op = intent.operation_id
    problem = operation_id_problem(op) or intent_digest_problem(intent)
    if problem is not None:
        return _refuse(state, ref, op, "BAD_INPUT", f"intent for {op} refused: {problem}")
    if intent.forked_from is not None and intent.forked_from == op:
        return _refuse(
            state,
            ref,
            op,
            "BAD_INPUT",
            f"intent for {op} refused: an operation cannot be a fork of itself; a fork needs "
            "a new operation ID",
        )
    if state is None and sink_problem is not None:
        return _unknown_sink(state, intent, ref, sink_problem)
    if state is None:
        new = OperationState(
            operation_id=op,
            state=ENTRY,
            version=1,
            epoch=0,
            parameter_digest=intent.parameter_digest,
            sink=intent.sink,
            action=intent.action,
            params_json=intent.params_json,
            actor=intent.actor,
            subject=intent.subject,
            purpose=intent.purpose,
            decision_version=intent.decision_version,
            approval_id=intent.approval_id,
            amount_minor=intent.amount_minor,
            reason="intent recorded",
            compensates=intent.compensates,
        )
        if intent.compensates is not None:
            refusal = compensation_refusal(
                op,
                intent.compensates,
                compensation,
                subject=intent.subject,
                params_json=intent.params_json,
            )
            if refusal is not None:
                return _move(new, S.ABANDONED, ref, refusal, created=True)
            if compensation is not None and compensation.tally:
                return await_tally(new, intent, compensation, ref)
        if intent.approval_id is None:
            return _move(
                new,
                S.NEEDS_REAUTHORISATION,
                ref,
                "no approval supplied with the intent"
                + (
                    f" (a fork of {intent.forked_from} inherits no admission)"
                    if intent.forked_from
                    else ""
                ),
                created=True,
                reauthorisations=1,
            )
        fork = f" (a fork of {intent.forked_from})" if intent.forked_from else ""
        return _move(
            new,
            STAY,
            ref,
            f"intent recorded{fork}; admission requested",
            (_admission_request(new, intent.approval_id),),
            created=True,
            reason=f"intent recorded{fork}",
        )
    if not _same_request(state, intent):
        if intent.compensates != state.compensates:
            # The digest does not bind the link: say what differs.
            bound = (
                f"compensates {state.compensates}" if state.compensates else "compensates nothing"
            )
            drift = (
                f"operation {op} {bound}; this intent names "
                f"{intent.compensates or 'no operation'} (parameter drift)"
            )
        else:
            drift = (
                f"operation {op} is bound to parameter digest {state.parameter_digest[:15]}... "
                f"for sink {state.sink}; this intent has {intent.parameter_digest[:15]}... for "
                f"sink {intent.sink} (parameter drift)"
            )
        return _refuse(
            state,
            ref,
            op,
            "PARAMETER_DRIFT",
            f"{drift}: use a new operation ID (e.g. a new decision version) for a different "
            "request",
        )
    if (
        state.state == S.NEEDS_REAUTHORISATION
        and intent.approval_id is not None
        and intent.approval_id != state.approval_id
    ):
        if sink_problem is not None:
            return _unknown_sink(state, intent, ref, sink_problem)
        approval_id = intent.approval_id
        return _move(
            state,
            S.NOT_ADMITTED,
            ref,
            f"reauthorisation with approval {approval_id}; admission requested",
            approval_id=approval_id,
            after=lambda new: (_admission_request(new, approval_id),),
        )
    return _noop(state, "duplicate intent: same operation, same digest")


def _same_request(state: OperationState, intent: Intent) -> bool:
    """Whether a valid intent asks for exactly the operation ``state`` is bound to.

    The sink is compared directly (a version-1 digest does not bind it), and
    the digests in the state's digest version: an operation recorded with a
    version-1 digest and re-published by a newer publisher (version 2) is
    the same request when its version-1 digest matches.

    Args:
        state: the operation as recorded.
        intent: an intent for it that passed :func:`intent_digest_problem`.

    Returns:
        ``True`` when the sink and the digest (in the state's version) agree.
    """
    if intent.sink != state.sink or intent.compensates != state.compensates:
        return False
    version = digest_version(state.parameter_digest)
    if digest_version(intent.parameter_digest) == version:
        return intent.parameter_digest == state.parameter_digest
    recomputed = parameter_digest(
        action=intent.action,
        params=json.loads(intent.params_json),
        subject=intent.subject,
        purpose=intent.purpose,
        decision_version=intent.decision_version,
        sink=intent.sink,
        version=version,
        params_checked=True,
    )
    return recomputed == state.parameter_digest
