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

A compensation must also be *of its original's effect*, and the effect is
compensated at most once (:func:`tally_refusal`): the same subject, the same
account (the original's ``params["account"]``), an amount (the compensation
sink's contract ``amount_field``) of at most the original's, and with the
compensations of the original that may still take or have taken effect
(every one not ``ABANDONED``: settled, in flight, awaiting admission or a new
approval) at most the original's amount in total. The processor observes
those compensations (:class:`PriorCompensation`) with the original; facts a
release before this check journaled carry none (``scoped`` false) and replay
decides as that release did. Those observations may be stale: two
compensations of one original decided at once on two partitions each see
the other not yet. So a compensation that passes them does not ask for
admission yet: it waits while the original's owner, the single writer of
the original's state, decides its claim on the effect with every claim
granted before it (:mod:`ledger.fold.tally`). The auditor checks the same
rules on what the ledger holds (:func:`ledger.audit.invariants.compensation_bounds`).

``compensates`` is not part of the parameter digest (the digest describes the
effect the sink makes); it is bound to the operation ID instead: an intent for
a known operation that names another original is parameter drift.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ledger.events import OperationState
from ledger.states import RecoveryState as S

#: States in which an original may be compensated: its effect is settled.
SETTLED: frozenset[S] = frozenset({S.OUTCOME_VERIFIED, S.EFFECT_COMMITTED})

#: The parameter naming the account an effect was made on: a compensation
#: must name the same one as its original.
ACCOUNT_PARAM = "account"

#: How many earlier compensations a refusal names before it says "and N more".
NAMED_PRIORS = 3


@dataclass(frozen=True)
class PriorCompensation:
    """Another compensation of the same original, as the processor observed it.

    Attributes:
        operation_id: its operation ID.
        state: its recovery state when observed.
        amount_minor: its amount in minor units (read from the parameter its
            sink's contract names), or ``None`` when it has none that can be
            read: it then counts as compensating the whole effect.
    """

    operation_id: str
    state: str
    amount_minor: int | None


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
        observed_scope: whether the fields below were observed (``False`` in
            facts journaled by releases before the scope and tally check:
            replay then decides without it, as they did).
        original_subject: the original's subject.
        original_account: the original's ``params["account"]`` as JSON text
            (``None`` when its parameters have none).
        original_amount_minor: the original's amount in minor units (from
            the parameter its sink's contract names), or ``None`` when it has
            none that can be read: it is then compensated once, whole.
        amount_field: the parameter holding the compensation's own amount,
            as its sink's contract names it (``None``: its effects carry no
            amount, so it compensates the whole effect).
        prior: the other compensations of the original on ``ledger.state``
            (and in the processor's open transaction), whatever their state.
        tally: the compensation's claim on the original's effect is decided
            by the original's owner (:mod:`ledger.fold.tally`): one that
            passes these checks waits for that verdict before it asks for
            admission (``False`` in facts journaled by releases before the
            tally: replay then asks for admission at once, as they did). In
            the facts of a tally request, the original as its owner observed it.
    """

    original_state: str | None
    original_sink: str | None
    consequence: str | None
    compensable: bool
    observed_scope: bool = False
    original_subject: str | None = None
    original_account: str | None = None
    original_amount_minor: int | None = None
    amount_field: str | None = None
    prior: tuple[PriorCompensation, ...] = ()
    tally: bool = False

    def to_json(self) -> str:
        """The facts as the journal keeps them (a JSON object, sorted keys)."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str | None) -> CompensationFacts | None:
        """The facts a journal entry recorded (``None`` when none or unreadable).

        Args:
            text: the entry's ``compensation_facts`` (keys an earlier release
                did not write take their defaults).

        Returns:
            The facts, or ``None`` for ``None`` or text that is not such an object.
        """
        if text is None:
            return None
        try:
            data = json.loads(text)
            prior = tuple(
                PriorCompensation(
                    operation_id=str(p["operation_id"]),
                    state=str(p["state"]),
                    amount_minor=_int_or_none(p.get("amount_minor")),
                )
                for p in data.get("prior") or ()
            )
            return CompensationFacts(
                original_state=data.get("original_state"),
                original_sink=data.get("original_sink"),
                consequence=data.get("consequence"),
                compensable=bool(data.get("compensable", False)),
                observed_scope=bool(data.get("observed_scope", False)),
                original_subject=data.get("original_subject"),
                original_account=data.get("original_account"),
                original_amount_minor=_int_or_none(data.get("original_amount_minor")),
                amount_field=data.get("amount_field"),
                prior=prior,
                tally=bool(data.get("tally", False)),
            )
        except (ValueError, AttributeError, TypeError, KeyError):
            return None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _params(params_json: str) -> dict[str, Any]:
    try:
        params = json.loads(params_json)
    except ValueError:
        return {}
    return params if isinstance(params, dict) else {}


def account_of(params_json: str) -> str | None:
    """The ``account`` parameter of an operation as JSON text, or ``None`` when absent.

    Args:
        params_json: the operation's parameters (a JSON object).
    """
    params = _params(params_json)
    if ACCOUNT_PARAM not in params:
        return None
    return json.dumps(params[ACCOUNT_PARAM], sort_keys=True)


def amount_of(params_json: str, amount_field: str | None) -> tuple[int | None, str | None]:
    """An operation's amount, read from the parameter its sink's contract names.

    Args:
        params_json: the operation's parameters (a JSON object).
        amount_field: the contract's ``amount_field`` (``None``: the sink's
            effects carry no amount).

    Returns:
        ``(amount in minor units, None)``; ``(None, None)`` when
        ``amount_field`` is ``None``; ``(None, problem)`` when the parameter
        is missing or not a non-negative integer.
    """
    if amount_field is None:
        return None, None
    value = _params(params_json).get(amount_field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None, (
            f"parameter {amount_field} (the amount field of the sink's contract) is "
            f"{json.dumps(value)}, not an amount in minor units (a non-negative integer)"
        )
    return value, None


def compensation_refusal(
    operation_id: str,
    original: str,
    facts: CompensationFacts | None,
    *,
    subject: str | None = None,
    params_json: str = "{}",
) -> str | None:
    """Why a compensation of ``original`` must be abandoned before admission.

    Args:
        operation_id: the compensation's own operation ID.
        original: the operation it names in ``compensates``.
        facts: what the processor observed of the original (``None``: not observed).
        subject: the compensation's subject (checked when ``facts.observed_scope``).
        params_json: the compensation's parameters (likewise).

    Returns:
        ``None`` when the compensation may ask for admission, else the reason
        (naming the original, its state, the contract field that refuses it,
        or the compensations of it that already claim its effect).
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
    if not facts.observed_scope:
        return None
    return tally_refusal(operation_id, original, facts, subject=subject, params_json=params_json)


def tally_refusal(
    operation_id: str,
    original: str,
    facts: CompensationFacts,
    *,
    subject: str | None,
    params_json: str,
) -> str | None:
    """Why a compensation is not of its original's effect, or would compensate it twice.

    Checked in order: the subject, the account, the compensation's own
    amount (readable, and at most the original's), then the total with the
    other compensations of the original that are not ``ABANDONED`` (each
    may yet take effect, or has): it may not exceed the original's amount,
    and an original whose amount cannot be read is compensated once.

    Args:
        operation_id: the compensation's own operation ID.
        original: the operation it compensates.
        facts: the processor's observation (``observed_scope`` true).
        subject: the compensation's subject.
        params_json: the compensation's parameters.

    Returns:
        ``None``, or the reason; a refusal by the total names the earlier
        compensations (operation ID, state, amount), the first by operation
        ID first.
    """
    problem = scope_refusal(
        operation_id,
        original,
        subject=subject,
        account=account_of(params_json),
        original_subject=facts.original_subject,
        original_account=facts.original_account,
    )
    if problem is not None:
        return problem
    total = facts.original_amount_minor
    own, problem = amount_of(params_json, facts.amount_field)
    if problem is not None:
        return f"compensation refused: {problem}"
    live = sorted(
        (p for p in facts.prior if p.state != S.ABANDONED and p.operation_id != operation_id),
        key=lambda p: p.operation_id,
    )
    return total_refusal(operation_id, original, total, own, live)


def scope_refusal(
    operation_id: str,
    original: str,
    *,
    subject: str | None,
    account: str | None,
    original_subject: str | None,
    original_account: str | None,
) -> str | None:
    """Why a compensation is not for its original's subject and account, or ``None``.

    Args:
        operation_id: the compensation's own operation ID.
        original: the operation it compensates.
        subject: the compensation's subject.
        account: its ``account`` parameter as JSON text (:func:`account_of`).
        original_subject: the original's subject.
        original_account: the original's ``account`` parameter as JSON text.

    Returns:
        ``None``, or the reason (the subject is checked first).
    """
    if subject != original_subject:
        return (
            f"compensation refused: {operation_id} is for subject {subject}, but {original} "
            f"was for subject {original_subject}; a compensation reverses its "
            "original's effect, for the same subject"
        )
    if account != original_account:
        return (
            f"compensation refused: {operation_id} is on account {account or '(none)'}, but "
            f"{original} was on account {original_account or '(none)'}; a compensation "
            "reverses its original's effect, on the same account"
        )
    return None


def total_refusal(
    operation_id: str,
    original: str,
    total: int | None,
    own: int | None,
    live: Sequence[PriorCompensation],
) -> str | None:
    """Why a compensation would exceed its original's effect, with the others that claim it.

    Args:
        operation_id: the compensation's own operation ID.
        original: the operation it compensates.
        total: the original's amount in minor units (``None``: it carries
            none that can be read, so it is compensated once, whole).
        own: the compensation's amount (``None``: the whole effect).
        live: the other compensations that may still take, or have taken,
            effect on the original, in the order the reason names them
            (the first first).

    Returns:
        ``None``, or the reason: the compensation alone exceeds the effect,
        or the compensations in ``live`` (up to :data:`NAMED_PRIORS` named:
        operation ID, state, amount) leave too little of it.
    """
    if own is None:
        own = total  # no amount of its own: it reverses the whole effect
    if total is not None and own is not None and own > total:
        return (
            f"compensation refused: {operation_id} would compensate {own} minor units, more "
            f"than the {total} of {original}'s effect"
        )
    if not live:
        return None
    named = ", ".join(
        f"{p.operation_id} ({p.state}, "
        + ("whole effect" if p.amount_minor is None else f"{p.amount_minor}")
        + ")"
        for p in live[:NAMED_PRIORS]
    )
    if len(live) > NAMED_PRIORS:
        named += f" and {len(live) - NAMED_PRIORS} more"
    if total is None or own is None:
        return (
            f"compensation refused: {original} is already compensated by {named}; its "
            "effect carries no amount that can be read, so it is compensated once"
        )
    claimed = sum(total if p.amount_minor is None else p.amount_minor for p in live)
    if claimed + own > total:
        return (
            f"compensation refused: {original} is already compensated by {named}: {claimed} of "
            f"its {total} minor units are compensated or claimed, so {own} more would exceed "
            f"its effect (at most {max(total - claimed, 0)} remain)"
        )
    return None


def priors_of(
    original: str, states: Iterable[OperationState], amount_fields: Mapping[str, str | None]
) -> tuple[PriorCompensation, ...]:
    """The compensations of ``original`` among ``states``, as :class:`PriorCompensation`.

    Args:
        original: the original's operation ID.
        states: operation states (any; those that compensate another are skipped).
        amount_fields: sink -> the parameter holding its amount (a sink not
            named reads ``amount_minor``; ``None``: its effects carry no amount).

    Returns:
        One per compensation of ``original``, ordered by operation ID.
    """
    found = []
    for st in states:
        if st.compensates != original:
            continue
        amount, _ = amount_of(st.params_json, amount_fields.get(st.sink, "amount_minor"))
        found.append(PriorCompensation(st.operation_id, str(st.state), amount))
    return tuple(sorted(found, key=lambda p: p.operation_id))


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
        original settled (partial ones, or ones decided by a release before
        the original's tally), ``compensated_by`` names the lower operation ID.
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
