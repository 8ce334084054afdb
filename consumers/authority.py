"""The authority kernel: admits one exact operation per approval, once.

Input: ``ledger.admission-requests`` (keyed by approval ID, so every request
for one approval is decided on that approval's partition by one instance —
the single writer of the consume-once invariant). It follows
``ledger.approvals`` (same partitions) and ``ledger.policy`` as tables, and
for each request writes, in one transaction with its offsets, the
:class:`~ledger.events.AdmissionDecision` (keyed by operation ID) and, when
admitted, the approval's consumed record (keyed by approval ID). Approvals
must be signed by a trusted reviewer key; refusals of every kind are also
published as operating events.

It reads three local files: the trusted reviewer keys, the sink registry
(the contract of each request's sink names the parameter holding the
amount) and the manual ledger clock. A corrupted one never stops it: the
content last read well stands, the problem is logged and published once as
a ``LOCAL_FILE`` operating event, and at start it waits for a readable file
(:mod:`consumers.localfiles`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Message
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from consumers.localfiles import LastGood, LastGoodClock, clock_refused_event
from consumers.stage import Record, Stage, Writer, record_event
from consumers.tables import IDLE_SETTLE_S, TableFollower
from ledger.authority import (
    LEGACY_POLICY_KEY,
    REASON_ADMITTED,
    REASON_UNVERIFIABLE,
    evaluate,
    merge_approval,
    policy_key,
    supersedes,
    version_in_force,
)
from ledger.clock import ClockVerdict, clock_for
from ledger.errors import LocalFileError
from ledger.events import (
    AdmissionRequest,
    Approval,
    ApprovalUse,
    Event,
    OperatingEvent,
    PolicyChange,
)
from ledger.logs import bound_each
from ledger.signing import load_trusted
from sinks.registry import SinkEndpoint, load_sinks

log = logging.getLogger(__name__)

#: Seconds between catch-ups of the approvals table while idle.
IDLE_CATCH_UP_S = 1.0


class AuthorityKernel(Stage):
    """Consume-transform-produce stage deciding admissions.

    Attributes:
        approvals: committed approvals of the assigned partitions.
        pending: approvals consumed in the open transaction.
        policy_version: policy version in force.
        notes: writes the approvals table asks for (re-asserted consumed
            records, operating events about refused review decisions).
    """

    component = "authority"
    inputs = ("admission-requests",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.clock = LastGoodClock(
            self.hooks.clock(clock_for(self.settings.clock, self.settings.run_dir)),
            component="authority",
            on_problem=self._local_file_problem,
            kind=self.settings.clock,
            max_skew_s=self.settings.clock_max_skew_s,
            on_refused=self._clock_refused,
            on_each_refusal=lambda: self.metrics.clock_refused(self.settings.clock),
        )
        trusted_path = self.settings.trusted_keys_path()
        self._trusted = LastGood(
            "trusted-keys file",
            lambda: load_trusted(trusted_path),
            component="authority",
            on_problem=self._local_file_problem,
        )
        sinks_path = self.settings.sinks_path()
        self._sinks = LastGood(
            "sink registry",
            lambda: load_sinks(sinks_path),
            component="authority",
            on_problem=self._local_file_problem,
        )
        self.approvals: dict[str, Approval] = {}
        #: approval ID -> its consumption, from approval-uses (this kernel's own topic).
        self.uses: dict[str, ApprovalUse] = {}
        self.pending: dict[str, ApprovalUse] = {}
        self.notes: list[tuple[str, str, Event]] = []
        #: The policy change in force (``None``: the configured version).
        self.policy_change: PolicyChange | None = None
        #: approval ID -> what about it cannot be verified (a use or a
        #: revocation sealed by a key this kernel does not hold): held, never
        #: admitted, until the kernel restarts with the key.
        self.unverifiable: dict[str, str] = {}
        #: a policy record this kernel cannot verify: every request is held.
        self.unverifiable_policy: str | None = None
        #: the offset of the latest such record: a verified change after it lifts the hold.
        self._unverifiable_policy_offset = -1
        self._last_catch_up = 0.0
        # Followed lazily: a restart files every approval and use by key, and
        # a key's signatures are verified when a request names it (settle).
        self._approvals = TableFollower(
            self.settings,
            "approvals",
            self._apply_approval,
            on_bad=self._bad_table_value,
            keyring=self.keyring,
            retry=self.retry,
            lazy=True,
            on_unverifiable=self._unverifiable_row,
        )
        self._uses = TableFollower(
            self.settings,
            "approval-uses",
            self._apply_use,
            on_bad=self._bad_table_value,
            keyring=self.keyring,
            retry=self.retry,
            lazy=True,
            on_unverifiable=self._unverifiable_row,
        )
        self._policy = TableFollower(
            self.settings,
            "policy",
            self._apply_policy,
            on_bad=self._bad_table_value,
            keyring=self.keyring,
            retry=self.retry,
            on_unverifiable=self._unverifiable_policy,
        )

    @property
    def policy_version(self) -> int:
        """The policy version in force (derived from :attr:`policy_change`)."""
        return version_in_force(self.policy_change, self.settings.policy_version)

    def on_start(self) -> None:
        """Read the local files (waiting while one is corrupted); load the policy in force."""
        waits: list[Callable[[Callable[[], bool]], object]] = [
            self._sinks.wait,
            self.clock.file.wait,
        ]
        if self.settings.require_signed_approvals:
            waits.append(self._trusted.wait)
        for wait in waits:
            wait(lambda: self.stopping)
            if self.stopping:
                return
        self._policy.follow({0})

    def trusted(self) -> dict[str, Ed25519PublicKey] | None:
        """Trusted reviewer keys (re-read each batch), or ``None`` when not required.

        Raises:
            LocalFileError: the file is corrupted and was never read well.
        """
        if not self.settings.require_signed_approvals:
            return None
        return self._trusted.read()

    def sinks(self) -> dict[str, SinkEndpoint]:
        """The sink registry (re-read each batch; the last good one while it is corrupted).

        Raises:
            LocalFileError: the file is corrupted and was never read well.
        """
        return self._sinks.read()

    def _local_file_problem(self, exc: LocalFileError) -> None:
        """A corrupted local file becomes a ``LOCAL_FILE`` operating event (once per problem)."""
        self.notes.append(
            (
                "operating-events",
                "local-file",
                OperatingEvent(
                    event_id=f"authority-{self.instance}:LOCAL_FILE:{uuid.uuid4().hex[:12]}",
                    component="authority",
                    kind="LOCAL_FILE",
                    reason=exc.message,
                ),
            )
        )

    def _clock_refused(self, reading_ms: int, verdict: ClockVerdict) -> None:
        """A refused clock reading becomes a ``CLOCK_REFUSED`` operating event (once per run)."""
        self.notes.append(
            (
                "operating-events",
                "clock",
                clock_refused_event(
                    f"authority-{self.instance}",
                    "authority",
                    self.settings.clock,
                    reading_ms,
                    verdict,
                ),
            )
        )

    def _misplaced(self, rec: Record, expected: str, named: str | None, key: str) -> bool:
        """Report a table record of another kind, or naming another key, as ``BAD_INPUT``.

        Such a record decodes and may be authentic, but it is not a row of the
        table: it is never applied, and an operating event (kept bytes) says so.

        Args:
            rec: the decoded record.
            expected: the event kind the table holds (``Approval`` ...).
            named: the key the event itself names (``None``: no such field).
            key: the record's key.

        Returns:
            True when the record was reported (and must not be applied).
        """
        if rec.event.KIND == expected and named == key:
            return False
        problem = (
            f"a {rec.event.KIND} is not a {rec.topic} record (expected {expected})"
            if rec.event.KIND != expected
            else f"the record's key {key[:200]!r} differs from the {expected}'s {named!r}"
        )
        log.warning("authority: %s at %s:%s:%s", problem, rec.topic, rec.partition, rec.offset)
        self.notes.append(
            (
                "operating-events",
                key or "(no key)",
                record_event("authority", rec, "BAD_INPUT", problem, id_suffix="MISPLACED"),
            )
        )
        return True

    def _apply_approval(self, key: str, rec: Record | None) -> None:
        if rec is None or self._misplaced(
            rec, Approval.KIND, getattr(rec.event, "approval_id", None), key
        ):
            return
        assert isinstance(rec.event, Approval)
        merged = merge_approval(self.approvals.get(key), rec.event)
        self.approvals[key] = merged.approval
        if merged.note:
            self.notes.append(
                (
                    "operating-events",
                    key,
                    record_event(
                        "authority", rec, "APPROVAL_REFUSED", merged.note, id_suffix="APPROVAL"
                    ),
                )
            )

    def _apply_use(self, key: str, rec: Record | None) -> None:
        if rec is None or self._misplaced(
            rec, ApprovalUse.KIND, getattr(rec.event, "approval_id", None), key
        ):
            return
        assert isinstance(rec.event, ApprovalUse)
        self.uses.setdefault(key, rec.event)  # the first use stands

    def _apply_policy(self, key: str, rec: Record | None) -> None:
        # A change is keyed by itself (policy_key); earlier releases wrote one
        # row keyed 'current'. The latest effective change is in force.
        named = None
        if isinstance(rec.event if rec else None, PolicyChange):
            assert rec is not None and isinstance(rec.event, PolicyChange)
            named = key if key == LEGACY_POLICY_KEY else policy_key(rec.event)
        if rec is None or self._misplaced(rec, PolicyChange.KIND, named, key):
            return
        assert isinstance(rec.event, PolicyChange)
        if rec.event.version < 1:
            # Versions count from 1; the publisher refuses others, so another
            # writer made this one. The policy in force stays.
            reason = (
                f"policy change to version {rec.event.version} by {rec.event.set_by!r} refused: "
                f"policy versions count from 1; version {self.policy_version} stays in force"
            )
            self._refuse_policy(rec, key, reason)
            return
        if not supersedes(rec.event, self.policy_change):
            shown = self.policy_change
            assert shown is not None
            reason = (
                f"policy change to version {rec.event.version} by {rec.event.set_by!r}, effective "
                f"at {rec.event.effective_at_ms} ms, refused: not later than version "
                f"{shown.version} in force since {shown.effective_at_ms} ms (a replayed "
                "change? set the version again to change it)"
            )
            self._refuse_policy(rec, key, reason)
            return
        self.policy_change = rec.event
        if self.unverifiable_policy is not None and rec.offset > self._unverifiable_policy_offset:
            # An operator with a trusted key set the policy after the record nobody
            # can verify: that change decides (a replayed old change cannot: it does
            # not supersede the one in force, so it is refused above).
            log.warning(
                "authority: %s no longer holds admissions: policy version %d set by %s after it",
                self.unverifiable_policy,
                rec.event.version,
                rec.event.set_by,
            )
            self.unverifiable_policy = None

    def _refuse_policy(self, rec: Record, key: str, reason: str) -> None:
        """A policy change that does not take over: logged, and a ``BAD_INPUT`` operating event."""
        log.error("authority: %s", reason)
        self.notes.append(
            (
                "operating-events",
                key,
                record_event("authority", rec, "BAD_INPUT", reason, id_suffix="POLICY"),
            )
        )

    def on_assign(self, partitions: set[int]) -> None:
        """Follow the approvals and uses of the assigned partitions from the beginning.

        Operating events still to write stay (a policy change refused while
        :meth:`on_start` read the policy is reported once, by this kernel).
        """
        self.approvals.clear()
        self.uses.clear()
        self.unverifiable.clear()
        approvals = self._approvals.follow(partitions)
        uses = self._uses.follow(partitions)
        log.info(
            "authority: %d approvals and %d uses filed (each checked when asked for)",
            approvals,
            uses,
        )

    def on_revoke(self, partitions: set[int]) -> None:
        """Drop uncommitted work (the next assignment reloads the table)."""
        self.pending.clear()

    def rebuild(self) -> None:
        """Forget consumptions of the aborted transaction; reload the table."""
        self.pending.clear()
        self.approvals.clear()
        self.uses.clear()
        self.unverifiable.clear()
        self.notes.clear()
        self._approvals.follow(self._approvals.partitions)
        self._uses.follow(self._uses.partitions)

    def after_commit(self) -> None:
        """The uses of this batch are now durable."""
        self.uses.update(self.pending)
        self.pending.clear()

    def _catch_up(self) -> None:
        self._approvals.catch_up()
        self._uses.catch_up()
        self._policy.catch_up()
        self._last_catch_up = time.monotonic()

    def _settle(self, records: list[Record]) -> None:
        """Check and apply the held approvals and uses of the batch's approval IDs."""
        for rec in records:
            if isinstance(rec.event, AdmissionRequest):
                self._approvals.settle(rec.event.approval_id)
                self._uses.settle(rec.event.approval_id)

    def _unverifiable_row(self, key: str, msg: Message, problem: str) -> None:
        """An approval or use record sealed by a key this kernel does not hold holds its approval.

        It may be authentic evidence (a use made before the keys were lost):
        reading it as absent would let a consumed approval pay again. The
        record itself is reported once, as an ``UNVERIFIABLE`` operating
        event, by :meth:`_bad_table_value`.
        """
        topic = (msg.topic() or "").removeprefix(self.settings.topic_prefix + ".")
        self.unverifiable.setdefault(key, f"{topic}:{msg.partition()}:{msg.offset()} {problem}")

    def _unverifiable_policy(self, key: str, msg: Message, problem: str) -> None:
        """A policy record this kernel cannot verify holds every request (fail closed).

        It may be a genuine change whose operator key was lost (read as absent,
        approvals it retired would admit again), or a record of a key nobody ever
        held. Either way the hold lasts until the key is restored or an operator
        sets the policy again with a trusted key: a verified change later in the
        topic than every unverifiable one decides (see :meth:`_apply_policy`).
        """
        self._unverifiable_policy_offset = max(self._unverifiable_policy_offset, msg.offset() or 0)
        if self.unverifiable_policy is None:
            self.unverifiable_policy = f"policy:{msg.partition()}:{msg.offset()} {problem}"
            log.error(
                "authority: %s: every admission is held until the key is restored or an "
                "operator sets the policy again ('ledger policy set N --by OPERATOR' with a "
                "version above the one in force)",
                self.unverifiable_policy,
            )

    def unverifiable_held(self) -> dict[str, str]:
        """What this kernel holds for evidence it cannot verify (key -> the record and reason)."""
        held = dict(self.unverifiable)
        if self.unverifiable_policy is not None:
            held["(policy: every approval)"] = self.unverifiable_policy
        return held

    def _bad_table_value(self, msg: Message, reason: str, kind: str) -> None:
        """An approval, use or policy record that is refused becomes an operating event.

        It is treated as absent (an intent relying on it is refused: approval
        not found; a forged use or tombstone changes nothing); see
        :meth:`consumers.stage.Stage.table_refusal`.
        """
        key, event = self.table_refusal(msg, reason, kind, keyed_by_operation=False)
        self.notes.append(("operating-events", key, event))

    def _write_notes(self, out: Writer) -> None:
        for topic, key, event in self.notes:
            out.write(topic, key, event)
        self.notes.clear()

    def idle(self) -> None:
        """Check some filed approvals and uses; catch the tables up now and then.

        Publishes what they ask for (operating events about refused records).
        """
        if self.producer is None:
            return
        # Every filed record is checked soon after a restart (a refused one
        # reported), a slice at a time, between requests.
        for table in (self._approvals, self._uses):
            if table.held:
                table.settle_some(IDLE_SETTLE_S)
        if time.monotonic() - self._last_catch_up >= IDLE_CATCH_UP_S:
            self._catch_up()
        if self.notes:
            self.producer.begin_transaction()
            self._write_notes(self.writer())
            self._commit()

    def before_transaction(self, records: list[Record]) -> None:
        """Wait (bounded) for approvals hidden behind an unresolved transaction.

        An approval the table does not hold is refused as not found, unless
        its partition's last stable offset is held back by an open
        transaction (a kernel instance killed or paused mid-transaction):
        then the approval may be behind it, and the kernel waits, catching
        up, until the approval appears or the transaction is resolved, for at
        most the transaction timeout plus five seconds. This runs before the
        kernel opens its own transaction, which would otherwise hold the
        partition back itself.
        """
        self._settle(records)
        missing = {
            rec.partition
            for rec in records
            if isinstance(rec.event, AdmissionRequest)
            and rec.event.approval_id not in self.approvals
        }
        if not missing:
            return
        self._catch_up()
        self._settle(records)
        deadline = time.monotonic() + self.settings.transaction_timeout_ms / 1000 + 5
        waited = False
        while time.monotonic() < deadline:
            pending = {
                rec.partition
                for rec in records
                if isinstance(rec.event, AdmissionRequest)
                and rec.event.approval_id not in self.approvals
            }
            if not any(self._approvals.unsettled(p) for p in pending):
                break
            waited = True
            time.sleep(0.2)
            self._catch_up()
            self._settle(records)
        if waited:
            log.info("authority: waited for an open transaction on %s", sorted(missing))

    def handle(self, records: list[Record], out: Writer) -> None:
        """Decide every admission request of the batch."""
        self._catch_up()
        self._settle(records)
        for rec in records:
            self.clock.observe(rec.timestamp_ms)
        trusted = self.trusted()
        sinks = self.sinks()
        # Requests are keyed by approval ID: the operation is the request's own.
        for rec in bound_each(
            self.spans.each(records), lambda r: getattr(r.event, "operation_id", None)
        ):
            request = rec.event
            if not isinstance(request, AdmissionRequest):
                log.warning("authority: refusing %s at %s", request.KIND, rec.offset)
                out.write(
                    "operating-events",
                    rec.key,
                    record_event(
                        "authority",
                        rec,
                        "BAD_INPUT",
                        f"{request.KIND} is not an admission request",
                    ),
                )
                continue
            self.hooks.seam("before_admission", request.operation_id)
            approval = self.approvals.get(request.approval_id)
            use = self.pending.get(request.approval_id) or self.uses.get(request.approval_id)
            endpoint = sinks.get(request.sink) if request.sink is not None else None
            result = evaluate(
                approval,
                request,
                use=use,
                now_ms=self.clock.now_ms(),
                policy_version=self.policy_version,
                decided_by=f"authority-{self.instance}",
                trusted=trusted,
                amount_field=endpoint.contract.amount_field if endpoint is not None else None,
                sink_registered=endpoint is not None,
                consequence=endpoint.contract.consequence if endpoint is not None else None,
                ledger_id=self.settings.ledger_identity,
                unverifiable=self.unverifiable.get(request.approval_id) or self.unverifiable_policy,
            )
            out.write("admissions", request.operation_id, result.decision)
            if result.use is not None:
                self.pending[request.approval_id] = result.use
                out.write("approval-uses", request.approval_id, result.use)
            if result.decision.reason != REASON_ADMITTED:
                out.write(
                    "operating-events",
                    request.operation_id,
                    record_event(
                        "authority",
                        rec,
                        "UNVERIFIABLE"
                        if result.decision.reason.startswith(REASON_UNVERIFIABLE)
                        else "ADMISSION_REFUSED",
                        f"{request.approval_id}: {result.decision.reason}",
                        operation_id=request.operation_id,
                        id_suffix="REFUSED",
                        keep_bytes=False,
                    ),
                )
            log.info(
                "%s: admission %s (%s)",
                request.operation_id,
                "granted" if result.decision.admitted else "refused",
                result.decision.reason,
            )
        # What the tables and the local files asked for, this batch's included.
        self._write_notes(out)

    def close(self) -> None:
        """Close the table followers too."""
        super().close()
        self._approvals.close()
        self._uses.close()
        self._policy.close()
