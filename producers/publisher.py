"""The ledger's publisher: every record a party outside the stages writes into the ledger.

:class:`LedgerPublisher` publishes seven kinds of record: intents (services),
approvals and revocations (review systems), claims (resumers), policy
changes and dispositions (operators), readbacks (reconcilers) and operating
events. ``LedgerPublisher`` is the same class under its former name. Every record is
validated against its Avro schema before it is sent, produced by an
idempotent producer with the ``murmur2_random`` partitioner (so Java and
Python producers agree on co-partitioning), and flushed before the call
returns (intents and approvals may be queued instead, ``wait=False``, and
acknowledged together by :meth:`LedgerPublisher.flush`: a driver publishing
in bulk). :meth:`LedgerPublisher.wait_for` waits for an operation to reach a
state (``OUTCOME_VERIFIED`` ...) and raises when it rests in another.

Each publish is a span (``publish <kind>``, a child of the caller's current
span if any) whose W3C ``traceparent`` goes in the record's headers, next to
its seal and outside it: the stages continue that trace (:mod:`ledger.tracing`;
the header is advisory context and decides nothing).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from confluent_kafka import Producer
from opentelemetry.trace import TracerProvider

from ledger.authority import policy_key
from ledger.credentials import Credentials
from ledger.errors import (
    InvalidInputError,
    OperationExistsError,
)
from ledger.events import (
    Approval,
    Claim,
    Disposition,
    Intent,
    OperatingEvent,
    OperationState,
    PolicyChange,
    Readback,
)
from ledger.identity import (
    amount_of,
    canonical_json,
    check_operation_id,
    parameter_digest,
)
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from ledger.signing import OPTIONAL_SIGNED_FIELDS
from ledger.states import RecoveryState
from ledger.topology import Topic
from ledger.tracing import tracer
from producers.sending import RecordSender
from producers.waiter import OperationWaiter


def require_name(what: str, value: str | None, *, operation_id: str | None = None) -> None:
    """Refuse an empty or whitespace-only name or ID before it is published.

    Args:
        what: the field, as the message names it (e.g. ``approval_id``).
        value: its value.
        operation_id: the operation concerned, if any (for the error).

    Raises:
        LedgerError: ``value`` is ``None``, empty or only white space.
    """
    if value is None or not value.strip():
        raise InvalidInputError(
            f"{what} must not be empty or only white space", operation_id=operation_id
        )


def require_policy_version(version: int) -> None:
    """Refuse a policy version below 1 (versions count from 1; 0 is not "the default").

    Raises:
        LedgerError: ``version`` is less than 1.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidInputError(
            f"policy version {version!r} is not valid: policy versions are integers from 1",
            expected=">= 1",
            observed=version,
        )


def build_disposition(
    operation_id: str,
    decision: str,
    by: str,
    evidence: str,
    disposed_at_ms: int,
    *,
    episode: int | None,
) -> Disposition:
    """An operator's disposition of an unknown outcome, with a fresh disposition ID.

    Args:
        operation_id: the operation held in UNKNOWN_OUTCOME.
        decision: ``committed``, ``absent`` or ``abandon`` (any case).
        by: the operator; the publisher signs with their key.
        evidence: what the decision rests on.
        disposed_at_ms: now on the ledger clock (milliseconds).
        episode: the unknown-outcome episode it answers: the operation's
            current ``OperationState.entered_version`` (``None`` for a state
            written before episodes were recorded). The processor applies
            the disposition only in that episode.

    Raises:
        pydantic.ValidationError: a decision outside the three.
    """
    return Disposition(
        disposition_id=f"disposition:{by}:{uuid.uuid4().hex[:8]}",
        operation_id=operation_id,
        decision=decision.upper(),  # type: ignore[arg-type]  # pydantic checks the Literal when the model is built
        by=by,
        evidence=evidence,
        disposed_at_ms=disposed_at_ms,
        episode=episode,
    )


