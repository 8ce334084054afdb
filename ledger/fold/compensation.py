"""Compensation: an intent that names the operation it ``compensates``.

A compensation is its own operation (its own ID, digest, approval,
admission, dispatch and receipts), linked to the original by the intent's
``compensates`` field, which the new operation's state keeps. Before it may
consume an approval, the fold checks the original as the processor observed
it (:class:`CompensationFacts`, passed in so the fold stays pure and journaled
so replay decides the same): an original that is unknown or has not settled
(neither ``OUTCOME_VERIFIED`` nor ``EFFECT_COMMITTED``), an irreversible
original, or a compensation sink whose contract is not ``compensable`` makes
the compensation ``ABANDONED`` at once, with the reason, and no approval is
used. What authority a compensation needs (a standing policy approval for a
reversible-internal effect, a reviewer's for a reversible-external one) is the
authority kernel's decision (:func:`ledger.authority.compensation_problem`).

``compensates`` is not part of the parameter digest (the digest describes the
effect the sink makes); it is bound to the operation ID instead: an intent for
a known operation that names another original is parameter drift.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from ledger.events import OperationState
from ledger.states import RecoveryState as S

#: States in which an original may be compensated: its effect is settled.
SETTLED: frozenset[S] = frozenset({S.OUTCOME_VERIFIED, S.EFFECT_COMMITTED})


@dataclass(frozen=True)
class CompensationFacts:
    """What the processor observed of a compensation's original when deciding.

    Attributes:
        original_state: the original's recovery state, or ``None`` when the
            ledger does not know the operation.
        original_sink: the original's sink (``None`` when unknown).
        consequence: the consequence class of the original's sink contract
            (``None`` when the sink registry does not name it).
        compensable: whether the compensation's own sink declares
            ``compensable: true``.
    """

    original_state: str | None
    original_sink: str | None
    consequence: str | None
    compensable: bool

    def to_json(self) -> str:
        """The facts as the journal keeps them (a JSON object, sorted keys)."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str | None) -> CompensationFacts | None:
        """The facts a journal entry recorded (``None`` when none or unreadable).

        Args:
            text: the entry's ``compensation_facts``.

        Returns:
            The facts, or ``None`` for ``None`` or text that is not such an object.
        """
        if text is None:
            return None
        try:
            data = json.loads(text)
            return CompensationFacts(
                original_state=data.get("original_state"),
                original_sink=data.get("original_sink"),
                consequence=data.get("consequence"),
                compensable=bool(data.get("compensable", False)),
            )
        except (ValueError, AttributeError, TypeError):
            return None


def compensation_refusal(
    operation_id: str, original: str, facts: CompensationFacts | None
) -> str | None:
    """Why a compensation of ``original`` must be abandoned before admission.

    Args:
        operation_id: the compensation's own operation ID.
        original: the operation it names in ``compensates``.
        facts: what the processor observed of the original (``None``: not observed).

    Returns:
        ``None`` when the compensation may ask for admission, else the reason
        (naming the original, its state or the contract field that refuses it).
    """
    if original == operation_id:
        return f"compensation {operation_id} names itself as the operation it compensates"
    if facts is None:
        return f"the state of {original} was not observed: compensation refused"
    if facts.original_state is None:
        return f"compensation refused: {original} is not known to the ledger"
    if facts.original_state not in SETTLED:
        return (
            f"compensation refused: {original} has not settled (it is {facts.original_state}; "
            "only OUTCOME_VERIFIED or EFFECT_COMMITTED can be compensated)"
        )
    if facts.consequence is None:
        return (
            f"compensation refused: the sink {facts.original_sink} of {original} is not registered"
        )
    if facts.consequence == "irreversible":
        return (
            f"compensation refused: {original} is irreversible (sink {facts.original_sink}, "
            "consequence irreversible); nothing can undo it"
        )
    if not facts.compensable:
        return "compensation refused: the sink's contract is not compensable"
    return None


@dataclass(frozen=True)
class CompensationCounts:
    """Compensations among a set of operation states, with their denominators.

    Attributes:
        compensated_by: original operation ID -> the compensation whose
            effect settled (``EFFECT_COMMITTED`` or ``OUTCOME_VERIFIED``); the
            original's side of the link, derived from the compensation's state.
        settled: compensations whose effect settled.
        attempts: compensations dispatched at least once (the denominator of
            ``failures``).
        failures: dispatched compensations that did not settle: in
            ``UNKNOWN_OUTCOME`` (their own, not the original's) or refused by
            the sink (``ABANDONED`` after a dispatch).
        refused: compensations abandoned before admission (unsettled or
            irreversible original, sink not compensable).
    """

    compensated_by: dict[str, str]
    settled: int
    attempts: int
    failures: int
    refused: int


def compensation_counts(states: Mapping[str, OperationState]) -> CompensationCounts:
    """Count the compensations among ``states`` and link each settled one to its original.

    Args:
        states: operation ID -> its current state (e.g. ``ledger.state`` as read).

    Returns:
        The :class:`CompensationCounts`; when two compensations of one
        original settled (which the ledger does not prevent across
        partitions), ``compensated_by`` names the lower operation ID.
    """
    linked: dict[str, str] = {}
    settled = attempts = failures = refused = 0
    for op in sorted(states):
        st = states[op]
        if st.compensates is None:
            continue
        if st.dispatches > 0:
            attempts += 1
        if S(st.state) in SETTLED:
            settled += 1
            linked.setdefault(st.compensates, op)
        elif st.dispatches > 0 and st.state in (S.UNKNOWN_OUTCOME, S.ABANDONED):
            failures += 1
        elif st.dispatches == 0 and st.state == S.ABANDONED:
            refused += 1
    return CompensationCounts(linked, settled, attempts, failures, refused)
