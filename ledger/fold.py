"""The pure fold: (state, input event) -> (new state, outputs).

This module is the processor's whole decision logic and the auditor's replay
function. It reads no clock, draws no random numbers and does no I/O: every
time it uses comes from a recorded event (an admission's evaluation time, an
observation's time), and every ID it makes is derived from the input's
position (``ref``). Replaying the journal through :func:`decide` therefore
reproduces ``ledger.state`` exactly.

The transition table (:data:`ledger.states.TRANSITIONS`) is law: every state
change goes through one function, ``_move``, which checks each hop of the
move against the table and refuses any other with a ``FORBIDDEN_TRANSITION``
operating event. A compound move (an admission: ``NOT_ADMITTED -> ADMITTED ->
EFFECT_PENDING``) is checked and recorded hop by hop (:attr:`Decision.hops`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal, TypedDict

from ledger.events import (
    AdmissionDecision,
    AdmissionRequest,
    Claim,
    Dispatch,
    DispatchKind,
    Disposition,
    EffectReceipt,
    Event,
    Intent,
    JournalEntry,
    OperatingEvent,
    OperationState,
    Readback,
    RecoveryAction,
    RecoveryReceipt,
    decode_event,
)
from ledger.identity import amount_of, parameter_digest
from ledger.states import ENTRY, IN_FLIGHT, allowed
from ledger.states import RecoveryState as S

#: "Unavailable" answers from a sink after which an operation is abandoned. An
#: absence observed by readback does not count: the request may never have
#: left (its sender crashed), and executing the same admitted operation again
#: under its idempotency key is safe.
MAX_UNAVAILABLE = 5

Outcome = Literal["APPLIED", "REFUSED", "NOOP"]

#: One step of the transition table, ``(from, to)``.
Hop = tuple[S, S]

#: The path of a self-loop: the state stays as it is (see :mod:`ledger.states`).
STAY: tuple[S, ...] = ()


@dataclass(frozen=True)
class Output:
    """A record the processor must write in the same transaction as the state.

    Attributes:
        topic: short topic name (``dispatches``, ``admission-requests`` ...).
        key: record key (operation ID or approval ID).
        event: the event, or ``None`` for a tombstone.
    """

    topic: str
    key: str
    event: Event | None


@dataclass(frozen=True)
class Decision:
    """The result of applying one input to one operation.

    Attributes:
        state: the operation's state after the input (``None`` if the
            operation does not exist and was not created).
        outcome: ``APPLIED`` (state changed, version bumped), ``REFUSED``
            (nothing changed; an operating event says why) or ``NOOP``.
        from_state: state before (``None`` for a new operation).
        to_state: state after.
        reason: why, in words an operator can act on.
        outputs: records to write with the state.
        hops: every transition of :data:`ledger.states.TRANSITIONS` the input
            took, in order: one for a simple move, two or more for a compound
            one (``UNKNOWN_OUTCOME -> ADMITTED -> EFFECT_PENDING``), none for a
            self-loop, a no-op or a refusal.
    """

    state: OperationState | None
    outcome: Outcome
    from_state: str | None
    to_state: str | None
    reason: str
    outputs: tuple[Output, ...] = field(default_factory=tuple)
    hops: tuple[Hop, ...] = ()


def decide(state: OperationState | None, event: Event, ref: str) -> Decision:
    """Apply one input event to one operation's state.

    Args:
        state: current state of the operation the event is keyed by, or
            ``None`` when the ledger has never seen it.
        event: an Intent, AdmissionDecision, EffectReceipt, Readback or Claim.
        ref: the input's position, ``topic:partition:offset``; IDs of the
            outputs are derived from it, so replay yields the same IDs.

    Returns:
        The :class:`Decision`. Never raises for bad input: a forbidden or
        malformed input is a ``REFUSED`` decision with an operating event.
    """
    if isinstance(event, Intent):
        return _intent(state, event, ref)
    if state is None:
        op = getattr(event, "operation_id", None)
        return _refuse(
            None, ref, op, "UNKNOWN_OPERATION", f"no operation {op!r} is known to the ledger"
        )
    if isinstance(event, AdmissionDecision):
        return _admission(state, event, ref)
    if isinstance(event, EffectReceipt):
        return _receipt(state, event, ref)
    if isinstance(event, Readback):
        return _readback(state, event, ref)
    if isinstance(event, Claim):
        return _claim(state, event, ref)
    if isinstance(event, Disposition):
        return _disposition(state, event, ref)
    return _refuse(
        state, ref, state.operation_id, "BAD_INPUT", f"{event.KIND} is not a processor input"
    )


# --------------------------------------------------------------------------- helpers


def _op_event(
    ref: str, op: str | None, kind: str, reason: str, transition: str | None = None
) -> Output:
    return Output(
        "operating-events",
        op or "",
        OperatingEvent(
            event_id=f"processor:{ref}:{kind}",
            operation_id=op,
            component="processor",
            kind=kind,
            reason=reason,
            attempted_transition=transition,
            source_topic=ref.rsplit(":", 2)[0],
            source_partition=_int(ref.rsplit(":", 2)[1]),
            source_offset=_int(ref.rsplit(":", 2)[2]),
        ),
    )


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _refuse(
    state: OperationState | None,
    ref: str,
    op: str | None,
    kind: str,
    reason: str,
    transition: str | None = None,
) -> Decision:
    name = str(state.state) if state else None
    return Decision(
        state,
        "REFUSED",
        name,
        name,
        reason,
        (_op_event(ref, op, kind, reason, transition),),
    )


def _noop(state: OperationState, reason: str, *outputs: Output) -> Decision:
    return Decision(state, "NOOP", str(state.state), str(state.state), reason, tuple(outputs))


def _forbidden(state: OperationState | None, op: str, hop: Hop, ref: str, why: str) -> Decision:
    transition = f"{hop[0]}->{hop[1]}"
    return _refuse(
        state,
        ref,
        op,
        "FORBIDDEN_TRANSITION",
        f"{transition} refused for {op}: {why}",
        transition,
    )


def _hops(start: S, path: tuple[S, ...]) -> tuple[Hop, ...]:
    """The hops of walking ``path`` from ``start`` (a step to the same state is none)."""
    hops: list[Hop] = []
    here = start
    for there in path:
        if there != here:
            hops.append((here, there))
        here = there
    return tuple(hops)


def _move(
    state: OperationState,
    to: S | tuple[S, ...],
    ref: str,
    why: str,
    outputs: Iterable[Output] = (),
    *,
    refused: str = "not in the transition table",
    created: bool = False,
    after: Callable[[OperationState], Iterable[Output]] | None = None,
    **changes: object,
) -> Decision:
    """Every state change of the fold, checked hop by hop against the table.

    The one place where the fold applies an input: each hop of ``to`` must be
    in :data:`ledger.states.TRANSITIONS`, or the input is refused with a
    ``FORBIDDEN_TRANSITION`` operating event naming the first hop that is not
    (``refused`` says why) and the state stays as it was. ``STAY`` (no hop) is
    a self-loop: the version moves, the recovery state does not.

    Args:
        state: the operation's state before the input; for a new operation
            (``created``), the state it enters with (version 1, ``NOT_ADMITTED``).
        to: the target state, or the path of a compound move, e.g.
            ``(S.ADMITTED, S.EFFECT_PENDING)``; ``STAY`` for a self-loop.
        ref: the input's position (names the operating event of a refusal).
        why: the decision's reason; also the new state's unless ``changes``
            sets ``reason``.
        outputs: records to write with the new state.
        refused: why a hop outside the table is refused (the operating
            event's reason ends with it).
        created: the input creates the operation: the decision's
            ``from_state`` is ``None`` and the version stays at 1.
        after: records that depend on the new state, written after ``outputs``.
        **changes: other fields of the new state.

    Returns:
        An ``APPLIED`` decision (version bumped, ``hops`` recorded), or a
        ``REFUSED`` one that leaves the state unchanged.
    """
    path = (to,) if isinstance(to, S) else to
    hops = _hops(S(state.state), path)
    for hop in hops:
        if not allowed(*hop):
            return _forbidden(None if created else state, state.operation_id, hop, ref, refused)
    end = path[-1] if path else S(state.state)
    new = state.model_copy(
        update={
            "state": end,
            "version": state.version + (0 if created else 1),
            "reason": why,
            **changes,
        }
    )
    written = (*outputs, *(after(new) if after else ()))
    return Decision(
        new, "APPLIED", None if created else str(state.state), str(end), why, written, hops
    )


def dispatch_id(state: OperationState, n: int) -> str:
    """ID of an operation's ``n``-th dispatch: ``{operation_id}#{epoch}.{n}``."""
    return f"{state.operation_id}#{state.epoch}.{n}"


def current_dispatch_id(state: OperationState) -> str:
    """ID of the latest dispatch the processor issued for this operation."""
    return dispatch_id(state, state.dispatches)


def _dispatch(
    state: OperationState, kind: DispatchKind, *, on_resume: bool = False
) -> tuple[Output, int]:
    n = state.dispatches + 1
    event = Dispatch(
        dispatch_id=dispatch_id(state, n),
        operation_id=state.operation_id,
        kind=kind,
        sink=state.sink,
        action=state.action,
        params_json=state.params_json,
        parameter_digest=state.parameter_digest,
        fencing_token=state.epoch,
        state_version=state.version + 1,
        approval_id=state.admitted_approval_id,
        on_resume=on_resume,
    )
    return Output("dispatches", state.operation_id, event), n


def _authority_text(state: OperationState) -> str:
    if state.admitted_approval_id is None:
        return "no admission"
    return (
        f"prior admission of this exact operation under approval {state.admitted_approval_id} "
        f"(policy {state.admitted_policy_version}, admitted at {state.admitted_at_ms} ms, "
        f"approval expires at {state.approval_expires_at_ms} ms)"
    )


class ObservedFields(TypedDict):
    """The state fields that record an observation (see :meth:`Observation.fields`)."""

    observation_source: str
    observation_status: str
    observed_at_ms: int


@dataclass(frozen=True)
class Observation:
    """What was observed of an operation's effect, where, when and by whom.

    Attributes:
        source: where it was read (sink and request, or a disposition).
        status: what was observed (``COMMITTED``, ``ABSENT`` ...).
        observed_at_ms: ledger time of the observation (milliseconds).
        on_resume: observed by a resume (a recovery receipt is due).
        observer: the relay, reconciler or person that observed it.
    """

    source: str
    status: str
    observed_at_ms: int
    on_resume: bool
    observer: str

    def fields(self) -> ObservedFields:
        """The state fields that record this observation."""
        return {
            "observation_source": self.source,
            "observation_status": self.status,
            "observed_at_ms": self.observed_at_ms,
        }


def _recovery_receipt(
    state: OperationState,
    ref: str,
    obs: Observation,
    *,
    action: RecoveryAction,
    effect_id: str | None,
    postcondition: str,
    uncertainty: str = "none",
    owner: str | None = None,
    release: str | None = None,
) -> Output:
    op = state.operation_id
    parts = op.split(":")
    return Output(
        "recovery-receipts",
        op,
        RecoveryReceipt(
            receipt_id=f"recovery:{ref}",
            operation_id=op,
            workflow_id=parts[1] if len(parts) >= 3 else op,
            checkpoint_version=state.version,
            claimant=state.owner or obs.observer,
            parameter_digest=state.parameter_digest,
            actor=state.actor,
            subject=state.subject,
            purpose=state.purpose,
            authority=_authority_text(state),
            authority_policy_version=state.admitted_policy_version,
            authority_expires_at_ms=state.approval_expires_at_ms,
            observation_source=obs.source,
            observation_status=obs.status,
            observed_at_ms=obs.observed_at_ms,
            action=action,
            effect_id=effect_id,
            postcondition=postcondition,
            uncertainty=uncertainty,
            uncertainty_owner=owner,
            release_condition=release,
        ),
    )


def _reconciliation(state: OperationState) -> Output:
    return Output("reconciliation", state.operation_id, state)


def _reconciliation_done(state: OperationState) -> Output:
    return Output("reconciliation", state.operation_id, None)


# --------------------------------------------------------------------------- intents


def intent_digest_problem(intent: Intent) -> str | None:
    """Why an intent's digest or amount does not match its fields (``None`` if fine)."""
    try:
        params = json.loads(intent.params_json)
        if not isinstance(params, dict):
            return "params_json is not a JSON object"
        digest = parameter_digest(
            action=intent.action,
            params=params,
            subject=intent.subject,
            purpose=intent.purpose,
            decision_version=intent.decision_version,
            params_checked=True,  # straight from json.loads
        )
        amount = amount_of(params)
    except Exception as exc:
        return f"parameters are not valid: {exc}"
    if digest != intent.parameter_digest:
        return (
            f"parameter_digest {intent.parameter_digest} does not match the parameters ({digest})"
        )
    if amount != intent.amount_minor:
        return f"amount_minor {intent.amount_minor} differs from params amount {amount}"
    return None


def _intent(state: OperationState | None, intent: Intent, ref: str) -> Decision:
    op = intent.operation_id
    problem = intent_digest_problem(intent)
    if problem is not None:
        return _refuse(state, ref, op, "BAD_INPUT", f"intent for {op} refused: {problem}")
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
        )
        if intent.approval_id is None:
            return _move(
                new,
                S.NEEDS_REAUTHORISATION,
                ref,
                "no approval supplied with the intent",
                created=True,
                reauthorisations=1,
            )
        return _move(
            new,
            STAY,
            ref,
            "intent recorded; admission requested",
            (_admission_request(new, intent.approval_id),),
            created=True,
            reason="intent recorded",
        )
    if intent.parameter_digest != state.parameter_digest:
        return _refuse(
            state,
            ref,
            op,
            "PARAMETER_DRIFT",
            f"operation {op} is bound to parameter digest {state.parameter_digest[:12]}...; "
            f"this intent has {intent.parameter_digest[:12]}... (parameter drift): use a new "
            "operation ID (e.g. a new decision version) for a different request",
        )
    if (
        state.state == S.NEEDS_REAUTHORISATION
        and intent.approval_id is not None
        and intent.approval_id != state.approval_id
    ):
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


