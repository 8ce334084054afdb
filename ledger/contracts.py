"""Effect contracts: what a sink can prove about its effects, and what that allows.

The field names follow ``shared/SCENARIOS.md``. Automatic resume is allowed
only where the contract supplies the evidence a step needs. The decisions a
contract permits are pure functions here (no I/O, no clock: times come in as
arguments, in ms of the ledger clock); the relay and the reconcilers ask them
and do only the I/O:

* :func:`after_ambiguous_send` -- read back, resubmit under the same key, or
  hold as unknown, after an ambiguous send or for a dispatch met again after
  a crash;
* :func:`marks_attempt_alone`, :func:`fencing_token_for`,
  :func:`sends_idempotency_key`, :func:`readback_unsupported`,
  :func:`key_retained` -- what a request to the sink carries and when.
* :func:`after_unreached` -- retry a request that never reached the sink
  (connection refused, sink not registered) after a backoff, or hold the
  operation for a person once the :class:`RetryBudget` is spent;
* :func:`postcondition_request`, :func:`judge_postcondition` -- which
  postcondition observation to ask the sink for (declared by the contract's
  :class:`PostconditionQuery`), and whether it shows the effect.

The sink registry file (name -> URL and contract) is read and written by
:mod:`sinks.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ledger.errors import InvalidInputError

Consequence = Literal["reversible-internal", "reversible-external", "irreversible"]


class PostconditionQuery(BaseModel):
    """A sink's independent business query that verifies an effect, declared.

    The one query the reference sinks offer is ``account-credits``: every
    credit the sink has made to a subject (an account), each with the
    operation that made it and its amount. The effect is verified when the
    subject shows exactly one credit by the operation, for the amount in the
    operation's parameters.

    Attributes:
        query: which query the sink offers (``account-credits``:
            ``GET /accounts/{subject}``).
        subject_field: the operation parameter that names the subject to
            query (default ``account``).
        amount_field: the operation parameter holding the amount, in minor
            units, that the operation's one credit must show (default
            ``amount_minor``; a missing parameter counts as 0).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    query: Literal["account-credits"] = "account-credits"
    subject_field: str = Field(default="account", min_length=1)
    amount_field: str = Field(default="amount_minor", min_length=1)


#: The reference payment gateway's postcondition: the credits of
#: ``params["account"]`` must show one credit of ``params["amount_minor"]``
#: by the operation. ``postcondition: true`` in a contract means this query.
ACCOUNT_CREDITS = PostconditionQuery()


