"""The recovery state machine as data: states, allowed transitions, evidence.

Importing this module loads nothing but :mod:`ledger.errors`: no Avro, no
Kafka client, no settings (a test says so).

Source: DESIGN.md "The recovery state machine (closed set)". Anything not in
:data:`TRANSITIONS` is forbidden: it fails closed and becomes an operating
event.

How the fold (:mod:`ledger.fold`) reads the table:

* A **hop** is one ``(from, to)`` step with ``from != to``. Every hop the fold
  takes is checked here, in one place, and recorded on its decision and its
  journal entry; a hop not in the table is refused (``FORBIDDEN_TRANSITION``)
  and the state stays as it was.
* A **compound move** is one input that takes several hops, checked and
  recorded hop by hop: an admission is ``NOT_ADMITTED -> ADMITTED ->
  EFFECT_PENDING`` (admitted, and dispatched in the same transaction), and an
  observed absence releases ``UNKNOWN_OUTCOME -> ADMITTED -> EFFECT_PENDING``
  (retry the same admitted operation). There is no direct
  ``UNKNOWN_OUTCOME -> EFFECT_PENDING`` hop: leaving an unknown outcome needs
  the evidence of the ``ADMITTED`` hop, never a timer.
* A **self-loop** (the state stays, e.g. a claim that bumps the version and
  the fencing token, or a re-dispatch after an absence while
  ``EFFECT_PENDING``) is not a hop and needs no entry; the table has none.
* An operation **enters** at :data:`ENTRY` when its intent is recorded. Entry
  is not a hop; an intent without an approval enters and takes the hop
  ``NOT_ADMITTED -> NEEDS_REAUTHORISATION`` at once.
"""

from __future__ import annotations

from enum import StrEnum

from ledger.errors import ForbiddenTransitionError


class RecoveryState(StrEnum):
    """The closed set of recovery states (DESIGN.md, "The recovery state machine")."""

    NOT_ADMITTED = "NOT_ADMITTED"
    ADMITTED = "ADMITTED"
    EFFECT_PENDING = "EFFECT_PENDING"
    EFFECT_COMMITTED = "EFFECT_COMMITTED"
    OUTCOME_VERIFIED = "OUTCOME_VERIFIED"
    UNKNOWN_OUTCOME = "UNKNOWN_OUTCOME"
    NEEDS_REAUTHORISATION = "NEEDS_REAUTHORISATION"
    ABANDONED = "ABANDONED"


S = RecoveryState

#: The state a new operation enters with (its intent recorded, not a hop).
ENTRY: S = S.NOT_ADMITTED

#: (from, to) -> the evidence that permits the transition.
TRANSITIONS: dict[tuple[S, S], str] = {
    (S.NOT_ADMITTED, S.ADMITTED): (
        "admission decision: approval current at decision time under the current policy, "
        "consumed by this operation only"
    ),
    (S.NOT_ADMITTED, S.NEEDS_REAUTHORISATION): (
        "admission rejected (expired, revoked, consumed elsewhere, policy changed, out of scope), "
        "or no approval supplied with the intent"
    ),
    (S.NOT_ADMITTED, S.ABANDONED): (
        "a compensation refused before admission: its original is unknown, has not settled, "
        "is irreversible, or its sink is not compensable, or the original's tally refused "
        "its claim on the effect (no approval consumed)"
    ),
    (S.NEEDS_REAUTHORISATION, S.NOT_ADMITTED): (
        "a new approval for the same operation and digest (reauthorisation)"
    ),
    (S.ADMITTED, S.EFFECT_PENDING): "dispatch record written atomically with the transition",
    (S.EFFECT_PENDING, S.EFFECT_COMMITTED): "a receipt or readback owned by the effect's owner",
    (S.EFFECT_PENDING, S.UNKNOWN_OUTCOME): (
        "ambiguous failure after the request may have left; or held for a person: a sink "
        "the relay could not reach within its retry budget (the request never left), or "
        "an effect observed absent again after the re-execution budget"
    ),
    (S.EFFECT_PENDING, S.NEEDS_REAUTHORISATION): (
        "a reservation cancelled at its sink because the admission no longer stood "
        "(approval revoked, or policy version changed): the hold was released, no effect"
    ),
    (S.EFFECT_PENDING, S.ABANDONED): (
        "the sink refused the request (rejected it, or answered unavailable repeatedly): "
        "the effect is absent"
    ),
    (S.UNKNOWN_OUTCOME, S.EFFECT_COMMITTED): (
        "a new observation (readback) or an attributable disposition 'committed'"
    ),
    (S.UNKNOWN_OUTCOME, S.ADMITTED): (
        "a new observation or an attributable disposition that the effect is absent: "
        "retry the same admitted operation"
    ),
    (S.UNKNOWN_OUTCOME, S.ABANDONED): "an attributable disposition 'abandon'",
    (S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED): "an independent postcondition readback",
}

#: States in which the operation may still cross, or has crossed without
#: verification, the effect boundary: a resume must read the effect first.
IN_FLIGHT: frozenset[S] = frozenset(
    {S.ADMITTED, S.EFFECT_PENDING, S.UNKNOWN_OUTCOME, S.EFFECT_COMMITTED}
)

#: States a resume treats as complete for workflow purposes.
COMPLETE: frozenset[S] = frozenset({S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED})

#: States no transition leaves, the operation is over: OUTCOME_VERIFIED and ABANDONED.
TERMINAL: frozenset[S] = frozenset(S) - {from_state for from_state, _ in TRANSITIONS}

#: States an operation stays in until something outside the stages acts: the
#: terminal ones, and those that wait for a person (a new approval for
#: NEEDS_REAUTHORISATION, a readback or a disposition for UNKNOWN_OUTCOME).
#: A caller waiting for another state (``wait_for``) stops at one of these.
RESTING: frozenset[S] = TERMINAL | {S.NEEDS_REAUTHORISATION, S.UNKNOWN_OUTCOME}


def evidence_for(from_state: S, to_state: S) -> str:
    """The evidence a transition requires.

    Args:
        from_state: the state the hop leaves.
        to_state: the state the hop enters.

    Returns:
        The evidence, in words, from :data:`TRANSITIONS`.

    Raises:
        ForbiddenTransitionError: if the transition is not in the table.
    """
    try:
        return TRANSITIONS[(from_state, to_state)]
    except KeyError:
        raise ForbiddenTransitionError(
            f"transition {from_state} -> {to_state} is not allowed",
            from_state=str(from_state),
            to_state=str(to_state),
        ) from None


def allowed(from_state: S, to_state: S) -> bool:
    """Whether a hop is in the transition table.

    Args:
        from_state: the state the hop leaves.
        to_state: the state the hop enters.

    Returns:
        True when ``from_state -> to_state`` is in :data:`TRANSITIONS`.
    """
    return (from_state, to_state) in TRANSITIONS