def _admission_request(state: OperationState, approval_id: str) -> Output:
    return Output(
        "admission-requests",
        approval_id,
        AdmissionRequest(
            operation_id=state.operation_id,
            approval_id=approval_id,
            parameter_digest=state.parameter_digest,
            subject=state.subject,
            amount_minor=state.amount_minor,
            state_version=state.version,
        ),
    )


# --------------------------------------------------------------------------- admission


class _AdmittedFields(TypedDict):
    epoch: int
    admitted_approval_id: str
    admitted_policy_version: int
    admitted_at_ms: int
    approval_expires_at_ms: int | None


def _admission(state: OperationState, d: AdmissionDecision, ref: str) -> Decision:
    if state.state != S.NOT_ADMITTED:
        return _noop(state, f"admission decision ignored: operation is {state.state}")
    if d.approval_id != state.approval_id or d.parameter_digest != state.parameter_digest:
        return _refuse(
            state,
            ref,
            state.operation_id,
            "BAD_INPUT",
            f"admission decision for approval {d.approval_id} does not match the pending "
            f"request (approval {state.approval_id})",
        )
    if not d.admitted:
        return _move(
            state,
            S.NEEDS_REAUTHORISATION,
            ref,
            d.reason,
            reauthorisations=state.reauthorisations + 1,
        )
    admission = _AdmittedFields(
        epoch=state.epoch + 1,
        admitted_approval_id=d.approval_id,
        admitted_policy_version=d.policy_version,
        admitted_at_ms=d.evaluated_at_ms,
        approval_expires_at_ms=d.approval_expires_at_ms,
    )
    out, n = _dispatch(state.model_copy(update=dict(admission)), "EXECUTE")
    # Admitted, then dispatched in the same transaction (the outbox): two hops.
    return _move(
        state,
        (S.ADMITTED, S.EFFECT_PENDING),
        ref,
        f"admitted under approval {d.approval_id} (policy {d.policy_version}); dispatched",
        (out,),
        **admission,
        dispatches=n,
    )


