"""The processor: the single writer of every operation's recovery state.

Inputs (co-partitioned, ``range``-assigned): intents, admission decisions,
effect receipts, readbacks, claims, dispositions and compensation tallies.
For each input it runs the pure :func:`ledger.fold.decide` and writes, in
one Kafka transaction with its consumer offsets: the new state
(``ledger.state``), the journal entry (``ledger.journal``), and any
dispatch, admission request, tally record, recovery receipt, reconciliation
item, operating event or outcome for the service (``ledger.outcomes``,
signed with the outcome key: :func:`ledger.outcomes.decided_outcome`). Its
in-memory state is restored from ``ledger.state`` on partition assignment
(the changelog pattern).

Before an intent can consume an approval, the processor looks its sink up in
the sink registry (``LEDGER_SINKS_FILE``, re-read when it changes): an intent
for a sink the registry does not name (a typo, a sink not yet registered) is
refused before admission with an ``UNKNOWN_SINK`` operating event, the
approval untouched and the operation ID still free; the observation is
journaled with the decision, so replay decides the same. A processor with no
registry file at all cannot check names and says so once in its log; the
relay then holds such an operation (see :mod:`consumers.relay`).

A sink whose contract offers no postcondition query cannot verify an
effect: the fold's ordinary verification of a committed effect is then not
written to the outbox (:meth:`consumers.input_facts.InputFacts.verification_pointless`), sparing a
round trip to the relay that could only answer ``UNSUPPORTED``. The decision
and its journal entry are the fold's, unchanged (replay decides the same);
the operation rests in EFFECT_COMMITTED as it did after that answer. A
resume's verification is always written: its answer carries the resume's
recovery receipt.

An intent that ``compensates`` another operation is decided with what the
processor observed of the original and of its other compensations
(:meth:`consumers.input_facts.InputFacts.compensation_facts`: ``ledger.state`` with its own open
transaction laid over it), journaled with the decision for replay. One that
passes waits for the original's tally: its claim on the original's effect
is decided by the processor that owns the original, from the
``compensation-tally`` requests it reads on the original's partition (see
:mod:`ledger.fold.tally`; the original's amount it observes is journaled too).

A state record that is refused on restore (its seal is missing or wrong, or
it does not decode) and is the latest record of its key has displaced the
operation's authentic state (after compaction nothing else of it is left on
``ledger.state``). The operation is not forgotten: its state is rebuilt by
replaying its own entries of ``ledger.journal`` (the processor's sealed
output, never compacted) with the fold the auditor uses, a ``STATE_REBUILT``
operating event names the displacing record, and the rebuilt state is
written again with the next input's transaction (see :meth:`Processor.on_assign`).

Every journal entry is linked into its partition's hash chain
(:mod:`consumers.journal_chain`, :mod:`ledger.chain`), and the heads of the
chains are published to ``ledger.heads`` and handed to the witnesses outside
Kafka at a bounded interval (:mod:`consumers.heads`). A re-published
identical intent is journaled by reference to the intent already journaled
(:func:`ledger.fold.repeats`), not copied again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Message

from consumers.heads import FileWitness, HeadsPublisher
from consumers.input_facts import InputFacts
from consumers.journal_chain import JournalChain, read_heads
from consumers.metrics import refusal_kind
from consumers.processor_step import decide_input, journal_of, writes_of
from consumers.runtime.pending import PendingMap, kept
from consumers.stage import Record, Stage, Writer, await_settled, read_partition, record_event
from consumers.state_restore import PartitionReader, SettleWait, StateRestore
from consumers.strandwatch import StrandWatch
from ledger.acl import STAGE_INPUTS
from ledger.events import AdmissionDecision, Claim, OperatingEvent, OperationState, decode_event
from ledger.fold import Decision
from ledger.logs import bound_each
from ledger.outcomes import decided_outcome
from ledger.states import IN_FLIGHT
from ledger.states import RecoveryState as S
from ledger.topology import Topic, is_reserved_key
from ledger.tracing import annotate
from sinks.registry import RegistryFile

log = logging.getLogger(__name__)


class Processor(Stage):
    """Consume-transform-produce stage deciding every recovery transition.

    Args:
        *args: as :class:`~consumers.stage.Stage`.
        reader: reads partitions of a ledger topic (restore, journal heads,
            compensations; :func:`~consumers.stage.read_partition` unless a
            test hands in its own topics).
        settle: waits for stable offsets (:func:`~consumers.stage.await_settled`).
        **kwargs: as :class:`~consumers.stage.Stage`.

    Attributes:
        states: state of every operation on the assigned partitions.
            Committed: an :class:`OperationState` while the operation is in
            flight, its encoded bytes once it rests (and as restored),
            decoded again when an input for it arrives (see :meth:`current`);
            resting operations so cost about their record's size, not a
            model's. Staged: ``(state, encoded)`` decided in the open
            transaction (committed on commit, dropped on abort).
    """

    component = "processor"
    inputs = STAGE_INPUTS["processor"]  # the ACL plan grants what it reads

    def __init__(
        self,
        *args: object,
        reader: PartitionReader = read_partition,
        settle: SettleWait = await_settled,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # Stage's own arguments, passed on
        self.reader = reader
        self.states: PendingMap[str, tuple[OperationState, bytes], OperationState | bytes] = (
            PendingMap(_rests_encoded)
        )
        self.partition_of: dict[str, int] = {}
        self.resume_queue: list[tuple[str, int]] = []
        #: Operations restored waiting for admission (NOT_ADMITTED, an
        #: approval requested) on newly assigned partitions (op -> partition):
        #: the admission decision that arrives for one of them resumes it, and
        #: its journal entry names this processor (``resumed_by``), so the fold
        #: writes a recovery receipt. Dropped once that decision is committed.
        self.admission_resumes: PendingMap[str, int, int] = PendingMap(kept)
        #: op -> trace headers of its restored state record (its resume claim continues them).
        self.resume_traces: dict[str, dict[str, str]] = {}
        #: Partitions this process has owned at some point of its life.
        self.ever_held: set[int] = set()
        #: operating events to write with the next transaction (refused state records).
        self.notes: list[tuple[str, OperatingEvent]] = []
        #: op -> encoded state of states rebuilt from the journal on
        #: restore, written again to ``ledger.state`` with the next input's
        #: transaction (see :meth:`on_assign`); dropped once committed.
        self.reasserts: PendingMap[str, bytes, bytes] = PendingMap(kept)
        #: The sink registry, checked for every intent (re-read when it changes).
        self.registry = RegistryFile(self.settings.sinks_path())
        #: operations in UNKNOWN_OUTCOME on the assigned partitions (committed states).
        self.unknown_open: set[str] = set()
        #: op -> (partition, the state record and why): operations whose
        #: latest state record is sealed by a key this processor does not
        #: hold. Nothing is decided for them (their inputs are reported as
        #: ``UNVERIFIABLE`` and left undecided) until the processor restarts
        #: with the key: reading such a record as absent would take a settled
        #: operation for a new one and act on it again.
        self.held: dict[str, tuple[int, str]] = {}
        self.metrics.unknown_outcomes.labels(self.component).set_function(
            lambda: len(self.unknown_open)
        )
        ledger_id = self.settings.ledger_identity
        #: the journal partitions' hash chains (heads read back on assignment).
        self.journal = JournalChain(
            ledger_id,
            lambda ps: read_heads(
                self.settings,
                ps,
                self.keyring,
                self.retry,
                reader=reader,
                settle=settle,
            ),
        )
        #: publishes the chains' heads to ledger.heads and the witness file.
        self.heads = HeadsPublisher(
            ledger_id,
            self.settings.heads_interval_s,
            f"processor-{self.instance}",
            self.sealer,
            [FileWitness(self.settings.witness_path(), ledger_id)],
        )
        #: stranded operations on the assigned partitions (``ledger_stranded_*`` gauges).
        self.strands = StrandWatch(self.settings, self.registry, lambda: self.held)
        self.metrics.stranded = self.strands.summary
        #: what the fold needs observed beyond a state; the stamps on dispatches.
        self.facts = InputFacts(
            self.registry, self._read_state, self._mine, self.states.staged_keys
        )
        #: restores the assigned partitions' states into the tables above.
        self.restorer = StateRestore(
            self.settings,
            self.keyring,
            self.retry,
            reader=reader,
            settle=settle,
            notes=self.notes,
            held=self.held,
            partition_of=self.partition_of,
            keep=self._keep,
            known=self.states.committed.get,
            unverified=self.strands.unverified,
            on_forgery=self._count_forgery,
        )

    def _read_state(self, load: Callable[[Record | None, Message], None]) -> int:
        """Read every partition of ``ledger.state`` into ``load`` (records read)."""
        return self.reader(
            self.settings, Topic.STATE, None, load, keyring=self.keyring, retry=self.retry
        )

    def _mine(self, op: str) -> OperationState | None:
        """This processor's state of ``op``, open transaction included (``None``: not its own)."""
        return self.current(op) if op in self.states else None

    def on_assign(self, partitions: set[int]) -> None:
        """Restore the state of the assigned partitions from ``ledger.state``.

        See :class:`consumers.state_restore.StateRestore`: the highest
        authentic version of each operation is kept, an older copy is
        reported, a displaced state is rebuilt from the journal (reported as
        ``STATE_REBUILT`` and written again with the next input's
        transaction), and a record sealed by a key not held here holds its
        operation. The in-flight operations of partitions this process never
        held are then queued for a resume claim (:meth:`_resume`).
        """
        found = self.restorer.restore(partitions)
        self.reasserts.committed.update(found.rebuilt)
        # A resume follows a crash or a takeover: partitions this process
        # owned before (a rebalance after a broker restart gives them back)
        # were never interrupted here, so their operations are not claimed.
        new = partitions - self.ever_held
        self.ever_held |= partitions
        self.resume_queue = sorted(
            (op, version)
            for op, (resumable, version) in found.versions.items()
            if resumable and self.partition_of.get(op) in new
        )
        self.resume_traces = {op: found.traces.get(op, {}) for op, _ in self.resume_queue}
        for op in found.awaiting:
            if self.partition_of.get(op) in new:
                self.admission_resumes.committed[op] = self.partition_of[op]
        self.journal.restore(partitions)
        if self.resume_queue:
            log.info("processor: %d in-flight operations to resume", len(self.resume_queue))

    def _keep(
        self, op: str, state: OperationState, raw: bytes, partition: int, at: int | None
    ) -> None:
        """File one restored state (encoded: it rests until an input for it arrives)."""
        self.states.committed[op] = raw
        self.partition_of[op] = partition
        self._track_unknown(state, at)

    def _count_forgery(self) -> None:
        self.forgeries_refused += 1

    def unverifiable_held(self) -> dict[str, str]:
        """Operations held because a record about them cannot be verified (op -> why)."""
        return {op: why for op, (_, why) in self.held.items()}

    def unverifiable_input(self, topic: str, key: str, msg: Message, problem: str) -> None:
        """An input about an operation, sealed by a key not held here, holds the operation.

        It may be an authentic admission, receipt or readback: deciding on
        without it could act where the ledger already acted. The operation's
        later inputs are reported ``UNVERIFIABLE`` and left undecided until
        the processor restarts with the key (a restart reads its inputs
        from the committed offsets, past this record, so restore the key
        and replay the record if it was authentic).
        """
        if not is_reserved_key(key):
            where = f"{topic}:{msg.partition()}:{msg.offset()}"
            self.held.setdefault(key, (msg.partition() or 0, f"{where} {problem}"))

    def on_revoke(self, partitions: set[int]) -> None:
        """Forget the operations of revoked partitions."""
        self.journal.forget(
            partitions, [o for o, p in self.partition_of.items() if p in partitions]
        )
        self.heads.forget(partitions)
        for op in [op for op, (p, _) in self.held.items() if p in partitions]:
            self.held.pop(op, None)
        for op in [op for op, p in self.partition_of.items() if p in partitions]:
            self.states.forget(op)
            self.partition_of.pop(op, None)
            self.unknown_open.discard(op)
            self.strands.forget(op)
            self.admission_resumes.forget(op)
            # The next owner rebuilds it again; a late write here could
            # overwrite a newer state that owner decided.
            self.reasserts.forget(op)
        self.states.abort()
        self.resume_queue = [(op, v) for op, v in self.resume_queue if op in self.states.committed]

    def close(self) -> None:
        """Publish the journal heads not yet published (a clean stop), then close."""
        if self.producer is not None and self.consumer is not None:
            self.heads.publish_last(
                self.producer, self.writer, self.journal.heads(), self.settings.stop_timeout_s
            )
        super().close()

    def settled(self) -> bool:
        """Ready once the in-flight operations it restored are claimed."""
        return not self.resume_queue

    def idle(self) -> None:
        """Resume in-flight operations of newly assigned partitions (see :meth:`_resume`).

        Operating events about refused state records are written here too
        when no input arrives to carry them.
        """
        self._resume()
        due = self.heads.due(self.journal.heads())
        if (self.notes or due) and self.producer is not None:
            with self.transaction() as out:  # the processor's own: no input batch's
                for key, note in self.notes:
                    out.write(Topic.OPERATING_EVENTS, key, note)
                self.heads.publish(out, due)
            self.notes.clear()
            self.heads.commit()

    def before_transaction(self, records: list[Record]) -> None:
        """Resume first, so the claims are decided before newer inputs."""
        self._resume()

    def _resume(self) -> None:
        """Claim every in-flight operation this instance now owns.

        A restarted or reassigned processor does not trust what it restored:
        it claims each in-flight operation at the version it restored
        (compare-and-swap), which bumps the fencing token and makes the ledger
        read the effect back before anything else, then decide and write a
        recovery receipt (the seven moves, DESIGN.md).
        """
        if not self.resume_queue or self.producer is None:
            return
        queue = self.resume_queue
        worker = f"processor-{self.instance}"
        with self.transaction() as out:
            for op, version in queue:
                # The claim continues the operation's trace (from its restored state record).
                with self.spans.continued(op, self.resume_traces.get(op, {}), "processor resume"):
                    out.write(
                        Topic.CLAIMS,
                        op,
                        Claim(
                            claim_id=f"resume:{self.transactional_id}:{op}:v{version}",
                            operation_id=op,
                            worker=worker,
                            expected_version=version,
                        ),
                    )
        self.spans.end()
        self.resume_queue = []  # only once the claims are durable
        self.resume_traces = {}
        log.info("processor: claimed %d in-flight operations for resume", len(queue))

    def rebuild(self) -> None:
        """Drop decisions of the aborted transaction; committed state stays."""
        self.journal.abort()
        self.heads.abort()
        self.states.abort()
        self.admission_resumes.abort()
        self.reasserts.abort()

    def after_commit(self) -> None:
        """Make the committed batch's states current (resting ones as bytes)."""
        self.journal.commit()
        self.heads.commit()
        self.reasserts.commit()
        for st, _ in self.states.commit().values():
            self._track_unknown(st)
        self.admission_resumes.commit()

    def _track_unknown(self, state: OperationState, at_ms: int | None = None) -> None:
        """Keep :attr:`unknown_open` and :attr:`strands` (their gauges) current."""
        self.strands.track(state, at_ms)
        if state.state == S.UNKNOWN_OUTCOME:
            self.unknown_open.add(state.operation_id)
        else:
            self.unknown_open.discard(state.operation_id)

    def current(self, operation_id: str) -> OperationState | None:
        """State including the open transaction's decisions (``None``: unknown operation).

        Raises:
            DecodeError: if a stored state no longer decodes (it did when stored).
        """
        staged = self.states.staged(operation_id)
        if staged is not None:
            return staged[0]
        stored = self.states.committed.get(operation_id)
        if isinstance(stored, bytes):
            event = decode_event(stored)
            assert isinstance(event, OperationState)
            self.states.committed[operation_id] = stored = event
        return stored

    def handle(self, records: list[Record], out: Writer) -> None:
        """Decide every record in order and write state, journal and outputs.

        States rebuilt from the journal on restore are written first (a
        transaction that commits input offsets, so a processor that lost its
        partitions meanwhile is fenced and cannot write them over a newer
        owner's).
        """
        for key, note in self.notes:
            out.write(Topic.OPERATING_EVENTS, key, note)
        self.notes.clear()
        self.heads.publish(out, self.heads.due(self.journal.heads()))
        for rebuilt, raw in sorted(self.reasserts.committed.items()):
            out.write_raw(Topic.STATE, rebuilt, raw)
            self.reasserts.drop(rebuilt)
        for rec in bound_each(self.spans.each(records), lambda r: r.key):
            op = getattr(rec.event, "operation_id", None)
            if op != rec.key:
                out.write(Topic.OPERATING_EVENTS, rec.key, _bad_key(rec, op))
                continue
            if op in self.held:
                out.write(Topic.OPERATING_EVENTS, op, _held_event(rec, op, self.held[op][1]))
                log.error("%s: %s not decided: held on unverifiable state", op, rec.event.KIND)
                continue
            state = self.current(op)
            resumed_by = (
                f"processor-{self.instance}"
                if isinstance(rec.event, AdmissionDecision)
                and op in self.admission_resumes  # not yet resumed in this transaction
                else None
            )
            step = decide_input(rec, state, self.facts, resumed_by)
            decision = step.decision
            if resumed_by is not None and decision.outcome == "APPLIED":
                self.admission_resumes.drop(op)
            self._seams(rec, decision)
            annotate(decision_attributes(decision))
            told = decided_outcome(state, decision, rec.event, step.ref, rec.timestamp_ms or 0)
            if told is not None:  # what the service learns, in the same transaction
                out.write(Topic.OUTCOMES, op, told)
            self.journal.write(out, rec.partition, op, journal_of(rec, state, step, self.journal))
            if decision.outcome == "APPLIED" and decision.state is not None:
                raw = decision.state.to_bytes()
                self.states.put(op, (decision.state, raw))
                self.partition_of[op] = rec.partition
                out.write_raw(Topic.STATE, op, raw)
                # One line per transition only on request: the journal already
                # records each one, and at INFO the log costs as much as the fold.
                log.debug(
                    "%s: %s -> %s (%s)", op, decision.from_state, decision.to_state, decision.reason
                )
            elif decision.outcome == "REFUSED":
                log.warning("%s: refused %s: %s", op, rec.event.KIND, decision.reason)
                self.metrics.refused(refusal_kind(o.event for o in decision.outputs))
            for topic, key, event in writes_of(rec, step, self.facts):
                out.write(topic, key, event)

    def _seams(self, rec: Record, decision: Decision) -> None:
        if (
            isinstance(rec.event, AdmissionDecision)
            and rec.event.admitted
            and decision.outcome == "APPLIED"
        ):
            self.hooks.seam("after_admission_before_dispatch", rec.event.operation_id)


