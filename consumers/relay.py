"""The relay: the transactional outbox's other half.

It reads committed dispatches (``read_committed``), performs them against the
sinks, and records what it saw. For an ``EXECUTE`` dispatch it first commits
an ``ATTEMPTED`` receipt (so a restarted relay knows the request may have
left), then calls the sink with the operation ID as idempotency key and the
operation's fencing token, then writes the receipt in a transaction with its
consumer offsets. A dispatch it meets again after a crash is never sent
blindly: it reads the effect back first (or, for an idempotent sink without
readback, resubmits under the same key while the sink still keeps it), and
otherwise records an ambiguous outcome.

Where the sink's contract offers a postcondition query, the relay asks it
right after a committed execution and records the verdict (``MATCH`` or
``MISMATCH``) in the ``COMMITTED`` receipt itself: one record, one
transaction, and the processor verifies without a ``VERIFY`` dispatch, a
round trip through the processor less (``LEDGER_RELAY_INLINE_VERIFY``,
default on). A query that does not answer leaves the receipt plain, and
the ``VERIFY`` path verifies as before.

A sink whose contract offers reservations (try-confirm-cancel) is never
sent a plain submit: the relay reserves a bounded hold, then confirms it
only while the operation's admission still stands (its approval not
revoked, the policy version unchanged since admission) and cancels it
otherwise; a dispatch met again reads the hold back first (confirmed:
recorded; held: confirmed or cancelled as above; released by the sink:
reserved again under the same key while the admission stands). The check is
the pure rule :func:`ledger.authority.admission_withdrawn` over the
approvals and policy tables the relay follows (authenticated records only),
made right before the confirmation it guards: it can only withdraw an
admission, never grant one (docs/architecture.md, "How it works": who decides). Every end
of a hold is a receipt (``COMMITTED`` with ``reservation: CONFIRMED``,
``CANCELLED``, ``EXPIRED``), journaled by the processor.

A request that never reached its sink (the connection was refused or could
not be made, or the sink is not in the registry) cannot have made an effect:
the relay parks its dispatch and tries again after a growing backoff
(:func:`~ledger.contracts.after_unreached`, ``LEDGER_SINK_RETRY_*``), while it
goes on with every other dispatch; the consumer offset is held back at the
oldest parked dispatch of each partition, so a relay that crashes meets it
again. Once the budget is spent it records the request as never delivered (an
``UNREACHABLE`` receipt, or an ``UNKNOWN`` readback) with an operating event
(``SINK_UNREACHABLE`` or ``UNKNOWN_SINK``): the processor holds the operation
for a person, its admission intact, instead of abandoning it.

In ``checkpoint-only`` mode (the negative control) it does what naive
runtimes do: trusts only its own checkpoint (the committed offset) and
resubmits with a fresh attempt identity (and a fresh idempotency key, the
attempt's, so a sink that requires a key still makes a second effect).

A sink that refuses the relay's bearer token (401/403,
:class:`~ledger.errors.SinkAuthError`) refused that request before looking at
it, and the operation is not at fault: it is never a rejection. When the
refused request was the first and only submit of the dispatch, no effect was
made and the execution gets an ``UNAVAILABLE`` receipt (the processor
re-dispatches within its unavailable budget, as for an outage). When an
earlier request of the dispatch may have reached the sink (a resume, or a
readback after a timed-out submit), the execution is held ``AMBIGUOUS``
(UNKNOWN_OUTCOME, for reconciliation once the token is fixed); a readback or
postcondition is observed ``UNKNOWN``. Each comes with a ``SINK_AUTH_FAILED``
operating event naming the sink and the remedy, and the relay rereads the
sink registry before its next request, so a corrected token is picked up
without a restart.

Before it contacts a sink for a step, the relay checks the step against the
release manifest (``LEDGER_RELEASE_MANIFEST_FILE``, :mod:`ledger.upgrades`)
when the sink's contract version in the registry differs from the one the
operation's first attempt was sent under (else its dispatch's): the relay is
the one stage that knows the contract it is about to act under, and the fold
stays pure. A step the manifest does not allow is not sent; it is recorded as
the relay records any step it cannot complete (an ``AMBIGUOUS`` receipt or an
``UNKNOWN`` observation, in its own topics) with a ``CONTRACT_UPGRADE_HOLD``
operating event naming both versions. Every receipt carries the contract
version the relay acted under.

A corrupted sink registry or clock file never stops it: the content last read
well stands, the problem is logged and published once as a ``LOCAL_FILE``
operating event, and at start it waits for a readable file
(:mod:`consumers.localfiles`).
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from confluent_kafka import KafkaException, Message, TopicPartition

from consumers.localfiles import LastGood, LastGoodClock, clock_refused_event
from consumers.metrics import dispatch_outcome
from consumers.sinkpool import PassGuard, run_per_sink
from consumers.stage import Record, Stage, Writer, record_event
from consumers.tables import IDLE_SETTLE_S, TableFollower
from ledger.authority import admission_withdrawn, merge_approval, takes_over, version_in_force
from ledger.clock import ClockVerdict, clock_for
from ledger.contracts import (
    EffectContract,
    RetryBudget,
    after_unreached,
    fencing_token_for,
    judge_postcondition,
    marks_attempt_alone,
    postcondition_request,
    readback_unsupported,
    sends_idempotency_key,
)
from ledger.delivery import (
    MAX_HOLD_ROUNDS,
    MUTATING,
    READBACK_STATUS,
    Observed,
    Send,
    Situation,
    next_step,
)
from ledger.delivery import Observation as DeliveryObservation
from ledger.delivery import Receipt as DeliveryReceipt
from ledger.errors import (
    LedgerError,
    LocalFileError,
    SinkAuthError,
    SinkConfigError,
    SinkNotReachedError,
)
from ledger.events import (
    Approval,
    Dispatch,
    EffectReceipt,
    Event,
    OperatingEvent,
    PolicyChange,
    Readback,
)
from ledger.logs import bound_each
from ledger.tracing import trace_headers
from ledger.upgrades import ReleaseManifest, attempted_version, state_of_step, upgrade_hold
from sinks.client import HoldResult, postcondition_source
from sinks.port import SinkPort, open_sink, readback_source
from sinks.registry import RegistryFile, SinkEndpoint, load_manifest

#: One output of the relay: ``(short topic, key, event)``.
Output = tuple[str, str, Event]

log = logging.getLogger(__name__)


@dataclass
class Parked:
    """A dispatch waiting for its next try at a sink it could not reach.

    Attributes:
        dispatch: the dispatch.
        fresh: retry it as a first send (nothing of it can have left yet).
        readback_on_resume: for an execution whose readback could not be
            sent, retry that readback (with this ``on_resume``), never a send.
        partition: the dispatch's partition of ``dispatches``.
        offset: its offset (the relay's committed offset stays at or below it).
        failures: tries that did not reach the sink.
        first_at: monotonic time of the first failed try (seconds).
        next_at: monotonic time of the next try (seconds).
        last: the last failure.
        trace: the W3C trace headers of the dispatch's span (its next tries continue them).
    """

    dispatch: Dispatch
    fresh: bool
    readback_on_resume: bool | None
    partition: int
    offset: int
    failures: int
    first_at: float
    next_at: float
    last: SinkNotReachedError
    trace: dict[str, str] = field(default_factory=dict)


def _say(d: Dispatch, attempt: int, what: str, detail: str) -> None:
    """One INFO line about a request to a sink: operation, sink, attempt, fencing token."""
    log.info(
        "relay: %s %s %s at %s (dispatch %s, attempt %d, fencing token %d): %s",
        what,
        d.kind,
        d.operation_id,
        d.sink,
        d.dispatch_id,
        attempt,
        d.fencing_token,
        detail,
    )


def _say_outcome(d: Dispatch, attempt: int, event: Event) -> None:
    """One INFO line per receipt or readback the relay records for dispatch ``d``."""
    if isinstance(event, EffectReceipt):
        held = " (held as UNKNOWN_OUTCOME)" if event.status in {"AMBIGUOUS", "UNREACHABLE"} else ""
        checked = (
            ""
            if event.postcondition_status is None
            else f"; postcondition {event.postcondition_status} read right after it: "
            f"{event.postcondition_detail}"
        )
        _say(d, attempt, "outcome", f"receipt {event.status}{held}: {event.detail}{checked}")
    elif isinstance(event, Readback):
        held = " (held as UNKNOWN_OUTCOME)" if event.status == "UNKNOWN" else ""
        _say(d, attempt, "outcome", f"{event.kind} readback {event.status}{held}: {event.detail}")


def read_effect(
    client: SinkPort, contract: EffectContract, operation_id: str, token: int
) -> tuple[str, str, str | None]:
    """Read an effect back by operation ID.

    Sends the operation's fencing token when the sink fences; a sink without
    readback is ``UNSUPPORTED`` without a request (both as the contract says:
    :func:`~ledger.contracts.fencing_token_for`,
    :func:`~ledger.contracts.readback_unsupported`).

    Args:
        client: the sink's client.
        contract: the sink's contract.
        operation_id: the operation to read back.
        token: the operation's current fencing token.

    Returns:
        ``(ReadbackStatus, detail, effect_id)``; ``effect_id`` is ``None``
        unless the effect committed.
    """
    unsupported = readback_unsupported(contract)
    if unsupported is not None:
        return "UNSUPPORTED", unsupported, None
    rb = client.readback(operation_id, fencing_token_for(contract, token))
    return READBACK_STATUS[rb.status], rb.detail or rb.status, rb.effect_id


def _not_sent(
    d: Dispatch,
    detail: str,
    kind: Literal["SINK_UNREACHABLE", "UNKNOWN_SINK"],
    fresh: bool,
    readback_on_resume: bool | None,
) -> SinkNotReachedError:
    """The error for a dispatch whose next request could not be sent (or tried).

    The request is what performing the dispatch would have sent first: the
    submit of a fresh execution, the postcondition query of a verification,
    else a readback (of an execution met again after a crash: a resume's).
    """
    request: Literal["submit", "readback", "postcondition"] = (
        "postcondition"
        if d.kind == "VERIFY"
        else "submit"
        if d.kind == "EXECUTE" and fresh and readback_on_resume is None
        else "readback"
    )
    on_resume = d.on_resume if readback_on_resume is None else readback_on_resume
    if d.kind == "EXECUTE" and readback_on_resume is None and not fresh:
        on_resume = True
    return SinkNotReachedError(detail, kind=kind, request=request, on_resume=on_resume, sink=d.sink)


class Relay(Stage):
    """Consume-transform-produce stage delivering dispatches to sinks.

    Attributes:
        attempts: ``dispatch_id -> first attempt time (ms)`` for every
            dispatch an earlier run of the relay may have sent.
        mode: ``ledger`` or ``checkpoint-only``.
    """

    component = "relay"
    inputs = ("dispatches",)
    batch_size = 50

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        if self.settings.relay_mode not in ("ledger", "checkpoint-only"):
            raise ValueError(
                f"unknown relay mode {self.settings.relay_mode!r}: use ledger or checkpoint-only"
            )
        self.mode = self.settings.relay_mode
        #: Held for what the sink lanes share (:func:`~consumers.sinkpool.run_per_sink`):
        #: the producer's transactions, the tables, the registry, the clock.
        self._shared = threading.RLock()
        #: (key, operating event) to write with the next batch or, when idle,
        #: in a transaction of their own: local-file problems (key
        #: ``local-file``) and receipts its table refused (forged or
        #: undecodable; keyed by operation). A refused approval or policy
        #: record is reported by the authority kernel, which follows those
        #: tables too.
        self.notes: list[tuple[str, OperatingEvent]] = []
        self.clock = LastGoodClock(
            self.hooks.clock(clock_for(self.settings.clock, self.settings.run_dir)),
            component="relay",
            on_problem=self._local_file_problem,
            kind=self.settings.clock,
            max_skew_s=self.settings.clock_max_skew_s,
            on_refused=self._clock_refused,
            on_each_refusal=lambda: self.metrics.clock_refused(self.settings.clock),
        )
        #: The sink registry, re-read when the file changes (it names the sinks,
        #: their URLs, contracts and bearer tokens).
        self.registry = RegistryFile(self.settings.sinks_path())
        self._registry = LastGood(
            "sink registry",
            self.registry.current,
            component="relay",
            on_problem=self._local_file_problem,
        )
        self.attempts: dict[str, int] = {}
        #: dispatch_id -> the contract version its first attempt was sent under.
        self.attempt_versions: dict[str, int] = {}
        #: operation -> the contract version its latest receipt names (any
        #: dispatch, any epoch): what a later readback of its effect must be
        #: allowed to resume from (see :func:`~ledger.upgrades.attempted_version`).
        self.operation_versions: dict[str, int] = {}
        self._manifest: ReleaseManifest | None = None
        self._manifest_read = False
        #: Dispatches whose final receipt is already committed.
        self.completed: set[str] = set()
        #: sink -> its adapter, behind a :class:`~consumers.sinkpool.PassGuard`.
        self.clients: dict[str, SinkPort] = {}
        self._opened_for: dict[str, SinkEndpoint] = {}
        #: dispatch_id -> a dispatch waiting to try an unreachable sink again.
        self.parked: dict[str, Parked] = {}
        #: Sinks a request could not reach in the current pass: other dispatches
        #: to them are parked without a request, so that a sink that does not
        #: answer costs one connection timeout per pass, not one per dispatch.
        self.down_now: dict[str, SinkNotReachedError] = {}
        self.budget = RetryBudget(
            attempts=self.settings.sink_retry_attempts,
            first_backoff_ms=int(self.settings.sink_retry_backoff_s * 1000),
            max_backoff_ms=int(self.settings.sink_retry_max_backoff_s * 1000),
        )
        self.results: dict[tuple[int, int], list[Output]] = {}
        #: Partitions of ``dispatches`` this process has owned at some point.
        self.ever_held: set[int] = set()
        #: partition -> end offset when this process took it over from an
        #: earlier owner (crashed, stopped or rebalanced away): a verification
        #: below it is a resume of that owner's work (see :meth:`_resumed`).
        self.handover_below: dict[int, int] = {}
        self.observer = f"relay-{self.instance}"
        # Lazy: an assignment files the partitions' receipts by operation,
        # and an operation's are checked and applied when one of its
        # dispatches is met (or while idle), so a restart over a long history
        # costs the filing, not a decode and a seal check per receipt.
        self._receipts = TableFollower(
            self.settings,
            "receipts",
            self._apply_receipt,
            on_bad=self._bad_table_value,
            keyring=self.keyring,
            retry=self.retry,
            lazy=True,
        )
        #: Approvals (revocations merged) and the policy version in force, read
        #: (authenticated) only to check that a reservation's admission still
        #: stands before it is confirmed; followed from the first reservation on.
        self.approvals: dict[str, Approval] = {}
        #: The policy change in force (``None``: the configured version).
        self.policy_change: PolicyChange | None = None
        self._authority_followed = False
        # Lazy: every grant's Ed25519 signature is checked only when a
        # dispatch names it (a restart files the whole topic by key).
        self._approvals = TableFollower(
            self.settings,
            "approvals",
            self._apply_approval,
            keyring=self.keyring,
            retry=self.retry,
            lazy=True,
        )
        self._policy = TableFollower(
            self.settings, "policy", self._apply_policy, keyring=self.keyring, retry=self.retry
        )

    # ------------------------------------------------------------------ state

    @property
    def policy_version(self) -> int:
        """The policy version in force (derived from :attr:`policy_change`)."""
        return version_in_force(self.policy_change, self.settings.policy_version)

    def _apply_receipt(self, key: str, rec: Record | None) -> None:
        if rec is not None and isinstance(rec.event, EffectReceipt):
            r = rec.event
            if r.status != "ATTEMPTED":
                self.completed.add(r.dispatch_id)
            if r.status == "ATTEMPTED" and r.contract_version is not None:
                self.attempt_versions.setdefault(r.dispatch_id, r.contract_version)
            if r.contract_version is not None:
                self.operation_versions[r.operation_id] = r.contract_version  # latest wins
            first = self.attempts.get(r.dispatch_id)
            self.attempts[r.dispatch_id] = (
                r.first_attempt_at_ms if first is None else min(first, r.first_attempt_at_ms)
            )

    def on_assign(self, partitions: set[int]) -> None:
        """Learn which dispatches of these partitions were already attempted."""
        self.attempts.clear()
        self.attempt_versions.clear()
        self.operation_versions.clear()
        self.completed.clear()
        filed = self._receipts.follow(partitions)
        log.info("relay: %d receipts filed (applied when their operation is met)", filed)
        new = partitions - self.ever_held
        self.ever_held |= partitions
        self._note_handover(new)

    def _note_handover(self, partitions: set[int]) -> None:
        """Remember where an earlier owner's work ends on partitions taken over from it.

        A partition the relay's group had committed an offset for had an
        owner before this process: dispatches below its end offset at the
        takeover were that owner's to perform. A failure to ask is logged and
        the partition treated as not taken over (its verifications then write
        no recovery receipt; nothing else changes).
        """
        if not partitions or self.consumer is None:
            return
        topic = self.settings.topic("dispatches")
        consumer = self.consumer
        try:
            asked = [TopicPartition(topic, p) for p in sorted(partitions)]
            committed = consumer.committed(asked, timeout=10)
            for tp in committed:
                if tp.offset < 0:
                    continue  # the group never owned it: a first start, not a resume
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, tp.partition), timeout=10, cached=False
                )
                if high > tp.offset:
                    self.handover_below[tp.partition] = high
        except KafkaException as exc:
            log.warning("relay: could not read where the previous owner stopped: %s", exc)
        if self.handover_below:
            log.info("relay: took over dispatches below %s", self.handover_below)

    def _resumed(self, d: Dispatch, partition: int, offset: int) -> Dispatch:
        """A verification taken over from an earlier relay is performed as a resume.

        The relay that owned the partition before may have been reading the
        postcondition when it died (``after_commit_before_verification``):
        performing it again is safe (it only reads), and the readback says
        ``on_resume`` so that the processor writes the resume's recovery
        receipt. Executions need no such rule: their ``ATTEMPTED`` markers say
        exactly which ones may have left.
        """
        if (
            d.kind == "VERIFY"
            and not d.on_resume
            and offset < self.handover_below.get(partition, -1)
        ):
            return d.model_copy(update={"on_resume": True})
        return d

    def on_revoke(self, partitions: set[int]) -> None:
        """Forget parked dispatches of revoked partitions (their new owner meets them)."""
        for dispatch_id, p in list(self.parked.items()):
            if p.partition in partitions:
                del self.parked[dispatch_id]
        for partition in partitions:
            self.handover_below.pop(partition, None)

    def rebuild(self) -> None:
        """Drop results of the aborted transaction (they will be recomputed).

        Parked dispatches stay parked: met again after the rewind, they keep
        waiting for their next try.
        """
        self.results.clear()

    def after_commit(self) -> None:
        """Results are durable."""
        self.results.clear()

    # ------------------------------------------------------------------ sinks

    def on_start(self) -> None:
        """Read the sink registry and the clock, waiting while one is corrupted."""
        for wait in (self._registry.wait, self.clock.file.wait):
            wait(lambda: self.stopping)
            if self.stopping:
                return

    def _local_file_problem(self, exc: LocalFileError) -> None:
        """A corrupted local file becomes a ``LOCAL_FILE`` operating event (once per problem)."""
        self.notes.append(
            (
                "local-file",
                OperatingEvent(
                    event_id=f"relay-{self.instance}:LOCAL_FILE:{uuid.uuid4().hex[:12]}",
                    component="relay",
                    kind="LOCAL_FILE",
                    reason=exc.message,
                ),
            )
        )

    def _clock_refused(self, reading_ms: int, verdict: ClockVerdict) -> None:
        """A refused clock reading becomes a ``CLOCK_REFUSED`` operating event (once per run)."""
        self.notes.append(
            (
                "clock",
                clock_refused_event(
                    f"relay-{self.instance}", "relay", self.settings.clock, reading_ms, verdict
                ),
            )
        )

    def _endpoint(self, name: str) -> SinkEndpoint | None:
        """The sink's entry as the registry file says now (``None``: not registered).

        The file is re-read when it changes; while it is corrupted, the content
        last read well stands (a ``LOCAL_FILE`` operating event says so).

        Raises:
            LocalFileError: the registry is corrupted and was never read well.
        """
        with self._shared:
            return self._registry.read().get(name)

    def _version_of(self, sink: str) -> int | None:
        """The sink's contract version in the registry now (``None``: unknown)."""
        try:
            endpoint = self._endpoint(sink)
        except LocalFileError:
            return None
        return endpoint.contract_version if endpoint is not None else None

    def _release_manifest(self) -> ReleaseManifest | None:
        """The release manifest (``LEDGER_RELEASE_MANIFEST_FILE``), read once.

        An unreadable manifest counts as none (every change of contract
        version then holds what it meets) and is logged.
        """
        with self._shared:
            return self._read_manifest()

    def _read_manifest(self) -> ReleaseManifest | None:
        if not self._manifest_read:
            self._manifest_read = True
            path = self.settings.release_manifest_file
            if path is not None:
                try:
                    self._manifest = load_manifest(path)
                except LocalFileError as exc:
                    log.error("relay: %s", exc.message)
        return self._manifest

    def _upgrade_hold(
        self, d: Dispatch, endpoint: SinkEndpoint, now: int, *, may_have_left: bool
    ) -> list[Output] | None:
        """Hold a step that the release manifest does not allow under the sink's new contract.

        The version the step resumes from is
        :func:`~ledger.upgrades.attempted_version`: for an execution that may
        have left, the version its attempt was sent under; for a readback or
        a postcondition, the version of the operation's latest receipt (any
        dispatch); else the dispatch's (``None``:
        version 1). When it differs from the registry's and the manifest does not let
        the new version resume the step's state (:func:`~ledger.upgrades.upgrade_hold`),
        nothing is sent: an execution is recorded ``AMBIGUOUS`` (the fold
        holds it as UNKNOWN_OUTCOME), a readback or postcondition as observed
        ``UNKNOWN``, each with a ``CONTRACT_UPGRADE_HOLD`` operating event; the
        reason names both versions. When the manifest allows it, the contract
        rules decide the step as always.

        Returns:
            The outputs of the hold, or ``None`` when the step may go on.
        """
        from_version = attempted_version(
            d,
            may_have_left=may_have_left,
            dispatch_attempt=self.attempt_versions.get(d.dispatch_id),
            operation_attempt=self.operation_versions.get(d.operation_id),
        )
        reason = upgrade_hold(
            self._release_manifest(),
            d.sink,
            from_version=from_version,
            to_version=endpoint.contract_version,
            contract=endpoint.contract,
            state=state_of_step(d.kind, may_have_left=may_have_left),
        )
        if reason is None:
            return None
        log.warning("relay: %s held: %s", d.dispatch_id, reason)
        outcome: Output
        if d.kind == "EXECUTE":
            first = self.attempts.get(d.dispatch_id, now)
            sent = f"the request may have reached {d.sink}" if may_have_left else "nothing was sent"
            outcome = (
                "receipts",
                d.operation_id,
                # Nothing was sent under the new version: the receipt names the
                # version the effect was attempted under, so that it survives
                # compaction of the earlier receipts (an operation's receipts
                # share its key) as the evidence the next resume is held on.
                self._receipt(
                    d,
                    "AMBIGUOUS",
                    first,
                    now,
                    f"{sent}; {reason}",
                    on_resume=may_have_left,
                    contract_version=from_version,
                ),
            )
        else:
            outcome = self._unobserved(d, reason, now)
        return [outcome, _dispatch_event(d, "CONTRACT_UPGRADE_HOLD", reason)]

    def _client(self, name: str, endpoint: SinkEndpoint) -> SinkPort:
        """The adapter of sink ``name``, opened again when its registry entry changed.

        Raises:
            SinkConfigError: when the entry names an unknown adapter or an invalid config.
        """
        with self._shared:
            client = self.clients.get(name)
            if client is None or self._opened_for.get(name, endpoint) != endpoint:
                if client is not None:
                    client.close()
                deadline_s = endpoint.deadline_s(self.settings.sink_timeout_s)
                opened = open_sink(
                    endpoint,
                    timeout_s=deadline_s,
                    name=name,
                    max_response_bytes=self.settings.sink_max_response_bytes,
                )
                client = PassGuard(opened, name, deadline_s)
                self.clients[name] = client
            elif not isinstance(client, PassGuard):  # an adapter put there by hand (tests)
                client = PassGuard(client, name, endpoint.deadline_s(self.settings.sink_timeout_s))
                self.clients[name] = client
            self._opened_for[name] = endpoint
            return client

    def _now_ms(self) -> int:
        """The relay's clock, read by one sink lane at a time."""
        with self._shared:
            return self.clock.now_ms()

    # ------------------------------------------------------------------ work

    def before_transaction(self, records: list[Record]) -> None:
        """Commit ATTEMPTED markers, then perform every dispatch of the batch."""
        assert self.producer is not None
        self._retry_due(commit_offsets=False)  # starts a new pass (down_now)
        for rec in records:
            self.clock.observe(rec.timestamp_ms)
        now = self.clock.now_ms()
        # What the receipts say about these operations, before anything is decided.
        for rec in records:
            if isinstance(rec.event, Dispatch):
                self._receipts.settle(rec.event.operation_id)
        fresh: list[Dispatch] = []
        for rec in self.spans.each(records):
            d = rec.event
            if (
                isinstance(d, Dispatch)
                and d.kind == "EXECUTE"
                and self.mode == "ledger"
                and d.dispatch_id not in self.attempts
                and d.dispatch_id not in self.parked
            ):
                fresh.append(d)
        # Dispatches to a sink that can be read back are marked together; one
        # that cannot is marked just before its own send and its receipt
        # committed just after, so that a crash leaves ambiguous only the one
        # request that may have left without its receipt.
        one_by_one = {d.dispatch_id for d in fresh if self._marks_alone(d.sink)}
        self._mark_attempted([d for d in fresh if d.dispatch_id not in one_by_one], now)
        fresh_ids = {d.dispatch_id for d in fresh}
        # Each sink's dispatches in order, the sinks' at once (consumers.sinkpool);
        # a job runs in its record's context (its span and log fields).
        jobs: list[tuple[str, Callable[[], object]]] = []
        for rec in bound_each(self.spans.each(records), lambda r: r.key):
            d = rec.event
            if not isinstance(d, Dispatch):
                continue
            d = self._resumed(d, rec.partition, rec.offset)
            at = (rec.partition, rec.offset)
            parked = self.parked.get(d.dispatch_id)
            if parked is not None:
                # Met again after a rewind: it keeps waiting for its next try.
                parked.partition, parked.offset = rec.partition, rec.offset
                self.results[at] = []
            elif self.mode == "ledger" and d.kind == "EXECUTE" and d.dispatch_id in self.completed:
                self.results[at] = []  # its receipt is in the ledger already
            else:
                job = self._alone_job if d.dispatch_id in one_by_one else self._batch_job
                ctx = contextvars.copy_context()
                fresh_send = d.dispatch_id in fresh_ids
                jobs.append((d.sink, partial(ctx.run, job, d, at, now, fresh_send)))
        run_per_sink(jobs)

    def _batch_job(self, d: Dispatch, at: tuple[int, int], now: int, fresh: bool) -> None:
        """Perform ``d``; its outputs are written with the batch (see :meth:`handle`)."""
        self.results[at] = self._attempt(d, at[0], at[1], fresh=fresh)

    def _alone_job(self, d: Dispatch, at: tuple[int, int], now: int, fresh: bool) -> None:
        """Mark ``d`` attempted, perform it and commit its receipt at once (a sink without
        readback: a crash leaves ambiguous only the one request of its lane in flight)."""
        self._mark_attempted([d], now)
        outputs = self._attempt(d, at[0], at[1], fresh=True)
        if d.dispatch_id not in self.parked:
            self._commit_outputs(outputs)
            self.completed.add(d.dispatch_id)
        self.results[at] = []

    def idle(self) -> None:
        """Try parked dispatches whose backoff has passed (see :meth:`_retry_due`).

        Then apply some filed receipts and approvals (:data:`IDLE_SETTLE_S`),
        so that what a restart filed is soon held as compactly as before.
        """
        self._retry_due(commit_offsets=True)
        for table in (self._receipts, self._approvals):
            if table.held:
                table.settle_some(IDLE_SETTLE_S)
        if self.notes and self.producer is not None:
            # Operating events only: no offsets, no authority in them.
            self.producer.begin_transaction()
            self._write_notes(self.writer())
            self._commit()

    def _bad_table_value(self, msg: Message, reason: str, kind: str) -> None:
        """A receipt the relay's table refuses becomes an operating event.

        The table treats it as absent: a forged receipt completes nothing,
        a forged tombstone forgets no attempt (see
        :meth:`consumers.stage.Stage.table_refusal`).
        """
        self.notes.append(self.table_refusal(msg, reason, kind, keyed_by_operation=True))

    def _write_notes(self, out: Writer) -> None:
        for key, event in self.notes:
            out.write("operating-events", key, event)
        self.notes.clear()

    # ------------------------------------------------------------------ unreachable sinks

    def _attempt(
        self,
        d: Dispatch,
        partition: int,
        offset: int,
        *,
        fresh: bool,
        readback_on_resume: bool | None = None,
    ) -> list[Output]:
        """Perform a dispatch; one that did not reach its sink is parked (no outputs yet).

        Returns:
            The outputs to write, or ``[]`` when the dispatch was parked for
            another try; once the retry budget is spent, the outputs that
            hold the operation for a person (:meth:`_unreached`).
        """
        down = self.down_now.get(d.sink)
        if down is not None:
            detail = f"not tried: {d.sink} could not be reached a moment ago ({down.detail})"
            exc = _not_sent(d, detail, "SINK_UNREACHABLE", fresh, readback_on_resume)
            return self._park(d, exc, partition, offset, fresh=fresh)
        attempt = self.parked[d.dispatch_id].failures + 1 if d.dispatch_id in self.parked else 1
        _say(d, attempt, "sending", "fresh" if fresh else "sent before: read back first")
        started = time.monotonic()
        try:
            outputs = self._perform_safely(d, fresh=fresh, readback_on_resume=readback_on_resume)
        except SinkNotReachedError as exc:
            self.metrics.dispatched(d.sink, d.kind, "NOT_REACHED", time.monotonic() - started)
            _say(d, attempt, "not sent", f"{exc.kind}: {exc.detail}")
            if exc.kind == "SINK_UNREACHABLE":
                self.down_now[d.sink] = exc
            outputs = self._park(d, exc, partition, offset, fresh=fresh)
        else:
            outcome = dispatch_outcome(event for _, _, event in outputs)
            self.metrics.dispatched(d.sink, d.kind, outcome, time.monotonic() - started)
            # Reached at last: no longer parked (if its outcome is then lost with
            # an aborted transaction, the dispatch is met again and read back).
            self.parked.pop(d.dispatch_id, None)
        for _, _, event in outputs:  # none while parked; once the budget is spent, the hold
            _say_outcome(d, attempt, event)
        return outputs

    def _park(
        self, d: Dispatch, exc: SinkNotReachedError, partition: int, offset: int, *, fresh: bool
    ) -> list[Output]:
        """Park a dispatch for another try, or give up on it once the budget is spent."""
        now = time.monotonic()
        before = self.parked.get(d.dispatch_id)
        failures = (before.failures if before else 0) + 1
        first_at = before.first_at if before else now
        decision = after_unreached(
            self.budget, failures=failures, waited_ms=int((now - first_at) * 1000)
        )
        if decision.retry:
            # What is retried is what could not be sent: a first send only if
            # nothing of this dispatch has left yet, else the readback.
            readback = exc.on_resume if d.kind == "EXECUTE" and exc.request == "readback" else None
            self.parked[d.dispatch_id] = Parked(
                dispatch=d,
                fresh=fresh and exc.request == "submit",
                readback_on_resume=readback,
                partition=partition,
                offset=offset,
                failures=failures,
                first_at=first_at,
                next_at=now + decision.delay_ms / 1000,
                last=exc,
                trace=before.trace if before is not None else trace_headers(),
            )
            log.warning(
                "relay: %s did not reach %s (%s); %s, next try in %.1f s",
                d.dispatch_id,
                d.sink,
                exc.detail,
                decision.reason,
                decision.delay_ms / 1000,
            )
            return []
        self.parked.pop(d.dispatch_id, None)
        return self._unreached(d, exc, decision.reason)

    def _unreached(self, d: Dispatch, exc: SinkNotReachedError, why: str) -> list[Output]:
        """The retry budget is spent: record what could not be sent, and say so."""
        now = self._now_ms()
        detail = f"{exc.detail}; {why}"
        log.error("relay: giving up on %s at %s: %s", d.dispatch_id, d.sink, detail)
        outcome: Output
        if exc.request == "submit":
            first = self.attempts.get(d.dispatch_id, now)
            outcome = (
                "receipts",
                d.operation_id,
                self._receipt(d, "UNREACHABLE", first, now, detail),
            )
        else:
            kind = "POSTCONDITION" if exc.request == "postcondition" else "EFFECT"
            on_resume = exc.on_resume if exc.request == "readback" else d.on_resume
            outcome = self._observation(
                d, kind, "UNKNOWN", d.sink, f"not observed: {detail}", now, on_resume=on_resume
            )
        return [
            outcome,
            _dispatch_event(
                d,
                exc.kind,
                (
                    f"{d.kind} of {d.operation_id}: the {exc.request} never reached sink {d.sink} "
                    f"({detail}); the operation is held for a person: start the sink or fix its "
                    f"entry in {self.registry.path}, then 'ledger reconcile run'"
                ),
            ),
        ]

    def _retry_due(self, *, commit_offsets: bool) -> None:
        """Try again every parked dispatch whose backoff has passed.

        Outcomes (an answer from the sink, or a spent budget) are committed in
        their own transaction; a dispatch that again did not reach its sink
        stays parked with a longer backoff. Called before every batch (then
        the batch's own commit moves the offsets) and when the relay is idle
        (``commit_offsets``: every consumed record is then handled, so the
        positions, held back at the dispatches still parked, are committed
        with the outcomes). Each call starts a new pass: a sink that could not
        be reached in it is not asked again until the next pass.

        Raises:
            KafkaException: from the transaction (the stage loop recovers; a
                dispatch whose outcome was lost is met again and read back).
        """
        self.down_now.clear()
        for guard in self.clients.values():
            if isinstance(guard, PassGuard):
                guard.new_pass()
        now = time.monotonic()
        due = sorted((p for p in self.parked.values() if p.next_at <= now), key=lambda p: p.next_at)
        if not due or self.producer is None:
            return
        if not self._still_a_member(between_batches=commit_offsets):
            return
        finished: list[tuple[Parked, list[Output]]] = []
        done: list[Parked] = []
        jobs: list[tuple[str, Callable[[], object]]] = []
        for p in bound_each(due, lambda p: p.dispatch.operation_id):
            self._receipts.settle(p.dispatch.operation_id)  # refiled by a reassignment meanwhile
            ctx = contextvars.copy_context()
            jobs.append((p.dispatch.sink, partial(ctx.run, self._retry_job, p, finished, done)))
        run_per_sink(jobs)
        any_done = bool(done)
        if not any_done or not (finished or commit_offsets):
            self.spans.end()
            return
        self.producer.begin_transaction()
        out = self.writer()
        for p, outputs in finished:
            with self.spans.of_operation(p.dispatch.operation_id):
                for topic, key, event in outputs:
                    out.write(topic, key, event)
        if commit_offsets and self.consumer is not None:
            positions = self.consumer.position(self.consumer.assignment())
            offsets = [tp for tp in positions if tp.offset >= 0]
            if offsets:
                self._send_offsets(offsets)
        self._commit()
        self.spans.end()
        for p, _ in finished:
            self._done(p.dispatch)

    def _retry_job(
        self, p: Parked, finished: list[tuple[Parked, list[Output]]], done: list[Parked]
    ) -> None:
        """Try parked ``p`` again (a sink lane's job of :meth:`_retry_due`)."""
        d = p.dispatch
        with self.spans.continued(d.operation_id, p.trace, "relay retry Dispatch"):
            outputs = self._attempt(
                d, p.partition, p.offset, fresh=p.fresh, readback_on_resume=p.readback_on_resume
            )
        if d.dispatch_id in self.parked:
            return
        done.append(p)
        if self._marks_alone(d.sink):
            # As for a first send: its receipt committed just after it.
            with self.spans.of_operation(d.operation_id):
                self._commit_outputs(outputs)
            self._done(p.dispatch)
        else:
            finished.append((p, outputs))

    def _still_a_member(self, *, between_batches: bool) -> bool:
        """Prove this relay still belongs to its group before parked dispatches are tried again.

        A relay paused past its session (a zombie) may hold parked
        dispatches its successor has since read back and sent again under
        the same fencing token: only an idempotency key would then keep a
        second effect out. An offsets-only transaction
        (:meth:`~consumers.stage.Stage._prove_membership`) is refused by the
        group coordinator from such a member, and then nothing is sent. The
        offsets are where the current batch starts, or between batches the
        consumer's positions (both held back at parked dispatches).

        Returns:
            ``False`` when there is nothing to prove it with (no position:
            nothing assigned), and no retry should be made.

        Raises:
            KafkaException: the transaction failed (a zombie: abortable); the
                stage loop recovers and nothing was sent.
        """
        assert self.producer is not None
        offsets: list[TopicPartition] | None = None
        if between_batches:
            if self.consumer is None:
                return False
            positions = self.consumer.position(self.consumer.assignment())
            offsets = [tp for tp in positions if tp.offset >= 0]
            if not offsets:
                return False
        elif not self.batch_starts:
            return False
        self.producer.begin_transaction()
        self._prove_membership(offsets)
        self._commit()
        return True

    def _done(self, d: Dispatch) -> None:
        """A parked dispatch's outcome is committed: a redelivery of it is skipped."""
        if d.kind == "EXECUTE":
            self.completed.add(d.dispatch_id)

    def _held_back(self, offsets: list[TopicPartition]) -> list[TopicPartition]:
        """Offsets to commit: never past the oldest parked dispatch of a partition."""
        if not self.parked:
            return offsets
        floor: dict[int, int] = {}
        for p in self.parked.values():
            floor[p.partition] = min(floor.get(p.partition, p.offset), p.offset)
        topic = self.settings.topic("dispatches")
        return [
            TopicPartition(tp.topic, tp.partition, min(tp.offset, floor[tp.partition]))
            if tp.topic == topic and tp.partition in floor
            else tp
            for tp in offsets
        ]

    def _send_offsets(self, offsets: list[TopicPartition], *args: Any, **kwargs: Any) -> None:
        """The stage's offset commit, held back at parked dispatches (see :meth:`_held_back`)."""
        super()._send_offsets(self._held_back(offsets), *args, **kwargs)

    def _marks_alone(self, sink: str) -> bool:
        try:
            endpoint = self._endpoint(sink)
        except LocalFileError:
            return False  # the dispatch's own handling reports the registry
        return endpoint is not None and marks_attempt_alone(endpoint.contract)

    def _commit_outputs(self, outputs: list[Output]) -> None:
        """Commit one dispatch's receipt at once (its offset follows with the batch)."""
        assert self.producer is not None
        with self._shared:
            self.producer.begin_transaction()
            out = self.writer()
            for topic, key, event in outputs:
                out.write(topic, key, event)
            self._commit()

    def _mark_attempted(self, dispatches: list[Dispatch], now: int) -> None:
        """Commit ATTEMPTED receipts: from here on these dispatches may have left.

        The markers' transaction carries the batch's start offsets
        (:meth:`~consumers.stage.Stage._prove_membership`), so a relay that
        lost its partitions while paused (a zombie, whose successor read the
        receipts without these markers and may have sent the same dispatches)
        cannot commit them, and so sends nothing.

        Raises:
            KafkaException: the transaction failed (a zombie: abortable); the
                stage loop recovers and nothing was sent.
        """
        if not dispatches:
            return
        with self._shared:
            self._mark_attempted_now(dispatches, now)

    def _mark_attempted_now(self, dispatches: list[Dispatch], now: int) -> None:
        assert self.producer is not None
        self.producer.begin_transaction()
        out = self.writer()
        for d in dispatches:
            with self.spans.of_operation(d.operation_id):  # the marker continues its trace
                out.write("receipts", d.operation_id, self._attempt_marker(d, now))
        self._prove_membership()
        self._commit()
        for d in dispatches:
            self.attempts[d.dispatch_id] = now
            version = self._version_of(d.sink)
            if version is not None:
                self.attempt_versions.setdefault(d.dispatch_id, version)
                self.operation_versions[d.operation_id] = version

    def handle(self, records: list[Record], out: Writer) -> None:
        """Write the receipts and readbacks gathered by :meth:`before_transaction`."""
        self._write_notes(out)
        for rec in self.spans.each(records):
            if not isinstance(rec.event, Dispatch):
                out.write(
                    "operating-events",
                    rec.key,
                    record_event(
                        "relay",
                        rec,
                        "BAD_INPUT",
                        f"{rec.event.KIND} is not a dispatch",
                        operation_id=rec.key,
                    ),
                )
                continue
            for topic, key, event in self.results.get((rec.partition, rec.offset), []):
                out.write(topic, key, event)

    def before_commit(self, records: list[Record]) -> None:
        """Seam: the receipt is written but its transaction not committed."""
        for rec in records:
            if isinstance(rec.event, Dispatch) and rec.event.kind == "EXECUTE":
                self.hooks.seam("after_receipt_before_commit", rec.event.operation_id)

    def _attempt_marker(self, d: Dispatch, now: int) -> EffectReceipt:
        return EffectReceipt(
            operation_id=d.operation_id,
            dispatch_id=d.dispatch_id,
            status="ATTEMPTED",
            sink=d.sink,
            attempt_id=d.dispatch_id,
            fencing_token=d.fencing_token,
            observed_at_ms=now,
            first_attempt_at_ms=now,
            detail="about to send",
            observer=self.observer,
            contract_version=self._version_of(d.sink),
        )

    def _perform_safely(
        self, d: Dispatch, *, fresh: bool, readback_on_resume: bool | None = None
    ) -> list[Output]:
        """:meth:`_perform`, with a failure confined to its own operation.

        A sink answering outside its protocol, a corrupted registry entry or
        any other error while handling this one dispatch never stops the
        relay (DESIGN.md "Trust boundary": nothing one operation does can stop
        a stage). The request may have left, so an execution is recorded as
        ``AMBIGUOUS`` (the fold holds the operation as UNKNOWN_OUTCOME) and a
        readback or postcondition as observed ``UNKNOWN``, each with a
        ``SINK_PROTOCOL_ERROR`` operating event naming the error. Kafka errors
        are the stage loop's and pass through, and so does :class:`SinkNotReachedError`
        (a request that never reached the sink is retried, see :meth:`_park`).
        """
        try:
            if readback_on_resume is not None:
                return self._perform(d, fresh=fresh, readback_on_resume=readback_on_resume)
            return self._perform(d, fresh=fresh)
        except (KafkaException, SinkNotReachedError):
            raise
        except SinkAuthError as exc:
            return self._auth_failed(d, exc, fresh=fresh)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.error("relay: %s failed: %s", d.dispatch_id, reason)
            now = self._now_ms()
            first = self.attempts.get(d.dispatch_id, now)
            detail = f"the request may have reached {d.sink}; it failed with {reason}"
            outcome: tuple[str, str, Event]
            if d.kind == "EXECUTE":
                outcome = (
                    "receipts",
                    d.operation_id,
                    self._receipt(d, "AMBIGUOUS", first, now, detail),
                )
            else:
                outcome = self._unobserved(d, detail, now)
            return [
                outcome,
                _dispatch_event(
                    d, "SINK_PROTOCOL_ERROR", f"{d.kind} of {d.operation_id} at {d.sink}: {reason}"
                ),
            ]

    def _auth_failed(
        self, d: Dispatch, exc: SinkAuthError, *, fresh: bool
    ) -> list[tuple[str, str, Event]]:
        """The sink refused our token: retry or hold, never reject (see the module docstring).

        Args:
            d: the dispatch being handled.
            exc: the refusal.
            fresh: no earlier run of the relay may have sent this dispatch.

        Returns:
            An ``UNAVAILABLE`` receipt (a fresh execution whose submit was
            refused: nothing reached the sink), an ``AMBIGUOUS`` one (an
            execution an earlier request of which may have reached it), or an
            ``UNKNOWN`` observation (readback, postcondition); and a
            ``SINK_AUTH_FAILED`` operating event.
        """
        now = self._now_ms()
        reason = (
            f"sink {d.sink} refused the relay's bearer token (HTTP {exc.http_status}); no effect "
            f"was made. Set the 'token' of {d.sink} in {self.settings.sinks_path()} to the token "
            "the sink was started with"
        )
        log.error("relay: %s (%s)", reason, d.dispatch_id)
        outcome: tuple[str, str, Event]
        if d.kind == "EXECUTE":
            first = self.attempts.get(d.dispatch_id, now)
            only_send_refused = fresh and self.mode == "ledger" and exc.method == "POST"
            status = "UNAVAILABLE" if only_send_refused else "AMBIGUOUS"
            if not only_send_refused:
                reason = f"an earlier request may have reached {d.sink}; {reason}"
            outcome = ("receipts", d.operation_id, self._receipt(d, status, first, now, reason))
        else:
            outcome = self._unobserved(d, reason, now)
        return [outcome, _dispatch_event(d, "SINK_AUTH_FAILED", reason)]

    def _perform(
        self, d: Dispatch, *, fresh: bool, readback_on_resume: bool | None = None
    ) -> list[Output]:
        endpoint = self._endpoint(d.sink)
        now = self._now_ms()
        if endpoint is None:
            problem = self.registry.problem(d.sink) or f"sink {d.sink!r} is not registered"
            raise _not_sent(d, problem, "UNKNOWN_SINK", fresh, readback_on_resume)
        if self.mode == "ledger":
            held = self._upgrade_hold(
                d, endpoint, now, may_have_left=not fresh or readback_on_resume is not None
            )
            if held is not None:
                return held
        try:
            client = self._client(d.sink, endpoint)
        except SinkConfigError as exc:  # an unknown adapter, a bad config: nothing was sent
            raise _not_sent(d, exc.message, "UNKNOWN_SINK", fresh, readback_on_resume) from exc
        contract = endpoint.contract
        if d.kind == "VERIFY":
            self.hooks.seam("after_commit_before_verification", d.operation_id)
            return [self._verify(d, client, contract, now)]
        first = now if self.mode == "checkpoint-only" else self.attempts.get(d.dispatch_id, now)
        outputs = self._deliver(
            d,
            client,
            contract,
            fresh=fresh,
            readback_on_resume=readback_on_resume,
            first=first,
            now=now,
        )
        if (
            d.kind == "EXECUTE"
            and self.mode == "ledger"
            and not contract.reservation
            and len(outputs) == 1
        ):
            return [self._read_postcondition_at_once(d, client, contract, outputs[0])]
        return outputs

    def _deliver(
        self,
        d: Dispatch,
        client: SinkPort,
        contract: EffectContract,
        *,
        fresh: bool,
        readback_on_resume: bool | None,
        first: int,
        now: int,
    ) -> list[Output]:
        """Execute the pure delivery decision (:func:`ledger.delivery.next_step`) for ``d``.

        Each decision's records become outputs (its crash seam first), then its
        request is sent and the answer joins the episode's history, until a
        decision ends the episode. A request that could not be sent raises
        :class:`SinkNotReachedError` (parked within the retry budget).

        Raises:
            SinkNotReachedError: the next request never left.
            LedgerError: a dispatch that predates the digest's inputs (held by the caller).
        """
        kind: Literal["EXECUTE", "READBACK"] = "READBACK" if d.kind == "READBACK" else "EXECUTE"
        history: list[Observed] = []
        outputs: list[Output] = []
        attempt_id = d.dispatch_id
        for _ in range(4 * MAX_HOLD_ROUNDS + 4):  # every branch ends within a few steps
            withdrawn = (
                self._admission_withdrawn(d)
                if contract.reservation and history and kind == "EXECUTE"
                else None
            )
            situation = Situation(
                kind=kind,
                mode=self.mode,
                fresh=fresh,
                first_attempt_ms=first,
                now_ms=now,
                readback_on_resume=readback_on_resume,
                on_resume=d.on_resume,
                admission_withdrawn=withdrawn,
                sink=d.sink,
            )
            decision = next_step(contract, situation, history)
            for record in decision.records:
                if isinstance(record, DeliveryReceipt) and record.seam is not None:
                    self.hooks.seam(record.seam, d.operation_id)
                outputs.append(self._record(d, record, first, now, attempt_id, client))
            if decision.not_reached is not None:
                nr = decision.not_reached
                raise SinkNotReachedError(
                    nr.detail, kind="SINK_UNREACHABLE", request=nr.request, on_resume=nr.on_resume
                )
            send = decision.send
            if send is None:
                return outputs
            if send.seam is not None:
                self.hooks.seam(send.seam, d.operation_id)
            try:
                answer, attempt_id = self._request(d, client, contract, send)
            except SinkConfigError as exc:
                # The adapter refused its own configuration before sending (a
                # template, a credential, a table): nothing left, so this is
                # parked and retried like a request that never left, then held
                # with the remedy, never recorded as "may have reached" the sink.
                request: Literal["submit", "readback"] = (
                    "submit" if send.request in MUTATING and not history else "readback"
                )
                raise SinkNotReachedError(
                    exc.message,
                    kind="UNKNOWN_SINK",
                    request=request,
                    on_resume=bool(history) or not fresh,
                ) from exc
            history.append(Observed.of(send.request, answer, resubmit=send.resubmit))
        raise LedgerError(
            f"delivery of {d.dispatch_id} did not end after {len(history)} requests "
            f"({[o.request + ':' + o.status for o in history]}); held for a person",
            operation_id=d.operation_id,
        )

    def _record(
        self,
        d: Dispatch,
        record: DeliveryReceipt | DeliveryObservation,
        first: int,
        now: int,
        attempt_id: str,
        client: SinkPort,
    ) -> Output:
        """The output of one record a delivery decision asks for."""
        if isinstance(record, DeliveryObservation):
            source = f"{d.sink} {readback_source(client, d.operation_id)}"
            return self._observation(
                d,
                "EFFECT",
                record.status,
                source,
                record.detail,
                now,
                effect_id=record.effect_id,
                on_resume=record.on_resume,
            )
        receipt = self._receipt(
            d,
            record.status,
            first,
            now,
            record.detail,
            effect_id=record.effect_id,
            attempt_id=attempt_id,
            on_resume=record.on_resume,
            reservation=record.reservation,
        )
        return ("receipts", d.operation_id, receipt)

    def _request(
        self, d: Dispatch, client: SinkPort, contract: EffectContract, send: Send
    ) -> tuple[Any, str]:
        """Send one request a decision asks for; the answer and the attempt's identity."""
        token = fencing_token_for(contract, d.fencing_token)
        if send.request == "readback":
            return client.readback(d.operation_id, token), d.dispatch_id
        if send.request == "read_hold":
            return client.read_hold(d.operation_id, token), d.dispatch_id
        if send.request == "confirm":
            return client.confirm(d.operation_id, token), d.dispatch_id
        if send.request == "cancel":
            return client.cancel(d.operation_id, token), d.dispatch_id
        if send.request == "reserve":
            return self._reserve(d, client, contract), d.dispatch_id
        return self._submit(d, client, contract, fresh_identity=send.fresh_identity)

    # ------------------------------------------------------------------ reservations

    def _admission_withdrawn(self, d: Dispatch) -> str | None:
        """Why the dispatch's admission no longer stands, or ``None`` (see module docstring).

        Reads the approvals and policy tables up to their current end first
        (authenticated records only), then applies the pure rule
        :func:`~ledger.authority.admission_withdrawn`.
        """
        with self._shared:
            return self._withdrawn_now(d)

    def _withdrawn_now(self, d: Dispatch) -> str | None:
        if not self._authority_followed:
            self._approvals.follow(set(range(self.settings.partitions)))
            self._policy.follow({0})
            self._authority_followed = True
        else:
            self._approvals.catch_up()
            self._policy.catch_up()
        if d.approval_id is not None:
            self._approvals.settle(d.approval_id)
        approval = self.approvals.get(d.approval_id) if d.approval_id is not None else None
        return admission_withdrawn(d.approval_id, approval, self.policy_version)

    def _apply_approval(self, key: str, rec: Record | None) -> None:
        if rec is not None and isinstance(rec.event, Approval) and rec.event.approval_id == key:
            self.approvals[key] = merge_approval(self.approvals.get(key), rec.event).approval

    def _apply_policy(self, key: str, rec: Record | None) -> None:
        # The kernel's rules; the kernel reports what they refuse.
        if (
            rec is not None
            and isinstance(rec.event, PolicyChange)
            and takes_over(key, rec.event, self.policy_change)
        ):
            self.policy_change = rec.event

    def _reserve(self, d: Dispatch, client: SinkPort, contract: EffectContract) -> HoldResult:
        """Take (or take again) the hold for dispatch ``d`` under the operation's key."""
        params: dict[str, Any] = json.loads(d.params_json)
        if d.subject is None or d.purpose is None or d.decision_version is None:
            raise LedgerError(
                f"dispatch {d.dispatch_id} predates schema version 2 and lacks the inputs of "
                "its parameter digest that the sink checks; a person decides",
                operation_id=d.operation_id,
            )
        return client.reserve(
            d.operation_id,
            d.parameter_digest,
            params,
            fencing_token_for(contract, d.fencing_token),
            d.dispatch_id,
            action=d.action,
            subject=d.subject,
            purpose=d.purpose,
            decision_version=d.decision_version,
        )

    def _receipt(
        self,
        d: Dispatch,
        status: str,
        first: int,
        now: int,
        detail: str,
        *,
        effect_id: str | None = None,
        attempt_id: str | None = None,
        on_resume: bool = False,
        reservation: str | None = None,
        contract_version: int | None = None,
    ) -> EffectReceipt:
        """A receipt of ``d``; ``contract_version`` is the version its effect was
        attempted under (default: the sink's version in the registry now)."""
        return EffectReceipt(
            operation_id=d.operation_id,
            dispatch_id=d.dispatch_id,
            status=status,  # type: ignore[arg-type]
            sink=d.sink,
            attempt_id=attempt_id or d.dispatch_id,
            fencing_token=d.fencing_token,
            effect_id=effect_id,
            observed_at_ms=now,
            first_attempt_at_ms=first,
            detail=detail,
            on_resume=on_resume,
            observer=self.observer,
            reservation=reservation,  # type: ignore[arg-type]
            contract_version=(
                contract_version if contract_version is not None else self._version_of(d.sink)
            ),
        )

    def _submit(
        self, d: Dispatch, client: SinkPort, contract: EffectContract, *, fresh_identity: bool
    ) -> tuple[Any, str]:
        """Submit ``d``'s effect; the answer and the attempt's identity (fresh: checkpoint-only)."""
        attempt_id = f"{d.dispatch_id}:{uuid.uuid4().hex[:8]}" if fresh_identity else d.dispatch_id
        params: dict[str, Any] = json.loads(d.params_json)
        if d.subject is None or d.purpose is None or d.decision_version is None:
            # A dispatch of schema version 1 cannot carry the digest's inputs
            # to the sink; held (as any per-dispatch error), never sent.
            raise LedgerError(
                f"dispatch {d.dispatch_id} predates schema version 2 and lacks the inputs of "
                "its parameter digest (subject, purpose, decision version) that the sink checks; "
                "a person decides (ledger reconcile dispose) or a new dispatch is issued",
                operation_id=d.operation_id,
            )
        keyed = sends_idempotency_key(contract, fresh_attempt_identity=fresh_identity)
        result = client.submit(
            d.operation_id,
            d.parameter_digest,
            params,
            fencing_token_for(contract, d.fencing_token),
            attempt_id,
            # The negative control sends a key of its own attempt: no deduplication.
            use_key=keyed or (contract.idempotent and fresh_identity),
            idempotency_key=None if keyed else attempt_id,
            action=d.action,
            subject=d.subject,
            purpose=d.purpose,
            decision_version=d.decision_version,
        )
        return result, attempt_id

    def _unobserved(self, d: Dispatch, reason: str, now: int) -> Output:
        """An UNKNOWN observation of what ``d`` reads back: its postcondition
        for a VERIFY, else its effect (nothing was observed: ``reason``)."""
        kind = "POSTCONDITION" if d.kind == "VERIFY" else "EFFECT"
        return self._observation(d, kind, "UNKNOWN", d.sink, reason, now, on_resume=d.on_resume)

    def _observation(
        self,
        d: Dispatch,
        kind: str,
        status: str,
        source: str,
        detail: str,
        now: int,
        *,
        effect_id: str | None = None,
        on_resume: bool,
    ) -> tuple[str, str, Event]:
        """A readback record answering dispatch ``d`` (key: operation ID)."""
        return (
            "readbacks",
            d.operation_id,
            Readback(
                operation_id=d.operation_id,
                dispatch_id=d.dispatch_id,
                kind=kind,  # type: ignore[arg-type]
                status=status,  # type: ignore[arg-type]
                source=source,
                effect_id=effect_id,
                observed_at_ms=now,
                detail=detail,
                on_resume=on_resume,
                observer=self.observer,
                fencing_token=d.fencing_token,
            ),
        )

    def _verify(
        self, d: Dispatch, client: SinkPort, contract: EffectContract, now: int
    ) -> tuple[str, str, Event]:
        """Ask the postcondition query the contract declares; the core judges the answer."""
        params: dict[str, Any] = json.loads(d.params_json)
        ask = postcondition_request(contract, params)
        source = f"{d.sink} {postcondition_source(ask.query, ask.subject)}"
        observation = client.postcondition(ask.query, ask.subject) if ask.offered else None
        if observation is not None and not observation.sent:
            raise SinkNotReachedError(
                observation.detail,
                kind="SINK_UNREACHABLE",
                request="postcondition",
                on_resume=d.on_resume,
            )
        status, detail = judge_postcondition(contract, params, observation, d.operation_id)
        return self._observation(
            d, "POSTCONDITION", status, source, detail, now, on_resume=d.on_resume
        )

    def _read_postcondition_at_once(
        self, d: Dispatch, client: SinkPort, contract: EffectContract, outcome: Output
    ) -> Output:
        """Read the postcondition right after an effect commits, into its receipt.

        Where ``relay_inline_verify`` is on and the sink's contract offers a
        postcondition query, a ``COMMITTED`` receipt of this execution takes
        the verdict of that query (``MATCH`` or ``MISMATCH``, with source,
        detail and time), so that the receipt and the readback commit in one
        record of one transaction and the processor verifies without a
        ``VERIFY`` dispatch (see :class:`~ledger.events.EffectReceipt`).

        Anything else leaves ``outcome`` as it is and the ``VERIFY`` path
        verifies, as when this is off: no postcondition query offered, an
        answer that is no verdict (``UNKNOWN``), and a query that failed
        (not reached, token refused, outside the protocol). The failure is
        logged; the ``VERIFY`` that follows asks again and records it as
        that path does. Only a Kafka error passes through.

        Args:
            d: the execution dispatch.
            client: the sink's client.
            contract: the sink's contract.
            outcome: the output the execution produced.

        Returns:
            ``outcome``, its receipt carrying the postcondition verdict when
            one was read.
        """
        topic, key, receipt = outcome
        if (
            not self.settings.relay_inline_verify
            or not isinstance(receipt, EffectReceipt)
            or receipt.status != "COMMITTED"
        ):
            return outcome
        params: dict[str, Any] = json.loads(d.params_json)
        ask = postcondition_request(contract, params)
        if not ask.offered:
            return outcome
        self.hooks.seam("after_commit_before_verification", d.operation_id)
        source = f"{d.sink} {postcondition_source(ask.query, ask.subject)}"
        try:
            observation = client.postcondition(ask.query, ask.subject)
            if not observation.sent:
                raise SinkNotReachedError(
                    observation.detail, kind="SINK_UNREACHABLE", request="postcondition"
                )
            status, detail = judge_postcondition(contract, params, observation, d.operation_id)
        except KafkaException:
            raise
        except Exception as exc:
            log.warning(
                "relay: postcondition of %s right after its effect not read (%s: %s); "
                "it is verified by a VERIFY dispatch",
                d.dispatch_id,
                type(exc).__name__,
                exc,
            )
            return outcome
        if status not in ("MATCH", "MISMATCH"):
            return outcome
        checked = receipt.model_copy(
            update={
                "postcondition_status": status,
                "postcondition_source": source,
                "postcondition_detail": detail,
                "postcondition_observed_at_ms": self._now_ms(),
            }
        )
        return (topic, key, checked)

    def close(self) -> None:
        """Close sink clients and the receipts follower too."""
        super().close()
        for client in self.clients.values():
            client.close()
        self._receipts.close()
        self._approvals.close()
        self._policy.close()


def _dispatch_event(d: Dispatch, kind: str, reason: str) -> Output:
    """The relay's operating event of ``kind`` about dispatch ``d`` (one per dispatch and kind)."""
    event = OperatingEvent(
        event_id=f"relay:{d.dispatch_id}:{kind}",
        operation_id=d.operation_id,
        component="relay",
        kind=kind,
        reason=reason,
    )
    return ("operating-events", d.operation_id, event)
