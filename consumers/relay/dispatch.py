"""Dispatch: performing one dispatch against its sink, its failures kept to itself.

The steps are decided by the pure delivery rule
(:func:`ledger.delivery.next_step`); :class:`Dispatcher` only carries them
out: it turns each decision's records into outputs, sends each request it
asks for through :mod:`consumers.relay.calls` (the one place that touches
the sink), and feeds the answer back as history. A request that never
reached its sink raises :class:`~ledger.errors.SinkNotReachedError` for the
caller to park (:mod:`consumers.relay.parking`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from confluent_kafka import KafkaException

from consumers.relay.attempts import AttemptBook
from consumers.relay.calls import send_request
from consumers.relay.postcondition import Postconditions
from consumers.relay.records import Output, Recorder, dispatch_event, not_sent
from consumers.relay.sinks import SinkDesk
from consumers.relay.upgrade import UpgradeGate
from ledger.contracts import EffectContract
from ledger.delivery import MAX_HOLD_ROUNDS, MUTATING, Observed, Situation, next_step
from ledger.delivery import Observation as DeliveryObservation
from ledger.delivery import Receipt as DeliveryReceipt
from ledger.errors import LedgerError, SinkAuthError, SinkConfigError, SinkNotReachedError
from ledger.events import Dispatch
from ledger.topology import Topic
from sinks.port import SinkPort, readback_source

log = logging.getLogger("consumers.relay")

#: How the relay treats a dispatch it meets again (``checkpoint-only``: the negative control).
RelayMode = Literal["ledger", "checkpoint-only"]


class Dispatcher:
    """Performs dispatches: one episode of requests to a sink per call.

    Args:
        mode: ``ledger`` or ``checkpoint-only`` (the negative control).
        sinks: the registry and the sinks' adapters.
        book: the relay's attempts.
        recorder: builds receipts and readbacks.
        gate: the upgrade hold.
        postconditions: verification.
        withdrawn: ``dispatch -> why its admission no longer stands`` (or
            ``None``), asked before a reservation is confirmed.
        seam: the fault hooks' seam (``(name, operation_id)``).
        now_ms: the relay's clock (ms).
    """

    def __init__(
        self,
        mode: RelayMode,
        sinks: SinkDesk,
        book: AttemptBook,
        recorder: Recorder,
        gate: UpgradeGate,
        postconditions: Postconditions,
        withdrawn: Callable[[Dispatch], str | None],
        seam: Callable[[str, str], None],
        now_ms: Callable[[], int],
    ) -> None:
        self.mode: RelayMode = mode
        self.sinks = sinks
        self.book = book
        self.recorder = recorder
        self.gate = gate
        self.postconditions = postconditions
        self.withdrawn = withdrawn
        self.seam = seam
        self.now_ms = now_ms

    def perform_safely(
        self, d: Dispatch, *, fresh: bool, readback_on_resume: bool | None = None
    ) -> list[Output]:
        """:meth:`perform`, with a failure confined to its own operation.

        A sink answering outside its protocol, a corrupted registry entry or
        any other error while handling this one dispatch never stops the
        relay (DESIGN.md "Trust boundary": nothing one operation does can stop
        a stage). The request may have left, so an execution is recorded as
        ``AMBIGUOUS`` (the fold holds the operation as UNKNOWN_OUTCOME) and a
        readback or postcondition as observed ``UNKNOWN``, each with a
        ``SINK_PROTOCOL_ERROR`` operating event naming the error. A refused
        bearer token is :meth:`auth_failed`.

        Raises:
            KafkaException: the stage loop's, passed through.
            SinkNotReachedError: the request never reached the sink (retried,
                see :class:`~consumers.relay.parking.Parking`).
        """
        try:
            return self.perform(d, fresh=fresh, readback_on_resume=readback_on_resume)
        except (KafkaException, SinkNotReachedError):
            raise
        except SinkAuthError as exc:
            return self.auth_failed(d, exc, fresh=fresh)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.error("relay: %s failed: %s", d.dispatch_id, reason)
            now = self.now_ms()
            first = self.book.first_attempt(d, now)
            detail = f"the request may have reached {d.sink}; it failed with {reason}"
            outcome: Output
            if d.kind == "EXECUTE":
                outcome = (
                    Topic.RECEIPTS,
                    d.operation_id,
                    self.recorder.receipt(d, "AMBIGUOUS", first, now, detail),
                )
            else:
                outcome = self.recorder.unobserved(d, detail, now)
            return [
                outcome,
                dispatch_event(
                    d, "SINK_PROTOCOL_ERROR", f"{d.kind} of {d.operation_id} at {d.sink}: {reason}"
                ),
            ]

    def auth_failed(self, d: Dispatch, exc: SinkAuthError, *, fresh: bool) -> list[Output]:
        """The sink refused our token: retry or hold, never reject.

        A sink that refuses the relay's bearer token (401/403) refused the
        request before looking at it, and the operation is not at fault.

        Args:
            d: the dispatch being handled.
            exc: the refusal.
            fresh: no earlier run of the relay may have sent this dispatch.

        Returns:
            An ``UNAVAILABLE`` receipt (a fresh execution whose submit was
            refused: nothing reached the sink), an ``AMBIGUOUS`` one (an
            execution an earlier request of which may have reached it), or an
            ``UNKNOWN`` observation (readback, postcondition); and a
            ``SINK_AUTH_FAILED`` operating event naming the remedy.
        """
        now = self.now_ms()
        reason = (
            f"sink {d.sink} refused the relay's bearer token (HTTP {exc.http_status}); no effect "
            f"was made. Set the 'token' of {d.sink} in {self.sinks.registry.path} to the token "
            "the sink was started with"
        )
        log.error("relay: %s (%s)", reason, d.dispatch_id)
        outcome: Output
        if d.kind == "EXECUTE":
            first = self.book.first_attempt(d, now)
            only_send_refused = fresh and self.mode == "ledger" and exc.method == "POST"
            status = "UNAVAILABLE" if only_send_refused else "AMBIGUOUS"
            if not only_send_refused:
                reason = f"an earlier request may have reached {d.sink}; {reason}"
            outcome = (
                Topic.RECEIPTS,
                d.operation_id,
                self.recorder.receipt(d, status, first, now, reason),
            )
        else:
            outcome = self.recorder.unobserved(d, reason, now)
        return [outcome, dispatch_event(d, "SINK_AUTH_FAILED", reason)]

    def perform(
        self, d: Dispatch, *, fresh: bool, readback_on_resume: bool | None = None
    ) -> list[Output]:
        """Perform ``d``: the upgrade hold, then verification or delivery.

        Args:
            d: the dispatch.
            fresh: no earlier run of the relay may have sent it.
            readback_on_resume: for an execution whose readback could not be
                sent before, retry that readback (with this ``on_resume``).

        Returns:
            The outputs to write.

        Raises:
            SinkNotReachedError: the sink is unknown or was not reached.
            LocalFileError: the registry is corrupted and was never read well.
        """
        endpoint = self.sinks.endpoint(d.sink)
        now = self.now_ms()
        if endpoint is None:
            raise not_sent(d, self.sinks.problem(d.sink), "UNKNOWN_SINK", fresh, readback_on_resume)
        if self.mode == "ledger":
            held = self.gate.hold(
                d, endpoint, now, may_have_left=not fresh or readback_on_resume is not None
            )
            if held is not None:
                return held
        try:
            client = self.sinks.client(d.sink, endpoint)
        except SinkConfigError as exc:  # an unknown adapter, a bad config: nothing was sent
            raise not_sent(d, exc.message, "UNKNOWN_SINK", fresh, readback_on_resume) from exc
        contract = endpoint.contract
        if d.kind == "VERIFY":
            self.seam("after_commit_before_verification", d.operation_id)
            return [self.postconditions.verify(d, client, contract, now)]
        first = now if self.mode == "checkpoint-only" else self.book.first_attempt(d, now)
        outputs = self.deliver(
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
            return [self.postconditions.read_at_once(d, client, contract, outputs[0])]
        return outputs

    def deliver(
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
        decision ends the episode.

        Args:
            d: the dispatch.
            client: the sink's adapter.
            contract: the sink's contract.
            fresh: no earlier run of the relay may have sent it.
            readback_on_resume: see :meth:`perform`.
            first: when it was first attempted (ms).
            now: the relay's clock (ms).

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
                self.withdrawn(d)
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
                    self.seam(record.seam, d.operation_id)
                outputs.append(self.record(d, record, first, now, attempt_id, client))
            if decision.not_reached is not None:
                nr = decision.not_reached
                raise SinkNotReachedError(
                    nr.detail, kind="SINK_UNREACHABLE", request=nr.request, on_resume=nr.on_resume
                )
            send = decision.send
            if send is None:
                return outputs
            if send.seam is not None:
                self.seam(send.seam, d.operation_id)
            try:
                answer, attempt_id = send_request(d, client, contract, send)
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

    def record(
        self,
        d: Dispatch,
        record: DeliveryReceipt | DeliveryObservation,
        first: int,
        now: int,
        attempt_id: str,
        client: SinkPort,
    ) -> Output:
        """The output of one record a delivery decision asks for (times in ms)."""
        if isinstance(record, DeliveryObservation):
            source = f"{d.sink} {readback_source(client, d.operation_id)}"
            return self.recorder.observation(
                d,
                "EFFECT",
                record.status,
                source,
                record.detail,
                now,
                effect_id=record.effect_id,
                on_resume=record.on_resume,
            )
        receipt = self.recorder.receipt(
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
        return (Topic.RECEIPTS, d.operation_id, receipt)