def build_intent(
    *,
    operation_id: str,
    sink: str,
    action: str,
    params: Mapping[str, Any],
    actor: str,
    subject: str,
    purpose: str,
    decision_version: int,
    approval_id: str | None = None,
    published_at_ms: int | None = None,
    forked_from: str | None = None,
    compensates: str | None = None,
) -> Intent:
    """Build (without publishing) the intent :meth:`LedgerPublisher.publish` would send.

    The parameter digest and the amount (minor currency units) are derived
    from ``params``; the arguments are those of :meth:`LedgerPublisher.publish`.

    Raises:
        InputBoundsError: an operation ID outside the grammar
            (:func:`ledger.identity.operation_id_problem`).
        LedgerError: an empty name field (an approval ID given but blank
            included), a negative decision version, or parameters that are
            not JSON values.
    """
    for name, value in (
        ("operation_id", operation_id),
        ("sink", sink),
        ("action", action),
        ("actor", actor),
        ("subject", subject),
        ("purpose", purpose),
    ):
        if not value or not value.strip():
            raise InvalidInputError(f"{name} must not be empty", operation_id=operation_id or None)
    if approval_id is not None:
        require_name("approval_id", approval_id, operation_id=operation_id)
    check_operation_id(operation_id)
    if compensates is not None:
        check_operation_id(compensates)
    if decision_version < 0:
        raise InvalidInputError(
            "decision_version must be 0 or more",
            operation_id=operation_id,
            observed=decision_version,
        )
    digest = parameter_digest(
        action=action,
        params=params,
        subject=subject,
        purpose=purpose,
        decision_version=decision_version,
        sink=sink,
    )
    return Intent(
        operation_id=operation_id,
        sink=sink,
        action=action,
        params_json=canonical_json(dict(params)),
        actor=actor,
        subject=subject,
        purpose=purpose,
        decision_version=decision_version,
        approval_id=approval_id,
        amount_minor=amount_of(params),
        parameter_digest=digest,
        published_at_ms=published_at_ms if published_at_ms is not None else int(time.time() * 1000),
        forked_from=forked_from,
        compensates=compensates,
    )


def fork_intent(
    original: OperationState,
    new_operation_id: str,
    *,
    existing: Container[str] = (),
    approval_id: str | None = None,
    params: Mapping[str, Any] | None = None,
    decision_version: int | None = None,
    actor: str | None = None,
    published_at_ms: int | None = None,
) -> Intent:
    """The intent of a deliberate fork of ``original`` (the article's alternative branch).

    The fork is a new operation: its own ID, its own approval (none is
    inherited: without ``approval_id`` it waits for reauthorisation, and an
    approval the original consumed is refused by the authority kernel), its
    own admission and its own effects (the sink keys them by the new ID).
    It copies the original's sink, action, subject and purpose, and by
    default its parameters, decision version and actor; the original is not
    touched.

    Args:
        original: the original operation's current state (``ledger.state``).
        new_operation_id: the fork's operation ID.
        existing: operation IDs the ledger already knows (the new ID must
            not be one of them).
        approval_id: the fork's own approval.
        params: parameters of the fork (default: the original's).
        decision_version: its decision version (default: the original's).
        actor: who forks (default: the original's actor).
        published_at_ms: informational timestamp (ms); default wall clock.

    Returns:
        The intent, ``forked_from`` set to the original's ID.

    Raises:
        LedgerError: the new ID is the original's or one the ledger already
            knows; or any problem :func:`build_intent` refuses.
    """
    old = original.operation_id
    if new_operation_id == old or new_operation_id in existing:
        raise OperationExistsError(
            f"operation {new_operation_id!r} already exists in the ledger: a fork of {old} "
            "needs a new operation ID (e.g. one with a new decision version)",
            operation_id=new_operation_id,
        )
    return build_intent(
        operation_id=new_operation_id,
        sink=original.sink,
        action=original.action,
        params=dict(params) if params is not None else json.loads(original.params_json),
        actor=actor or original.actor,
        subject=original.subject,
        purpose=original.purpose,
        decision_version=(
            decision_version if decision_version is not None else original.decision_version
        ),
        approval_id=approval_id,
        published_at_ms=published_at_ms,
        forked_from=old,
    )


