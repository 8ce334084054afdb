"""What a sink backend receives and answers, and the two rules it applies.

A backend is the business half of a conformant sink (:mod:`sinks.toolkit`):
the toolkit hands it requests that have already passed every check of the
protocol that needs no stored state (token, body, types, the operation ID
grammar, the key and fencing token the contract promises, the parameter
digest), and renders whatever it answers as the protocol's HTTP response.

The backend owns the storage of fencing tokens and idempotency keys, because
only the backend can make them atomic with the effect: a token raised or a
key recorded in another store than the effect's can be lost by a crash between
the two writes, and the sink would then make a second effect or take a stale
owner's request. The toolkit owns the *rules* instead, as two pure functions
the backend calls inside its own transaction:

* :func:`fence` -- is this fencing token stale, absurd, or accepted (and what
  is the operation's highest token afterwards)?
* :func:`replay` -- within the key's retention, does this submit replay the
  key's first effect, conflict with it, or make a new effect?

A backend is any object with the methods of :class:`SinkBackend` (``submit``;
the only part every sink needs), plus those of :class:`ReadbackBackend`,
:class:`PostconditionBackend` and :class:`ReservationBackend` for the parts its
contract declares, and optionally ``health_info()``. Each method may be a
plain function (called on the server's event loop, one request at a time, so
an in-memory backend needs no lock; it must not block) or a coroutine
function (which must then make its own check-and-write atomic).

Times are ledger time in milliseconds since the epoch.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypeAlias, TypeVar, runtime_checkable

from sinks.client import Credit

#: How far above the highest fencing token seen for an operation (0 when
#: none) a request's token may be: the ledger raises a token by one per
#: resume, so a larger step can only be an error, and accepting it would make
#: every later request of the operation stale.
MAX_TOKEN_STEP: Final = 1000

#: Largest fencing token (a signed 64-bit integer).
MAX_TOKEN: Final = 2**63 - 1


@dataclass(frozen=True)
class SubmitRequest:
    """A submit (``POST /operations``) or a reserve (``POST /reservations``) as checked.

    Attributes:
        operation_id: the operation (the ledger's ID grammar).
        parameter_digest: the digest, already recomputed and found equal.
        params: the parameters exactly as received (JSON values).
        fencing_token: the operation's fencing token; ``None`` when the
            request carried none or the contract does not fence.
        attempt_id: the caller's attempt identity (for inspection).
        action: the action.
        subject: the represented subject.
        purpose: the declared purpose.
        decision_version: the business decision's version.
        idempotency_key: the ``Idempotency-Key`` header; ``None`` when absent
            or the contract is not idempotent (the header is then ignored).
    """

    operation_id: str
    parameter_digest: str
    params: Mapping[str, Any]
    fencing_token: int | None
    attempt_id: str
    action: str
    subject: str
    purpose: str
    decision_version: int
    idempotency_key: str | None


# --------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Committed:
    """The effect exists (201 when new, 200 when ``replayed``).

    Attributes:
        effect_id: the system's own ID of the effect.
        committed_ms: when it committed (ledger time, ms).
        replayed: ``True`` when this answers with an earlier effect (a key replay).
        parameter_digest: the digest the effect was made with (default the request's).
        fencing_token: the token the effect was made with, if any.
        extra: more fields for the response body (informative; the client ignores them).
    """

    effect_id: str
    committed_ms: int
    replayed: bool = False
    parameter_digest: str | None = None
    fencing_token: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OperationFound:
    """A readback's answer: the operation's effects exist (200).

    Attributes:
        effect_id: the first effect's ID.
        committed_ms: when the first effect committed (ledger time, ms).
        parameter_digest: the digest the first effect was made with.
        effects: how many effects the system holds for the operation (1 unless
            something made it twice: the ledger's audit counts on this number).
        extra: more fields for the response body.
    """

    effect_id: str
    committed_ms: int
    parameter_digest: str
    effects: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HoldState:
    """A reservation as it stands (try-confirm-cancel).

    Attributes:
        status: ``held``, ``confirmed`` (the effect is made) or ``released``.
        held_at_ms: when the hold was taken (ledger time, ms).
        expires_at_ms: when an unconfirmed hold is released by the sink itself.
        parameter_digest: the digest the hold was taken with.
        reserves: how many holds were taken under this operation ID.
        effect_id: the effect made by the confirmation, when confirmed.
        released_why: ``cancelled`` or ``expired`` when released.
        new: ``True`` when this request took the hold (a reserve answers 201).
        extra: more fields for the response body.
    """

    status: Literal["held", "confirmed", "released"]
    held_at_ms: int
    expires_at_ms: int
    parameter_digest: str
    reserves: int = 1
    effect_id: str | None = None
    released_why: Literal["cancelled", "expired"] | None = None
    new: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Absent:
    """The system holds no effect (readback) or no hold (reservations) for the operation (404)."""


@dataclass(frozen=True)
class StaleToken:
    """The token is lower than the highest seen for the operation (409): a newer owner acts.

    Attributes:
        highest: the highest token seen.
    """

    highest: int


@dataclass(frozen=True)
class TokenOutOfRange:
    """The token is more than :data:`MAX_TOKEN_STEP` above the highest seen (400; nothing kept).

    Attributes:
        ceiling: the largest token that would have been accepted.
    """

    ceiling: int


@dataclass(frozen=True)
class KeyReused:
    """The key names an effect (or hold) made with another parameter digest (409).

    Attributes:
        effect_id: the existing effect, if any.
        detail: a human-readable reason.
    """

    effect_id: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Rejected:
    """The system refused the effect, definitely without making it (422).

    Attributes:
        error: a machine-readable reason (default ``rejected_by_sink``).
        detail: a human-readable reason.
    """

    error: str = "rejected_by_sink"
    detail: str = ""


@dataclass(frozen=True)
class Unavailable:
    """The system did not process the request and certainly made no effect (503).

    Attributes:
        detail: a human-readable reason.
    """

    detail: str = ""


@dataclass(frozen=True)
class OutcomeUnknown:
    """The system may or may not have acted, e.g. its own API timed out (504).

    The ledger then holds the operation and reads it back; answer this, never
    :class:`Unavailable` or :class:`Rejected`, whenever the effect may exist.

    Attributes:
        detail: a human-readable reason.
    """

    detail: str = ""


#: What ``submit`` may answer.
SubmitOutcome = (
    Committed | StaleToken | TokenOutOfRange | KeyReused | Rejected | Unavailable | OutcomeUnknown
)
#: What ``readback`` may answer.
ReadbackOutcome = (
    OperationFound | Absent | StaleToken | TokenOutOfRange | Unavailable | OutcomeUnknown
)
#: What ``reserve`` may answer (a hold already confirmed answers as it stands).
ReserveOutcome = (
    HoldState | StaleToken | TokenOutOfRange | KeyReused | Rejected | Unavailable | OutcomeUnknown
)
#: What ``confirm``, ``cancel`` and ``read_hold`` may answer.
HoldOutcome = HoldState | Absent | StaleToken | TokenOutOfRange | Unavailable | OutcomeUnknown
#: What ``account`` may answer: the account's credits, oldest first.
AccountOutcome = Sequence[Credit] | Unavailable | OutcomeUnknown


# ------------------------------------------------------------------------ rules


@dataclass(frozen=True)
class FenceVerdict:
    """What :func:`fence` decides.

    Attributes:
        refusal: the answer to give (:class:`StaleToken` or
            :class:`TokenOutOfRange`), or ``None`` when the request may go on.
        highest: the operation's highest token to store afterwards (unchanged
            on a refusal; ``None`` when there is none yet).
    """

    refusal: StaleToken | TokenOutOfRange | None
    highest: int | None


def fence(token: int | None, highest: int | None) -> FenceVerdict:
    """Apply the fencing rule to a request's token.

    Call it inside the transaction that makes the effect, with the highest
    token stored for the operation, and store ``verdict.highest`` when the
    request goes on.

    Args:
        token: the request's token (``None``: not fenced, always accepted).
        highest: the highest token stored for the operation, or ``None``.

    Returns:
        The verdict: a token more than :data:`MAX_TOKEN_STEP` above ``highest``
        (0 when none) is out of range; one lower than ``highest`` is stale;
        any other raises the highest to it.
    """
    if token is None:
        return FenceVerdict(None, highest)
    ceiling = (highest or 0) + MAX_TOKEN_STEP
    if token > ceiling:
        return FenceVerdict(TokenOutOfRange(ceiling), highest)
    if highest is not None and token < highest:
        return FenceVerdict(StaleToken(highest), highest)
    return FenceVerdict(None, max(token, highest or token))


def replay(
    prior: Committed | None,
    *,
    first_seen_ms: int,
    parameter_digest: str,
    now_ms: int,
    retention_s: int,
) -> Committed | KeyReused | None:
    """Apply the idempotency rule to a submit whose key names a stored effect.

    Args:
        prior: the latest effect stored under the request's key (with its
            ``parameter_digest``), or ``None``.
        first_seen_ms: when that key was first seen (ledger time, ms).
        parameter_digest: the request's digest.
        now_ms: the current ledger time (ms).
        retention_s: the contract's ``key_retention_s`` (seconds).

    Returns:
        ``None`` when the request makes a new effect (no prior effect, or the
        key's retention has passed); the prior effect marked ``replayed`` when
        the digests are equal; :class:`KeyReused` when they differ.
    """
    if prior is None or now_ms - first_seen_ms >= retention_s * 1000:
        return None
    if prior.parameter_digest != parameter_digest:
        return KeyReused(prior.effect_id, "the key names an effect made with other parameters")
    return Committed(
        prior.effect_id,
        prior.committed_ms,
        replayed=True,
        parameter_digest=parameter_digest,
        fencing_token=prior.fencing_token,
        extra=prior.extra,
    )


# -------------------------------------------------------------------- protocols

_T = TypeVar("_T")

#: A backend method's answer: the outcome, or an awaitable of it.
Answer: TypeAlias = _T | Awaitable[_T]


@runtime_checkable
class SinkBackend(Protocol):
    """What every backend offers: making an effect."""

    def submit(self, request: SubmitRequest) -> Answer[SubmitOutcome]:
        """Make the request's effect once (fence, key, effect in one transaction)."""
        ...


@runtime_checkable
class ReadbackBackend(Protocol):
    """A backend whose contract declares ``readback``."""

    def readback(self, operation_id: str, fencing_token: int | None) -> Answer[ReadbackOutcome]:
        """Whether the operation committed.

        For every operation ever committed, whatever the key retention (fence the token as a submit
        does).
        """
        ...


@runtime_checkable
class PostconditionBackend(Protocol):
    """A backend whose contract declares the ``account-credits`` postcondition."""

    def account(self, account: str) -> Answer[AccountOutcome]:
        """Every credit the system made to ``account``, oldest first."""
        ...


@runtime_checkable
class ReservationBackend(Protocol):
    """A backend whose contract declares ``reservation`` (try-confirm-cancel).

    The hold's key is the operation ID. A hold not confirmed by
    ``expires_at_ms`` must be released by the backend itself (before it
    answers anything about it).
    """

    def reserve(self, request: SubmitRequest) -> Answer[ReserveOutcome]:
        """Take a hold.

        Take a hold; a held or confirmed one answers as it stands, a released
        one is taken anew (``new=True``).
        """
        ...

    def confirm(self, operation_id: str, fencing_token: int | None) -> Answer[HoldOutcome]:
        """Make a held effect (once); a released hold answers as it stands."""
        ...

    def cancel(self, operation_id: str, fencing_token: int | None) -> Answer[HoldOutcome]:
        """Release a held hold; a confirmed one answers as it stands."""
        ...

    def read_hold(self, operation_id: str, fencing_token: int | None) -> Answer[HoldOutcome]:
        """The hold as it stands, or :class:`Absent`."""
        ...
