"""Delivery as a pure decision: what the relay does next for one dispatch.

The relay executes; this module decides. Given the sink's contract, the
dispatch's situation (fresh or met again after a crash, times, whether its
admission still stands) and the answers the sink has given so far in this
episode, :func:`next_step` returns what to do next: records to write (an
effect receipt, a readback observation), then at most one request to send
(submit, readback, reserve, read the hold, confirm, cancel), or that the
request could not be sent (the relay parks it within its retry budget). An
empty decision ends the episode. No clock, no randomness, no I/O: the same
inputs always give the same step, so the branches can be enumerated by
property tests (``tests/unit/test_delivery.py``):

* no mutating request (submit, reserve, confirm) follows an observed effect;
* no resubmit once the sink's key retention has passed since the first
  attempt, unless a readback came first;
* every ambiguity ends held (``AMBIGUOUS``, ``UNKNOWN``) or observed, never
  dropped, never read as a rejection.

The recovery rules themselves are the contract's (:mod:`ledger.contracts`:
:func:`~ledger.contracts.after_ambiguous_send`,
:func:`~ledger.contracts.readback_unsupported`,
:func:`~ledger.contracts.sends_idempotency_key`), and DESIGN.md "Effect
contracts" is their source. The postcondition (a ``VERIFY``) is judged by
:func:`~ledger.contracts.judge_postcondition`, equally pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ledger.contracts import EffectContract, Recovery, after_ambiguous_send, readback_unsupported

#: How the relay resumes a dispatch: ``ledger`` reads the effect back before any
#: second attempt; ``checkpoint-only`` re-sends from its checkpoint (the control
#: the missions compare against; never for production).
RelayMode = Literal["ledger", "checkpoint-only"]

Request = Literal["submit", "readback", "reserve", "read_hold", "confirm", "cancel"]

#: Requests that can make an effect.
MUTATING: frozenset[str] = frozenset({"submit", "reserve", "confirm"})

#: A sink's readback answer -> the readback record's status.
READBACK_STATUS = {
    "committed": "COMMITTED",
    "absent": "ABSENT",
    "unsupported": "UNSUPPORTED",
    "stale_token": "STALE_TOKEN",
    "ambiguous": "UNKNOWN",
}

#: A sink's submit answer -> the receipt's status.
SUBMIT_STATUS = {
    "committed": "COMMITTED",
    "rejected": "REJECTED",
    "stale_token": "STALE_TOKEN",
    "key_reused": "KEY_REUSED",
    "unavailable": "UNAVAILABLE",
    "ambiguous": "AMBIGUOUS",
}

#: Seams (crash points of the testbed) a step names; see :mod:`consumers.hooks`.
BEFORE_SEND = "after_dispatch_before_send"
BEFORE_RECEIPT = "after_sink_commit_before_receipt"
BEFORE_CONFIRM = "after_reserve_before_confirm"

#: How many hold transitions (reserve again, confirm, cancel) one episode takes at most.
MAX_HOLD_ROUNDS = 3


@dataclass(frozen=True)
class Observed:
    """One answer of the sink in this episode.

    Attributes:
        request: the request it answers.
        status: the answer's status (the adapter's vocabulary, :mod:`sinks.port`).
        sent: ``False`` when the request never left (nothing can have happened).
        detail: the adapter's words.
        effect_id: the sink's effect ID, when it names one.
        replayed: a submit answered with an earlier effect (idempotent replay).
        released_why: for a released hold, ``cancelled`` or ``expired``.
        resubmit: the answer is to a resubmit under the same key.
    """

    request: Request
    status: str
    sent: bool = True
    detail: str = ""
    effect_id: str | None = None
    replayed: bool = False
    released_why: str | None = None
    resubmit: bool = False

    @classmethod
    def of(cls, request: Request, answer: Any, *, resubmit: bool = False) -> Observed:
        """From an adapter's result (``SubmitResult``, ``ReadbackResult``, ``HoldResult``)."""
        return cls(
            request,
            answer.status,
            sent=answer.sent,
            detail=answer.detail,
            effect_id=getattr(answer, "effect_id", None),
            replayed=getattr(answer, "replayed", False),
            released_why=getattr(answer, "released_why", None),
            resubmit=resubmit,
        )


@dataclass(frozen=True)
class Situation:
    """What the ledger knows of the dispatch when it decides.

    Attributes:
        kind: ``EXECUTE`` (make the effect) or ``READBACK`` (observe it).
        mode: ``ledger``, or ``checkpoint-only`` (the negative control).
        fresh: no earlier run of the relay may have sent this dispatch.
        readback_on_resume: for a parked readback asked again, the
            ``on_resume`` it carries; ``None`` otherwise.
        on_resume: the dispatch's own ``on_resume`` (for a ``READBACK``).
        first_attempt_ms: ledger time (ms) of the dispatch's first attempt.
        now_ms: ledger time (ms) now.
        admission_withdrawn: why the dispatch's admission no longer stands,
            read just before this decision (reservation sinks), or ``None``.
        sink: the sink's name (for the records' words).
    """

    kind: Literal["EXECUTE", "READBACK"]
    mode: RelayMode
    fresh: bool
    first_attempt_ms: int
    now_ms: int
    readback_on_resume: bool | None = None
    on_resume: bool = False
    admission_withdrawn: str | None = None
    sink: str = "the sink"


