"""The authority kernel: admits one exact operation per approval, once.

Input: ``ledger.admission-requests`` (keyed by approval ID, so every request
for one approval is decided on that approval's partition by one instance —
the single writer of the consume-once invariant). It follows
``ledger.approvals`` (same partitions) and ``ledger.policy`` as tables, and
for each request writes, in one transaction with its offsets, the
:class:`~ledger.events.AdmissionDecision` (keyed by operation ID) and, when
admitted, the approval's consumed record (keyed by approval ID).
"""

from __future__ import annotations

import logging

from consumers import faults
from consumers.stage import Record, Stage, Writer
from consumers.tables import TableFollower
from ledger.authority import evaluate
from ledger.clock import Clock, clock_for
from ledger.events import AdmissionRequest, Approval, PolicyChange

log = logging.getLogger(__name__)


class AuthorityKernel(Stage):
    """Consume-transform-produce stage deciding admissions.

    Attributes:
        approvals: committed approvals of the assigned partitions.
        pending: approvals consumed in the open transaction.
        policy_version: policy version in force.
    """

    component = "authority"
    inputs = ("admission-requests",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.clock: Clock = clock_for(self.settings.clock, self.settings.run_dir)
        self.approvals: dict[str, Approval] = {}
        self.pending: dict[str, Approval] = {}
        self.policy_version = self.settings.policy_version
        self._approvals = TableFollower(self.settings, "approvals", self._apply_approval)
        self._policy = TableFollower(self.settings, "policy", self._apply_policy)
        self._policy.follow({0})

    def _apply_approval(self, key: str, rec: Record | None) -> None:
        if rec is None:
            self.approvals.pop(key, None)
        elif isinstance(rec.event, Approval) and rec.event.approval_id == key:
            self.approvals[key] = rec.event

    def _apply_policy(self, key: str, rec: Record | None) -> None:
        if rec is not None and isinstance(rec.event, PolicyChange):
            self.policy_version = rec.event.version

    def on_assign(self, partitions: set[int]) -> None:
        """Follow the approvals of the assigned partitions from the beginning."""
        self.approvals.clear()
        self._approvals.follow(partitions)
        log.info("authority: %d approvals loaded", len(self.approvals))

    def on_revoke(self, partitions: set[int]) -> None:
        """Stop following (the next assignment reloads)."""
        self.pending.clear()

    def rebuild(self) -> None:
        """Forget consumptions of the aborted transaction."""
        self.pending.clear()

    def after_commit(self) -> None:
        """Consumed approvals are now durable."""
        self.approvals.update(self.pending)
        self.pending.clear()

    def handle(self, records: list[Record], out: Writer) -> None:
        """Decide every admission request of the batch."""
        self._approvals.catch_up()
        self._policy.catch_up()
        for rec in records:
            request = rec.event
            if not isinstance(request, AdmissionRequest):
                log.warning("authority: ignoring %s at %s", request.KIND, rec.offset)
                continue
            faults.seam(self.run_dir, "before_admission", request.operation_id)
            approval = self.pending.get(request.approval_id) or self.approvals.get(
                request.approval_id
            )
            result = evaluate(
                approval,
                request,
                now_ms=self.clock.now_ms(),
                policy_version=self.policy_version,
                decided_by=f"authority-{self.instance}",
            )
            out.write("admissions", request.operation_id, result.decision)
            if result.approval is not None:
                self.pending[request.approval_id] = result.approval
                out.write("approvals", request.approval_id, result.approval)
            log.info(
                "%s: admission %s (%s)",
                request.operation_id,
                "granted" if result.decision.admitted else "refused",
                result.decision.reason,
            )

    def close(self) -> None:
        """Close the table followers too."""
        super().close()
        self._approvals.close()
        self._policy.close()
