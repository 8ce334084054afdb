"""The fold's common machinery: decisions, outputs, the one move, refusals, receipts.

Every state change of the fold goes through :func:`_move`, which checks each
hop against :data:`ledger.states.TRANSITIONS`; every refusal through
:func:`_refuse`. Names with a leading underscore are private to
:mod:`ledger.fold`: its input modules share them, nothing else should.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from ledger.events import (
    AdmissionRequest,
    Dispatch,
    DispatchKind,
    Event,
    OperatingEvent,
    OperationState,
    RecoveryAction,
    RecoveryReceipt,
)
from ledger.states import RecoveryState as S
from ledger.states import allowed
from ledger.topology import Topic

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


def _op_event(
    ref: str, op: str | None, kind: str, reason: str, transition: str | None = None
) -> Output:
    """An operating event of the processor about the input at ``ref``."""
    return Output(
        Topic.OPERATING_EVENTS,
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
    """Refuse the input: the state stays, an operating event of ``kind`` says why."""
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
    """Nothing to change (the input is noted in the journal, with any ``outputs``)."""
    return Decision(state, "NOOP", str(state.state), str(state.state), reason, tuple(outputs))


def _forbidden(state: OperationState | None, op: str, hop: Hop, ref: str, why: str) -> Decision:
    """Refuse ``hop`` with a ``FORBIDDEN_TRANSITION`` operating event."""
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
        An ``APPLIED`` decision (version bumped, ``hops`` recorded, and
        ``entered_version`` set to the new version when a hop was taken or
        the operation created), or a ``REFUSED`` one that leaves the state
        unchanged.
    """
    path = (to,) if isinstance(to, S) else to
    hops = _hops(S(state.state), path)
    for hop in hops:
        if not allowed(*hop):
            return _forbidden(None if created else state, state.operation_id, hop, ref, refused)
    end = path[-1] if path else S(state.state)
    version = state.version + (0 if created else 1)
    new = state.model_copy(
        update={
            "state": end,
            "version": version,
            # A move that takes a transition begins a new episode of the
            # state it enters; a self-loop (a claim) stays in the episode.
            "entered_version": version if hops or created else state.entered_version,
            "reason": why,
            **changes,
        }
    )
    written = (*outputs, *(after(new) if after else ()))
    return Decision(
        new, "APPLIED", None if created else str(state.state), str(end), why, written, hops
    )


def episode(state: OperationState) -> int | None:
    """The episode an operation is in: the version at which it entered its state.

    Admission decisions answer the episode of a NOT_ADMITTED operation (the
    admission request is written at that version) and dispositions the
    episode of an UNKNOWN_OUTCOME one; a record that answers another episode
    changes nothing (a ``REPLAYED`` operating event).

    Args:
        state: the operation.

    Returns:
        ``state.entered_version``; ``None`` for a state written before
        schema version 5 (an episode that began under an earlier release).
    """
    return state.entered_version


def _replayed(state: OperationState, ref: str, what: str, answers: str, why: str) -> Decision:
    """Refuse an authentic record that answers another episode (``REPLAYED``).

    Args:
        state: the operation (unchanged).
        ref: the record's position.
        what: the record, e.g. ``disposition d-1 by operator-3``.
        answers: what it answers, e.g. ``episode 7``.
        why: the remedy, in words.

    Returns:
        A ``REFUSED`` decision that leaves ``state`` as it is, with a
        ``REPLAYED`` operating event naming both episodes.
    """
    current = episode(state)
    now = "an episode begun before episodes were recorded" if current is None else current
    return _refuse(
        state,
        ref,
        state.operation_id,
        "REPLAYED",
        f"{what} answers {answers}; {state.operation_id} is {state.state} in episode {now} "
        f"(state version {state.version}): it changes nothing. {why}",
    )


def dispatch_id(state: OperationState, n: int) -> str:
    """ID of an operation's ``n``-th dispatch.

    Args:
        state: the operation (its ID and current epoch name the dispatch).
        n: the dispatch's number, counted from 1 over the operation's life.

    Returns:
        ``{operation_id}#{epoch}.{n}``, e.g. ``refund:c1:v1#1.1``.
    """
    return f"{state.operation_id}#{state.epoch}.{n}"


def current_dispatch_id(state: OperationState) -> str:
    """ID of the latest dispatch the processor issued for this operation.

    Receipts and readbacks for any other dispatch are superseded (only a
    ``COMMITTED`` one still counts).

    Args:
        state: the operation.

    Returns:
        :func:`dispatch_id` of ``state.dispatches`` (``...#{epoch}.0`` before
        the first dispatch).
    """
    return dispatch_id(state, state.dispatches)


def _dispatch(
    state: OperationState, kind: DispatchKind, *, on_resume: bool = False
) -> tuple[Output, int]:
    """The operation's next dispatch (the outbox record) and its number."""
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
        subject=state.subject,
        purpose=state.purpose,
        decision_version=state.decision_version,
    )
    return Output(Topic.DISPATCHES, state.operation_id, event), n


def _authority_text(state: OperationState) -> str:
    """The authority a recovery receipt cites, in words."""
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
        """The state fields that record this observation.

        Returns:
            ``observation_source``, ``observation_status`` and
            ``observed_at_ms``, ready to update an ``OperationState``.
        """
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
    claimant: str | None = None,
    authority: str | None = None,
) -> Output:
    """The recovery receipt of a resume: why acting (or not) was safe.

    ``claimant`` names the resumer when it is not the operation's owner (a
    restarted processor resuming an admission); ``authority`` replaces the
    authority text derived from ``state`` (a refused admission).
    """
    op = state.operation_id
    parts = op.split(":")
    return Output(
        Topic.RECOVERY_RECEIPTS,
        op,
        RecoveryReceipt(
            receipt_id=f"recovery:{ref}",
            operation_id=op,
            workflow_id=parts[1] if len(parts) >= 3 else op,
            checkpoint_version=state.version,
            claimant=claimant or state.owner or obs.observer,
            parameter_digest=state.parameter_digest,
            actor=state.actor,
            subject=state.subject,
            purpose=state.purpose,
            authority=authority or _authority_text(state),
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
    """Queue an unknown outcome for the reconcilers."""
    return Output(Topic.RECONCILIATION, state.operation_id, state)


def _reconciliation_done(state: OperationState) -> Output:
    """Take an operation off the reconciliation queue (a tombstone)."""
    return Output(Topic.RECONCILIATION, state.operation_id, None)


def _admission_request(state: OperationState, approval_id: str) -> Output:
    """Ask the authority kernel to admit ``state`` under ``approval_id``.

    The request names the episode it belongs to (``state_version``: the
    version at which the operation entered NOT_ADMITTED, its current
    version for a state that names none), which the kernel's decision
    answers (see :mod:`ledger.fold.admissions`).
    """
    episode = state.entered_version if state.entered_version is not None else state.version
    return Output(
        Topic.ADMISSION_REQUESTS,
        approval_id,
        AdmissionRequest(
            operation_id=state.operation_id,
            approval_id=approval_id,
            parameter_digest=state.parameter_digest,
            subject=state.subject,
            amount_minor=state.amount_minor,
            state_version=episode,
            sink=state.sink,
            action=state.action,
            purpose=state.purpose,
            params_json=state.params_json,
            compensates=state.compensates,
        ),
    )