@dataclass(frozen=True)
class Send:
    """Send one request.

    Attributes:
        request: which.
        seam: the crash seam just before it, or ``None``.
        resubmit: a submit sent again under the same key (its receipt is ``on_resume``).
        fresh_identity: a submit under a fresh attempt identity and key (checkpoint-only).
    """

    request: Request
    seam: str | None = None
    resubmit: bool = False
    fresh_identity: bool = False


@dataclass(frozen=True)
class Receipt:
    """Record an effect receipt of the dispatch.

    Attributes:
        status: the receipt's status (``COMMITTED``, ``AMBIGUOUS``, ``EXPIRED`` ...).
        detail: its words.
        effect_id: the sink's effect ID, when committed.
        on_resume: the receipt follows a request that may have been sent before.
        reservation: ``CONFIRMED``, ``CANCELLED`` or ``EXPIRED`` for a hold's end.
        seam: the crash seam just before it is recorded.
        fresh_identity: the attempt's identity was fresh (checkpoint-only).
    """

    status: str
    detail: str
    effect_id: str | None = None
    on_resume: bool = False
    reservation: str | None = None
    seam: str | None = None
    fresh_identity: bool = False


@dataclass(frozen=True)
class Observation:
    """Record a readback of the effect (what the sink says it holds)."""

    status: str
    detail: str
    effect_id: str | None = None
    on_resume: bool = False


@dataclass(frozen=True)
class NotReached:
    """The request could not be sent: the relay retries it within its budget, then holds."""

    request: Literal["submit", "readback"]
    detail: str
    on_resume: bool = False


@dataclass(frozen=True)
class Decision:
    """What to do now: write ``records``, then send ``send`` (or report ``not_reached``).

    A decision with neither ``send`` nor ``not_reached`` ends the episode.
    """

    records: tuple[Receipt | Observation, ...] = ()
    send: Send | None = None
    not_reached: NotReached | None = None

    @property
    def done(self) -> bool:
        """``True`` when the episode ends with this decision."""
        return self.send is None and self.not_reached is None


def next_step(
    contract: EffectContract, situation: Situation, history: Sequence[Observed]
) -> Decision:
    """Decide the relay's next step for one dispatch (see the module docstring).

    Args:
        contract: the sink's effect contract.
        situation: what the ledger knows of the dispatch.
        history: the sink's answers so far in this episode, oldest first.

    Returns:
        The decision.
    """
    if situation.kind == "READBACK":
        return _readback(contract, situation, history, on_resume=situation.on_resume)
    if situation.mode == "checkpoint-only":
        return _checkpoint_only(history)
    if contract.reservation:
        return _reservation(situation, history)
    return _execute(contract, situation, history)


def _readback(
    contract: EffectContract, s: Situation, history: Sequence[Observed], *, on_resume: bool
) -> Decision:
    """Observe the effect: one readback, or UNSUPPORTED without asking."""
    unsupported = readback_unsupported(contract)
    if unsupported is not None:
        return Decision((Observation("UNSUPPORTED", unsupported, on_resume=on_resume),))
    answers = [o for o in history if o.request == "readback"]
    if not answers:
        return Decision(send=Send("readback"))
    rb = answers[-1]
    if not rb.sent:
        return Decision(not_reached=NotReached("readback", rb.detail, on_resume=on_resume))
    effect_id = rb.effect_id if rb.status == "committed" else None
    status = READBACK_STATUS.get(rb.status, "UNKNOWN")
    return Decision((Observation(status, rb.detail or rb.status, effect_id, on_resume),))


def _checkpoint_only(history: Sequence[Observed]) -> Decision:
    """The negative control: send under a fresh identity, believe the answer."""
    if not history:
        return Decision(send=Send("submit", fresh_identity=True))
    last = history[-1]
    if not last.sent:
        return Decision(not_reached=NotReached("submit", last.detail))
    if last.status == "committed":
        detail = "replayed by the sink" if last.replayed else "committed"
        return Decision(
            (
                Receipt(
                    "COMMITTED", detail, last.effect_id, seam=BEFORE_RECEIPT, fresh_identity=True
                ),
            )
        )
    status = SUBMIT_STATUS.get(last.status, "AMBIGUOUS")
    return Decision((Receipt(status, last.detail or last.status, fresh_identity=True),))


def _may_have_left(
    contract: EffectContract, s: Situation, *, on_resume: bool, why: str = ""
) -> Decision:
    """A request may have reached the sink: find out before anything is sent again.

    ``why`` is the adapter's account of the ambiguous answer (a deadline, a
    reset), kept in the receipt when the outcome is held so that an operator
    can tell a faulty network from a deadline set too short.
    """
    decision = after_ambiguous_send(contract, first_seen_ms=s.first_attempt_ms, now_ms=s.now_ms)
    if decision.action is Recovery.READ_BACK:
        return Decision(send=Send("readback"))
    if decision.action is Recovery.RESUBMIT_SAME_KEY:
        return Decision(send=Send("submit", resubmit=True))
    because = f" ({why})" if why else ""
    return Decision(
        (
            Receipt(
                "AMBIGUOUS",
                f"the request may have reached {s.sink}{because}; {decision.reason}",
                on_resume=on_resume,
            ),
        )
    )


