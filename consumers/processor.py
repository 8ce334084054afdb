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
written to the outbox (:meth:`Processor.verification_pointless`), sparing a
round trip to the relay that could only answer ``UNSUPPORTED``. The decision
and its journal entry are the fold's, unchanged (replay decides the same);
the operation rests in EFFECT_COMMITTED as it did after that answer. A
resume's verification is always written: its answer carries the resume's
recovery receipt.

An intent that ``compensates`` another operation is decided with what the
processor observed of the original and of its other compensations
(:meth:`Processor.compensation_facts`: ``ledger.state`` with its own open
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

import hashlib
import json
import logging
from collections.abc import Callable

from confluent_kafka import Message

from consumers.compensations import observe_compensation, observe_tally
from consumers.heads import FileWitness, HeadsPublisher
from consumers.journal_chain import JournalChain, read_heads
from consumers.metrics import refusal_kind
from consumers.stage import (
    Record,
    Stage,
    Writer,
    await_settled,
    dead_letter,
    key_text,
    read_partition,
    record_event,
    seal_refusal_kind,
)
from consumers.strandwatch import StrandWatch
from ledger.acl import STAGE_INPUTS
from ledger.authn import unverifiable
from ledger.contracts import postcondition_request
from ledger.errors import LedgerError, LocalFileError
from ledger.events import (
    AdmissionDecision,
    Claim,
    CompensationTally,
    Dispatch,
    Intent,
    JournalEntry,
    OperatingEvent,
    OperationState,
    decode_event,
)
from ledger.fold import (
    CompensationFacts,
    Decision,
    decide,
    drifts,
    journal_entry,
    keeps_intent,
    ref_of,
    repeats,
    replay_decisions,
)
from ledger.logs import bound_each
from ledger.outcomes import decided_outcome
from ledger.states import IN_FLIGHT
from ledger.states import RecoveryState as S
from ledger.topology import MISPLACED, is_reserved_key
from ledger.tracing import annotate, trace_headers_of
from ledger.upgrades import schema_versions
from sinks.registry import RegistryFile

log = logging.getLogger(__name__)

#: In-flight states a restarted processor claims. EFFECT_COMMITTED is left
#: out: its verification is already in the outbox (the relay performs it
#: after a crash as before), and for a sink without a postcondition query it
#: is where the operation rests (no verification is written for it), so
#: claiming it would re-verify every such operation ever committed at every
#: restart. Only one stranded there (its verification not come back within
#: ``LEDGER_STRANDED_COMMITTED_S``, :mod:`consumers.strandwatch`) is claimed:
#: the claim dispatches its verification again, never the effect.
RESUMABLE = IN_FLIGHT - {S.EFFECT_COMMITTED}

#: The schema versions a dispatch's records are written with (stamped on each dispatch).
SCHEMA_VERSIONS_JSON = json.dumps(schema_versions(), sort_keys=True, separators=(",", ":"))


class Processor(Stage):
    """Consume-transform-produce stage deciding every recovery transition.

    Attributes:
        states: committed state of every operation on the assigned partitions:
            an :class:`OperationState` while the operation is in flight, its
            encoded bytes once it rests (and as restored), decoded again when
            an input for it arrives (see :meth:`current`). Resting operations
            so cost about their record's size, not a model's.
        pending: states decided in the open transaction (merged on commit,
            dropped on abort).
    """

    component = "processor"
    inputs = STAGE_INPUTS["processor"]  # the ACL plan grants what it reads

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.states: dict[str, OperationState | bytes] = {}
        self.partition_of: dict[str, int] = {}
        self.pending: dict[str, OperationState] = {}
        #: encoded form of each pending state (as written to ledger.state).
        self.pending_raw: dict[str, bytes] = {}
        self.resume_queue: list[tuple[str, int]] = []
        #: Operations restored waiting for admission (NOT_ADMITTED, an
        #: approval requested) on newly assigned partitions: the admission
        #: decision that arrives for one of them resumes it, and its journal
        #: entry names this processor (``resumed_by``), so the fold writes a
        #: recovery receipt. Dropped once that decision is committed.
        self.admission_resumes: set[str] = set()
        #: admission resumes decided in the open transaction.
        self.admission_resumed: set[str] = set()
        #: op -> trace headers of its restored state record (its resume claim continues them).
        self.resume_traces: dict[str, dict[str, str]] = {}
        #: Partitions this process has owned at some point of its life.
        self.ever_held: set[int] = set()
        #: operating events to write with the next transaction (refused state records).
        self.notes: list[tuple[str, OperatingEvent]] = []
        #: op -> encoded state of states rebuilt from the journal on
        #: restore, written again to ``ledger.state`` with the next input's
        #: transaction (see :meth:`on_assign`); dropped once committed.
        self.reasserts: dict[str, bytes] = {}
        #: reasserts written in the open transaction.
        self.reasserted: set[str] = set()
        #: The sink registry, checked for every intent (re-read when it changes).
        self.registry = RegistryFile(self.settings.sinks_path())
        self._unchecked_logged = False
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
                reader=read_partition,
                settle=await_settled,
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

    def sink_problem(self, sink: str) -> str | None:
        """Why an intent's sink cannot be used, or ``None`` (registered, or no registry).

        Args:
            sink: the sink an intent names.

        Returns:
            ``None`` when the registry names the sink, or when there is no
            registry file to check against (logged once); otherwise the
            problem, naming the file (see :meth:`RegistryFile.problem`).
        """
        if not self.registry.exists():
            if not self._unchecked_logged:
                log.warning(
                    "processor: no sink registry at %s: intents are not checked against it",
                    self.registry.path,
                )
                self._unchecked_logged = True
            return None
        return self.registry.problem(sink)

    def compensation_facts(self, intent: Intent) -> CompensationFacts:
        """What the ledger knows of the original a compensation names, and of its compensations.

        Every partition of ``ledger.state`` is read, with this processor's
        own decisions (table and open transaction) laid over it; see
        :func:`consumers.compensations.observe_compensation`.

        Args:
            intent: an intent whose ``compensates`` is set.

        Returns:
            The observed :class:`CompensationFacts` (``tally`` true).
        """

        def read_state(load: Callable[[Record | None, Message], None]) -> int:
            return read_partition(
                self.settings, "state", None, load, keyring=self.keyring, retry=self.retry
            )

        def mine(op: str) -> OperationState | None:
            return self.current(op) if op in self.states or op in self.pending else None

        return observe_compensation(intent, read_state, mine, list(self.pending), self.registry)

    def verification_pointless(self, dispatch: Dispatch) -> bool:
        """Whether a dispatch is an ordinary verification its sink cannot perform.

        The relay would answer such a ``VERIFY`` with an ``UNSUPPORTED``
        postcondition readback, which changes nothing for an ordinary
        verification (the fold notes it; the operation rests in
        EFFECT_COMMITTED). The sink registry as it is now says whether the
        contract offers a postcondition query for the dispatch's parameters
        (:func:`ledger.contracts.postcondition_request`). A resume's
        verification (``on_resume``), a sink the registry does not name, and
        a registry or parameters that cannot be read all count as worth
        sending: the relay then answers as before.

        Args:
            dispatch: a dispatch the fold decided.

        Returns:
            True when the dispatch need not be written.
        """
        if dispatch.kind != "VERIFY" or dispatch.on_resume:
            return False
        try:
            endpoint = self.registry.current().get(dispatch.sink)
            params = json.loads(dispatch.params_json)
        except (LedgerError, ValueError):
            return False
        if endpoint is None or not isinstance(params, dict):
            return False
        return not postcondition_request(endpoint.contract, params).offered

    def stamped(self, dispatch: Dispatch) -> Dispatch:
        """The dispatch with its sink's contract version and the schema versions it is written with.

        The fold decides the dispatch; the version comes from the sink
        registry as it is now (the relay checks a resume under another
        version against the release manifest, :mod:`ledger.upgrades`). A
        sink the registry does not name, or a registry that cannot be read,
        leaves ``contract_version`` unset (the relay reads it as version 1).

        Args:
            dispatch: a dispatch the fold decided.

        Returns:
            A copy with ``contract_version`` and ``schema_versions_json`` set.
        """
        try:
            endpoint = self.registry.current().get(dispatch.sink)
        except LocalFileError:
            endpoint = None
        return dispatch.model_copy(
            update={
                "contract_version": endpoint.contract_version if endpoint else None,
                "schema_versions_json": SCHEMA_VERSIONS_JSON,
            }
        )

    def on_assign(self, partitions: set[int]) -> None:
        """Restore the state of the assigned partitions from ``ledger.state``.

        Each operation gets the state of its highest version among its
        authentic records: a state record older than one already read (a
        genuine earlier record appended again, at a higher offset) is not
        restored and is reported (a ``REPLAYED`` operating event naming both
        versions), so a copy cannot take a settled operation back. When
        the latest record of a key is refused (its seal is missing or wrong,
        or it is authentic but does not decode), it has displaced the
        operation's authentic state: after compaction no authentic record of
        the operation is left. Such an operation is not forgotten (else a
        re-published intent would be taken as new and re-request admission
        under its consumed approval): its state is rebuilt from its journal
        entries (:meth:`_rebuild_from_journal`), a ``STATE_REBUILT`` operating
        event names the displacing record (``state:partition:offset``), and
        the rebuilt state is written again with the next input's transaction
        so that it is the latest record again. Only a restore that met such
        a record reads the journal (the whole of the partitions those keys
        are on, decoding only those keys' entries).
        """

        #: op -> (in a resumable state, version), from its latest record.
        restored: dict[str, tuple[bool, int]] = {}
        #: ops whose latest record waits for an admission decision.
        awaiting: set[str] = set()
        traces: dict[str, dict[str, str]] = {}
        #: op -> (partition, offset, why) of its latest record, while that one was refused.
        displaced: dict[str, tuple[int, int, str]] = {}

        def keep(
            op: str, state: OperationState, raw: bytes, partition: int, at: int | None = None
        ) -> None:
            self.states[op] = raw
            self.partition_of[op] = partition
            self._track_unknown(state, at)
            # A committed effect whose verification never came is claimed too.
            resumable = S(state.state) in RESUMABLE or self.strands.unverified(op)
            restored[op] = (resumable, state.version)
            if (
                state.state == S.NOT_ADMITTED
                and state.approval_id is not None
                and state.tally != "REQUESTED"  # waits for its original's tally, not the kernel
            ):
                awaiting.add(op)
            else:
                awaiting.discard(op)

        def load(rec: Record | None, msg: Message) -> None:
            if rec is not None and isinstance(rec.event, OperationState):
                held = restored.get(rec.key)
                if held is not None and rec.event.version < held[1]:
                    # An authentic state older than one already restored: a
                    # copy of an earlier record appended again. The highest
                    # version stands; the copy is reported, not restored.
                    self.notes.append(_older_state(msg, rec.event, held[1]))
                    return
                keep(rec.key, rec.event, rec.raw, rec.partition, rec.timestamp_ms)
                displaced.pop(rec.key, None)
                self.held.pop(rec.key, None)  # a later authentic state supersedes it
                if restored[rec.key][0]:  # kept only for what may be resumed
                    traces[rec.key] = trace_headers_of(msg.headers())
                else:
                    traces.pop(rec.key, None)
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
            self.notes.append(
                dead_letter(
                    "processor", "state", msg, f"not an operation state: {what}", kind="BAD_INPUT"
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
                self.held[key] = (msg.partition() or 0, f"{where} {problem}")
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
        waited = await_settled(self.settings, "state", partitions, retry=self.retry)
        if waited > 1.0:
            log.info("processor: waited %.1f s for ledger.state to settle", waited)
        n = read_partition(
            self.settings,
            "state",
            partitions,
            load,
            keyring=self.keyring,
            on_refused=refused,
            retry=self.retry,
        )
        log.info("processor restored %d state records for partitions %s", n, sorted(partitions))
        for op, (_, why) in sorted(self.held.items()):
            if self.partition_of.get(op) is None or self.partition_of[op] in partitions:
                log.error("processor: %s held: its state cannot be verified (%s)", op, why)
        if displaced:
            rebuilt = self._rebuild_from_journal(
                {p for p, _, _ in displaced.values()}, set(displaced)
            )
            for op, (partition, offset, why) in sorted(displaced.items()):
                found = rebuilt.get(op)
                if found is None:
                    log.warning(
                        "processor: %s: its latest state record at state:%s:%s was refused "
                        "(%s) and the journal holds no entry for it: nothing to restore",
                        op,
                        partition,
                        offset,
                        why,
                    )
                    continue
                state, entries = found
                raw = state.to_bytes()
                before = self.states.get(op)
                keep(op, state, raw, partition)
                traces.pop(op, None)  # the displacing record's trace is not the operation's
                self.reasserts[op] = raw
                self.notes.append(
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
        # A resume follows a crash or a takeover: partitions this process
        # owned before (a rebalance after a broker restart gives them back)
        # were never interrupted here, so their operations are not claimed.
        new = partitions - self.ever_held
        self.ever_held |= partitions
        self.resume_queue = sorted(
            (op, version)
            for op, (resumable, version) in restored.items()
            if resumable and self.partition_of.get(op) in new
        )
        self.resume_traces = {op: traces.get(op, {}) for op, _ in self.resume_queue}
        self.admission_resumes |= {op for op in awaiting if self.partition_of.get(op) in new}
        self.journal.restore(partitions)
        if self.resume_queue:
            log.info("processor: %d in-flight operations to resume", len(self.resume_queue))

    def _rebuild_from_journal(
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
                "journal",
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

        await_settled(self.settings, "journal", partitions, retry=self.retry)
        read_partition(self.settings, "journal", partitions, keep, decode=False, retry=self.retry)

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
        entries give (see :meth:`on_assign`): a forged "in flight" state
        cannot make a restarted processor resume or dispatch anything, and a
        forged record that displaced a settled state cannot make it forget
        the operation. The operating event is written with the next
        transaction.
        """
        doubt = unverifiable(problem)
        kind = seal_refusal_kind(problem)
        self.forgeries_refused += not doubt
        log.error(
            "processor: %s state record at state:%s:%s not restored: %s",
            kind,
            msg.partition(),
            msg.offset(),
            problem,
        )
        verdict = "cannot be verified here (its operation is held)" if doubt else "not authentic"
        self.notes.append(
            dead_letter("processor", "state", msg, f"{verdict}: {problem}", kind=kind)
        )

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
            self.states.pop(op, None)
            self.partition_of.pop(op, None)
            self.unknown_open.discard(op)
            self.strands.forget(op)
            self.admission_resumes.discard(op)
            # The next owner rebuilds it again; a late write here could
            # overwrite a newer state that owner decided.
            self.reasserts.pop(op, None)
        self.pending.clear()
        self.pending_raw.clear()
        self.resume_queue = [(op, v) for op, v in self.resume_queue if op in self.states]

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
            self.producer.begin_transaction()
            out = self.writer()
            for key, note in self.notes:
                out.write("operating-events", key, note)
            self.heads.publish(out, due)
            self._commit()
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
        self.producer.begin_transaction()
        out = self.writer()
        worker = f"processor-{self.instance}"
        for op, version in queue:
            # The claim continues the operation's trace (from its restored state record).
            with self.spans.continued(op, self.resume_traces.get(op, {}), "processor resume"):
                out.write(
                    "claims",
                    op,
                    Claim(
                        claim_id=f"resume:{self.transactional_id}:{op}:v{version}",
                        operation_id=op,
                        worker=worker,
                        expected_version=version,
                    ),
                )
        self._commit()
        self.spans.end()
        self.resume_queue = []  # only once the claims are durable
        self.resume_traces = {}
        log.info("processor: claimed %d in-flight operations for resume", len(queue))

    def rebuild(self) -> None:
        """Drop decisions of the aborted transaction; committed state stays."""
        self.journal.abort()
        self.heads.abort()
        self.pending.clear()
        self.pending_raw.clear()
        self.admission_resumed.clear()
        self.reasserted.clear()

    def after_commit(self) -> None:
        """Make the committed batch's states current (resting ones as bytes)."""
        self.journal.commit()
        self.heads.commit()
        for op in self.reasserted:
            self.reasserts.pop(op, None)
        self.reasserted.clear()
        for op, st in self.pending.items():
            self.states[op] = st if S(st.state) in IN_FLIGHT else self.pending_raw[op]
            self._track_unknown(st)
        self.pending.clear()
        self.pending_raw.clear()
        self.admission_resumes -= self.admission_resumed
        self.admission_resumed.clear()

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
        st = self.pending.get(operation_id)
        if st is not None:
            return st
        stored = self.states.get(operation_id)
        if isinstance(stored, bytes):
            event = decode_event(stored)
            assert isinstance(event, OperationState)
            self.states[operation_id] = stored = event
        return stored

    def handle(self, records: list[Record], out: Writer) -> None:
        """Decide every record in order and write state, journal and outputs.

        States rebuilt from the journal on restore are written first (a
        transaction that commits input offsets, so a processor that lost its
        partitions meanwhile is fenced and cannot write them over a newer
        owner's).
        """
        for key, note in self.notes:
            out.write("operating-events", key, note)
        self.notes.clear()
        self.heads.publish(out, self.heads.due(self.journal.heads()))
        for rebuilt, raw in sorted(self.reasserts.items()):
            out.write_raw("state", rebuilt, raw)
            self.reasserted.add(rebuilt)
        for rec in bound_each(self.spans.each(records), lambda r: r.key):
            op = getattr(rec.event, "operation_id", None)
            if op != rec.key:
                out.write("operating-events", rec.key, _bad_key(rec, op))
                continue
            if op in self.held:
                out.write("operating-events", op, _held_event(rec, op, self.held[op][1]))
                log.error("%s: %s not decided: held on unverifiable state", op, rec.event.KIND)
                continue
            state = self.current(op)
            ref = ref_of(rec.topic, rec.partition, rec.offset)
            sink_problem = (
                self.sink_problem(rec.event.sink) if isinstance(rec.event, Intent) else None
            )
            resumed_by = (
                f"processor-{self.instance}"
                if isinstance(rec.event, AdmissionDecision)
                and op in self.admission_resumes
                and op not in self.admission_resumed
                else None
            )
            facts = self._facts(rec.event, state)
            decision = decide(
                state,
                rec.event,
                ref,
                sink_problem=sink_problem,
                resumed_by=resumed_by,
                compensation=facts,
            )
            if resumed_by is not None and decision.outcome == "APPLIED":
                self.admission_resumed.add(op)
            self._seams(rec, decision)
            annotate(decision_attributes(decision))
            told = decided_outcome(state, decision, rec.event, ref, rec.timestamp_ms or 0)
            if told is not None:  # what the service learns, in the same transaction
                out.write("outcomes", op, told)
            repeat = self.journal.repeat_ref(op) if repeats(state, rec.event, decision) else None
            if drifts(state, rec.event, decision):  # an identical drift: by reference
                sha = hashlib.sha256(rec.raw).hexdigest()
                repeat = self.journal.drift_ref(op, sha)
                if repeat is None:
                    self.journal.keep_drift(op, sha, ref)
            entry = journal_entry(
                decision,
                rec.event,
                rec.raw,
                rec.topic,
                rec.partition,
                rec.offset,
                sink_problem=sink_problem,
                resumed_by=resumed_by,
                compensation=facts,
                repeat_of=repeat,
            )
            self.journal.write(out, rec.partition, op, entry)
            if repeat is None and keeps_intent(rec.event, decision):
                self.journal.keep_ref(op, ref)
            if decision.outcome == "APPLIED" and decision.state is not None:
                raw = decision.state.to_bytes()
                self.pending[op] = decision.state
                self.pending_raw[op] = raw
                self.partition_of[op] = rec.partition
                out.write_raw("state", op, raw)
                # One line per transition only on request: the journal already
                # records each one, and at INFO the log costs as much as the fold.
                log.debug(
                    "%s: %s -> %s (%s)", op, decision.from_state, decision.to_state, decision.reason
                )
            elif decision.outcome == "REFUSED":
                log.warning("%s: refused %s: %s", op, rec.event.KIND, decision.reason)
                self.metrics.refused(refusal_kind(o.event for o in decision.outputs))
            for output in decision.outputs:
                event = output.event
                if isinstance(event, OperatingEvent) and event.original_bytes is None:
                    # Refused inputs travel with their original bytes (a dead letter).
                    event = event.model_copy(update={"original_bytes": rec.raw})
                if isinstance(event, Dispatch):
                    if self.verification_pointless(event):
                        log.debug(
                            "%s: %s not written: %s offers no postcondition",
                            op,
                            event.dispatch_id,
                            event.sink,
                        )
                        continue
                    event = self.stamped(event)
                out.write(output.topic, output.key, event)

    def _facts(self, event: object, state: OperationState | None) -> CompensationFacts | None:
        """What the fold needs observed for a new compensation, or for a tally request."""
        if isinstance(event, Intent) and event.compensates is not None and state is None:
            return self.compensation_facts(event)
        if isinstance(event, CompensationTally) and event.kind == "REQUEST" and state is not None:
            return observe_tally(state, self.registry)
        return None

    def _seams(self, rec: Record, decision: Decision) -> None:
        if (
            isinstance(rec.event, AdmissionDecision)
            and rec.event.admitted
            and decision.outcome == "APPLIED"
        ):
            self.hooks.seam("after_admission_before_dispatch", rec.event.operation_id)


def decision_attributes(decision: Decision) -> dict[str, str]:
    """What a span says of the processor's decision on its record (``ledger.*`` attributes)."""
    return {
        "ledger.outcome": str(decision.outcome),
        "ledger.from_state": str(decision.from_state or ""),
        "ledger.to_state": str(decision.to_state or ""),
    }


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
        source_topic="state",
        source_partition=partition,
        source_offset=offset,
    )


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
        "state",
        msg,
        f"state record of {state.operation_id} at version {state.version} ({state.state}) "
        f"is older than version {held} read before it on ledger.state: a copy of an earlier "
        f"state appended again; not restored (the operation keeps version {held})",
        kind="REPLAYED",
    )


def _bad_key(rec: Record, op: str | None) -> OperatingEvent:
    return record_event(
        "processor",
        rec,
        "BAD_INPUT",
        f"record key {rec.key!r} differs from the event's operation ID {op!r}",
        operation_id=op,
        id_suffix="BAD_KEY",
    )
