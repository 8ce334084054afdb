"""What the receipts say the relay already did: attempted and completed dispatches.

Filled from the ``receipts`` table of the relay's partitions (an assignment
starts it afresh) and from the ``ATTEMPTED`` markers this relay commits.
"""

from __future__ import annotations

from consumers.stage import Record
from ledger.events import Dispatch, EffectReceipt


class AttemptBook:
    """The relay's memory of attempts, per dispatch and per operation.

    Attributes:
        attempts: ``dispatch_id -> first attempt time (ms)`` for every
            dispatch an earlier run of the relay may have sent.
        attempt_versions: ``dispatch_id -> the contract version its first
            attempt was sent under``.
        operation_versions: ``operation -> the contract version its latest
            receipt names`` (any dispatch, any epoch): what a later readback
            of its effect must be allowed to resume from (see
            :func:`~ledger.upgrades.attempted_version`).
        completed: dispatches whose final receipt is already committed.
    """

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.attempt_versions: dict[str, int] = {}
        self.operation_versions: dict[str, int] = {}
        self.completed: set[str] = set()

    def clear(self) -> None:
        """Forget everything (an assignment files the receipts again)."""
        self.attempts.clear()
        self.attempt_versions.clear()
        self.operation_versions.clear()
        self.completed.clear()

    def apply(self, key: str, rec: Record | None) -> None:
        """Apply one record of the ``receipts`` table (a tombstone changes nothing)."""
        if rec is None or not isinstance(rec.event, EffectReceipt):
            return
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

    def marked(self, d: Dispatch, now: int, version: int | None) -> None:
        """``d``'s ``ATTEMPTED`` marker is committed at ``now`` (ms) under contract ``version``."""
        self.attempts[d.dispatch_id] = now
        if version is not None:
            self.attempt_versions.setdefault(d.dispatch_id, version)
            self.operation_versions[d.operation_id] = version

    def first_attempt(self, d: Dispatch, now: int) -> int:
        """When ``d`` was first attempted (ms), ``now`` when never."""
        return self.attempts.get(d.dispatch_id, now)

    def done_before(self, d: Dispatch) -> bool:
        """Whether ``d``'s final receipt is already committed."""
        return d.dispatch_id in self.completed

    def done(self, d: Dispatch) -> None:
        """``d``'s outcome is committed: a redelivery of an execution is skipped."""
        if d.kind == "EXECUTE":
            self.completed.add(d.dispatch_id)