# --------------------------------------------------------------------------- effects


def _committed(
    state: OperationState,
    ref: str,
    obs: Observation,
    *,
    effect_id: str | None,
) -> Decision:
    if state.state in (S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED):
        return _noop(state, "effect already recorded as committed")
    outputs: list[Output] = []
    if obs.on_resume:
        outputs.append(
            _recovery_receipt(
                state,
                ref,
                obs,
                action="COMPLETE",
                effect_id=effect_id,
                postcondition="pending: verification dispatched",
            )
        )
    if state.state == S.UNKNOWN_OUTCOME:
        outputs.append(_reconciliation_done(state))
    verify, n = _dispatch(state, "VERIFY", on_resume=obs.on_resume)
    outputs.append(verify)
    return _move(
        state,
        S.EFFECT_COMMITTED,
        ref,
        f"effect committed ({obs.source})",
        outputs,
        refused="an effect was observed for an operation never admitted",
        effect_id=effect_id,
        **obs.fields(),
        dispatches=n,
        recovery_receipts=state.recovery_receipts + (1 if obs.on_resume else 0),
    )


def _unknown(state: OperationState, ref: str, obs: Observation, *, why: str) -> Decision:
    if state.state == S.UNKNOWN_OUTCOME:
        return _noop(state, f"still unknown: {why}")
    outputs: list[Output] = []
    if obs.on_resume:
        outputs.append(
            _recovery_receipt(
                state,
                ref,
                obs,
                action="RECONCILE",
                effect_id=None,
                postcondition="not checked: effect state unknown",
                uncertainty=f"whether the effect committed at {state.sink}",
                owner="reconciliation",
                release="a readback that observes the effect, or an attributable disposition",
            )
        )
    return _move(
        state,
        S.UNKNOWN_OUTCOME,
        ref,
        f"outcome unknown: {why}",
        outputs,
        refused=why,
        after=lambda new: (_reconciliation(new),),
        **obs.fields(),
        recovery_receipts=state.recovery_receipts + (1 if obs.on_resume else 0),
    )


