"""The ledger's error hierarchy.

Every error a ledger component or the sink client raises on purpose is a
:class:`LedgerError` (the testbed's own errors, e.g. a malformed game-day
scenario or a reference sink that does not start, are in ``testbed.errors``,
under the same root). The message says what went wrong and
how to fix it; the structured fields let callers (CLI, game-day runner,
tests) react without parsing the message. Adapters translate third-party
errors once, at the edge (``raise SinkUnavailableError(...) from exc``).

The hierarchy (``retryable`` classes marked *)::

    LedgerError
    ├── BrokerError
    │   └── BrokerUnavailableError *
    ├── DeliveryUnknownError *
    ├── ScopeNotBoundError
    ├── TopicConfigError
    ├── SchemaError
    │   ├── UnknownSchemaError
    │   ├── SchemaValidationError
    │   └── DecodeError
    ├── ParameterDriftError
    ├── ForbiddenTransitionError
    └── SinkError
        ├── SinkUnavailableError *
        ├── SinkProtocolError
        └── SinkAuthError

``retryable`` never licenses re-executing an effect: a request whose outcome
cannot be observed is ``UNKNOWN_OUTCOME`` (the sink client returns it as the
value ``ambiguous``), not a retryable error.
"""

from __future__ import annotations

from typing import ClassVar, Literal


class LedgerError(Exception):
    """Base class of every deliberate ledger error.

    Args:
        message: what went wrong and the remedy, in one or two sentences.
        operation_id: the operation concerned, if any.
        expected: what the ledger expected (a value, state or config).
        observed: what it found instead.

    Attributes:
        retryable: class attribute: ``True`` when the same call, unchanged,
            may succeed later because the cause is transient (a broker or
            sink that is down, restarting or slow to answer); ``False`` (the
            default) when something must change first -- configuration,
            input, the ledger's contents or the code. Callers that retry
            still bound their retries; the message says what to change.
        message: as given.
        operation_id: as given.
        expected: as given.
        observed: as given.
    """

    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        operation_id: str | None = None,
        expected: object = None,
        observed: object = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.operation_id = operation_id
        self.expected = expected
        self.observed = observed


class BrokerError(LedgerError):
    """The Kafka broker could not be fetched, started, reached, read or stopped.

    Not retryable as such: most causes (a missing tool, a busy port, a failed
    format) need a fix first. :class:`BrokerUnavailableError` is the
    transient case.
    """


class DeliveryUnknownError(LedgerError):
    """A published record was not acknowledged in time: it may still be delivered.

    The client keeps trying until its delivery timeout, and a request already
    sent may have been written by the broker, so the record is neither
    "failed" nor "published". Publishing the same operation again (the same
    operation ID and parameters) is always safe and tells which: the ledger
    records an intent once and answers a repeat with the state it holds.
    """

    retryable: ClassVar[bool] = True


class ScopeNotBoundError(LedgerError):
    """A grant would admit any value of a field nobody chose to leave open.

    ``observed`` lists the fields (:data:`ledger.scope.BINDABLE`) to bind, or
    to name as open on purpose (:func:`producers.review.grant`).
    """


class BrokerUnavailableError(BrokerError):
    """The broker does not answer, or not in time; trying again later can succeed.

    Raised when Kafka does not answer a metadata request, a broker being
    started does not answer within the wait, or a read does not reach its
    end in time (an open transaction may hold the last stable offset).
    """

    retryable: ClassVar[bool] = True


class ConsumerStuckError(LedgerError):
    """Kafka answers a stage's producer while its consumer's calls keep timing out.

    Raised between tries of a stage's wait for Kafka; the stage replaces the
    consumer (``consumers.runtime.loop.StageLoop.await_kafka``), and a new one can
    succeed.
    """

    retryable: ClassVar[bool] = True


class SettingsError(LedgerError):
    """A setting is invalid or unsafe for this process.

    For example, the manual clock in a production stage. The message names the variable and the
    remedy.
    """


class MissingExtraError(SettingsError):
    """A command needs an optional dependency (an extra) that is not installed.

    The message names the ``pip install`` that adds it.
    """


