"""The service SDK: perform one consequential operation and get its typed outcome.

::

    service = LedgerService(LedgerSettings(), actor="svc-remediation")
    result = service.perform(
        operation_id="refund:1842:v3", sink="payments", action="refund",
        params={"account": "acct-1842", "amount_minor": 5000, "currency": "GBP"},
        subject="customer-1842", purpose="fee-remediation", decision_version=3,
        approval_id="review-1842", wait_s=30.0,
    )
    match result:
        case Verified(effect_id=effect): ...
        case Refused(kind="UNKNOWN_SINK", remedy=remedy): ...
        case Pending(): ...  # the wait ran out: perform again later

:meth:`LedgerService.perform` publishes the intent and waits for the
processor's signed answer on ``outcomes`` (:mod:`producers.outcomes`). The
service needs write on ``intents``, read on ``outcomes`` and the outcome
key's public half (``LEDGER_OUTCOME_PUBLIC_KEY_FILE``): no secret, no
internal topic. It never creates a key.

Idempotent per operation ID: performing the same operation again (after a
crash, a timeout, a :class:`~ledger.errors.DeliveryUnknownError`) publishes
the same intent, which the ledger records once, and returns the operation's
outcome: never a second effect. Parameters that differ under the same
operation ID are refused (``Refused(kind="PARAMETER_DRIFT")``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ledger.events import Outcome as OutcomeRecord
from ledger.settings import LedgerSettings
from producers.outcomes import OutcomeReader
from producers.publisher import LedgerPublisher, build_intent


@dataclass(frozen=True)
class Verified:
    """The effect was made once and its postcondition read back.

    Attributes:
        operation_id: the operation.
        effect_id: the sink's effect ID (from the receipt).
        postcondition: the observation that verified it (``source: status``).
        policy_version: the policy version it was admitted under.
        reason: the processor's words.
    """

    operation_id: str
    effect_id: str | None
    postcondition: str | None
    policy_version: int | None
    reason: str


@dataclass(frozen=True)
class Committed:
    """The sink's receipt says the effect was made once; nothing independent verified it.

    The sink offers no postcondition (an e-mail relay, say), or the one it
    offers has not confirmed the effect yet (the ledger reconciles it and
    announces ``Verified`` once read back). Final for a waiter: performing
    the operation again never makes a second effect.

    Attributes:
        operation_id: the operation.
        effect_id: the sink's effect ID (from the receipt).
        policy_version: the policy version it was admitted under.
        reason: the processor's words.
        remedy: where to look when an independent check matters.
    """

    operation_id: str
    effect_id: str | None
    policy_version: int | None
    reason: str
    remedy: str


@dataclass(frozen=True)
class NeedsReauthorisation:
    """No effect: the operation needs a new approval (none given, expired, consumed, revoked ...).

    Attributes:
        operation_id: the operation.
        reason: why the approval did not admit it.
        approval_id: the approval that was refused or missing (``None``: none given).
        policy_version: the policy version of the decision, when one was made.
        remedy: what to do (a new approval bound to this operation, then perform again).
    """

    operation_id: str
    reason: str
    approval_id: str | None
    policy_version: int | None
    remedy: str


@dataclass(frozen=True)
class Held:
    """The effect's outcome is unknown; the ledger holds the operation until it is observed.

    Attributes:
        operation_id: the operation.
        owner: who must act (reconciliation, an operator ...).
        release_condition: what releases it (never a timer).
        reason: why it is held.
        effect_id: the effect ID, when one is known.
    """

    operation_id: str
    owner: str | None
    release_condition: str | None
    reason: str
    effect_id: str | None


@dataclass(frozen=True)
class Refused:
    """The intent was refused; nothing was done and no approval used.

    Attributes:
        operation_id: the operation.
        kind: the refusal's kind (``UNKNOWN_SINK``, ``PARAMETER_DRIFT``, ``BAD_INPUT`` ...).
        reason: why.
        remedy: what to correct.
    """

    operation_id: str
    kind: str
    reason: str
    remedy: str


@dataclass(frozen=True)
class Abandoned:
    """The operation is closed without (further) effect.

    Attributes:
        operation_id: the operation.
        reason: why.
        remedy: what to do (a new request needs a new operation ID).
    """

    operation_id: str
    reason: str
    remedy: str


@dataclass(frozen=True)
class Pending:
    """The wait ran out before the operation settled: perform it again later to learn more.

    Attributes:
        operation_id: the operation.
        state: its recovery state as last seen (``None``: no answer seen yet,
            e.g. the processor is not running).
        reason: the last answer's reason, or why none was seen.
        records_read: records the wait read (its cost).
    """

    operation_id: str
    state: str | None
    reason: str
    records_read: int = 0


#: What :meth:`LedgerService.perform` returns.
Outcome = Verified | Committed | NeedsReauthorisation | Held | Refused | Abandoned | Pending


def result_of(record: OutcomeRecord | None, operation_id: str, records_read: int = 0) -> Outcome:
    """The typed result of an outcome record (``None``: nothing seen, :class:`Pending`).

    Args:
        record: the outcome the wait found (final, or the last seen).
        operation_id: the operation waited for.
        records_read: records the wait read.

    Returns:
        One of :data:`Outcome`'s classes, by the record's kind.
    """
    if record is None:
        return Pending(
            operation_id,
            None,
            "no answer from the ledger yet (are the stages running?); perform the same "
            "operation again to find out",
            records_read,
        )
    r = record
    if r.kind == "VERIFIED":
        return Verified(operation_id, r.effect_id, r.postcondition, r.policy_version, r.reason)
    if r.kind == "COMMITTED":
        return Committed(operation_id, r.effect_id, r.policy_version, r.reason, r.remedy)
    if r.kind == "NEEDS_REAUTHORISATION":
        return NeedsReauthorisation(
            operation_id, r.reason, r.approval_id, r.policy_version, r.remedy
        )
    if r.kind == "HELD":
        return Held(operation_id, r.owner, r.release_condition, r.reason, r.effect_id)
    if r.kind == "REFUSED":
        return Refused(operation_id, r.refusal_kind or "REFUSED", r.reason, r.remedy)
    if r.kind == "ABANDONED":
        return Abandoned(operation_id, r.reason, r.remedy)
    return Pending(operation_id, r.state, r.reason, records_read)


class Performer(Protocol):
    """What an integration needs of a service: :meth:`LedgerService.perform` (fakes match it).

    ``actor`` is the requesting actor named in every intent.
    """

    actor: str

    def perform(
        self,
        *,
        operation_id: str,
        sink: str,
        action: str,
        params: Mapping[str, Any],
        subject: str,
        purpose: str,
        decision_version: int = 1,
        approval_id: str | None = None,
        compensates: str | None = None,
        wait_s: float = 30.0,
    ) -> Outcome:
        """See :meth:`LedgerService.perform`."""
        ...


class AsyncPerformer(Protocol):
    """:class:`Performer` for asyncio: :meth:`LedgerService.perform_async`."""

    actor: str

    async def perform_async(
        self,
        *,
        operation_id: str,
        sink: str,
        action: str,
        params: Mapping[str, Any],
        subject: str,
        purpose: str,
        decision_version: int = 1,
        approval_id: str | None = None,
        compensates: str | None = None,
        wait_s: float = 30.0,
    ) -> Outcome:
        """See :meth:`LedgerService.perform_async`."""
        ...


class LedgerService:
    """A service's handle on the ledger: perform operations, get typed outcomes.

    Args:
        settings: bootstrap servers, topic prefix, the outcome public key
            file (``LEDGER_OUTCOME_PUBLIC_KEY_FILE``).
        actor: the requesting actor named in every intent.
        publisher: the intent publisher (default: a :class:`LedgerPublisher`).
        reader: the outcome reader (default: one with the outcome public key).

    Raises:
        MissingKeyError: no outcome public key (the message names
            ``ledger keys export --outcome-public``); checked before
            anything is published.
    """

    def __init__(
        self,
        settings: LedgerSettings,
        *,
        actor: str = "service",
        publisher: LedgerPublisher | None = None,
        reader: OutcomeReader | None = None,
    ) -> None:
        self.settings = settings
        self.actor = actor
        self.reader = reader if reader is not None else OutcomeReader(settings)
        self.publisher = publisher if publisher is not None else LedgerPublisher(settings)
        #: records the last wait read from ``outcomes`` (its cost, for benchmarks and tests).
        self.last_records_read = 0

    def perform(
        self,
        *,
        operation_id: str,
        sink: str,
        action: str,
        params: Mapping[str, Any],
        subject: str,
        purpose: str,
        decision_version: int = 1,
        approval_id: str | None = None,
        compensates: str | None = None,
        wait_s: float = 30.0,
    ) -> Outcome:
        """Publish the intent for one operation and wait (bounded) for its outcome.

        Args:
            operation_id: stable operation ID chosen from case state (``refund:1842:v3``).
            sink: the sink that performs the effect.
            action: the action.
            params: semantic parameters (JSON values; amounts in minor units).
            subject: the represented subject.
            purpose: the declared purpose.
            decision_version: version of the business decision.
            approval_id: the approval relied on for admission.
            compensates: the settled operation this one compensates.
            wait_s: how long to wait for a final outcome (seconds).

        Returns:
            The first final outcome after this publish, or :class:`Pending`
            with the state last seen when ``wait_s`` ran out.

        Raises:
            DeliveryUnknownError: the intent was not acknowledged in time: it
                may still be delivered; perform the same operation again to
                find out (always safe).
            LedgerError: invalid parameters, or the broker refused the intent.
            BrokerUnavailableError: the outcomes topic cannot be described.
        """
        intent = build_intent(
            operation_id=operation_id,
            sink=sink,
            action=action,
            params=params,
            actor=self.actor,
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
            approval_id=approval_id,
            compensates=compensates,
        )
        deadline = time.monotonic() + wait_s
        with self.reader.watch(operation_id, timeout_s=min(wait_s, 10.0)) as watch:
            published = self.publisher.publish_intent(intent)
            waited = watch.wait(
                max(deadline - time.monotonic(), 0.0),
                answer_to=(published.partition, published.offset),
                parameter_digest=intent.parameter_digest,
            )
        self.last_records_read = waited.records_read
        return result_of(waited.outcome, operation_id, waited.records_read)

    async def perform_async(
        self,
        *,
        operation_id: str,
        sink: str,
        action: str,
        params: Mapping[str, Any],
        subject: str,
        purpose: str,
        decision_version: int = 1,
        approval_id: str | None = None,
        compensates: str | None = None,
        wait_s: float = 30.0,
    ) -> Outcome:
        """:meth:`perform` for asyncio: runs it in a worker thread (same arguments).

        The event loop keeps running while the wait lasts; several operations
        may be performed at once (``asyncio.gather``).

        Raises:
            As :meth:`perform`.
        """
        return await asyncio.to_thread(
            self.perform,
            operation_id=operation_id,
            sink=sink,
            action=action,
            params=params,
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
            approval_id=approval_id,
            compensates=compensates,
            wait_s=wait_s,
        )

    def close(self) -> None:
        """Flush the publisher."""
        self.publisher.close()

    def __enter__(self) -> LedgerService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
