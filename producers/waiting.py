"""Waiting for an operation to reach a state: what ``LedgerPublisher.wait_for`` does.

The processor writes every operation's state to the compacted ``state``
topic (key: operation ID) in the transaction that decides it. A waiter reads
that topic ``read_committed`` from the beginning, keeps the latest
authentic :class:`~ledger.events.OperationState` of the one operation, and
decides once it has read to the end of every partition: the state is one of
those asked for (return it), or a resting state that is not
(:data:`ledger.states.RESTING`: raise), or neither (read on until the
deadline).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from ledger.authn import Keyring
from ledger.errors import OperationEndedElsewhereError, ParameterDriftError, WaitTimeoutError
from ledger.events import OperationState, decode_event
from ledger.identity import digest_version
from ledger.kafka import make_consumer
from ledger.settings import LedgerSettings
from ledger.states import RESTING, RecoveryState
from ledger.topology import Topic


def parse_states(text: str) -> frozenset[RecoveryState]:
    """States named in ``STATE[,STATE]`` (as ``--until`` takes them), case-insensitive.

    Raises:
        ValueError: a name that is not a recovery state, or none at all; the
            message lists the valid names.
    """
    names = [part.strip().upper() for part in text.split(",") if part.strip()]
    valid = ", ".join(s.value for s in RecoveryState)
    if not names:
        raise ValueError(f"name at least one state: {valid}")
    unknown = [n for n in names if n not in RecoveryState.__members__]
    if unknown:
        raise ValueError(f"not a recovery state: {', '.join(unknown)} (valid: {valid})")
    return frozenset(RecoveryState(n) for n in names)


def verdict(
    state: OperationState | None,
    wanted: frozenset[RecoveryState],
    parameter_digest: str | None = None,
) -> OperationState | None:
    """Decide on the latest state read: reached, ended elsewhere, or not yet.

    Args:
        state: the operation's latest state, or ``None`` when none was read.
        wanted: the states waited for.
        parameter_digest: the digest of the intent the caller published, or
            ``None``; a state bound to another digest (of the same digest
            version) is another request's, and the caller's was refused.

    Returns:
        ``state`` when it is one of ``wanted``; ``None`` to wait on.

    Raises:
        OperationEndedElsewhereError: ``state`` is resting and not wanted.
        ParameterDriftError: ``state`` is bound to another parameter digest.
    """
    if state is None:
        return None
    if (
        parameter_digest is not None
        and digest_version(parameter_digest) == digest_version(state.parameter_digest)
        and parameter_digest != state.parameter_digest
    ):
        raise ParameterDriftError(
            f"operation {state.operation_id} is bound to parameter digest "
            f"{state.parameter_digest[:15]}..., not this intent's {parameter_digest[:15]}...: "
            f"the processor refused the intent (PARAMETER_DRIFT) and its state "
            f"({state.state}) is the earlier request's; use a new operation ID for a "
            "different request",
            operation_id=state.operation_id,
            expected=parameter_digest,
            observed=state.parameter_digest,
        )
    if state.state in wanted:
        return state
    if state.state in RESTING:
        raise OperationEndedElsewhereError(
            f"operation {state.operation_id} ended in {state.state} ({state.reason}), not in "
            f"{' or '.join(sorted(wanted))}; `ledger history {state.operation_id}` says why",
            operation_id=state.operation_id,
            expected=sorted(wanted),
            observed=str(state.state),
        )
    return None


def wait_for_state(
    settings: LedgerSettings,
    operation_id: str,
    states: Iterable[RecoveryState | str],
    timeout_s: float,
    keyring: Keyring | None,
    parameter_digest: str | None = None,
) -> OperationState:
    """Wait until an operation is in one of ``states``; see :meth:`LedgerPublisher.wait_for`.

    Args:
        settings: ledger settings (bootstrap servers, topic prefix).
        operation_id: the operation.
        states: the states to wait for (names or :class:`RecoveryState`).
        timeout_s: how long to wait, in seconds.
        keyring: checks each state record's seal; ``None`` reads them unchecked.
        parameter_digest: the digest of the intent waited on (see :func:`verdict`).

    Returns:
        The operation's state record once its state is one of ``states``.

    Raises:
        OperationEndedElsewhereError: it rests in another state
            (:data:`ledger.states.RESTING`).
        ParameterDriftError: it is bound to another parameter digest.
        WaitTimeoutError: none of ``states`` within ``timeout_s`` (the
            processor is not running, the broker does not answer, or the
            operation is still on its way).
    """
    wanted = frozenset(RecoveryState(s) for s in states)

    def decided(latest: OperationState | None) -> OperationState | None:
        return verdict(latest, wanted, parameter_digest)

    full = settings.topic(Topic.STATE)
    consumer = make_consumer(
        settings,
        f"{settings.topic_prefix}.wait",
        extra={"enable.partition.eof": True, "fetch.wait.max.ms": 50},
    )
    deadline = time.monotonic() + timeout_s
    latest: OperationState | None = None
    try:
        partitions = _partitions(consumer, full, deadline)
        consumer.assign([TopicPartition(full, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        while time.monotonic() < deadline:
            msg = consumer.poll(min(0.2, max(deadline - time.monotonic(), 0.0)))
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
                    if at_end >= partitions and (found := decided(latest)):
                        return found
                continue
            state = _state_of(msg, operation_id, keyring)
            if state is not None:
                latest = state
                if at_end >= partitions and (found := decided(latest)):
                    return found
    finally:
        consumer.close()
    seen = f"it is {latest.state}" if latest is not None else "it is not in the ledger yet"
    raise WaitTimeoutError(
        f"operation {operation_id} reached none of {', '.join(sorted(wanted))} in "
        f"{timeout_s:g} s ({seen}); are the stages running (`ledger status`)?",
        operation_id=operation_id,
        expected=sorted(wanted),
        observed=str(latest.state) if latest is not None else None,
    )


def _partitions(consumer: Consumer, topic: str, deadline: float) -> set[int]:
    """The partitions of ``topic``, asked until the deadline (the broker may be starting)."""
    while True:
        try:
            meta = consumer.list_topics(topic, timeout=max(min(deadline - time.monotonic(), 10), 1))
            found = meta.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                return set(found.partitions)
        except Exception:  # noqa: BLE001 -- KafkaException: asked again until the deadline
            pass
        if time.monotonic() >= deadline:
            return set()
        time.sleep(0.2)


def _state_of(msg: Message, operation_id: str, keyring: Keyring | None) -> OperationState | None:
    """The authentic state record of ``operation_id`` in ``msg``, else ``None``."""
    key = msg.key()
    value = msg.value()
    if key is None or value is None or key.decode("utf-8", "replace") != operation_id:
        return None
    try:
        event = decode_event(value)
    except Exception:  # noqa: BLE001 -- a value that does not decode is not a state
        return None
    if not isinstance(event, OperationState):
        return None
    if keyring is not None and keyring.check(
        Topic.STATE, key, value, msg.headers(), event, timestamp=msg.timestamp()
    ):
        return None
    return event
