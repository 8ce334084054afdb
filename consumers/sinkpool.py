"""No sink can stall the others: the relay's sends, one lane per sink.

Two pieces, each used by :class:`consumers.relay.Relay`:

* :func:`run_per_sink` performs a batch's dispatches one sink per thread:
  the dispatches to one sink one after another, in the batch's order (so an
  operation's requests keep their order), the sinks' lanes at once. A batch
  with dispatches to a hanging sink A and a live sink B performs B's within
  B's own time; A's are bounded by the deadline of each call
  (``LEDGER_SINK_TIMEOUT_S``, :mod:`sinks.limits`).
* :class:`PassGuard` makes the deadline cost a sink once per pass, not once
  per request. The deadline alone is not enough: every dispatch to a hanging
  sink would still cost a deadline per request (a submit, then the readback
  its ambiguity calls for, then a postcondition), so a batch of fifty would
  hold its transaction -- and the receipts of every other sink in it -- for
  minutes, and every later batch again. Once a call of this pass used its
  whole deadline without an answer, the guard sends that sink nothing more
  in the pass: each later request answers "not sent", which the relay
  already treats as a sink it could not reach (the dispatch is parked, its
  consumer offset held back, and tried again after a growing backoff within
  the ``LEDGER_SINK_RETRY_*`` budget, then held for a person). The request
  that timed out keeps its own meaning: a submit is ``ambiguous`` and its
  readback, refused by the guard, is parked as a readback, never a resend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ledger.contracts import PostconditionQuery
from sinks.client import AccountCredits, HoldResult, ReadbackResult, SubmitResult
from sinks.port import SinkPort, readback_source

#: Share of the deadline a call must have used, without an answer, to stall its sink.
STALL_SHARE = 0.9

#: Most sink lanes of one batch run at once (more sinks wait for a free lane).
MAX_LANES = 32


def run_per_sink(
    jobs: list[tuple[str, Callable[[], object]]], *, prefix: str = "relay-sink"
) -> None:
    """Run ``(sink, job)`` pairs: one sink's in order, different sinks' at once.

    A batch whose jobs all go to one sink runs them in the calling thread.
    Every lane is waited for, even when one fails, so that nothing is still
    being sent when the caller goes on (or recovers).

    Args:
        jobs: the work, in the batch's order; each job is called once.
        prefix: the lane threads' name prefix.

    Raises:
        BaseException: the first exception a job raised (in ``jobs`` order
            of the lanes' first failures), once every lane has ended.
    """
    lanes: dict[str, list[Callable[[], object]]] = {}
    for sink, job in jobs:
        lanes.setdefault(sink, []).append(job)
    if len(lanes) <= 1:
        for job in (job for _, job in jobs):
            job()
        return

    def run_lane(lane: list[Callable[[], object]]) -> None:
        for job in lane:
            job()

    with ThreadPoolExecutor(
        max_workers=min(len(lanes), MAX_LANES), thread_name_prefix=prefix
    ) as pool:
        futures: list[Future[None]] = [pool.submit(run_lane, lane) for lane in lanes.values()]
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error


class PassGuard:
    """A sink's adapter that sends nothing more in a pass once the sink stalled in it.

    A call *stalls* its sink when it comes back ``ambiguous`` without an
    answer (``http_status`` ``None``) after using at least
    :data:`STALL_SHARE` of the deadline. Until :meth:`new_pass`, every later
    call answers at once as a request that was not sent (``sent=False``).

    Args:
        inner: the sink's adapter.
        sink: the sink's name.
        timeout_s: the adapter's deadline (seconds).

    Attributes:
        stalled: why the sink stalled in this pass, or ``None``.
    """

    def __init__(self, inner: SinkPort, sink: str, timeout_s: float) -> None:
        self.inner = inner
        self.sink = sink
        self.timeout_s = timeout_s
        self.stalled: str | None = None
        self._lock = threading.Lock()

    def readback_source(self, operation_id: str) -> str:
        """The adapter's name for its readback (:func:`sinks.port.readback_source`)."""
        return readback_source(self.inner, operation_id)

    def new_pass(self) -> None:
        """Start a new pass: the sink is asked again."""
        with self._lock:
            self.stalled = None

    def _refusal(self) -> str | None:
        with self._lock:
            stalled = self.stalled
        if stalled is None:
            return None
        return f"not sent: {self.sink} gave no answer within its deadline a moment ago ({stalled})"

    def _watch(self, call: Callable[[], Any]) -> Any:
        started = time.monotonic()
        result = call()
        used = time.monotonic() - started
        if (
            getattr(result, "status", None) == "ambiguous"
            and getattr(result, "sent", False)
            and getattr(result, "http_status", 0) is None
            and used >= STALL_SHARE * self.timeout_s
        ):
            with self._lock:
                self.stalled = f"{used:.1f} s: {getattr(result, 'detail', '')}"[:500]
        return result

    def submit(self, operation_id: str, *args: Any, **kwargs: Any) -> SubmitResult:
        """As :meth:`SinkPort.submit`; ``unavailable``, not sent, while stalled."""
        refused = self._refusal()
        if refused is not None:
            return SubmitResult("unavailable", operation_id, detail=refused, sent=False)
        result: SubmitResult = self._watch(lambda: self.inner.submit(operation_id, *args, **kwargs))
        return result

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        """As :meth:`SinkPort.readback`; ``ambiguous``, not sent, while stalled."""
        refused = self._refusal()
        if refused is not None:
            return ReadbackResult("ambiguous", operation_id, detail=refused, sent=False)
        result: ReadbackResult = self._watch(
            lambda: self.inner.readback(operation_id, fencing_token)
        )
        return result

    def _hold(self, operation_id: str, call: Callable[[], HoldResult]) -> HoldResult:
        refused = self._refusal()
        if refused is not None:
            return HoldResult("unavailable", operation_id, detail=refused, sent=False)
        result: HoldResult = self._watch(call)
        return result

    def reserve(self, operation_id: str, *args: Any, **kwargs: Any) -> HoldResult:
        """As :meth:`SinkPort.reserve`; ``unavailable``, not sent, while stalled."""
        return self._hold(operation_id, lambda: self.inner.reserve(operation_id, *args, **kwargs))

    def confirm(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """As :meth:`SinkPort.confirm`; ``unavailable``, not sent, while stalled."""
        return self._hold(operation_id, lambda: self.inner.confirm(operation_id, fencing_token))

    def cancel(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """As :meth:`SinkPort.cancel`; ``unavailable``, not sent, while stalled."""
        return self._hold(operation_id, lambda: self.inner.cancel(operation_id, fencing_token))

    def read_hold(self, operation_id: str, fencing_token: int | None = None) -> HoldResult:
        """As :meth:`SinkPort.read_hold`; ``unavailable``, not sent, while stalled."""
        return self._hold(operation_id, lambda: self.inner.read_hold(operation_id, fencing_token))

    def postcondition(self, query: PostconditionQuery, subject: str) -> AccountCredits:
        """As :meth:`SinkPort.postcondition`; ``ambiguous``, not sent, while stalled."""
        refused = self._refusal()
        if refused is not None:
            return AccountCredits("ambiguous", subject, detail=refused, sent=False)
        result: AccountCredits = self._watch(lambda: self.inner.postcondition(query, subject))
        return result

    def health_info(self) -> dict[str, Any] | None:
        """As :meth:`SinkPort.health_info` (``None`` while stalled)."""
        return None if self._refusal() is not None else self.inner.health_info()

    def health(self) -> bool:
        """As :meth:`SinkPort.health` (``False`` while stalled)."""
        return self.health_info() is not None

    def close(self) -> None:
        """Close the adapter."""
        self.inner.close()
