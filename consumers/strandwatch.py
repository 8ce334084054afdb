"""The processor's watch over its own partitions' stranded operations (the metrics).

The processor owns every operation on its partitions; it tells this watch
each committed state and when it was written (:meth:`StrandWatch.track`),
and what it holds behind refused records. At each scrape the watch judges
them with the one definition (:func:`ledger.stranded.evaluate`, the wall
clock, the ``LEDGER_STRANDED_*_S`` bounds, :func:`bounds_of`) and exports
``ledger_stranded_operations{reason}`` and
``ledger_stranded_oldest_age_seconds{reason}`` through
:class:`consumers.metrics.StageMetrics`.

A restored processor claims the ``committed_unverified`` ones of the
partitions it takes over (:meth:`StrandWatch.unverified`): the claim
dispatches their verification again, so a restart picks them up.

Only operations at a waypoint are kept (NOT_ADMITTED, ADMITTED,
EFFECT_PENDING, EFFECT_COMMITTED at a sink that can verify): a resting
operation costs nothing here. The processor does not see the relay's
group, so an in-flight operation's owner is reported unknown
(``in_flight_without_owner``); the audit and ``ledger reconcile run``,
which read the groups, tell ``in_flight_overdue`` apart. Nor does the
watch count ``intent_not_consumed`` (an intent the processor's group has
not consumed): the processor that would count it is the one not consuming;
the readers find it (:mod:`consumers.unconsumed`), and the shipped alert
``LedgerIntentsNotConsumed`` fires when no processor is ready.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping

from ledger.contracts import postcondition_request
from ledger.errors import LedgerError
from ledger.events import OperationState
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.stranded import (
    IN_FLIGHT_WAYPOINTS,
    Evidence,
    Stranded,
    StrandedBounds,
    StrandedReason,
    StrandedSummary,
    evaluate,
    order,
    summarise,
)
from sinks.registry import RegistryFile, SinkEndpoint

#: Waypoints the watch keeps (EFFECT_COMMITTED only where the sink can verify).
WATCHED = IN_FLIGHT_WAYPOINTS | {S.NOT_ADMITTED, S.EFFECT_COMMITTED}


def bounds_of(settings: LedgerSettings) -> StrandedBounds:
    """The bounds in force (``LEDGER_STRANDED_*_S``, seconds)."""
    return StrandedBounds(
        in_flight_s=settings.stranded_in_flight_s,
        committed_s=settings.stranded_committed_s,
        not_admitted_s=settings.stranded_not_admitted_s,
        held_s=settings.stranded_held_s,
        intents_s=settings.stranded_intents_s,
    )


def verifiable_at(sinks: Mapping[str, SinkEndpoint], st: OperationState) -> bool:
    """Whether ``st``'s sink, as ``sinks`` registers it, offers a postcondition query for it.

    An unknown sink or unreadable parameters count as able to verify: such
    an operation is shown stranded, never hidden.
    """
    endpoint = sinks.get(st.sink)
    try:
        params = json.loads(st.params_json)
    except ValueError:
        return True
    if endpoint is None or not isinstance(params, dict):
        return True
    return postcondition_request(endpoint.contract, params).offered


class StrandWatch:
    """Stranded operations on one processor's partitions (see the module docstring).

    Args:
        settings: the processor's settings (bounds, the sink registry).
        registry: the processor's sink registry (whether a sink can verify).
        held: op -> (partition, why) of what the processor holds behind
            records it refused (:attr:`consumers.processor.Processor.held`).
        now_ms: the wall clock (milliseconds; a test passes its own).
    """

    def __init__(
        self,
        settings: LedgerSettings,
        registry: RegistryFile,
        held: Callable[[], Mapping[str, tuple[int, str]]] = dict,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.bounds = bounds_of(settings)
        self.registry = registry
        self._held = held
        self._now_ms = now_ms
        #: op -> (state, sink, since_ms) of operations at a waypoint.
        self.waypoints: dict[str, tuple[str, str, int]] = {}
        #: op -> when the watch first saw it held (wall clock, ms).
        self.held_since: dict[str, int] = {}
        self._lock = threading.Lock()  # scrapes come from the metrics thread

    def track(self, state: OperationState, since_ms: int | None = None) -> None:
        """A state of the operation was committed (or restored) at ``since_ms``.

        Args:
            state: its committed state.
            since_ms: its record's Kafka timestamp (wall clock, ms); ``None``:
                now.
        """
        op = state.operation_id
        at = self._now_ms() if since_ms is None else since_ms
        keep = state.state in WATCHED
        if keep and state.state == S.EFFECT_COMMITTED:
            try:
                keep = verifiable_at(self.registry.current(), state)
            except LedgerError:
                keep = True  # an unreadable registry hides nothing
        with self._lock:
            if keep:
                self.waypoints[op] = (str(state.state), state.sink, at)
            else:
                self.waypoints.pop(op, None)

    def forget(self, operation_id: str) -> None:
        """The operation's partition went to another processor."""
        with self._lock:
            self.waypoints.pop(operation_id, None)
            self.held_since.pop(operation_id, None)

    def unverified(self, operation_id: str) -> bool:
        """Whether the operation is stranded ``committed_unverified`` now.

        A restored processor claims such an operation: the claim's fold
        dispatches its verification again (``VERIFY``, a query), never the
        effect (:func:`ledger.fold.claims._claim`).
        """
        with self._lock:
            row = self.waypoints.get(operation_id)
        if row is None or row[0] != S.EFFECT_COMMITTED:
            return False
        state, sink, since = row
        found = evaluate(operation_id, state, sink, Evidence(since), self._now_ms(), self.bounds)
        return found is not None and found.reason == StrandedReason.COMMITTED_UNVERIFIED

    def stranded(self) -> list[Stranded]:
        """The stranded operations on this processor's partitions now, oldest first."""
        now = self._now_ms()
        held = dict(self._held())
        with self._lock:
            for op in list(self.held_since):
                if op not in held:
                    self.held_since.pop(op)
            for op in held:
                self.held_since.setdefault(op, now)
            rows = dict(self.waypoints)
            since_held = dict(self.held_since)
        found: list[Stranded] = []
        for op in set(rows) | set(held):
            state, sink, since = rows.get(op, ("", "", since_held.get(op, now)))
            why = held.get(op)
            evidence = Evidence(
                since_ms=since_held[op] if why is not None else since,
                held=None if why is None else why[1],
            )
            item = evaluate(op, state, sink, evidence, now, self.bounds)
            if item is not None:
                found.append(item)
        return order(found)

    def summary(self) -> StrandedSummary:
        """:func:`ledger.stranded.summarise` of :meth:`stranded` (the gauges)."""
        return summarise(self.stranded())
