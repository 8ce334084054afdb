"""The processor's restore: its operations' states read back from ``ledger.state``.

On partition assignment the processor restores the state of every
operation on the assigned partitions from ``ledger.state`` (the changelog
pattern). Each operation gets the state of its highest version among its
authentic records: a state record older than one already read (a genuine
earlier record appended again, at a higher offset) is not restored and is
reported (a ``REPLAYED`` operating event naming both versions), so a copy
cannot take a settled operation back.

When the latest record of a key is refused (its seal is missing or wrong,
or it is authentic but does not decode), it has displaced the operation's
authentic state: after compaction no authentic record of the operation is
left. Such an operation is not forgotten (else a re-published intent would
be taken as new and re-request admission under its consumed approval): its
state is rebuilt from its journal entries (:meth:`StateRestore.rebuild_from_journal`,
the auditor's fold), a ``STATE_REBUILT`` operating event names the
displacing record (``state:partition:offset``), and the rebuilt state is
handed back to be written again with the next input's transaction, so that
it is the latest record again. Only a restore that met such a record reads
the journal (the whole of the partitions those keys are on, decoding only
those keys' entries).

A state record sealed by a key this host does not hold holds its
operation: nothing is decided for it until the processor restarts with the
key (see :attr:`consumers.processor.Processor.held`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Message

from consumers.retry import KafkaRetry
from consumers.stage import Record, dead_letter, key_text, seal_refusal_kind
from ledger.authn import Keyring, unverifiable
from ledger.events import JournalEntry, OperatingEvent, OperationState, decode_event
from ledger.fold import replay_decisions
from ledger.settings import LedgerSettings
from ledger.states import IN_FLIGHT
from ledger.states import RecoveryState as S
from ledger.topology import MISPLACED, Topic, is_reserved_key
from ledger.tracing import trace_headers_of

# The restore's lines are the processor's: operators filter its log by this name.
log = logging.getLogger("consumers.processor")

#: In-flight states a restarted processor claims. EFFECT_COMMITTED is left
#: out: its verification is already in the outbox (the relay performs it
#: after a crash as before), and for a sink without a postcondition query it
#: is where the operation rests (no verification is written for it), so
#: claiming it would re-verify every such operation ever committed at every
#: restart. Only one stranded there (its verification not come back within
#: ``LEDGER_STRANDED_COMMITTED_S``, :mod:`consumers.strandwatch`) is claimed:
#: the claim dispatches its verification again, never the effect.
RESUMABLE = IN_FLIGHT - {S.EFFECT_COMMITTED}

#: Reads partitions of a topic (:func:`consumers.stage.read_partition`'s shape).
PartitionReader = Callable[..., int]
#: Waits for partitions' stable offsets (:func:`consumers.stage.await_settled`'s shape), seconds.
SettleWait = Callable[..., float]
#: Files one restored state: ``(operation, state, encoded, partition, record time ms or None)``.
Keep = Callable[[str, OperationState, bytes, int, int | None], None]


@dataclass
class Restored:
    """What one restore found, for the processor to act on.

    Attributes:
        versions: operation -> (in a resumable state, version), from its latest record.
        awaiting: operations whose latest record waits for an admission decision.
        traces: operation -> trace headers of its restored record (resumable ones only).
        rebuilt: operation -> encoded state rebuilt from the journal, to write again.
    """

    versions: dict[str, tuple[bool, int]] = field(default_factory=dict)
    awaiting: set[str] = field(default_factory=set)
    traces: dict[str, dict[str, str]] = field(default_factory=dict)
    rebuilt: dict[str, bytes] = field(default_factory=dict)


class StateRestore:
    """Restores the processor's operations of some partitions (see the module docstring).

    It shares the processor's tables it fills, given explicitly:

    Args:
        settings: the processor's settings.
        keyring: checks the seals of the journal entries it replays.
        retry: the retry policy of its reads.
        reader: reads partitions of a topic (``read_partition``).
        settle: waits for stable offsets (``await_settled``).
        notes: the processor's operating events still to write (appended to).
        held: the processor's held operations (op -> (partition, why)).
        partition_of: the processor's partition of each operation (read only).
        keep: files one restored state in the processor's tables.
        known: the processor's committed state of an operation, if any.
        unverified: whether a committed effect's verification is overdue
            (:meth:`consumers.strandwatch.StrandWatch.unverified`).
        on_forgery: counts a state record refused as not authentic.
    """

    def __init__(
        self,
        settings: LedgerSettings,
        keyring: Keyring,
        retry: KafkaRetry,
        *,
        reader: PartitionReader,
        settle: SettleWait,
        notes: list[tuple[str, OperatingEvent]],
        held: dict[str, tuple[int, str]],
        partition_of: Mapping[str, int],
        keep: Keep,
        known: Callable[[str], OperationState | bytes | None],
        unverified: Callable[[str], bool],
        on_forgery: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.keyring = keyring
        self.retry = retry
        self.reader = reader
        self.settle = settle
        self._notes = notes
        self._held = held
        self._partition_of = partition_of
        self._keep = keep
        self._known = known
        self._unverified = unverified
        self._on_forgery = on_forgery

    def restore(self, partitions: set[int]) -> Restored:
        """Restore the states of ``partitions`` (rebuilding displaced ones from the journal).

        Every state kept is filed with ``keep``; refused records become
        operating events in ``notes``; records that cannot be verified here
        hold their operations in ``held``.

        Args:
            partitions: the newly assigned partitions.

        Returns:
            What was restored (versions, operations awaiting admission,
            trace headers, states rebuilt to write again).

        Raises:
            LedgerError: ``ledger.state`` or the journal could not be read to
                its end (as :func:`~consumers.stage.read_partition`).
        """
        found = Restored()
        #: op -> (partition, offset, why) of its latest record, while that one was refused.
        displaced: dict[str, tuple[int, int, str]] = {}

        def keep(
            op: str, state: OperationState, raw: bytes, partition: int, at: int | None = None
        ) -> None:
            self._keep(op, state, raw, partition, at)
            # A committed effect whose verification never came is claimed too.
            resumable = S(state.state) in RESUMABLE or self._unverified(op)
            found.versions[op] = (resumable, state.version)
            if (
                state.state == S.NOT_ADMITTED
                and state.approval_id is not None
                and state.tally != "REQUESTED"  # waits for its original's tally, not the kernel
            ):
                found.awaiting.add(op)
            else:
                found.awaiting.discard(op)

        def load(rec: Record | None, msg: Message) -> None:
            if rec is not None and isinstance(rec.event, OperationState):
                held = found.versions.get(rec.key)
                if held is not None and rec.event.version < held[1]:
                    # An authentic state older than one already restored: a
                    # copy of an earlier record appended again. The highest
                    # version stands; the copy is reported, not restored.
                    self._notes.append(_older_state(msg, rec.event, held[1]))
                    return
                keep(rec.key, rec.event, rec.raw, rec.partition, rec.timestamp_ms)
                displaced.pop(rec.key, None)
                self._held.pop(rec.key, None)  # a later authentic state supersedes it
                if found.versions[rec.key][0]:  # kept only for what may be resumed
                    found.traces[rec.key] = trace_headers_of(msg.headers())
                else:
                    found.traces.pop(rec.key, None)
                return
            key = key_text(msg)
            if is_reserved_key(key):
                return
            # Authentic, but not a state: only a holder of the processor's key
            # writes it. It is reported and treated like a refused record.
            what = (
                "a tombstone"
                if msg.value() is None
                else f"a {rec.event.KIND}"
                if rec is not None
                else "a value that does not decode"
            )
            self._notes.append(
                dead_letter(
                    "processor",
                    Topic.STATE,
                    msg,
                    f"not an operation state: {what}",
                    kind="BAD_INPUT",
                )
            )
            displaced[key] = (msg.partition() or 0, msg.offset() or 0, f"it is {what}")

        def refused(msg: Message, problem: str) -> None:
            self._refused_state(msg, problem)
            key = key_text(msg)
            if unverifiable(problem) and not is_reserved_key(key):
                # It may be the operation's newest authentic state, sealed with a
                # key this host lacks: held, never rebuilt over (a rebuilt, older
                # state written again would make that evidence count as absent,
                # and the next restart would hold nothing).
                where = f"state:{msg.partition()}:{msg.offset()}"
                self._held[key] = (msg.partition() or 0, f"{where} {problem}")
                displaced.pop(key, None)
                return
            # A record off its key's partition is no record of the operation:
            # a copy there must not stand for (nor hide) the record that
            # displaced its state on its own partition, whose journal rebuilds it.
            if not is_reserved_key(key) and not problem.startswith(MISPLACED):
                why = f"not authentic: {problem}"
                displaced[key] = (msg.partition() or 0, msg.offset() or 0, why)

        # The stage has waited for stable offsets (Stage._restore); the state
        # partitions may still wait for the same transaction's markers.
        waited = self.settle(self.settings, Topic.STATE, partitions, retry=self.retry)
        if waited > 1.0:
            log.info("processor: waited %.1f s for ledger.state to settle", waited)
        n = self.reader(
            self.settings,
            Topic.STATE,
            partitions,
            load,
            keyring=self.keyring,
            on_refused=refused,
            retry=self.retry,
        )
        log.info("processor restored %d state records for partitions %s", n, sorted(partitions))
        for op, (_, why) in sorted(self._held.items()):
            if self._partition_of.get(op) is None or self._partition_of[op] in partitions:
                log.error("processor: %s held: its state cannot be verified (%s)", op, why)
        if displaced:
            rebuilt = self.rebuild_from_journal(
                {p for p, _, _ in displaced.values()}, set(displaced)
            )
            for op, (partition, offset, why) in sorted(displaced.items()):
                got = rebuilt.get(op)
                if got is None:
                    log.warning(
                        "processor: %s: its latest state record at state:%s:%s was refused "
                        "(%s) and the journal holds no entry for it: nothing to restore",
                        op,
                        partition,
                        offset,
                        why,
                    )
                    continue
                state, entries = got
                raw = state.to_bytes()
                before = self._known(op)
                keep(op, state, raw, partition)
                found.traces.pop(op, None)  # the displacing record's trace is not the operation's
                found.rebuilt[op] = raw
                self._notes.append(
                    (op, _rebuilt_event(op, partition, offset, why, state, entries, before))
                )
                log.error(
                    "processor: %s: latest state record at state:%s:%s refused (%s); state "
                    "rebuilt from %d journal entries: %s v%d",
                    op,
                    partition,
                    offset,
                    why,
                    entries,
                    state.state,
                    state.version,
                )
        return found

    def rebuild_from_journal(
        self, partitions: set[int], operations: set[str]
    ) -> dict[str, tuple[OperationState, int]]:
        """Replay the journal entries of some operations (the auditor's fold).

        Reads ``partitions`` of ``ledger.journal`` from the beginning
        (``read_committed``; every entry of an operation is on the partition
        of its key, as its state is). Only the entries keyed by one of
        ``operations`` are decoded and have their seal checked; an entry
        that is not authentic or does not decode is left out (logged; the
        auditor reports it), exactly as the auditor's replay leaves it out.

        Args:
            partitions: journal partitions to read.
            operations: operation IDs whose state is wanted.

        Returns:
            Operation ID -> (its state after its last entry, the number of
            entries replayed), for the operations the journal holds a state
            for.

        Raises:
            LedgerError: the journal could not be read to its end (as
                :func:`~consumers.stage.read_partition`).
        """
        entries: list[JournalEntry] = []

        def keep(_: Record | None, msg: Message) -> None:
            key = key_text(msg)
            if key not in operations:
                return
            where = f"journal:{msg.partition()}:{msg.offset()}"
            problem = self.keyring.check(
                Topic.JOURNAL,
                msg.key() or b"",
                msg.value(),
                msg.headers(),
                None,
                msg.partition(),
                msg.timestamp(),
            )
            if self.keyring.refuses(problem, self.settings.require_authenticated_records):
                log.error("processor: %s entry for %s not replayed: %s", where, key, problem)
                return
            try:
                event = decode_event(msg.value() or b"")
            except Exception as exc:  # reported, never fatal
                log.error("processor: %s entry for %s does not decode: %s", where, key, exc)
                return
            if isinstance(event, JournalEntry) and event.operation_id == key:
                entries.append(event)

        self.settle(self.settings, Topic.JOURNAL, partitions, retry=self.retry)
        self.reader(self.settings, Topic.JOURNAL, partitions, keep, decode=False, retry=self.retry)

        def unreadable(entry: JournalEntry, exc: Exception) -> None:
            log.error(
                "processor: journal entry %s of %s records an input that does not decode: %s",
                entry.seq,
                entry.operation_id,
                exc,
            )

        states, steps = replay_decisions(entries, on_unreadable=unreadable)
        counts: dict[str, int] = {}
        for entry, *_ in steps:
            counts[entry.operation_id] = counts.get(entry.operation_id, 0) + 1
        return {op: (state, counts.get(op, 0)) for op, state in states.items()}

    def _refused_state(self, msg: Message, problem: str) -> None:
        """A state record that is not authentic is not restored; it is reported.

        The operation keeps the state of its last authentic record, or, when
        the refused record is the latest of its key, the state its journal
        entries give (see :meth:`restore`): a forged "in flight" state
        cannot make a restarted processor resume or dispatch anything, and a
        forged record that displaced a settled state cannot make it forget
        the operation. The operating event is written with the next
        transaction.
        """
        doubt = unverifiable(problem)
        kind = seal_refusal_kind(problem)
        if not doubt:
            self._on_forgery()
        log.error(
            "processor: %s state record at state:%s:%s not restored: %s",
            kind,
            msg.partition(),
            msg.offset(),
            problem,
        )
        verdict = "cannot be verified here (its operation is held)" if doubt else "not authentic"
        self._notes.append(
            dead_letter("processor", Topic.STATE, msg, f"{verdict}: {problem}", kind=kind)
        )


def _rebuilt_event(
    op: str,
    partition: int,
    offset: int,
    why: str,
    state: OperationState,
    entries: int,
    before: OperationState | bytes | None,
) -> OperatingEvent:
    """The ``STATE_REBUILT`` operating event of an operation restored from its journal.

    Args:
        op: the operation.
        partition: partition of the displacing ``ledger.state`` record.
        offset: its offset.
        why: why it was refused (not authentic, does not decode ...).
        state: the state the journal's replay gives.
        entries: journal entries replayed.
        before: the operation's last authentic state record read, if any
            (encoded or decoded).

    Returns:
        The event, its ID derived from the displacing record's position (a
        restore that meets the same record again writes the same ID).
    """
    if isinstance(before, bytes):
        decoded = decode_event(before)
        before = decoded if isinstance(decoded, OperationState) else None
    earlier = (
        "no earlier authentic state record of it is left"
        if before is None
        else f"its last authentic state record says {before.state} v{before.version}"
    )
    return OperatingEvent(
        event_id=f"processor:state:{partition}:{offset}:STATE_REBUILT",
        operation_id=op,
        component="processor",
        kind="STATE_REBUILT",
        reason=(
            f"the latest ledger.state record of {op}, at state:{partition}:{offset}, displaced "
            f"its authentic state ({why}); {earlier}. State rebuilt from its {entries} "
            f"journal entries: {state.state} v{state.version} epoch {state.epoch}"
        ),
        source_topic=Topic.STATE,
        source_partition=partition,
        source_offset=offset,
    )


def _older_state(msg: Message, state: OperationState, held: int) -> tuple[str, OperatingEvent]:
    """The ``REPLAYED`` operating event of a state record older than one restored before it.

    Args:
        msg: the older record as read (kept in the event, within the bounds).
        state: its state.
        held: the version restored before it (higher).

    Returns:
        ``(key, OperatingEvent)``, as :func:`~consumers.stage.dead_letter`.
    """
    return dead_letter(
        "processor",
        Topic.STATE,
        msg,
        f"state record of {state.operation_id} at version {state.version} ({state.state}) "
        f"is older than version {held} read before it on ledger.state: a copy of an earlier "
        f"state appended again; not restored (the operation keeps version {held})",
        kind="REPLAYED",
    )