class EffectContract(BaseModel):
    """What one sink declares it can do.

    Attributes:
        idempotent: a resubmission with the same idempotency key (the operation
            ID) returns the first outcome instead of making a second effect.
        readback: ``GET /operations/{id}`` answers authoritatively whether the
            operation committed, for every operation ever committed.
        postcondition: the sink offers an independent business query to
            verify an effect: ``True`` for :data:`ACCOUNT_CREDITS` (the
            account's credit, as contracts have always said), a
            :class:`PostconditionQuery` to name other parameter fields, or
            ``False`` for none. Read it through :meth:`postcondition_query`.
        fencing: the sink refuses requests whose fencing token is lower than
            the highest it has seen for that operation.
        key_retention_s: how long (ledger clock, seconds) the sink keeps an
            idempotency key after it first saw it; after that a resubmission
            is a new effect.
        consequence: consequence class of the effect.
        compensable: a compensating operation exists.
        reservation: try-confirm-cancel is offered: the relay reserves a
            bounded hold, confirms it only while the operation's admission
            still stands and cancels it otherwise, and reads the hold back
            on a resume (see :mod:`consumers.relay`).
        reservation_hold_s: how long (ledger clock, seconds) the sink keeps
            an unconfirmed hold before it releases it by itself (default 300).
        amount_field: the operation parameter holding the amount, in minor
            units, that an approval's ``scope_max_amount_minor`` caps
            (default ``amount_minor``). The authority kernel reads the amount
            from this parameter and refuses an operation whose parameters
            lack it or hold anything but a non-negative integer there.
            ``None`` declares that the sink's effects carry no amount (a
            notification): no amount cap applies to its operations.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    idempotent: bool = False
    readback: bool = False
    postcondition: bool | PostconditionQuery = False
    fencing: bool = False
    key_retention_s: int = Field(default=0, ge=0)
    consequence: Consequence = "irreversible"
    compensable: bool = False
    reservation: bool = False
    reservation_hold_s: int = Field(default=300, ge=1)
    amount_field: str | None = Field(default="amount_minor", min_length=1)

    def postcondition_query(self) -> PostconditionQuery | None:
        """The postcondition query the sink offers.

        Returns:
            The declared query, :data:`ACCOUNT_CREDITS` for
            ``postcondition: true``, or ``None`` when the sink offers none.
        """
        if isinstance(self.postcondition, PostconditionQuery):
            return self.postcondition
        return ACCOUNT_CREDITS if self.postcondition else None


#: The reference payment gateway's contract (idempotent, readback, fencing,
#: postcondition; keys kept seven days).
PAYMENT_GATEWAY = EffectContract(
    idempotent=True,
    readback=True,
    postcondition=True,
    fencing=True,
    key_retention_s=7 * 24 * 3600,
    consequence="irreversible",
)

#: The deliberately unsafe sink: no idempotency key, no readback.
UNSAFE_SINK = EffectContract(consequence="irreversible")


# --------------------------------------------------------------------------
# What a contract allows: pure decisions (no I/O, no clock; times in ms).


class Recovery(StrEnum):
    """What the relay may do about a request that may have reached the sink."""

    #: Ask the sink whether the operation committed (readback by operation ID).
    READ_BACK = "READ_BACK"
    #: Resubmit under the same idempotency key: the sink still keeps it, so a
    #: committed first attempt is replayed, never repeated.
    RESUBMIT_SAME_KEY = "RESUBMIT_SAME_KEY"
    #: Send nothing: record the outcome as ambiguous (the operation is held in
    #: UNKNOWN_OUTCOME until a new observation or a disposition releases it).
    HOLD_UNKNOWN = "HOLD_UNKNOWN"


@dataclass(frozen=True)
class RecoveryAction:
    """A recovery decision and why the contract allows it.

    Attributes:
        action: what to do.
        reason: why, in words a receipt can carry (for :attr:`Recovery.HOLD_UNKNOWN`
            the text the relay appends to "the request may have reached SINK; ").
    """

    action: Recovery
    reason: str


def marks_attempt_alone(contract: EffectContract) -> bool:
    """Whether each dispatch to this sink needs its own ``ATTEMPTED`` receipt.

    A sink with readback can have a whole batch marked attempted at once: after
    a crash every one of them is read back. A sink without readback cannot, so
    each dispatch is marked just before its own send and its receipt committed
    just after; a crash then leaves ambiguous only the one request that may
    have left without its receipt.

    Args:
        contract: the sink's contract.

    Returns:
        ``True`` when the sink offers no readback.
    """
    return not contract.readback


def fencing_token_for(contract: EffectContract, token: int) -> int | None:
    """The fencing token a request to this sink carries.

    Args:
        contract: the sink's contract.
        token: the operation's current fencing token (its epoch).

    Returns:
        ``token`` when the sink fences, else ``None`` (nothing is sent).
    """
    return token if contract.fencing else None


def sends_idempotency_key(contract: EffectContract, *, fresh_attempt_identity: bool) -> bool:
    """Whether a submit carries the operation ID as ``Idempotency-Key``.

    Args:
        contract: the sink's contract.
        fresh_attempt_identity: the submit is a new attempt with its own
            identity (the ``checkpoint-only`` negative control), which never
            relies on the key.

    Returns:
        ``True`` when the sink is idempotent and the attempt is not fresh.
    """
    return contract.idempotent and not fresh_attempt_identity


def readback_unsupported(contract: EffectContract) -> str | None:
    """Why no readback may be asked of this sink, or ``None`` when it may.

    Args:
        contract: the sink's contract.

    Returns:
        ``"the sink offers no readback"`` for a sink without readback (the
        observation is then ``UNSUPPORTED`` without a request), else ``None``.
    """
    return None if contract.readback else "the sink offers no readback"


def key_retained(contract: EffectContract, *, first_seen_ms: int, now_ms: int) -> bool:
    """Whether the sink still keeps the operation's idempotency key.

    Args:
        contract: the sink's contract.
        first_seen_ms: ledger time (ms) of the operation's first attempt.
        now_ms: ledger time (ms) now.

    Returns:
        ``True`` when the sink is idempotent and less than
        ``key_retention_s`` seconds have passed since ``first_seen_ms``.
    """
    return contract.idempotent and now_ms - first_seen_ms < contract.key_retention_s * 1000


def after_ambiguous_send(
    contract: EffectContract, *, first_seen_ms: int, now_ms: int
) -> RecoveryAction:
    """Decide what to do about a request that may have reached the sink.

    Used after a send whose outcome is ambiguous, and for a dispatch met
    again after a crash (a previous run may have sent it). Nothing is ever
    sent blindly: a sink with readback is read back; an idempotent sink
    without readback is resubmitted under the same key while it still keeps
    the key; otherwise the outcome is held as unknown. A resume older than
    the key retention cannot rely on the key (DESIGN.md, "Effect contracts").

    Args:
        contract: the sink's contract.
        first_seen_ms: ledger time (ms) of the operation's first attempt.
        now_ms: ledger time (ms) now.

    Returns:
        The action and its reason.
    """
    if contract.readback:
        return RecoveryAction(Recovery.READ_BACK, "the sink answers readback by operation ID")
    if key_retained(contract, first_seen_ms=first_seen_ms, now_ms=now_ms):
        return RecoveryAction(
            Recovery.RESUBMIT_SAME_KEY,
            f"the sink keeps idempotency keys for {contract.key_retention_s} s and the first "
            f"attempt was at {first_seen_ms} ms",
        )
    if not contract.idempotent:
        return RecoveryAction(
            Recovery.HOLD_UNKNOWN, "the sink has neither readback nor idempotency"
        )
    return RecoveryAction(
        Recovery.HOLD_UNKNOWN,
        f"the sink's key retention ({contract.key_retention_s} s) has passed since "
        f"the first attempt at {first_seen_ms} ms",
    )


# --------------------------------------------------------------------------
# A request that never reached the sink: retry with backoff, then hold.


@dataclass(frozen=True)
class RetryBudget:
    """How often, and how patiently, the relay retries a request that never left.

    A request the sink cannot have received (the connection was refused or
    could not be made, or the sink is not in the registry) is safe to send
    again: the relay retries it after a growing backoff, without holding up
    other operations, and holds the operation for a person once the budget is
    spent. A request that may have left (a timeout after sending) is never
    retried this way: it is read back (:func:`after_ambiguous_send`).

    Attributes:
        attempts: tries in all, the first included (at least 1).
        first_backoff_ms: wait after the first failed try (milliseconds).
        max_backoff_ms: the longest wait between two tries (milliseconds);
            each wait doubles the one before, up to this.
    """

    attempts: int = 6
    first_backoff_ms: int = 500
    max_backoff_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_backoff_ms < 0 or self.max_backoff_ms < 0:
            raise InvalidInputError(
                f"retry budget {self} is not usable: attempts must be at least 1 and "
                "backoffs at least 0 ms",
                expected="attempts >= 1, backoffs >= 0",
                observed=str(self),
            )


@dataclass(frozen=True)
class UnreachedDecision:
    """What to do about a request that did not reach the sink.

    Attributes:
        retry: ``True``: try again after ``delay_ms``; ``False``: the budget
            is spent, hold the operation for a person.
        delay_ms: wait before the next try (milliseconds; 0 when holding).
        reason: why, in words a receipt or an operating event can carry.
    """

    retry: bool
    delay_ms: int
    reason: str


def after_unreached(budget: RetryBudget, *, failures: int, waited_ms: int = 0) -> UnreachedDecision:
    """Decide whether to try a request that never reached its sink again.

    Args:
        budget: the relay's retry budget.
        failures: tries that have failed so far (at least 1).
        waited_ms: time spent since the first try (milliseconds; for the
            reason only).

    Returns:
        Retry after ``min(first_backoff_ms * 2**(failures-1), max_backoff_ms)``
        while ``failures < budget.attempts``; otherwise hold, with a reason
        that says the request never left and how often it was tried.
    """
    if failures < budget.attempts:
        delay = min(budget.first_backoff_ms * 2 ** (failures - 1), budget.max_backoff_ms)
        return UnreachedDecision(
            True, delay, f"try {failures} of {budget.attempts} did not reach the sink"
        )
    return UnreachedDecision(
        False,
        0,
        f"tried {failures} times over {waited_ms / 1000:.1f} s without reaching the sink; "
        "the request never left, so no effect was made",
    )


# --------------------------------------------------------------------------
# Postcondition: which observation to ask for, and what it shows.

#: Outcome of a postcondition check (a subset of the ledger's ``ReadbackStatus``).
PostconditionStatus = Literal["MATCH", "MISMATCH", "UNKNOWN", "UNSUPPORTED"]


class ObservedCredit(Protocol):
    """One credit a sink shows for a subject (e.g. ``sinks.client.Credit``)."""

    @property
    def operation_id(self) -> str:
        """The operation that made the credit."""
        ...

    @property
    def amount_minor(self) -> int:
        """Its amount in minor units."""
        ...


class CreditsObservation(Protocol):
    """A sink's answer to an ``account-credits`` query (e.g. ``sinks.client.AccountCredits``)."""

    @property
    def status(self) -> str:
        """``observed`` when the sink answered; anything else is no observation."""
        ...

    @property
    def detail(self) -> str:
        """Why there is no observation (empty when ``observed``)."""
        ...

    @property
    def credits(self) -> Sequence[ObservedCredit]:
        """Every credit to the subject, oldest first."""
        ...