def _execute(contract: EffectContract, s: Situation, history: Sequence[Observed]) -> Decision:
    """Submit, or recover a submit that may have left (readback, resubmit, hold)."""
    resumed = s.readback_on_resume is not None or not s.fresh
    resume_flag = s.readback_on_resume if s.readback_on_resume is not None else True
    if not history:
        if resumed:  # a previous run may have sent it: never send blindly
            return _may_have_left(contract, s, on_resume=resume_flag)
        return Decision(send=Send("submit", seam=BEFORE_SEND))
    last = history[-1]
    if last.request == "readback":
        return _readback(contract, s, history, on_resume=resume_flag if resumed else False)
    if not last.sent:
        return Decision(not_reached=NotReached("submit", last.detail))
    if last.status == "committed":
        detail = "replayed by the sink" if last.replayed else "committed"
        receipt = Receipt(
            "COMMITTED", detail, last.effect_id, on_resume=last.resubmit, seam=BEFORE_RECEIPT
        )
        return Decision((receipt,))
    if last.status == "ambiguous" and not last.resubmit:
        return _may_have_left(contract, s, on_resume=False, why=last.detail)
    status = SUBMIT_STATUS.get(last.status, "AMBIGUOUS")
    return Decision((Receipt(status, last.detail or last.status, on_resume=last.resubmit),))


def _reservation(s: Situation, history: Sequence[Observed]) -> Decision:
    """Try-confirm-cancel: reserve (or read the hold back), then confirm or cancel.

    A fresh dispatch reserves a hold; one met again reads its hold back first
    (and reserves when the sink holds none). Then: ``confirmed`` -> the effect
    is recorded; ``held`` -> confirmed while the admission stands, else
    cancelled; ``released`` (expired) -> reserved again under the same key
    while the admission stands (an ``EXPIRED`` receipt journals the release),
    else ``CANCELLED``. Every end of a hold is a receipt.
    """
    on_resume = not s.fresh
    if not history:
        return Decision(send=Send("reserve", seam=BEFORE_SEND) if s.fresh else Send("read_hold"))
    first = history[0]
    if not first.sent:
        request: Literal["submit", "readback"] = "submit" if s.fresh else "readback"
        return Decision(not_reached=NotReached(request, first.detail, on_resume=on_resume))
    start = 0
    if first.request == "read_hold" and first.status == "absent":  # the reserve never arrived
        if len(history) == 1:
            return Decision(send=Send("reserve"))
        start = 1
    hold = history[-1]
    rounds = len(history) - 1 - start

    def receipt(status: str, detail: str, **kw: Any) -> Receipt:
        return Receipt(status, detail, on_resume=on_resume, **kw)

    withdrawn = s.admission_withdrawn
    sink = s.sink
    if hold.request == "cancel":  # our own cancel answered: the hold ends here
        if hold.status == "released":
            return Decision(
                (
                    receipt(
                        "CANCELLED",
                        f"hold cancelled at {sink}: {withdrawn}",
                        reservation="CANCELLED",
                    ),
                )
            )
    elif rounds < MAX_HOLD_ROUNDS:
        if hold.status == "released":
            why = hold.released_why or "released"
            if withdrawn is not None:
                return Decision(
                    (
                        receipt(
                            "CANCELLED",
                            f"hold {why} at {sink} and not taken again: {withdrawn}",
                            reservation="CANCELLED",
                        ),
                    )
                )
            expired = receipt(
                "EXPIRED",
                f"hold {why} at {sink}; the admission stands: reserved again under the same key",
                reservation="EXPIRED",
            )
            return Decision((expired,), send=Send("reserve"))
        if hold.status == "held":
            if withdrawn is None:
                return Decision(send=Send("confirm", seam=BEFORE_CONFIRM))
            return Decision(send=Send("cancel", seam=BEFORE_CONFIRM))
    if hold.status == "confirmed" and (hold.request == "cancel" or rounds < MAX_HOLD_ROUNDS):
        confirmed = receipt(
            "COMMITTED",
            f"reservation confirmed at {sink}",
            effect_id=hold.effect_id,
            reservation="CONFIRMED",
            seam=BEFORE_RECEIPT,
        )
        return Decision((confirmed,))
    status = {
        "rejected": "REJECTED",
        "stale_token": "STALE_TOKEN",
        "key_reused": "KEY_REUSED",
        "unavailable": "UNAVAILABLE" if s.fresh else "AMBIGUOUS",
    }.get(hold.status, "AMBIGUOUS")
    return Decision(
        (receipt(status, f"reservation at {sink}: {hold.status}: {hold.detail}"[:2000]),)
    )