def _rests_encoded(_: str, staged: tuple[OperationState, bytes]) -> OperationState | bytes:
    """A committed state as kept: decoded while in flight, encoded once it rests."""
    state, raw = staged
    return state if S(state.state) in IN_FLIGHT else raw


def decision_attributes(decision: Decision) -> dict[str, str]:
    """What a span says of the processor's decision on its record (``ledger.*`` attributes)."""
    return {
        "ledger.outcome": str(decision.outcome),
        "ledger.from_state": str(decision.from_state or ""),
        "ledger.to_state": str(decision.to_state or ""),
    }


def _held_event(rec: Record, op: str, why: str) -> OperatingEvent:
    """The ``UNVERIFIABLE`` operating event of an input left undecided (its bytes kept).

    Args:
        rec: the input (authentic) that was not decided.
        op: its operation, held.
        why: the record that cannot be verified (a state or an input), and why.
    """
    event = record_event(
        "processor",
        rec,
        "UNVERIFIABLE",
        f"{rec.event.KIND} for {op} not decided: the operation is held, since a record "
        f"about it cannot be verified with this processor's keys ({why}); restore the "
        "keys folder the ledger's records were sealed with and restart the processor, "
        "then send this input again",
        operation_id=op,
        id_suffix="HELD",
    )
    return event


def _bad_key(rec: Record, op: str | None) -> OperatingEvent:
    return record_event(
        "processor",
        rec,
        "BAD_INPUT",
        f"record key {rec.key!r} differs from the event's operation ID {op!r}",
        operation_id=op,
        id_suffix="BAD_KEY",
    )