def _absent_retry(state: OperationState, ref: str, obs: Observation) -> Decision:
    """The effect is known absent: execute the same admitted operation again."""
    if state.state == S.EFFECT_PENDING:
        unavailable = state.unavailable + (1 if obs.status == "UNAVAILABLE" else 0)
        if unavailable >= MAX_UNAVAILABLE:
            return _move(
                state,
                S.ABANDONED,
                ref,
                f"{state.sink} answered unavailable {unavailable} times; giving up ({obs.source})",
                unavailable=unavailable,
            )
        out, n = _dispatch(state, "EXECUTE", on_resume=obs.on_resume)
        outputs: list[Output] = []
        if obs.on_resume:
            outputs.append(
                _recovery_receipt(
                    state,
                    ref,
                    obs,
                    action="EXECUTE",
                    effect_id=None,
                    postcondition="pending: effect re-dispatched",
                )
            )
        outputs.append(out)
        return _move(
            state,
            STAY,
            ref,
            f"effect absent ({obs.source}); same admitted operation dispatched again",
            outputs,
            dispatches=n,
            unavailable=unavailable,
            **obs.fields(),
            recovery_receipts=state.recovery_receipts + (1 if obs.on_resume else 0),
        )
    if state.state == S.UNKNOWN_OUTCOME:
        out, n = _dispatch(state, "EXECUTE", on_resume=True)
        reason = f"effect observed absent ({obs.source}); same admitted operation dispatched again"
        outputs = [
            _recovery_receipt(
                state,
                ref,
                obs,
                action="EXECUTE",
                effect_id=None,
                postcondition="pending: effect re-dispatched",
            ),
            _reconciliation_done(state),
            out,
        ]
        # Readmitted by the observation, then dispatched again: two hops.
        return _move(
            state,
            (S.ADMITTED, S.EFFECT_PENDING),
            ref,
            reason,
            outputs,
            dispatches=n,
            **obs.fields(),
            recovery_receipts=state.recovery_receipts + 1,
        )
    return _noop(state, f"absence observed while {state.state}: nothing to do")


