"""Reading one operation's history from the ledger's topics.

:func:`read_history` reads, for one operation ID, the partition that holds
it on every operation-keyed topic (they are co-partitioned: the key decides
the partition with the ``murmur2`` hash, :func:`partition_for`), then the
approval-keyed topics (``approvals``, ``approval-uses``,
``admission-requests``) for the approvals the operation names, checks every
record's seal (:mod:`ledger.authn`) and hands them to the pure
:func:`ledger.history.build_history`. ``ledger history`` and the operator
console both call it.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from consumers.reader import read_topic
from consumers.stage import key_text, read_partition
from ledger.authn import Keyring
from ledger.credentials import load_keyring
from ledger.errors import LedgerError
from ledger.events import (
    AdmissionDecision,
    AdmissionRequest,
    Dispatch,
    Event,
    Intent,
    OperationState,
    decode_event,
)
from ledger.fold.compensation import SETTLED
from ledger.history import History, HistoryRecord, build_history
from ledger.settings import LedgerSettings
from ledger.topics import partitions_for
from ledger.topology import TOPIC_BY_NAME, TOPICS, Topic, is_reserved_key, murmur2, partition_for

__all__ = ["UnknownOperationError", "murmur2", "partition_for", "read_history"]

#: Topics keyed by approval ID (read for the approvals the operation names).
APPROVAL_TOPICS = (Topic.APPROVALS, Topic.APPROVAL_USES, Topic.ADMISSION_REQUESTS)

#: Topics keyed by operation ID, read for the operation's partition.
OPERATION_TOPICS = tuple(
    t.name for t in TOPICS if t.key == "operation ID" and not t.single_partition
)


class UnknownOperationError(LedgerError):
    """No record on any ledger topic is about this operation."""


def read_history(
    settings: LedgerSettings, operation_id: str, timeout_s: float = 60.0, *, links: bool = False
) -> History:
    """Every record about one operation, in causal order, with the five answers.

    Args:
        settings: the ledger's settings.
        operation_id: the operation.
        timeout_s: how long each topic's read may take (seconds).
        links: also find the settled compensations of the operation (its
            ``compensated_by``): reads every partition of ``ledger.state``,
            so only ``ledger history`` asks for it, and only for a settled
            operation (the only kind that can be compensated).

    Returns:
        The history (:class:`ledger.history.History`); records that fail
        authentication or do not decode are in it, marked not believed.

    Raises:
        UnknownOperationError: no record on any topic is about the operation.
        LedgerError: a topic could not be read to its end in time.
        LocalFileError: a key file is unreadable.
    """
    keyring = load_keyring(settings, missing_ok=True)  # reads, creates nothing
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="history-read") as pool:
        futures = [
            pool.submit(_read_keys, settings, keyring, t, {operation_id}, timeout_s)
            for t in OPERATION_TOPICS
        ]
        forks = pool.submit(_forks_of, settings, operation_id, timeout_s)
        records = [r for f in futures for r in f.result()]
        if not records:
            raise UnknownOperationError(
                f"no operation {operation_id!r} in the ledger (topic prefix "
                f"{settings.topic_prefix!r}); list operations with `ledger state`",
                operation_id=operation_id,
            )
        approvals = _approvals_named(records)
        if approvals:
            futures = [
                pool.submit(_read_keys, settings, keyring, t, approvals, timeout_s)
                for t in APPROVAL_TOPICS
            ]
            for f in futures:
                records.extend(
                    r
                    for r in f.result()
                    if not isinstance(r.event, AdmissionRequest)
                    or r.event.operation_id == operation_id
                )
    history = build_history(operation_id, records, forks.result())
    final = history.final_state
    if links and final is not None and final.state in SETTLED:
        states = {
            r.key: r.event
            for r in read_topic(settings, Topic.STATE)
            if isinstance(r.event, OperationState)
        }
        linked = [
            op
            for op, st in states.items()
            if st.compensates == operation_id and st.state in SETTLED
        ]
        history = build_history(operation_id, records, forks.result(), linked)
    return history


def _forks_of(settings: LedgerSettings, operation_id: str, timeout_s: float) -> list[str]:
    """Operations whose intents name ``operation_id`` as ``forked_from`` (a scan of intents).

    Forks have their own keys, so every partition of ``ledger.intents`` is
    read; a record that does not decode is skipped (the reader of its own
    key lists it).
    """
    count = partitions_for(settings, TOPIC_BY_NAME[Topic.INTENTS])
    found: list[str] = []

    def keep(_: object, msg: Message) -> None:
        value = msg.value()
        if value is None:
            return
        try:
            event = decode_event(value)
        except Exception:  # listed in the history of its own key, never fatal here
            return
        if isinstance(event, Intent) and event.forked_from == operation_id:
            found.append(event.operation_id)

    read_partition(settings, Topic.INTENTS, set(range(count)), keep, timeout_s, decode=False)
    return found


def _approvals_named(records: Iterable[HistoryRecord]) -> set[str]:
    """Approval IDs the operation's intents, states, decisions and dispatches name."""
    named: set[str] = set()
    for r in records:
        e = r.event
        if isinstance(e, Intent | AdmissionDecision | Dispatch) and e.approval_id:
            named.add(e.approval_id)
        if isinstance(e, OperationState):
            named.update(a for a in (e.approval_id, e.admitted_approval_id) if a)
    return named


def _read_keys(
    settings: LedgerSettings, keyring: Keyring, topic: str, keys: set[str], timeout_s: float
) -> list[HistoryRecord]:
    """The records of ``topic`` whose key is one of ``keys``, seals checked."""
    spec = TOPIC_BY_NAME[topic]
    count = partitions_for(settings, spec)
    partitions = {partition_for(k, count) for k in keys}
    found: list[HistoryRecord] = []

    def keep(_: object, msg: Message) -> None:
        raw_key = msg.key() or b""
        if is_reserved_key(raw_key):
            return
        key = key_text(msg)
        value = msg.value()
        if key not in keys or value is None:  # another key, or a tombstone
            return
        kind, ts = msg.timestamp()
        when = None if kind == TIMESTAMP_NOT_AVAILABLE else int(ts)
        event: Event | None = None
        problem: str | None = None
        try:
            event = decode_event(value)
        except Exception as exc:  # listed as such, never fatal
            problem = f"does not decode: {type(exc).__name__}: {exc}"
        if problem is None:
            refused = keyring.check(
                topic, raw_key, value, msg.headers(), event, msg.partition(), msg.timestamp()
            )
            if refused is not None:
                problem = f"not authentic: {refused}"
        found.append(
            HistoryRecord(topic, msg.partition() or 0, msg.offset() or 0, when, key, event, problem)
        )

    read_partition(settings, topic, partitions, keep, timeout_s, decode=False)
    return found
