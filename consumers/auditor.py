"""The auditor: replays the whole ledger and proves its invariants.

Reads ``ledger.journal`` and every other audited topic from the beginning
(``read_committed``, no consumer group), checks every record's seal
(:mod:`ledger.authn`), asks every sink that offers readback how many effects
it holds per operation, and runs the pure checks of :mod:`ledger.audit`.
Reading the journal (never compacted) and the latest authentic value per key
of the compacted topics gives the same answer before and after log
compaction. A record that does not decode, or that no trusted writer
produced, is reported with its position; the audit goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from consumers.chain_audit import KEPT_FOREVER, ChainCollector, check_chains, deleted_ranges
from consumers.stage import key_text, read_partition
from consumers.stranding import find_stranded
from ledger.audit import AuditReport, OpenItem, Provenance, audit, open_items, stranded_items
from ledger.authn import Keyring, unverifiable
from ledger.credentials import load_keyring
from ledger.errors import LocalFileError, SinkConfigError, SinkError
from ledger.events import (
    Approval,
    ApprovalUse,
    Dispatch,
    Event,
    JournalEntry,
    OperatingEvent,
    OperationState,
    RecoveryReceipt,
    decode_event,
)
from ledger.settings import LedgerSettings
from ledger.signing import load_trusted, verify
from ledger.topology import MISPLACED, TOPICS, Topic, is_reserved_key
from sinks.limits import Deadline
from sinks.port import open_sink
from sinks.registry import load_sinks

log = logging.getLogger(__name__)

#: Topics whose every record is decoded (the journal is replayed; the others
#: name their writer, which the seal must match).
DECODE_ALL = frozenset(
    {
        Topic.JOURNAL,
        Topic.HEADS,
        Topic.APPROVALS,
        Topic.POLICY,
        Topic.DISPOSITIONS,
        Topic.OPERATING_EVENTS,
    }
)

#: Compacted topics of which the audit reads the latest authentic value per key.
LATEST = frozenset(
    {Topic.STATE, Topic.DISPATCHES, Topic.RECOVERY_RECEIPTS, Topic.APPROVAL_USES, Topic.APPROVALS}
)

#: An event class the audit reads the latest values of.
_E = TypeVar("_E", bound=Event)


@dataclass
class TopicScan:
    """One topic read through: its authentic records and what was refused.

    Attributes:
        topic: short topic name.
        records: every authentic, decodable event (``DECODE_ALL`` topics),
            in offset order per partition.
        latest: key -> latest authentic event (``LATEST`` topics; an
            authentic tombstone removes the key, a forged one does not).
        unauthenticated: position -> reason.
        undecodable: position -> reason.
        count: records read.
        ends: partition -> end offset read to.
        written_ms: key -> Kafka timestamp (wall clock, ms) of its latest
            authentic record (``LATEST`` topics).
        displaced: key -> (position, reason) of its latest record when that
            one is not authentic, or its latest authentic value does not
            decode (``LATEST`` topics): it displaces the key's authentic
            value, which compaction then removes.
        replayed: position -> reason of every authentic state record older
            (lower version) than one of its operation read before it: a copy
            of an earlier state appended again. It is not the operation's
            state (the processor's restore keeps the highest version too).
    """

    topic: str
    records: list[Event] = field(default_factory=list)
    latest: dict[str, Event] = field(default_factory=dict)
    unauthenticated: dict[tuple[str, int, int], str] = field(default_factory=dict)
    #: the refused records whose seal names a key the auditor does not hold: position -> reason.
    unverifiable: dict[tuple[str, int, int], str] = field(default_factory=dict)
    #: their keys, by position.
    unverifiable_keys: dict[tuple[str, int, int], str] = field(default_factory=dict)
    undecodable: dict[tuple[str, int, int], str] = field(default_factory=dict)
    count: int = 0
    ends: dict[int, int] = field(default_factory=dict)
    written_ms: dict[str, int] = field(default_factory=dict)
    displaced: dict[str, tuple[tuple[str, int, int], str]] = field(default_factory=dict)
    replayed: dict[tuple[str, int, int], str] = field(default_factory=dict)
    #: authentic records on a partition their key does not name: position -> (key, reason).
    misplaced: dict[tuple[str, int, int], tuple[str, str]] = field(default_factory=dict)


def scan_topic(
    settings: LedgerSettings,
    keyring: Keyring,
    topic: str,
    timeout_s: float = 120.0,
    every: Callable[[Message, Event | None, bool], None] | None = None,
) -> TopicScan:
    """Read one topic from the beginning, checking every record's seal.

    ``every``, when given, is handed each record read (authentic or not)
    with its decoded value (``None`` when it has none or it does not
    decode) and whether its seal verified (``False`` for one that does not
    decode), e.g. the journal's chain collector.

    Raises:
        LedgerError: the topic could not be read to its end in ``timeout_s``.
    """
    scan = TopicScan(topic)
    latest_msgs: dict[str, Message] = {}
    #: state topic: operation -> highest version read so far.
    versions: dict[str, int] = {}

    def handle(_: object, msg: Message) -> None:
        key = msg.key() or b""
        if is_reserved_key(key):
            return
        scan.count += 1
        where = (topic, msg.partition() or 0, msg.offset() or 0)
        value = msg.value()
        event: Event | None = None
        if value is not None and topic in DECODE_ALL:
            try:
                event = decode_event(value)
            except Exception as exc:  # reported with its position, never fatal
                scan.undecodable[where] = f"{type(exc).__name__}: {exc}"
                if every is not None:
                    every(msg, None, False)
                return
        problem = keyring.check(
            topic, key, value, msg.headers(), event, msg.partition(), msg.timestamp()
        )
        if every is not None:
            every(msg, event, problem is None)
        if problem is not None:
            scan.unauthenticated[where] = problem
            if problem.startswith(MISPLACED) and (
                keyring.check(topic, key, value, msg.headers(), event, None, msg.timestamp())
                is None
            ):  # authentic, but for its place
                scan.misplaced[where] = (key_text(msg), problem)
            if unverifiable(problem):
                scan.unverifiable[where] = problem
                scan.unverifiable_keys[where] = key_text(msg)
            if topic in LATEST and not problem.startswith(MISPLACED):  # a copy elsewhere
                scan.displaced[key_text(msg)] = (where, f"not authentic: {problem}")
            return
        if event is not None:
            scan.records.append(event)
        if topic in LATEST:
            text = key_text(msg)
            if (
                topic == Topic.STATE
                and value is not None
                and _older_state(scan, versions, text, msg)
            ):
                return
            scan.displaced.pop(text, None)
            if value is None:
                latest_msgs.pop(text, None)
            else:
                latest_msgs[text] = msg

    read_partition(settings, topic, None, handle, timeout_s, decode=False, ends_out=scan.ends)
    for text, msg in latest_msgs.items():
        kind, ts = msg.timestamp()
        if kind != TIMESTAMP_NOT_AVAILABLE:
            scan.written_ms[text] = int(ts)
        try:
            scan.latest[text] = decode_event(msg.value())
        except Exception as exc:
            where = (topic, msg.partition() or 0, msg.offset() or 0)
            scan.undecodable[where] = f"{type(exc).__name__}: {exc}"
            scan.displaced[text] = (where, f"does not decode: {type(exc).__name__}: {exc}")
    return scan


def _older_state(scan: TopicScan, versions: dict[str, int], key: str, msg: Message) -> bool:
    """Whether an authentic state record is older than one of its key read before it.

    The highest version of an operation's state is its state, wherever a
    copy of an earlier one was appended (as the processor restores it); an
    older record is listed in ``scan.replayed``. A value that does not decode
    is left to the caller (its latest value is decoded and reported there).

    Args:
        scan: the state topic's scan so far.
        versions: operation -> highest state version read so far (updated).
        key: the record's key (operation ID).
        msg: the record.

    Returns:
        True when the record is older and was listed (the caller skips it).
    """
    try:
        state = decode_event(msg.value())
    except Exception:
        return False
    if not isinstance(state, OperationState):
        return False
    held = versions.get(key)
    if held is not None and state.version < held:
        where = (Topic.STATE, msg.partition() or 0, msg.offset() or 0)
        scan.replayed[where] = (
            f"state of {key} at version {state.version} ({state.state}) is older than "
            f"version {held} read before it: a copy of an earlier state; not its state"
        )
        return True
    versions[key] = state.version
    return False


def run_audit(
    settings: LedgerSettings,
    *,
    read_sinks: bool = True,
    witness: Sequence[Path] | None = None,
) -> AuditReport:
    """Audit one ledger.

    Args:
        settings: the ledger's settings.
        read_sinks: also read back effect counts from sinks with readback.
        witness: the witness files of the journal's heads to check the
            chains against (default: ``LEDGER_WITNESS_FILE`` when it exists).

    Returns:
        The report (``violations`` empty when every invariant holds;
        ``unauthenticated_records`` lists every record no trusted writer
        produced); it says when it started (wall clock) and how long it took,
        the end offset it read to on every partition, whether sinks were
        read back, and the open items (ages on the wall clock: from the
        Kafka timestamp of each operation's latest state record to the
        audit's start), stranded operations among them
        (:mod:`consumers.stranding`; the report is not clean while any is).

    Raises:
        LedgerError: a topic could not be read to its end.
        LocalFileError: a key file or the witness file is unreadable.
    """
    started_ms = int(time.time() * 1000)
    if witness is None:
        witness = [settings.witness_path()] if settings.witness_path().exists() else []
    chain = ChainCollector()
    started = time.monotonic()
    keyring = load_keyring(settings, missing_ok=True)  # reads, creates nothing
    topics = [t.name for t in TOPICS if t.audited and t.auth]
    # Topics are read at once (each reader waits on the broker in librdkafka,
    # outside the GIL).
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="audit-read") as pool:
        futures = {
            t: pool.submit(
                scan_topic, settings, keyring, t, every=chain if t == Topic.JOURNAL else None
            )
            for t in topics
        }
        scans = {t: f.result() for t, f in futures.items()}
    journal = [e for e in scans[Topic.JOURNAL].records if isinstance(e, JournalEntry)]

    def latest(topic: str, kind: type[_E]) -> dict[str, _E]:
        return {k: e for k, e in scans[topic].latest.items() if isinstance(e, kind)}

    states = latest(Topic.STATE, OperationState)
    dispatches = latest(Topic.DISPATCHES, Dispatch)
    receipts = latest(Topic.RECOVERY_RECEIPTS, RecoveryReceipt)
    provenance = _provenance(settings, scans)
    sink_effects, sink_unread = _sink_effects(settings, states) if read_sinks else (None, [])
    report = audit(
        journal,
        states,
        dispatches,
        receipts,
        sink_effects,
        provenance=provenance,
        amount_fields=_amount_fields(settings),
    )
    _, chain_findings, report.journal_chain = check_chains(
        settings,
        keyring,
        chain,
        scans[Topic.JOURNAL].ends,
        scans[Topic.HEADS].records,
        witness,
        heads_end=scans[Topic.HEADS].ends.get(0, 0),
        now_ms=started_ms,
    )
    report.merge(chain_findings)
    for evidence in deleted_ranges(settings, {t: dict(scan.ends) for t, scan in scans.items()}):
        report.add(KEPT_FOREVER, None, evidence)
    unverified = report.journal_chain.get("unverified")
    report.unverified = [str(w) for w in unverified] if isinstance(unverified, list) else []
    report.started_at_ms = started_ms
    report.sink_unread = sink_unread
    report.took_s = time.monotonic() - started
    report.offsets = {t: dict(scan.ends) for t, scan in scans.items()}
    report.replayed_records = [
        {"topic": t, "partition": p, "offset": o, "reason": reason}
        for (t, p, o), reason in sorted(scans[Topic.STATE].replayed.items())
    ]
    mismatched = {
        e.operation_id: e.reason
        for e in scans[Topic.OPERATING_EVENTS].records
        if isinstance(e, OperatingEvent)
        and e.kind == "POSTCONDITION_MISMATCH"
        and e.operation_id is not None
    }
    report.open_items = open_items(
        states,
        scans[Topic.STATE].written_ms,
        started_ms,
        mismatched,
    )
    witness_lines = cast(
        "list[dict[str, Any]]", report.journal_chain.get("unverifiable_witness_lines", [])
    )
    report.unverifiable_records = [
        r for r in report.unauthenticated_records if unverifiable(str(r.get("reason")))
    ] + list(witness_lines)
    report.open_items += _unverifiable_items(scans, states, report.open_items)
    report.stranded = find_stranded(
        settings,
        states,
        scans[Topic.STATE].written_ms,
        started_ms,
        mismatched=set(mismatched),
        unknown=report.unverified,
    )
    report.open_items += stranded_items(report.stranded, report.open_items)
    return report


#: Topics keyed by approval ID: what is unverifiable there covers the
#: operations that name the approval.
_APPROVAL_KEYED = (Topic.APPROVALS, Topic.APPROVAL_USES, Topic.ADMISSION_REQUESTS)


def _unverifiable_items(
    scans: dict[str, TopicScan], states: dict[str, OperationState], already: list[OpenItem]
) -> list[OpenItem]:
    """Open items for the operations that records sealed by unknown keys cover.

    An operation-keyed record covers its operation; a record keyed by an
    approval ID covers every operation whose state names that approval; a
    policy record covers the whole ledger (one item, ``(policy)``). Such a
    record may be authentic evidence the auditor cannot check, so the
    decisions resting on it, or blocked by it, are not taken as sound.

    Returns:
        One item per covered operation (state ``UNVERIFIABLE``, the record
        and why in ``reason``), for operations not already open, by ID.
    """
    by_approval: dict[str, list[str]] = {}
    for op, st in states.items():
        if st.approval_id is not None:
            by_approval.setdefault(st.approval_id, []).append(op)
    covered: dict[str, str] = {}
    for topic, scan in scans.items():
        for (t, partition, offset), problem in sorted(scan.unverifiable.items()):
            key = scan.unverifiable_keys[(t, partition, offset)]
            what = f"{t}:{partition}:{offset} {problem}"
            if topic == Topic.POLICY:
                covered.setdefault("(policy)", what)
            elif topic in _APPROVAL_KEYED:
                for op in by_approval.get(key, []):
                    covered.setdefault(op, what)
            else:
                covered.setdefault(key, what)
    listed = {i.operation_id for i in already}
    items: list[OpenItem] = []
    for op, what in sorted(covered.items()):
        if op in listed:
            continue
        found = states.get(op)
        items.append(
            OpenItem(
                op,
                "UNVERIFIABLE",
                found.sink if found is not None else "",
                f"evidence cannot be verified with the keys here ({what}); restore the keys "
                "folder the ledger's records were sealed with and audit again",
                None,
                None,
            )
        )
    return items


def _provenance(settings: LedgerSettings, scans: dict[str, TopicScan]) -> Provenance:
    """Gather who wrote what: refused records, signed uses and grants."""
    unauthenticated: dict[tuple[str, int, int], str] = {}
    undecodable: dict[tuple[str, int, int], str] = {}
    misplaced: dict[tuple[str, int, int], tuple[str, str]] = {}
    for scan in scans.values():
        unauthenticated.update(scan.unauthenticated)
        undecodable.update(scan.undecodable)
        misplaced.update(scan.misplaced)
    # A record a stage refused as a dead letter (an authentic BAD_INPUT or
    # UNAUTHENTICATED operating event names its position) was handled: it is
    # listed, not a violation. Garbage nobody refused is corrupted evidence.
    refused = {
        (e.source_topic, e.source_partition, e.source_offset)
        for e in scans[Topic.OPERATING_EVENTS].records
        if isinstance(e, OperatingEvent)
        and e.kind in ("BAD_INPUT", "UNAUTHENTICATED")
        and e.source_topic is not None
        and e.source_partition is not None
        and e.source_offset is not None
    }
    dead_lettered = {w: r for w, r in undecodable.items() if w in refused}
    uses = {
        k: e
        for k, e in scans[Topic.APPROVAL_USES].latest.items()
        if isinstance(e, ApprovalUse) and e.approval_id == k
    }
    trusted = load_trusted(settings.trusted_keys_path())
    check: Callable[[Approval], str | None] = (
        (lambda a: verify(a, trusted, settings.ledger_identity))
        if settings.require_signed_approvals
        else (lambda a: None)
    )
    grants = {
        k: check(e)
        for k, e in scans[Topic.APPROVALS].latest.items()
        if isinstance(e, Approval) and e.approval_id == k
    }
    if unauthenticated:
        log.warning("auditor: %d unauthenticated records on the ledger", len(unauthenticated))
    return Provenance(
        unauthenticated=unauthenticated,
        undecodable={w: r for w, r in undecodable.items() if w not in dead_lettered},
        dead_lettered=dead_lettered,
        uses=uses,
        grants=grants,
        records=sum(s.count for s in scans.values()),
        displaced_states=dict(scans[Topic.STATE].displaced),
        misplaced=misplaced,
    )


def _amount_fields(settings: LedgerSettings) -> dict[str, str | None]:
    """Sink -> the parameter holding its amount, from the sink registry.

    An unreadable registry is logged and read as empty: every sink's amount
    is then read from ``amount_minor`` (the ``compensation-bounds`` check
    still runs).
    """
    try:
        sinks = load_sinks(settings.sinks_path())
    except LocalFileError as exc:
        log.warning("auditor: %s; compensation amounts are read from amount_minor", exc)
        return {}
    return {name: endpoint.contract.amount_field for name, endpoint in sinks.items()}


#: Deadlines of one sink's calls an audit spends on that sink in all: past them,
#: the sink's remaining operations are left unread (and said so).
AUDIT_SINK_CALLS = 10


def _sink_effects(
    settings: LedgerSettings, states: Mapping[str, Event]
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Effects each readback-capable sink holds per operation, and what could not be read.

    Every sink is read in a lane of its own (at once), each call within the
    sink's deadline and size cap (``LEDGER_SINK_TIMEOUT_S``,
    ``LEDGER_SINK_MAX_RESPONSE_BYTES``), and each sink for at most
    :data:`AUDIT_SINK_CALLS` deadlines in all. A sink that gives no answer
    within a deadline is asked nothing more. So the audit ends within about
    ``AUDIT_SINK_CALLS * sink_timeout_s`` whatever the sinks do.

    Returns:
        ``(operation -> effects held, unread)``: ``unread`` is ``[{"sink":
        str, "operations": int, "reason": str}]``, one per sink whose
        operations were not all read back.
    """
    sinks = load_sinks(settings.sinks_path())
    by_sink: dict[str, list[str]] = {}
    for op, state in sorted(states.items()):
        assert isinstance(state, OperationState)
        endpoint = sinks.get(state.sink)
        if endpoint is not None and endpoint.contract.readback:
            by_sink.setdefault(state.sink, []).append(op)
    if not by_sink:
        return {}, []
    with ThreadPoolExecutor(
        max_workers=min(len(by_sink), 16), thread_name_prefix="audit-sink"
    ) as pool:
        futures = {
            sink: pool.submit(_read_sink, settings, sinks[sink], sink, ops)
            for sink, ops in by_sink.items()
        }
        answers = {sink: f.result() for sink, f in futures.items()}
    effects: dict[str, int] = {}
    unread: list[dict[str, Any]] = []
    for _, (held, note) in sorted(answers.items()):
        effects.update(held)
        if note is not None:
            unread.append(note)
    return effects, unread


def _read_sink(
    settings: LedgerSettings, endpoint: Any, sink: str, ops: list[str]
) -> tuple[dict[str, int], dict[str, Any] | None]:
    """Read ``ops`` back at one sink, within its budget (see :func:`_sink_effects`)."""
    deadline_s = endpoint.deadline_s(settings.sink_timeout_s)
    budget = Deadline.start(AUDIT_SINK_CALLS * deadline_s)
    held: dict[str, int] = {}
    left = 0
    reason = ""
    try:
        client = open_sink(
            endpoint,
            timeout_s=deadline_s,
            name=sink,
            max_response_bytes=settings.sink_max_response_bytes,
        )
    except SinkConfigError as exc:
        return held, {"sink": sink, "operations": len(ops), "reason": exc.message}
    with closing(client):
        for i, op in enumerate(ops):
            if budget.passed():
                left, reason = (
                    len(ops) - i,
                    f"its {budget.budget_s:g} s budget of the audit ran out",
                )
                break
            try:
                result = client.readback(op, None)
            except SinkError as exc:
                left, reason = len(ops) - i, f"{type(exc).__name__}: {exc}"
                break
            if result.status == "committed":
                held[op] = result.effects
            elif result.status == "ambiguous":
                log.warning("auditor: %s readback of %s gave no answer", sink, op)
                if result.http_status is None:
                    left, reason = len(ops) - i, f"no answer ({result.detail})"
                    break
    if not left:
        return held, None
    log.warning("auditor: %d operations not read back at %s: %s", left, sink, reason)
    return held, {"sink": sink, "operations": left, "reason": reason[:500]}
