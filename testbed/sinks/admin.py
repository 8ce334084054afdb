"""The reference sinks' admin API: arm faults, count effects, read counters.

Only the testbed's reference sinks (:mod:`testbed.sinks.gateway`) offer
``/admin/...``; the relay's :class:`sinks.client.SinkClient` speaks only the
sink protocol (submit, readback, postcondition, health).
"""

from __future__ import annotations

from typing import Any

from ledger.errors import SinkProtocolError, SinkUnavailableError
from sinks.client import SinkClient, _json, _NoAnswer
from testbed.sinks.store import FaultMode


class ReferenceSinkClient(SinkClient):
    """A :class:`SinkClient` that also drives a reference sink's admin endpoints."""

    def _admin(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """Send an admin request; its answer's JSON body, or an error.

        Raises:
            SinkUnavailableError: if no answer came (chained to the httpx error).
            SinkProtocolError: if the answer is not ``200``.
        """
        answer = self._send(method, path, **kwargs)
        if isinstance(answer, _NoAnswer):
            raise SinkUnavailableError(
                f"{method} {self.base_url}{path} got no answer ({answer.detail}); "
                "is the sink running?",
                sink=self.base_url,
                expected="an answer",
                observed=answer.detail,
            ) from answer.cause
        if answer.status_code != 200:
            raise SinkProtocolError(
                method, path, answer.status_code, answer.text, sink=self.base_url
            )
        return _json(answer)

    def arm_fault(self, operation_id: str, mode: FaultMode, times: int = 1) -> None:
        """Arm a fault for the operation's next ``times`` submits (admin).

        Raises:
            SinkProtocolError: for an unknown mode or ``times < 1``.
            SinkUnavailableError: if the sink gives no answer (retryable).
        """
        self._admin(
            "POST",
            "/admin/faults",
            json={"operation_id": operation_id, "mode": mode, "times": times},
        )

    def effects(self) -> dict[str, int]:
        """Return ``{operation_id: effects held by the sink}`` (admin).

        Raises:
            SinkUnavailableError: if the sink gives no answer (retryable).
        """
        counts = self._admin("GET", "/admin/effects").get("effects", {})
        return {str(op): int(n) for op, n in counts.items()}

    def traces(self) -> list[dict[str, str | None]]:
        """The ``traceparent`` of the sink's latest requests, oldest first (admin).

        Returns:
            ``[{"method", "path", "traceparent"}]`` (``traceparent`` ``None``
            when a request carried none).

        Raises:
            SinkUnavailableError: if the sink gives no answer (retryable).
        """
        return list(self._admin("GET", "/admin/traces").get("requests", []))

    def stats(self) -> dict[str, int]:
        """Return the sink's counters, e.g. ``stale_rejections`` (admin).

        Raises:
            SinkUnavailableError: if the sink gives no answer (retryable).
        """
        return {str(name): int(value) for name, value in self._admin("GET", "/admin/stats").items()}