def _receipt(state: OperationState, r: EffectReceipt, ref: str) -> Decision:
    op = state.operation_id
    if r.status == "ATTEMPTED":
        return _noop(state, f"attempt {r.attempt_id} recorded before sending")
    if r.status == "STALE_TOKEN":
        return _noop(
            state,
            f"sink {r.sink} refused fencing token {r.fencing_token}",
            _op_event(ref, op, "STALE_TOKEN", f"{r.sink} refused stale fencing token: {r.detail}"),
        )
    stale = r.dispatch_id != current_dispatch_id(state)
    if stale and r.status != "COMMITTED":
        return _noop(state, f"receipt for superseded dispatch {r.dispatch_id} ({r.status})")
    source = f"{r.sink} receipt ({'resume' if r.on_resume else 'submit'})"
    if r.status == "COMMITTED":
        return _committed(
            state,
            ref,
            Observation(source, "COMMITTED", r.observed_at_ms, r.on_resume, r.observer),
            effect_id=r.effect_id,
        )
    if r.status == "REJECTED":
        if state.state != S.EFFECT_PENDING:
            return _noop(state, f"rejection ignored while {state.state}")
        return _move(state, S.ABANDONED, ref, f"{r.sink} rejected the request: {r.detail}")
    if r.status == "UNAVAILABLE":
        return _absent_retry(
            state,
            ref,
            Observation(source, "UNAVAILABLE", r.observed_at_ms, r.on_resume, r.observer),
        )
    if r.status == "KEY_REUSED":
        decision = _unknown(
            state,
            ref,
            Observation(source, "KEY_REUSED", r.observed_at_ms, r.on_resume, r.observer),
            why=f"{r.sink} holds this operation ID with other parameters",
        )
        drift = _op_event(ref, op, "PARAMETER_DRIFT_AT_SINK", f"{r.sink}: {r.detail}")
        return replace(decision, outputs=(*decision.outputs, drift))
    return _unknown(
        state,
        ref,
        Observation(source, r.status, r.observed_at_ms, r.on_resume, r.observer),
        why=f"{r.sink}: {r.detail}",
    )