class TopicConfigError(LedgerError):
    """A ledger topic is missing or configured so that the ledger is unsafe.

    Args:
        message: the problem(s) and the remedy.
        topic: full name of the (first) offending topic.
        config: the (first) offending setting, e.g. ``cleanup.policy``, or
            ``partitions``, or ``existence`` for a missing topic.
        expected: the value the ledger needs.
        observed: the value found.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        config: str | None = None,
        expected: object = None,
        observed: object = None,
    ) -> None:
        super().__init__(message, expected=expected, observed=observed)
        self.topic = topic
        self.config = config


class SchemaError(LedgerError):
    """An event does not fit the ledger's Avro schemas (base of the serde errors)."""


class UnknownSchemaError(SchemaError):
    """No schema in ``schemas/`` has the requested name or fingerprint."""


class SchemaValidationError(SchemaError):
    """A record to encode does not match its schema."""


class DecodeError(SchemaError):
    """A record value cannot be decoded (missing, wrong marker, truncated, malformed)."""


class LocalFileError(LedgerError):
    """A local file the ledger reads is unreadable or malformed.

    A local file the ledger reads (sink registry, trusted keys, the manual
    clock) is unreadable or malformed; the message names the file and the remedy.
    """


class ParameterDriftError(LedgerError):
    """An operation ID was reused with a different parameter digest."""


class InputBoundsError(LedgerError):
    """An input is malformed or too large to be carried.

    An operation ID outside the grammar (:func:`ledger.identity.operation_id_problem`) or a record
    over the input bound (:data:`ledger.identity.MAX_INPUT_BYTES`).
    """


class InvalidInputError(LedgerError):
    """A caller's argument is not acceptable.

    Parameters that are not JSON values, an empty name, a version out of range, an integration used
    outside the place it must be called from. The message names the argument and what to pass
    instead.
    """


class OperationExistsError(InvalidInputError):
    """An operation ID that must be new is already in the ledger (a fork's new operation).

    Choose another, e.g. with a new decision version.
    """


class InvalidStateError(LedgerError):
    """The operation's recorded state does not allow what was asked.

    For example, a readback of an operation that has no effect to read back.
    """


class CredentialError(LedgerError):
    """A signing key or a trusted name is missing, already there, or held by another role.

    Or a record cannot be signed by the role asked to sign it. The message names the key file or the
    command that makes the key.
    """


class AccessPlanError(SettingsError):
    """The ACL or quota plan cannot be made from what was given.

    An unknown role, a principal mapping or quota spec out of format, two roles sharing a principal.
    The message gives the expected format with an example.
    """


class PublishError(BrokerError):
    """The broker did not accept a record the publisher sent.

    The message carries the broker's error. Nothing is known to be written.
    """


class ForbiddenTransitionError(LedgerError):
    """A transition outside the closed transition table was attempted.

    Attributes:
        from_state: state the operation is in.
        to_state: state the event asked for.
    """

    def __init__(
        self,
        message: str,
        *,
        operation_id: str | None = None,
        from_state: str | None = None,
        to_state: str | None = None,
    ) -> None:
        super().__init__(message, operation_id=operation_id, expected=from_state, observed=to_state)
        self.from_state = from_state
        self.to_state = to_state


class SinkError(LedgerError):
    """A sink, its store or the sink client failed (base of the sink errors).

    The expected outcomes of a sink call (committed, rejected, stale token,
    unavailable, ambiguous ...) are values that :class:`sinks.client.SinkClient`
    returns, never errors; a ``SinkError`` means the sink cannot be used as
    asked.

    Args:
        message: what went wrong and the remedy.
        sink: the sink's name or base URL, if known.
        operation_id: the operation concerned, if any.
        expected: what was expected of the sink.
        observed: what it did instead.

    Attributes:
        sink: as given.
    """

    def __init__(
        self,
        message: str,
        *,
        sink: str | None = None,
        operation_id: str | None = None,
        expected: object = None,
        observed: object = None,
    ) -> None:
        super().__init__(message, operation_id=operation_id, expected=expected, observed=observed)
        self.sink = sink


class SinkConfigError(SinkError):
    """A sink's entry in the sink registry cannot be used as written.

    An unknown adapter kind, a missing or invalid adapter setting, or a contract that claims more
    than the adapter can do. The message names the sink, the setting and the remedy (``ledger sink
    register`` again, or fix the registry file).
    """


class SinkUnavailableError(SinkError):
    """The sink gave no answer (down, hanging, or slower than the timeout).

    Raised by the client's admin calls (arming faults, counting effects,
    stats); trying again once the sink is up can succeed. Effect calls
    (submit, readback, account) return ``unavailable`` or ``ambiguous``
    instead, because whether the effect happened is evidence, not an error.
    """

    retryable: ClassVar[bool] = True


