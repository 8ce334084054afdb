"""The authority kernel: admits one exact operation per approval, once.

Input: ``ledger.admission-requests`` (keyed by approval ID, so every request
for one approval is decided on that approval's partition by one instance —
the single writer of the consume-once invariant). It follows
``ledger.approvals`` (same partitions) and ``ledger.policy`` as tables, and
for each request writes, in one transaction with its offsets, the
:class:`~ledger.events.AdmissionDecision` (keyed by operation ID) and, when
admitted, the approval's consumed record (keyed by approval ID). Approvals
must be signed by a trusted reviewer key; refusals of every kind are also
published as operating events. The tables, and what the kernel does with
records in them it cannot use, are :mod:`consumers.admission_tables`; the
decision is the pure :func:`ledger.authority.evaluate`.

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

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from consumers.admission_tables import AdmissionTables
from consumers.localfiles import LastGood, LastGoodClock, clock_refused_event
from consumers.stage import Record, Stage, Writer, record_event
from consumers.tables import IDLE_SETTLE_S
from ledger.authority import REASON_ADMITTED, REASON_UNVERIFIABLE, evaluate
from ledger.clock import ClockVerdict, clock_for
from ledger.errors import LocalFileError
from ledger.events import AdmissionRequest, Event, OperatingEvent
from ledger.logs import bound_each
from ledger.signing import load_trusted
from ledger.topology import Topic
from sinks.registry import SinkEndpoint, load_sinks

log = logging.getLogger(__name__)

#: Seconds between catch-ups of the approvals table while idle.
IDLE_CATCH_UP_S = 1.0


class AuthorityKernel(Stage):
    """Consume-transform-produce stage deciding admissions.

    Reads its tables (:class:`consumers.admission_tables.AdmissionTables`),
    calls the pure :func:`ledger.authority.evaluate` for each request, and
    writes the decision (and the approval's use) in one transaction.

    Attributes:
        tables: approvals, uses (the open transaction's staged) and the
            policy in force, as followed from their topics.
        policy_version: policy version in force.
        notes: writes the tables and the local files ask for (operating
            events about refused records, corrupted files, refused clock
            readings), as ``(topic, key, event)``.
    """

    component = "authority"
    inputs = (Topic.ADMISSION_REQUESTS,)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]  # Stage's own arguments, passed on
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
        self.notes: list[tuple[str, str, Event]] = []
        #: approvals, their uses (the open transaction's staged) and the policy in force.
        self.tables = AdmissionTables(
            self.settings, self.keyring, self.retry, self.notes, self.table_refusal
        )
        self._last_catch_up = 0.0

    @property
    def policy_version(self) -> int:
        """The policy version in force (see :attr:`AdmissionTables.policy_version`)."""
        return self.tables.policy_version

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
        self.tables.policy_follower.follow({0})

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
                Topic.OPERATING_EVENTS,
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
                Topic.OPERATING_EVENTS,
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

    def on_assign(self, partitions: set[int]) -> None:
        """Follow the approvals and uses of the assigned partitions from the beginning.

        Operating events still to write stay (a policy change refused while
        :meth:`on_start` read the policy is reported once, by this kernel).
        """
        approvals, uses = self.tables.follow(partitions)
        log.info(
            "authority: %d approvals and %d uses filed (each checked when asked for)",
            approvals,
            uses,
        )

    def on_revoke(self, partitions: set[int]) -> None:
        """Drop uncommitted work (the next assignment reloads the table)."""
        self.tables.uses.abort()

    def rebuild(self) -> None:
        """Forget consumptions of the aborted transaction; reload the table."""
        self.notes.clear()
        self.tables.reload()

    def after_commit(self) -> None:
        """The uses of this batch are now durable."""
        self.tables.uses.commit()

    def _catch_up(self) -> None:
        self.tables.catch_up()
        self._last_catch_up = time.monotonic()

    def unverifiable_held(self) -> dict[str, str]:
        """What this kernel holds for evidence it cannot verify (key -> the record and reason)."""
        return self.tables.unverifiable_held()

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
        for table in (self.tables.approval_follower, self.tables.use_follower):
            if table.held:
                table.settle_some(IDLE_SETTLE_S)
        if time.monotonic() - self._last_catch_up >= IDLE_CATCH_UP_S:
            self._catch_up()
        if self.notes:
            with self.transaction() as out:
                self._write_notes(out)

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
        self.tables.settle(records)
        missing = {
            rec.partition
            for rec in records
            if isinstance(rec.event, AdmissionRequest)
            and rec.event.approval_id not in self.tables.approvals
        }
        if not missing:
            return
        self._catch_up()
        self.tables.settle(records)
        deadline = time.monotonic() + self.settings.transaction_timeout_ms / 1000 + 5
        waited = False
        while time.monotonic() < deadline:
            pending = {
                rec.partition
                for rec in records
                if isinstance(rec.event, AdmissionRequest)
                and rec.event.approval_id not in self.tables.approvals
            }
            if not any(self.tables.approval_follower.unsettled(p) for p in pending):
                break
            waited = True
            time.sleep(0.2)
            self._catch_up()
            self.tables.settle(records)
        if waited:
            log.info("authority: waited for an open transaction on %s", sorted(missing))

    def handle(self, records: list[Record], out: Writer) -> None:
        """Decide every admission request of the batch."""
        self._catch_up()
        self.tables.settle(records)
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
                    Topic.OPERATING_EVENTS,
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
            approval = self.tables.approvals.get(request.approval_id)
            use = self.tables.uses.get(request.approval_id)  # this transaction's first
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
                unverifiable=self.tables.held_for(request.approval_id),
            )
            out.write(Topic.ADMISSIONS, request.operation_id, result.decision)
            if result.use is not None:
                self.tables.uses.put(request.approval_id, result.use)
                out.write(Topic.APPROVAL_USES, request.approval_id, result.use)
            if result.decision.reason != REASON_ADMITTED:
                out.write(
                    Topic.OPERATING_EVENTS,
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
        self.tables.close()
