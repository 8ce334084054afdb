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
from collections.abc import Callable, Container, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, overload

from confluent_kafka import KafkaError, Message, Producer
from opentelemetry.trace import Span, SpanKind, TracerProvider

from ledger.authn import seal_headers
from ledger.authority import policy_key
from ledger.credentials import Credentials, load_keyring
from ledger.errors import (
    DeliveryUnknownError,
    InputBoundsError,
    InvalidInputError,
    OperationExistsError,
    PublishError,
)
from ledger.events import (
    Approval,
    Claim,
    Disposition,
    Event,
    Intent,
    OperatingEvent,
    OperationState,
    PolicyChange,
    Readback,
)
from ledger.identity import (
    MAX_INPUT_BYTES,
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
from ledger.tracing import tracer, with_trace
from producers.waiting import wait_for_state


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
        self._tracer = tracer(tracer_provider)
        self.send_timeout_s = send_timeout_s
        #: the keys records are sealed with (:class:`ledger.credentials.Credentials`):
        #: intents are not sealed; a policy change, disposition or approval is
        #: signed by the person it names; claims, readbacks and operating
        #: events by the key of a stage role that writes the topic (ledger.rolekeys).
        self.credentials = credentials or Credentials(settings)
        #: (short topic, partition, offset) of the last record published.
        self.last_position: tuple[str, int, int] | None = None
        #: records published with ``wait=False`` not yet acknowledged, and the
        #: broker's refusals among them (reported by :meth:`flush`).
        self._pending = 0
        self._failed: list[str] = []
        #: operation ID -> the parameter digest this publisher last published
        #: for it (what :meth:`wait_for` checks the state against).
        self._published: dict[str, str] = {}
        self.producer = Producer(
            producer_config(settings, **{"client.id": client_id, "linger.ms": 1})
        )

    def _span(self, topic: str, key: str, event: Event) -> AbstractContextManager[Span]:
        """The ``publish <kind>`` producer span of one record."""
        attributes: dict[str, str] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "publish",
            "messaging.destination.name": topic,
            "messaging.kafka.message.key": key,
        }
        operation_id = getattr(event, "operation_id", None)
        if operation_id:
            attributes["ledger.operation_id"] = operation_id
        return self._tracer.start_as_current_span(
            f"publish {event.KIND}", kind=SpanKind.PRODUCER, attributes=attributes
        )

    def _send(self, topic: str, key: str, event: Event, timeout_s: float | None = None) -> Message:
        with self._span(topic, key, event) as span:
            msg = self._send_traced(topic, key, event, timeout_s)
            span.set_attribute("messaging.destination.partition.id", str(msg.partition() or 0))
            span.set_attribute("messaging.kafka.offset", msg.offset() or 0)
            return msg

    def _send_later(self, topic: str, key: str, event: Event) -> None:
        """Produce one record without waiting; :meth:`flush` reports its delivery."""
        with self._span(topic, key, event):
            self._produce(topic, key, event, self._note_delivery)
        self._pending += 1
        self.producer.poll(0)  # serve the callbacks of records already delivered

    def _note_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self._pending -= 1
        if err is not None:
            self._failed.append(f"{msg.topic()}: {err}")
            return
        topic = (msg.topic() or "").removeprefix(self.settings.topic_prefix + ".")
        self.last_position = (topic, msg.partition() or 0, msg.offset() or 0)

    def _produce(
        self,
        topic: str,
        key: str,
        event: Event,
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        """Produce one record (its seal and the current span's traceparent in its headers)."""
        value = event.to_bytes()  # validates against the schema first
        if len(value) > MAX_INPUT_BYTES:
            raise InputBoundsError(
                f"the {event.KIND} is {len(value)} bytes encoded; the ledger accepts at most "
                f"{MAX_INPUT_BYTES} (keep large documents elsewhere and pass a reference)",
                expected=f"at most {MAX_INPUT_BYTES} bytes",
                observed=len(value),
            )
        raw_key = key.encode("utf-8")
        sealer = self.credentials.sealer_for(topic, event)
        headers = with_trace(seal_headers(sealer, topic, raw_key, value))
        while True:
            try:
                self.producer.produce(
                    self.settings.topic(topic),
                    key=raw_key,
                    value=value,
                    headers=headers,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:  # the local queue is full: deliver some first
                self.producer.poll(0.1)

    def _send_traced(
        self, topic: str, key: str, event: Event, timeout_s: float | None = None
    ) -> Message:
        """Produce one record and wait for the broker's acknowledgement."""
        delivered: list[tuple[KafkaError | None, Message]] = []
        self._produce(topic, key, event, lambda err, msg: delivered.append((err, msg)))
        timeout_s = self.send_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not delivered:
            if time.monotonic() > deadline:
                raise DeliveryUnknownError(
                    f"{event.KIND} {key!r} was not acknowledged by {self.settings.topic(topic)} "
                    f"within {timeout_s:g} s: it may still be delivered (this client keeps "
                    "trying), so it has not failed; publish the same operation again to find "
                    "out, which is always safe. Is the broker running (ledger broker status)?",
                    observed=key,
                )
            self.producer.poll(0.1)
        err, msg = delivered[0]
        if err is not None:
            raise PublishError(f"publishing to {self.settings.topic(topic)} failed: {err}")
        self.last_position = (topic, msg.partition() or 0, msg.offset() or 0)
        return msg

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
        timeout_s = self.send_timeout_s if timeout_s is None else timeout_s
        self.producer.flush(timeout_s)
        failed, self._failed = self._failed, []
        if failed:
            raise PublishError(
                f"{len(failed)} record(s) were not accepted by the broker: "
                + "; ".join(failed[:3]),
                observed=len(failed),
            )
        if self._pending:
            raise DeliveryUnknownError(
                f"{self._pending} record(s) not acknowledged after {timeout_s:g} s: they may "
                "still be delivered (this client keeps trying), so they have not failed; "
                "publish the same operations again to find out, which is always safe. Is the "
                "broker running (ledger broker status)?",
                observed=self._pending,
            )

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
            self._send_later(Topic.INTENTS, intent.operation_id, intent)
            return None
        msg = self._send(Topic.INTENTS, intent.operation_id, intent)
        self._published[intent.operation_id] = intent.parameter_digest
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
            self._send_later(Topic.APPROVALS, approval.approval_id, approval)
            return
        self._send(Topic.APPROVALS, approval.approval_id, approval)

    def publish_claim(self, operation_id: str, worker: str, expected_version: int) -> str:
        """Ask to own an operation, compare-and-swap on its version.

        Returns:
            The claim ID; the processor's decision is journaled under it.
        """
        require_name("a claim's worker name", worker, operation_id=operation_id)
        claim_id = f"claim:{worker}:{uuid.uuid4().hex[:12]}"
        self._send(
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
        self._send(Topic.POLICY, policy_key(change), change)

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
        self._send(Topic.DISPOSITIONS, disposition.operation_id, disposition)

    def publish_readback(self, readback: Readback) -> None:
        """Publish an observation of an effect (reconcilers; key: operation ID)."""
        self._send(Topic.READBACKS, readback.operation_id, readback)

    def publish_operating_event(self, event: OperatingEvent) -> None:
        """Publish an operating event (e.g. a worker's refused stale dispatch)."""
        self._send(Topic.OPERATING_EVENTS, event.operation_id or "", event)

    def wait_for(
        self,
        operation_id: str,
        states: Iterable[RecoveryState | str],
        timeout_s: float = 60.0,
        parameter_digest: str | None = None,
    ) -> OperationState:
        """Wait until the ledger holds ``operation_id`` in one of ``states``.

        Reads the processor's ``state`` topic (only records sealed by a
        stage) and decides on the latest state once it has read to the end:
        one of ``states`` returns, a resting state that is not one of them
        (:data:`ledger.states.RESTING`: OUTCOME_VERIFIED, ABANDONED,
        NEEDS_REAUTHORISATION, UNKNOWN_OUTCOME) raises at once, any other
        state is waited through. The latest state is what counts: an
        operation published again after NEEDS_REAUTHORISATION is still seen
        there until the processor has decided on the new intent, so wait for
        that decision first (``ledger intent publish`` does).

        Args:
            operation_id: the operation, e.g. ``refund:1842:v3``.
            states: the states to wait for, e.g. ``{"OUTCOME_VERIFIED"}``.
            timeout_s: how long to wait, in seconds.
            parameter_digest: the digest of the intent waited on; default:
                the digest this publisher last published for the operation
                (none: not checked). A state bound to another digest means
                the intent was refused as parameter drift, so its state is
                not an answer.

        Returns:
            The operation's :class:`~ledger.events.OperationState` (its
            ``state`` one of ``states``; ``reason`` says why it moved there).

        Raises:
            LedgerError: ``states`` is empty or names no recovery state.
            OperationEndedElsewhereError: it rests in another state
                (``observed`` names it).
            ParameterDriftError: the operation is bound to another parameter
                digest (``expected`` is the intent's, ``observed`` the state's).
            WaitTimeoutError: none of ``states`` within ``timeout_s``
                (retryable; ``observed`` is the state last seen, or ``None``).
            LocalFileError: a key file is unreadable.
        """
        try:
            wanted = frozenset(RecoveryState(s) for s in states)
        except ValueError as exc:
            raise InvalidInputError(f"wait_for: {exc}", operation_id=operation_id) from exc
        if not wanted:
            raise InvalidInputError("wait_for: name at least one state", operation_id=operation_id)
        keyring = (
            load_keyring(self.settings) if self.settings.require_authenticated_records else None
        )
        digest = parameter_digest or self._published.get(operation_id)
        return wait_for_state(self.settings, operation_id, wanted, timeout_s, keyring, digest)

    def close(self) -> None:
        """Flush outstanding records."""
        self.producer.flush(10)


#: The former name of :class:`LedgerPublisher`, kept for services that import it.
IntentPublisher = LedgerPublisher
