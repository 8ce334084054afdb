"""The relay's outbox of operating events that belong to no dispatch.

Local-file problems (key ``local-file``), a refused clock reading (key
``clock``) and receipts its table refused (forged or undecodable; keyed by
operation) wait here until the next batch's transaction, or one of their own
when the relay is idle. A refused approval or policy record is reported by
the authority kernel, which follows those tables too.
"""

from __future__ import annotations

import uuid

from consumers.localfiles import clock_refused_event
from consumers.stage import Writer
from ledger.clock import ClockVerdict
from ledger.errors import LocalFileError
from ledger.events import OperatingEvent
from ledger.topology import Topic


class Notes:
    """Operating events waiting to be written.

    Args:
        instance: the relay's instance name.
        clock_kind: the configured clock (named in a refusal).

    Attributes:
        pending: ``(key, operating event)`` in the order they arose.
    """

    def __init__(self, instance: str, clock_kind: str) -> None:
        self.instance = instance
        self.clock_kind = clock_kind
        self.pending: list[tuple[str, OperatingEvent]] = []

    def add(self, key: str, event: OperatingEvent) -> None:
        """Queue ``event`` under ``key``."""
        self.pending.append((key, event))

    def local_file_problem(self, exc: LocalFileError) -> None:
        """A corrupted local file becomes a ``LOCAL_FILE`` operating event (once per problem)."""
        self.add(
            "local-file",
            OperatingEvent(
                event_id=f"relay-{self.instance}:LOCAL_FILE:{uuid.uuid4().hex[:12]}",
                component="relay",
                kind="LOCAL_FILE",
                reason=exc.message,
            ),
        )

    def clock_refused(self, reading_ms: int, verdict: ClockVerdict) -> None:
        """A refused clock reading becomes a ``CLOCK_REFUSED`` operating event (once per run)."""
        self.add(
            "clock",
            clock_refused_event(
                f"relay-{self.instance}", "relay", self.clock_kind, reading_ms, verdict
            ),
        )

    def write(self, out: Writer) -> None:
        """Write every pending event to ``operating-events`` and forget them."""
        for key, event in self.pending:
            out.write(Topic.OPERATING_EVENTS, key, event)
        self.pending.clear()