def _readback(state: OperationState, b: Readback, ref: str) -> Decision:
    op = state.operation_id
    if b.status == "STALE_TOKEN":
        return _noop(
            state,
            f"readback refused for stale token {b.fencing_token}",
            _op_event(ref, op, "STALE_TOKEN", f"{b.source}: {b.detail}"),
        )
    if b.dispatch_id != current_dispatch_id(state) and b.status != "COMMITTED":
        return _noop(state, f"readback for superseded dispatch {b.dispatch_id} ({b.status})")
    if b.kind == "POSTCONDITION":
        if state.state != S.EFFECT_COMMITTED:
            return _noop(state, f"postcondition {b.status} noted while {state.state}")
        if b.status == "MATCH":
            receipts = (
                (
                    _recovery_receipt(
                        state,
                        ref,
                        Observation(
                            b.source, "VERIFIED", b.observed_at_ms, b.on_resume, b.observer
                        ),
                        action="COMPLETE",
                        effect_id=state.effect_id,
                        postcondition=f"verified: {b.detail}",
                    ),
                )
                if b.on_resume
                else ()
            )
            return _move(
                state,
                S.OUTCOME_VERIFIED,
                ref,
                f"postcondition verified ({b.source})",
                receipts,
                observation_source=b.source,
                observation_status="VERIFIED",
                observed_at_ms=b.observed_at_ms,
                recovery_receipts=state.recovery_receipts + len(receipts),
            )
        if b.status == "MISMATCH":
            return _noop(
                state,
                f"postcondition mismatch: {b.detail}",
                _op_event(ref, op, "POSTCONDITION_MISMATCH", f"{b.source}: {b.detail}"),
            )
        return _noop(state, f"postcondition not verifiable at {state.sink} ({b.status})")
    if b.status == "COMMITTED":
        return _committed(
            state,
            ref,
            Observation(b.source, "COMMITTED", b.observed_at_ms, b.on_resume, b.observer),
            effect_id=b.effect_id,
        )
    if b.status == "ABSENT":
        return _absent_retry(
            state,
            ref,
            Observation(b.source, "ABSENT", b.observed_at_ms, b.on_resume, b.observer),
        )
    if state.state != S.EFFECT_PENDING:
        return _noop(state, f"readback {b.status} noted while {state.state}")
    return _unknown(
        state,
        ref,
        Observation(b.source, b.status, b.observed_at_ms, b.on_resume, b.observer),
        why=f"readback {b.status}: {b.detail}",
    )


