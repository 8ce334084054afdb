"""The console's triage: problems first, counts in the navigation, "read back now".

The console (:mod:`ledger.console`) lists operations problems first:
stranded ones (:mod:`ledger.stranded`) before those held for a person
(UNKNOWN_OUTCOME, NEEDS_REAUTHORISATION, ABANDONED), those before work in
flight, and settled work last; within a rank the oldest first, then by
operation ID. Its ``/queue`` page shows the stranded operations above the
unknown outcomes, each with a "read back now" button where a readback can
move it (a verification of a committed effect, an effect readback of an
unknown outcome: never a second request for the effect), beside the
disposition form. The navigation counts both, read at most every
:data:`COUNTS_TTL_S` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ledger.errors import LedgerError
from ledger.events import OperationState
from ledger.states import TERMINAL
from ledger.states import RecoveryState as S
from ledger.stranded import Stranded

#: Ranks of a row, problems first (lower first).
STRANDED_RANK = 0
#: Held for a person, in this order after the stranded.
HELD_RANKS: dict[str, int] = {
    S.UNKNOWN_OUTCOME: 1,
    S.NEEDS_REAUTHORISATION: 2,
    S.ABANDONED: 3,
}
#: Work in flight (a stage owes it a step, within its bound).
IN_FLIGHT_RANK = 4
#: Settled: nothing left to do.
SETTLED_RANK = 5

#: Seconds the navigation's counts are kept before they are read again.
COUNTS_TTL_S = 5.0


def rank(state: OperationState, stranded: Mapping[str, Stranded]) -> int:
    """Where an operation sorts: 0 stranded, 1-3 held for a person, 4 in flight, 5 settled.

    Args:
        state: the operation's state.
        stranded: operation -> why it is stranded (absent: not stranded).

    Returns:
        The rank (lower sorts first).
    """
    if state.operation_id in stranded:
        return STRANDED_RANK
    held = HELD_RANKS.get(str(state.state))
    if held is not None:
        return held
    return SETTLED_RANK if state.state in TERMINAL else IN_FLIGHT_RANK


def problems_first(
    rows: Iterable[dict[str, Any]], stranded: Mapping[str, Stranded]
) -> list[dict[str, Any]]:
    """Rows (``{"state": OperationState, "age_s": float | None}``) problems first.

    Each row gains ``"stranded"`` (the :class:`Stranded` or ``None``) and
    ``"rank"``. Within a rank: the oldest first (an unknown age last), then
    by operation ID.
    """
    out = []
    for row in rows:
        st: OperationState = row["state"]
        out.append({**row, "stranded": stranded.get(st.operation_id), "rank": rank(st, stranded)})
    return sorted(
        out,
        key=lambda r: (
            r["rank"],
            r["age_s"] is None,
            -(r["age_s"] or 0.0),
            r["state"].operation_id,
        ),
    )


class NavCounts:
    """The navigation's counts (stranded, unknown outcomes), read at most every few seconds.

    Args:
        stranded: reads the stranded operations.
        queue: reads the unknown-outcome queue.
        ttl_s: seconds a reading is kept (:data:`COUNTS_TTL_S`).
        clock: monotonic seconds (a test passes its own).
    """

    def __init__(
        self,
        stranded: Callable[[], list[Stranded]],
        queue: Callable[[], list[OperationState]],
        ttl_s: float = COUNTS_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stranded = stranded
        self._queue = queue
        self.ttl_s = ttl_s
        self._clock = clock
        self._kept: tuple[float, dict[str, int] | None] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> dict[str, int] | None:
        """``{"stranded": n, "unknown": m}``; ``None`` when the ledger could not be read."""
        with self._lock:
            now = self._clock()
            if self._kept is not None and now - self._kept[0] < self.ttl_s:
                return self._kept[1]
            try:
                counts: dict[str, int] | None = {
                    "stranded": len(self._stranded()),
                    "unknown": len(self._queue()),
                }
            except LedgerError:
                counts = None
            self._kept = (now, counts)
            return counts

    def forget(self) -> None:
        """Read again at the next call (after an action changed the ledger)."""
        with self._lock:
            self._kept = None
