"""The admission tables the relay follows before it confirms a reservation.

Approvals (revocations merged) and the policy version in force, read from
their topics (authenticated records only) and judged by the pure rule
:func:`ledger.authority.admission_withdrawn`: the check can only withdraw an
admission, never grant one. The tables are followed from the first
reservation on.
"""

from __future__ import annotations

import threading

from consumers.retry import KafkaRetry
from consumers.stage import Record
from consumers.tables import TableFollower
from ledger.authn import Keyring
from ledger.authority import admission_withdrawn, merge_approval, takes_over, version_in_force
from ledger.events import Approval, Dispatch, PolicyChange
from ledger.settings import LedgerSettings
from ledger.topology import Topic


class AdmissionTables:
    """Approvals and the policy in force, as the relay sees them.

    Args:
        settings: ledger settings (topics, partitions, configured policy version).
        keyring: checks the records' seals and signatures.
        retry: rides out retriable Kafka errors while the tables are read.
        lock: the relay's lock for what its sink lanes share.

    Attributes:
        approvals: ``approval_id -> approval`` (revocations merged).
        policy_change: the policy change in force (``None``: the configured version).
        approvals_table: follows ``approvals`` (lazy: a grant's Ed25519
            signature is checked only when a dispatch names it).
        policy_table: follows ``policy``.
    """

    def __init__(
        self,
        settings: LedgerSettings,
        keyring: Keyring,
        retry: KafkaRetry,
        lock: threading.RLock,
    ) -> None:
        self.settings = settings
        self._lock = lock
        self.approvals: dict[str, Approval] = {}
        self.policy_change: PolicyChange | None = None
        self._followed = False
        self.approvals_table = TableFollower(
            settings, Topic.APPROVALS, self.apply_approval, keyring=keyring, retry=retry, lazy=True
        )
        self.policy_table = TableFollower(
            settings, Topic.POLICY, self.apply_policy, keyring=keyring, retry=retry
        )

    @property
    def policy_version(self) -> int:
        """The policy version in force (derived from :attr:`policy_change`)."""
        return version_in_force(self.policy_change, self.settings.policy_version)

    def withdrawn(self, d: Dispatch) -> str | None:
        """Why the dispatch's admission no longer stands, or ``None``.

        Reads the approvals and policy tables up to their current end first
        (authenticated records only), then applies the pure rule
        :func:`~ledger.authority.admission_withdrawn`.
        """
        with self._lock:
            if not self._followed:
                self.approvals_table.follow(set(range(self.settings.partitions)))
                self.policy_table.follow({0})
                self._followed = True
            else:
                self.approvals_table.catch_up()
                self.policy_table.catch_up()
            if d.approval_id is not None:
                self.approvals_table.settle(d.approval_id)
            approval = self.approvals.get(d.approval_id) if d.approval_id is not None else None
            return admission_withdrawn(d.approval_id, approval, self.policy_version)

    def apply_approval(self, key: str, rec: Record | None) -> None:
        """Apply one record of the ``approvals`` table (a grant, or a revocation merged in)."""
        if rec is not None and isinstance(rec.event, Approval) and rec.event.approval_id == key:
            self.approvals[key] = merge_approval(self.approvals.get(key), rec.event).approval

    def apply_policy(self, key: str, rec: Record | None) -> None:
        """Apply one record of the ``policy`` table (the kernel's rules; it reports refusals)."""
        if (
            rec is not None
            and isinstance(rec.event, PolicyChange)
            and takes_over(key, rec.event, self.policy_change)
        ):
            self.policy_change = rec.event

    def close(self) -> None:
        """Close both followers."""
        self.approvals_table.close()
        self.policy_table.close()