class SinkNotReachedError(SinkError):
    """A request never reached its sink: asking again is safe.

    The connection was refused or could not be made, or the sink is not in
    the registry: the sink cannot have received the request, so no effect
    was made. The relay raises it inside its handling of one dispatch and
    parks the dispatch for another try (never raised to a caller outside it).

    Args:
        message: what happened (the connection error, or the registry's word).
        kind: the operating event's kind if the relay gives up:
            ``SINK_UNREACHABLE`` or ``UNKNOWN_SINK``.
        request: what could not be sent: ``submit``, ``readback`` or
            ``postcondition``.
        on_resume: for a readback of an execution, whether it was a resume's.
        sink: the sink's name.
        operation_id: the operation concerned.

    Attributes:
        detail: the message.
        kind, request, on_resume: as given.
    """

    retryable: ClassVar[bool] = True

    def __init__(
        self,
        message: str,
        *,
        kind: Literal["SINK_UNREACHABLE", "UNKNOWN_SINK"],
        request: Literal["submit", "readback", "postcondition"],
        on_resume: bool = False,
        sink: str | None = None,
        operation_id: str | None = None,
    ) -> None:
        super().__init__(message, sink=sink, operation_id=operation_id)
        self.detail = message
        self.kind = kind
        self.request = request
        self.on_resume = on_resume


class SinkProtocolError(SinkError):
    """The sink answered something outside the protocol (400, an unknown route).

    Args:
        method: HTTP method of the request.
        path: request path.
        http_status: the status the sink answered.
        body: the answer's body (kept to its first 500 characters).
        sink: the sink's base URL, if known.
        operation_id: the operation concerned, if any.

    Attributes:
        method: as given.
        path: as given.
        http_status: as given (also ``observed``).
        body: the answer's body, truncated to 500 characters.
    """

    def __init__(
        self,
        method: str,
        path: str,
        http_status: int,
        body: str,
        *,
        sink: str | None = None,
        operation_id: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.http_status = http_status
        self.body = body[:500]
        super().__init__(
            f"{method} {path} answered {http_status}: {self.body!r}; check that the URL points "
            "at a reference sink and that the request matches sinks.gateway",
            sink=sink,
            operation_id=operation_id,
            expected="an answer of the sink protocol (sinks.gateway)",
            observed=http_status,
        )


class SinkAuthError(SinkError):
    """A sink refused the caller's credentials (HTTP 401 or 403).

    A configuration problem, not a rejection of the operation: the sink
    refused the request before looking at it, so no effect was made. The
    remedy is the sink's bearer token in the sink registry (``sinks.json``).

    Args:
        method: HTTP method of the request.
        path: request path.
        http_status: 401 (no or wrong token) or 403 (the token may not do this).
        body: the answer's body (kept to its first 300 characters).
        sink: the sink's base URL, if known.
        operation_id: the operation concerned, if any.

    Attributes:
        method: as given.
        path: as given.
        http_status: as given (also ``observed``).
    """

    def __init__(
        self,
        method: str,
        path: str,
        http_status: int,
        body: str,
        *,
        sink: str | None = None,
        operation_id: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.http_status = http_status
        super().__init__(
            f"sink {sink} refused the credentials of {method} {path} (HTTP {http_status}: "
            f"{body[:300]!r}); no effect was made. Set the sink's bearer token in the sink "
            "registry (the 'token' of its entry in sinks.json) to the token the sink was "
            "started with, or register the sink again",
            sink=sink,
            operation_id=operation_id,
            expected="an accepted bearer token",
            observed=http_status,
        )


class WaitError(LedgerError):
    """An operation did not reach the state a caller waits for (``wait_for``).

    Args:
        message: the operation, the states waited for, what it reached, the remedy.
        operation_id: the operation.
        expected: the states waited for (names, sorted).
        observed: the state it was last seen in (``None``: not seen at all).
    """


class OperationEndedElsewhereError(WaitError):
    """The operation came to rest in a state the caller did not wait for.

    Resting states (:data:`ledger.states.RESTING`): OUTCOME_VERIFIED,
    ABANDONED, NEEDS_REAUTHORISATION, UNKNOWN_OUTCOME. ``observed`` names it.
    """


class WaitTimeoutError(WaitError):
    """The operation reached none of the states waited for in time.

    Retryable: waiting again can succeed (is the processor running?).
    """

    retryable: ClassVar[bool] = True
