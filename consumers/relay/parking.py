"""Parking: dispatches whose sink could not be reached wait for their next try.

A request that never reached its sink (the connection was refused or could
not be made, or the sink is not in the registry) cannot have made an effect:
its dispatch is parked and tried again after a growing backoff
(:func:`~ledger.contracts.after_unreached`, ``LEDGER_SINK_RETRY_*``) while the
relay goes on with every other dispatch; the consumer offset is held back at
the oldest parked dispatch of each partition (:meth:`Parking.held_back`).
Once the budget is spent the request is recorded as never delivered (an
``UNREACHABLE`` receipt, or an ``UNKNOWN`` readback) with an operating event:
the processor holds the operation for a person, its admission intact.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from confluent_kafka import TopicPartition

from consumers.metrics import StageMetrics, dispatch_outcome
from consumers.relay.attempts import AttemptBook
from consumers.relay.records import (
    Output,
    Recorder,
    dispatch_event,
    not_sent,
    say,
    say_outcome,
)
from ledger.contracts import RetryBudget, after_unreached
from ledger.errors import SinkNotReachedError
from ledger.events import Dispatch
from ledger.topology import Topic
from ledger.tracing import trace_headers

log = logging.getLogger("consumers.relay")


class Perform(Protocol):
    """Performs a dispatch (the dispatcher's ``perform_safely``).

    Raises :class:`~ledger.errors.SinkNotReachedError` when nothing reached the sink.
    """

    def __call__(
        self, d: Dispatch, *, fresh: bool, readback_on_resume: bool | None = None
    ) -> list[Output]:
        """Perform ``d``; the outputs to write in the batch's transaction."""
        ...


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


class Parking:
    """The relay's parked dispatches and the pass's unreachable sinks.

    Args:
        budget: how often and how long an unreached sink is tried.
        perform: performs a dispatch (the dispatcher's ``perform_safely``).
        book: the relay's attempts.
        recorder: builds the records of a spent budget.
        metrics: the relay's metrics (one observation per try).
        registry_path: the sink registry, named in the remedy.
        now_ms: the relay's clock (ms).

    Attributes:
        parked: ``dispatch_id -> a dispatch waiting to try an unreachable sink again``.
        down_now: sinks a request could not reach in the current pass: other
            dispatches to them are parked without a request, so that a sink
            that does not answer costs one connection timeout per pass, not
            one per dispatch.
    """

    def __init__(
        self,
        budget: RetryBudget,
        perform: Perform,
        book: AttemptBook,
        recorder: Recorder,
        metrics: StageMetrics,
        registry_path: Path,
        now_ms: Callable[[], int],
    ) -> None:
        self.budget = budget
        self.perform = perform
        self.book = book
        self.recorder = recorder
        self.metrics = metrics
        self.registry_path = registry_path
        self.now_ms = now_ms
        self.parked: dict[str, Parked] = {}
        self.down_now: dict[str, SinkNotReachedError] = {}

    def new_pass(self) -> None:
        """Start a new pass: every sink is asked again."""
        self.down_now.clear()

    def due(self, now: float) -> list[Parked]:
        """Parked dispatches due at monotonic ``now`` (seconds), oldest first."""
        return sorted(
            (p for p in self.parked.values() if p.next_at <= now), key=lambda p: p.next_at
        )

    def forget(self, partitions: set[int]) -> None:
        """Forget parked dispatches of revoked partitions (their new owner meets them)."""
        for dispatch_id, p in list(self.parked.items()):
            if p.partition in partitions:
                del self.parked[dispatch_id]

    def held_back(self, offsets: list[TopicPartition], topic: str) -> list[TopicPartition]:
        """Offsets to commit: never past the oldest parked dispatch of a partition of ``topic``."""
        if not self.parked:
            return offsets
        floor: dict[int, int] = {}
        for p in self.parked.values():
            floor[p.partition] = min(floor.get(p.partition, p.offset), p.offset)
        return [
            TopicPartition(tp.topic, tp.partition, min(tp.offset, floor[tp.partition]))
            if tp.topic == topic and tp.partition in floor
            else tp
            for tp in offsets
        ]

    def attempt(
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
            hold the operation for a person (:meth:`unreached`).
        """
        down = self.down_now.get(d.sink)
        if down is not None:
            detail = f"not tried: {d.sink} could not be reached a moment ago ({down.detail})"
            exc = not_sent(d, detail, "SINK_UNREACHABLE", fresh, readback_on_resume)
            return self.park(d, exc, partition, offset, fresh=fresh)
        attempt = self.parked[d.dispatch_id].failures + 1 if d.dispatch_id in self.parked else 1
        say(d, attempt, "sending", "fresh" if fresh else "sent before: read back first")
        started = time.monotonic()
        try:
            outputs = self.perform(d, fresh=fresh, readback_on_resume=readback_on_resume)
        except SinkNotReachedError as exc:
            self.metrics.dispatched(d.sink, d.kind, "NOT_REACHED", time.monotonic() - started)
            say(d, attempt, "not sent", f"{exc.kind}: {exc.detail}")
            if exc.kind == "SINK_UNREACHABLE":
                self.down_now[d.sink] = exc
            outputs = self.park(d, exc, partition, offset, fresh=fresh)
        else:
            outcome = dispatch_outcome(event for _, _, event in outputs)
            self.metrics.dispatched(d.sink, d.kind, outcome, time.monotonic() - started)
            # Reached at last: no longer parked (if its outcome is then lost with
            # an aborted transaction, the dispatch is met again and read back).
            self.parked.pop(d.dispatch_id, None)
        for _, _, event in outputs:  # none while parked; once the budget is spent, the hold
            say_outcome(d, attempt, event)
        return outputs

    def park(
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
        return self.unreached(d, exc, decision.reason)

    def unreached(self, d: Dispatch, exc: SinkNotReachedError, why: str) -> list[Output]:
        """The retry budget is spent: record what could not be sent, and say so."""
        now = self.now_ms()
        detail = f"{exc.detail}; {why}"
        log.error("relay: giving up on %s at %s: %s", d.dispatch_id, d.sink, detail)
        outcome: Output
        if exc.request == "submit":
            first = self.book.first_attempt(d, now)
            outcome = (
                Topic.RECEIPTS,
                d.operation_id,
                self.recorder.receipt(d, "UNREACHABLE", first, now, detail),
            )
        else:
            kind = "POSTCONDITION" if exc.request == "postcondition" else "EFFECT"
            on_resume = exc.on_resume if exc.request == "readback" else d.on_resume
            outcome = self.recorder.observation(
                d, kind, "UNKNOWN", d.sink, f"not observed: {detail}", now, on_resume=on_resume
            )
        return [
            outcome,
            dispatch_event(
                d,
                exc.kind,
                (
                    f"{d.kind} of {d.operation_id}: the {exc.request} never reached sink {d.sink} "
                    f"({detail}); the operation is held for a person: start the sink or fix its "
                    f"entry in {self.registry_path}, then 'ledger reconcile run'"
                ),
            ),
        ]