# --------------------------------------------------------------------------- claims


def _claim(state: OperationState, c: Claim, ref: str) -> Decision:
    if c.expected_version != state.version:
        return _refuse(
            state,
            ref,
            state.operation_id,
            "STALE_CLAIM",
            f"claim by {c.worker} rejected: it read version {c.expected_version}, "
            f"current is {state.version}",
        )
    claimed = state.model_copy(update={"epoch": state.epoch + 1, "owner": c.worker})
    outputs: list[Output] = []
    n = state.dispatches
    if S(state.state) in IN_FLIGHT and state.state != S.ADMITTED:
        kind: DispatchKind = "VERIFY" if state.state == S.EFFECT_COMMITTED else "READBACK"
        out, n = _dispatch(claimed, kind, on_resume=True)
        outputs.append(out)
    # A claim is a self-loop: it fences (new epoch and owner), the recovery
    # state and its reason stay as they were.
    return _move(
        state,
        STAY,
        ref,
        f"claim by {c.worker} accepted at version {state.version}; fencing token now "
        f"{claimed.epoch}",
        outputs,
        epoch=claimed.epoch,
        owner=c.worker,
        dispatches=n,
        reason=state.reason,
    )


# --------------------------------------------------------------------------- dispositions


def _disposition(state: OperationState, d: Disposition, ref: str) -> Decision:
    """An attributable human decision releases an unknown outcome (never a timer)."""
    if state.state != S.UNKNOWN_OUTCOME:
        target = {"COMMITTED": S.EFFECT_COMMITTED, "ABSENT": S.ADMITTED, "ABANDON": S.ABANDONED}
        # Refused on its evidence, not the table: a disposition releases only
        # UNKNOWN_OUTCOME (NOT_ADMITTED -> ADMITTED is in the table, but its
        # evidence is an admission, never a disposition).
        return _forbidden(
            state,
            state.operation_id,
            (S(state.state), target[d.decision]),
            ref,
            f"disposition {d.decision} by {d.by} applies only to UNKNOWN_OUTCOME",
        )
    source = f"disposition by {d.by}: {d.evidence}"
    if d.decision == "COMMITTED":
        return _committed(
            state,
            ref,
            Observation(source, "COMMITTED (disposition)", d.disposed_at_ms, True, d.by),
            effect_id=state.effect_id,
        )
    if d.decision == "ABSENT":
        return _absent_retry(
            state,
            ref,
            Observation(source, "ABSENT (disposition)", d.disposed_at_ms, True, d.by),
        )
    obs = Observation(source, "ABANDON (disposition)", d.disposed_at_ms, True, d.by)
    receipt = _recovery_receipt(
        state,
        ref,
        obs,
        action="ABANDON",
        effect_id=None,
        postcondition="not checked: operation abandoned",
        uncertainty=f"whether the effect committed at {state.sink} (accepted by {d.by})",
        owner=d.by,
        release="none: abandoned by an attributable disposition",
    )
    return _move(
        state,
        S.ABANDONED,
        ref,
        f"abandoned by {d.by}: {d.evidence}",
        (receipt, _reconciliation_done(state)),
        **obs.fields(),
        recovery_receipts=state.recovery_receipts + 1,
    )