@dataclass(frozen=True)
class PublishedIntent:
    """What :meth:`LedgerPublisher.publish` returns.

    Attributes:
        operation_id: the stable operation ID.
        parameter_digest: the digest the operation is bound to (``v2:`` and SHA-256 hex; it
            binds the sink too, see :func:`ledger.identity.parameter_digest`).
        partition: partition the intent landed on.
        offset: its offset.
    """

    operation_id: str
    parameter_digest: str
    partition: int
    offset: int


class LedgerPublisher:
    """Publishes ledger inputs from services.

    Args:
        settings: ledger settings (bootstrap servers, topic prefix).
        client_id: identifies the publishing service in broker logs.
        send_timeout_s: how long one publish waits for the broker's
            acknowledgement before it raises (seconds); a caller that must
            ride out a cluster restart waits longer.
        tracer_provider: where the publish spans go (default: the global
            OpenTelemetry tracer provider, a no-op unless the application
            installed one, e.g. with :func:`ledger.tracing.configure`).

    Example:
        >>> pub = LedgerPublisher(LedgerSettings())
        >>> pub.publish(operation_id="refund:1842:v3", sink="payments",
        ...             action="refund", params={"account": "acct-1842",
        ...             "amount_minor": 5000, "currency": "GBP"},
        ...             actor="svc-remediation", subject="customer-1842",
        ...             purpose="fee-remediation", decision_version=3,
        ...             approval_id="review-1842")
    """

    def __init__(
        self,
        settings: LedgerSettings,
        client_id: str = "intent-publisher",
        *,
        credentials: Credentials | None = None,
        send_timeout_s: float = 30.0,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        #: the keys records are sealed with (:class:`ledger.credentials.Credentials`):
        #: intents are not sealed; a policy change, disposition or approval is
        #: signed by the person it names; claims, readbacks and operating
        #: events by the key of a stage role that writes the topic (ledger.rolekeys).
        self.credentials = credentials or Credentials(settings)
        #: waits for states, knowing the digest last published for each operation.
        self._waiter = OperationWaiter(settings)
        producer = Producer(producer_config(settings, **{"client.id": client_id, "linger.ms": 1}))
        #: seals, traces and produces each record, and counts the queued ones.
        self._sender = RecordSender(
            settings, self.credentials, producer, tracer(tracer_provider), send_timeout_s
        )

    @property
    def producer(self) -> Producer:
        """The idempotent producer every record goes through (the sender's)."""
        return self._sender.producer

    @producer.setter
    def producer(self, producer: Producer) -> None:
        self._sender.producer = producer

    @property
    def send_timeout_s(self) -> float:
        """How long one publish waits for the broker's acknowledgement (seconds)."""
        return self._sender.send_timeout_s

    @send_timeout_s.setter
    def send_timeout_s(self, seconds: float) -> None:
        self._sender.send_timeout_s = seconds

    @property
    def last_position(self) -> tuple[str, int, int] | None:
        """``(short topic, partition, offset)`` of the last record published, or ``None``."""
        return self._sender.last_position

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every record published with ``wait=False`` is acknowledged.

        Args:
            timeout_s: how long to wait in all (seconds); default
                ``send_timeout_s``.

        Raises:
            LedgerError: some were refused by the broker (the first reasons
                named; the failures are then forgotten), or not all were
                acknowledged within ``timeout_s`` (they stay pending).
            DeliveryUnknownError: some were not acknowledged within
                ``timeout_s``: they may still be delivered.
        """
        self._sender.flush(timeout_s)

    def publish(
        self,
        *,
        operation_id: str,
        sink: str,
        action: str,
        params: Mapping[str, Any],
        actor: str,
        subject: str,
        purpose: str,
        decision_version: int,
        approval_id: str | None = None,
        published_at_ms: int | None = None,
        compensates: str | None = None,
    ) -> PublishedIntent:
        """Publish an intent for one consequential operation.

        Args:
            operation_id: stable operation ID chosen from case state, e.g.
                ``refund:1842:v3`` (see :func:`ledger.identity.operation_id`).
            sink: name of the sink that performs the effect.
            action: action name.
            params: semantic parameters (JSON values); ``amount_minor`` is in
                minor currency units.
            actor: requesting actor.
            subject: represented subject.
            purpose: declared purpose.
            decision_version: version of the business decision.
            approval_id: approval relied on for admission.
            published_at_ms: informational timestamp (ms); default wall clock.
            compensates: the settled operation this one compensates (its own
                operation, linked to the original; see
                :mod:`ledger.fold.compensation`).

        Returns:
            The operation ID, its parameter digest and where it landed.

        Raises:
            LedgerError: invalid parameters, or the broker refused it.
            DeliveryUnknownError: not acknowledged within ``send_timeout_s``: it
                may still be delivered; publish the same operation again to
                find out (never under a new operation ID).
            SchemaValidationError: the intent does not fit its schema.
        """
        intent = build_intent(
            operation_id=operation_id,
            sink=sink,
            action=action,
            params=params,
            actor=actor,
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
            approval_id=approval_id,
            published_at_ms=published_at_ms,
            compensates=compensates,
        )
        return self.publish_intent(intent)

    @overload
    def publish_intent(self, intent: Intent, *, wait: Literal[True] = True) -> PublishedIntent: ...

    @overload
    def publish_intent(self, intent: Intent, *, wait: Literal[False]) -> None: ...

    def publish_intent(self, intent: Intent, *, wait: bool = True) -> PublishedIntent | None:
        """Publish an intent built with :func:`build_intent` (key: its operation ID).

        Args:
            intent: the intent.
            wait: wait for the broker's acknowledgement (the default). With
                ``False`` the record is only queued (the same record, sealed
                alike): nothing is returned, and :meth:`flush` waits for
                every queued record and reports a refusal.

        Returns:
            Where it landed (``None`` when not waited for).

        Raises:
            LedgerError: the broker refused it (when waited for).
            DeliveryUnknownError: not acknowledged in time: it may still be
                delivered (publish it again to find out).
            SchemaValidationError: the intent does not fit its schema.
        """
        if not wait:
            self._sender.send_later(Topic.INTENTS, intent.operation_id, intent)
            return None
        msg = self._sender.send(Topic.INTENTS, intent.operation_id, intent)
        self._waiter.published[intent.operation_id] = intent.parameter_digest
        return PublishedIntent(
            intent.operation_id, intent.parameter_digest, msg.partition() or 0, msg.offset() or 0
        )

    def fork(
        self,
        original: OperationState,
        new_operation_id: str,
        *,
        existing: Container[str] = (),
        approval_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        decision_version: int | None = None,
        actor: str | None = None,
    ) -> PublishedIntent:
        """Publish a deliberate fork of ``original`` under a new operation ID.

        See :func:`fork_intent` (no inherited admission, no claim over the
        original's effects, the original untouched).

        Args:
            original: the original operation's current state.
            new_operation_id: the fork's operation ID.
            existing: operation IDs the ledger already knows.
            approval_id: the fork's own approval.
            params: the fork's parameters (default: the original's).
            decision_version: its decision version (default: the original's).
            actor: who forks (default: the original's actor).

        Returns:
            The fork's operation ID, digest and where its intent landed.

        Raises:
            LedgerError: an existing new ID, invalid parameters, or the
                broker did not accept it.
        """
        intent = fork_intent(
            original,
            new_operation_id,
            existing=existing,
            approval_id=approval_id,
            params=params,
            decision_version=decision_version,
            actor=actor,
        )
        return self.publish_intent(intent)

    def publish_approval(self, approval: Approval, *, wait: bool = True) -> None:
        """Publish a review decision (key: approval ID).

        Args:
            approval: the decision (a grant signed by its reviewer).
            wait: wait for the broker's acknowledgement (the default); with
                ``False`` it is only queued, and :meth:`flush` reports its
                delivery (as for :meth:`publish_intent`).

        Raises:
            LedgerError: a blank approval ID, reviewer, subject, revoker or
                optional scope value, a policy version below 1, or the broker
                did not accept it (when waited for).
        """
        require_name("approval_id", approval.approval_id)
        require_name("reviewer", approval.reviewer)
        require_name("scope_subject", approval.scope_subject)
        require_policy_version(approval.policy_version)
        if approval.status == "REVOKED":
            require_name("revoked_by", approval.revoked_by)
        for field in ("scope_operation_id", *OPTIONAL_SIGNED_FIELDS):
            value = getattr(approval, field)
            if value is not None:
                require_name(field, value)
        if not wait:
            self._sender.send_later(Topic.APPROVALS, approval.approval_id, approval)
            return
        self._sender.send(Topic.APPROVALS, approval.approval_id, approval)

    def publish_claim(self, operation_id: str, worker: str, expected_version: int) -> str:
        """Ask to own an operation, compare-and-swap on its version.

        Returns:
            The claim ID; the processor's decision is journaled under it.
        """
        require_name("a claim's worker name", worker, operation_id=operation_id)
        claim_id = f"claim:{worker}:{uuid.uuid4().hex[:12]}"
        self._sender.send(
            Topic.CLAIMS,
            operation_id,
            Claim(
                claim_id=claim_id,
                operation_id=operation_id,
                worker=worker,
                expected_version=expected_version,
            ),
        )
        return claim_id

    def publish_policy(self, version: int, set_by: str, effective_at_ms: int) -> None:
        """Publish the policy version now in force, keyed by the change itself.

        The stages order changes by ``effective_at_ms`` (ledger milliseconds),
        not by offset (:func:`ledger.authority.supersedes`): it must be later
        than the change in force, or the change is refused as a replay
        (``ledger policy set`` sees to it).

        Raises:
            LedgerError: a version below 1, a blank ``set_by``, or the broker
                did not accept it.
        """
        require_policy_version(version)
        require_name("set_by", set_by)
        change = PolicyChange(version=version, set_by=set_by, effective_at_ms=effective_at_ms)
        self._sender.send(Topic.POLICY, policy_key(change), change)

    def publish_disposition(self, disposition: Disposition) -> None:
        """Publish an attributable disposition of an unknown outcome (key: operation ID).

        Raises:
            LedgerError: a blank disposition ID, ``by`` or evidence, or the
                broker did not accept it.
        """
        op = disposition.operation_id
        require_name("disposition_id", disposition.disposition_id, operation_id=op)
        require_name("a disposition's by (who decides)", disposition.by, operation_id=op)
        require_name("a disposition's evidence", disposition.evidence, operation_id=op)
        self._sender.send(Topic.DISPOSITIONS, disposition.operation_id, disposition)

    def publish_readback(self, readback: Readback) -> None:
        """Publish an observation of an effect (reconcilers; key: operation ID)."""
        self._sender.send(Topic.READBACKS, readback.operation_id, readback)

    def publish_operating_event(self, event: OperatingEvent) -> None:
        """Publish an operating event (e.g. a worker's refused stale dispatch)."""
        self._sender.send(Topic.OPERATING_EVENTS, event.operation_id or "", event)

    def wait_for(
        self,
        operation_id: str,
        states: Iterable[RecoveryState | str],
        timeout_s: float = 60.0,
        parameter_digest: str | None = None,
    ) -> OperationState:
        """Wait until the ledger holds ``operation_id`` in one of ``states``.

        The latest state on the processor's ``state`` topic decides: one of
        ``states`` returns, another resting state raises at once, any other
        state is waited through (in full: :meth:`OperationWaiter.wait_for
        <producers.waiter.OperationWaiter.wait_for>`).

        Args:
            operation_id: the operation, e.g. ``refund:1842:v3``.
            states: the states to wait for, e.g. ``{"OUTCOME_VERIFIED"}``.
            timeout_s: how long to wait, in seconds.
            parameter_digest: the digest of the intent waited on; default:
                the digest this publisher last published for the operation
                (none: not checked).

        Returns:
            The operation's :class:`~ledger.events.OperationState`.

        Raises:
            LedgerError: ``states`` is empty or names no recovery state.
            OperationEndedElsewhereError: it rests in another state.
            ParameterDriftError: the operation is bound to another parameter digest.
            WaitTimeoutError: none of ``states`` within ``timeout_s`` (retryable).
            LocalFileError: a key file is unreadable.
        """
        return self._waiter.wait_for(operation_id, states, timeout_s, parameter_digest)

    def close(self) -> None:
        """Flush outstanding records."""
        self._sender.producer.flush(10)


#: The former name of :class:`LedgerPublisher`, kept for services that import it.
IntentPublisher = LedgerPublisher