@dataclass(frozen=True)
class PostconditionRequest:
    """The postcondition observation to ask a sink for.

    Attributes:
        query: the query to ask; when the sink offers none, the shape of
            :data:`ACCOUNT_CREDITS` (it still names the subject in reports).
        subject: the subject to query, ``str(params[query.subject_field])``,
            or ``""`` when the parameters lack it.
        offered: ``False`` when the sink offers no postcondition query or
            there is no subject: ask nothing, the check is ``UNSUPPORTED``.
    """

    query: PostconditionQuery
    subject: str
    offered: bool


def postcondition_request(
    contract: EffectContract, params: Mapping[str, Any]
) -> PostconditionRequest:
    """Describe the postcondition observation the contract lets one ask for.

    Args:
        contract: the sink's contract.
        params: the operation's semantic parameters.

    Returns:
        The query, its subject and whether to ask it at all.
    """
    declared = contract.postcondition_query()
    query = declared if declared is not None else ACCOUNT_CREDITS
    subject = str(params.get(query.subject_field, ""))
    return PostconditionRequest(query, subject, offered=declared is not None and bool(subject))


def judge_postcondition(
    contract: EffectContract,
    params: Mapping[str, Any],
    observation: CreditsObservation | None,
    operation_id: str,
) -> tuple[PostconditionStatus, str]:
    """Judge what a postcondition observation shows about an operation's effect.

    Args:
        contract: the sink's contract.
        params: the operation's semantic parameters.
        observation: the sink's answer to the query that
            :func:`postcondition_request` describes; ``None`` when it was
            not asked (the request is not ``offered``).
        operation_id: the operation whose effect is verified.

    Returns:
        ``(status, detail)``: ``UNSUPPORTED`` when the sink offers no query
        (or the parameters name no subject); ``UNKNOWN`` when the sink gave no
        observation; ``MATCH`` when the subject shows exactly one credit by
        the operation, of the expected amount (minor units); else
        ``MISMATCH``. ``detail`` says what was seen.

    Raises:
        LedgerError: when the request is offered but ``observation`` is
            ``None`` (the caller must ask the sink first).
    """
    request = postcondition_request(contract, params)
    if not request.offered:
        return "UNSUPPORTED", "the sink offers no postcondition query"
    if observation is None:
        raise InvalidInputError(
            f"{operation_id}: the sink offers the postcondition query "
            f"{request.query.query} of {request.subject!r}; ask it and pass its observation",
            operation_id=operation_id,
            expected=f"{request.query.query} observation",
            observed=None,
        )
    if observation.status != "observed":
        return "UNKNOWN", observation.detail or observation.status
    subject = request.subject
    mine = [c for c in observation.credits if c.operation_id == operation_id]
    amount = int(params.get(request.query.amount_field, 0))
    if len(mine) == 1 and mine[0].amount_minor == amount:
        return "MATCH", f"account {subject} shows one credit of {amount} for the operation"
    return "MISMATCH", (
        f"account {subject} shows {len(mine)} credit(s) "
        f"{[c.amount_minor for c in mine]} for the operation; expected one of "
        f"{amount}"
    )