# --------------------------------------------------------------------------- replay


def hop_names(decision: Decision) -> tuple[str, ...]:
    """A decision's hops as the journal records them, ``FROM->TO`` each."""
    return tuple(f"{frm}->{to}" for frm, to in decision.hops)


def journal_entry(
    decision: Decision, event: Event, raw: bytes, topic: str, partition: int, offset: int
) -> JournalEntry:
    """The journal record of one decision (the input bytes are the evidence)."""
    op = getattr(event, "operation_id", "") or ""
    return JournalEntry(
        operation_id=op,
        seq=decision.state.version if decision.state else 0,
        kind=event.KIND,
        outcome=decision.outcome,
        from_state=decision.from_state,
        to_state=decision.to_state,
        reason=decision.reason,
        input_topic=topic,
        input_partition=partition,
        input_offset=offset,
        input_event=raw,
        hops=hop_names(decision),
    )


def ref_of(topic: str, partition: int, offset: int) -> str:
    """The ``ref`` string of an input position."""
    return f"{topic}:{partition}:{offset}"


def replay_decisions(
    entries: Iterable[JournalEntry],
) -> tuple[
    dict[str, OperationState], list[tuple[JournalEntry, Event, OperationState | None, Decision]]
]:
    """Fold journal entries like :func:`replay`, also returning every step.

    Returns:
        ``(states, steps)`` where each step is ``(entry, input event, state
        before, decision)`` in journal order.
    """
    states: dict[str, OperationState] = {}
    steps: list[tuple[JournalEntry, Event, OperationState | None, Decision]] = []
    for entry in entries:
        event = decode_event(entry.input_event)
        ref = ref_of(entry.input_topic, entry.input_partition, entry.input_offset)
        before = states.get(entry.operation_id)
        decision = decide(before, event, ref)
        steps.append((entry, event, before, decision))
        if decision.state is not None:
            states[entry.operation_id] = decision.state
    return states, steps


def replay(entries: Iterable[JournalEntry]) -> dict[str, OperationState]:
    """Fold journal entries (in journal order) into the state of every operation.

    Each entry's recorded input is decoded and applied with :func:`decide`,
    exactly as the processor did; the result must equal ``ledger.state``.
    """
    states: dict[str, OperationState] = {}
    for entry in entries:
        event = decode_event(entry.input_event)
        ref = ref_of(entry.input_topic, entry.input_partition, entry.input_offset)
        decision = decide(states.get(entry.operation_id), event, ref)
        if decision.state is not None:
            states[entry.operation_id] = decision.state
    return states
