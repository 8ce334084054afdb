"""The authority kernel's tables: approvals, their uses and the policy in force.

The kernel (:mod:`consumers.authority`) follows three topics as tables
(:class:`consumers.tables.TableFollower`): ``ledger.approvals`` and
``ledger.approval-uses`` (its own output) on the partitions it is assigned,
and ``ledger.policy`` whole. :class:`AdmissionTables` holds what they say
and what about them cannot be used:

* a record of another kind, or naming another key, is no row of its table
  (``BAD_INPUT``, :meth:`AdmissionTables.misplaced`); a review decision that
  cannot take effect is reported (``APPROVAL_REFUSED``); a policy change
  that does not supersede the one in force is refused (``BAD_INPUT``);
* a record sealed by a key this kernel does not hold holds what it is
  about: its approval (an approval or a use) or every request (a policy
  change), until the kernel restarts with the key or, for the policy, an
  operator sets it again with a trusted key (fail closed).

Operating events about them go to the kernel's notes, written with its next
transaction. The uses consumed in the open transaction are staged in
:attr:`AdmissionTables.uses` (committed on commit, dropped on abort).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import Message

from consumers.retry import KafkaRetry
from consumers.runtime.pending import PendingMap, kept
from consumers.stage import Record, record_event
from consumers.tables import TableFollower
from ledger.authn import Keyring
from ledger.authority import (
    LEGACY_POLICY_KEY,
    merge_approval,
    policy_key,
    supersedes,
    version_in_force,
)
from ledger.events import (
    AdmissionRequest,
    Approval,
    ApprovalUse,
    Event,
    OperatingEvent,
    PolicyChange,
)
from ledger.settings import LedgerSettings
from ledger.topology import Topic

# These lines are the kernel's: operators filter its log by this name.
log = logging.getLogger("consumers.authority")

#: The operating event of a refused table record (as :meth:`consumers.stage.Stage.table_refusal`).
TableRefusal = Callable[..., tuple[str, OperatingEvent]]


class AdmissionTables:
    """Approvals, uses and the policy the kernel decides with (see the module docstring).

    Args:
        settings: the kernel's settings (topics, the configured policy version).
        keyring: checks the tables' seals.
        retry: the retry policy of the followers' reads.
        notes: the kernel's writes still to make (``(topic, key, event)``, appended to).
        refusal: the operating event of a refused record (the kernel's
            :meth:`~consumers.stage.Stage.table_refusal`).

    Attributes:
        approvals: approval ID -> the approval as merged from its records.
        uses: approval ID -> its consumption, from approval-uses (committed),
            and those consumed in the open transaction (staged).
        policy_change: the policy change in force (``None``: the configured version).
        unverifiable: approval ID -> what about it cannot be verified (a use
            or a revocation sealed by a key this kernel does not hold):
            held, never admitted, until the kernel restarts with the key.
        unverifiable_policy: a policy record this kernel cannot verify:
            every request is held.
        approval_follower: follows ``ledger.approvals``.
        use_follower: follows ``ledger.approval-uses``.
        policy_follower: follows ``ledger.policy``.
    """

    def __init__(
        self,
        settings: LedgerSettings,
        keyring: Keyring,
        retry: KafkaRetry,
        notes: list[tuple[str, str, Event]],
        refusal: TableRefusal,
    ) -> None:
        self.settings = settings
        self._notes = notes
        self._refusal = refusal
        self.approvals: dict[str, Approval] = {}
        self.uses: PendingMap[str, ApprovalUse, ApprovalUse] = PendingMap(kept)
        self.policy_change: PolicyChange | None = None
        self.unverifiable: dict[str, str] = {}
        self.unverifiable_policy: str | None = None
        #: the offset of the latest such record: a verified change after it lifts the hold.
        self._unverifiable_policy_offset = -1
        # Followed lazily: a restart files every approval and use by key, and
        # a key's signatures are verified when a request names it (settle).
        self.approval_follower = TableFollower(
            settings,
            Topic.APPROVALS,
            self.apply_approval,
            on_bad=self.bad_table_value,
            keyring=keyring,
            retry=retry,
            lazy=True,
            on_unverifiable=self.unverifiable_row,
        )
        self.use_follower = TableFollower(
            settings,
            Topic.APPROVAL_USES,
            self.apply_use,
            on_bad=self.bad_table_value,
            keyring=keyring,
            retry=retry,
            lazy=True,
            on_unverifiable=self.unverifiable_row,
        )
        self.policy_follower = TableFollower(
            settings,
            Topic.POLICY,
            self.apply_policy,
            on_bad=self.bad_table_value,
            keyring=keyring,
            retry=retry,
            on_unverifiable=self.unverifiable_policy_row,
        )

    @property
    def policy_version(self) -> int:
        """The policy version in force (derived from :attr:`policy_change`)."""
        return version_in_force(self.policy_change, self.settings.policy_version)

    def followers(self) -> tuple[TableFollower, TableFollower, TableFollower]:
        """The three followers: approvals, uses, policy."""
        return self.approval_follower, self.use_follower, self.policy_follower

    def follow(self, partitions: set[int]) -> tuple[int, int]:
        """Follow the approvals and uses of ``partitions`` from the beginning (committed ones).

        Returns:
            ``(approvals, uses)`` filed (each checked when a request names it).
        """
        self.approvals.clear()
        self.uses.committed.clear()
        self.unverifiable.clear()
        return self.approval_follower.follow(partitions), self.use_follower.follow(partitions)

    def reload(self) -> None:
        """Forget the open transaction's uses and read the approvals and uses again."""
        self.uses.abort()
        self.approvals.clear()
        self.uses.committed.clear()
        self.unverifiable.clear()
        self.approval_follower.follow(self.approval_follower.partitions)
        self.use_follower.follow(self.use_follower.partitions)

    def catch_up(self) -> None:
        """Read what the three topics gained since the last catch-up."""
        self.approval_follower.catch_up()
        self.use_follower.catch_up()
        self.policy_follower.catch_up()

    def settle(self, records: list[Record]) -> None:
        """Check and apply the held approvals and uses of the batch's approval IDs."""
        for rec in records:
            if isinstance(rec.event, AdmissionRequest):
                self.approval_follower.settle(rec.event.approval_id)
                self.use_follower.settle(rec.event.approval_id)

    def held_for(self, approval_id: str) -> str | None:
        """Why a request for ``approval_id`` must be held (``None``: its evidence is verified)."""
        return self.unverifiable.get(approval_id) or self.unverifiable_policy

    def close(self) -> None:
        """Close the followers' consumers."""
        for follower in self.followers():
            follower.close()

    def misplaced(self, rec: Record, expected: str, named: str | None, key: str) -> bool:
        """Report a table record of another kind, or naming another key, as ``BAD_INPUT``.

        Such a record decodes and may be authentic, but it is not a row of the
        table: it is never applied, and an operating event (kept bytes) says so.

        Args:
            rec: the decoded record.
            expected: the event kind the table holds (``Approval`` ...).
            named: the key the event itself names (``None``: no such field).
            key: the record's key.

        Returns:
            True when the record was reported (and must not be applied).
        """
        if rec.event.KIND == expected and named == key:
            return False
        problem = (
            f"a {rec.event.KIND} is not a {rec.topic} record (expected {expected})"
            if rec.event.KIND != expected
            else f"the record's key {key[:200]!r} differs from the {expected}'s {named!r}"
        )
        log.warning("authority: %s at %s:%s:%s", problem, rec.topic, rec.partition, rec.offset)
        self._notes.append(
            (
                Topic.OPERATING_EVENTS,
                key or "(no key)",
                record_event("authority", rec, "BAD_INPUT", problem, id_suffix="MISPLACED"),
            )
        )
        return True

    def apply_approval(self, key: str, rec: Record | None) -> None:
        """Apply one ``approvals`` record (``None``: a tombstone) to the approvals table."""
        if rec is None or self.misplaced(
            rec, Approval.KIND, getattr(rec.event, "approval_id", None), key
        ):
            return
        assert isinstance(rec.event, Approval)
        merged = merge_approval(self.approvals.get(key), rec.event)
        self.approvals[key] = merged.approval
        if merged.note:
            self._notes.append(
                (
                    Topic.OPERATING_EVENTS,
                    key,
                    record_event(
                        "authority", rec, "APPROVAL_REFUSED", merged.note, id_suffix="APPROVAL"
                    ),
                )
            )

    def apply_use(self, key: str, rec: Record | None) -> None:
        """Apply one ``approval-uses`` record; the first use of an approval stands."""
        if rec is None or self.misplaced(
            rec, ApprovalUse.KIND, getattr(rec.event, "approval_id", None), key
        ):
            return
        assert isinstance(rec.event, ApprovalUse)
        self.uses.committed.setdefault(key, rec.event)  # the first use stands

    def apply_policy(self, key: str, rec: Record | None) -> None:
        """Apply one ``policy`` record; the latest effective change is in force."""
        # A change is keyed by itself (policy_key); earlier releases wrote one
        # row keyed 'current'. The latest effective change is in force.
        named = None
        if isinstance(rec.event if rec else None, PolicyChange):
            assert rec is not None and isinstance(rec.event, PolicyChange)
            named = key if key == LEGACY_POLICY_KEY else policy_key(rec.event)
        if rec is None or self.misplaced(rec, PolicyChange.KIND, named, key):
            return
        assert isinstance(rec.event, PolicyChange)
        if rec.event.version < 1:
            # Versions count from 1; the publisher refuses others, so another
            # writer made this one. The policy in force stays.
            reason = (
                f"policy change to version {rec.event.version} by {rec.event.set_by!r} refused: "
                f"policy versions count from 1; version {self.policy_version} stays in force"
            )
            self.refuse_policy(rec, key, reason)
            return
        if not supersedes(rec.event, self.policy_change):
            shown = self.policy_change
            assert shown is not None
            reason = (
                f"policy change to version {rec.event.version} by {rec.event.set_by!r}, effective "
                f"at {rec.event.effective_at_ms} ms, refused: not later than version "
                f"{shown.version} in force since {shown.effective_at_ms} ms (a replayed "
                "change? set the version again to change it)"
            )
            self.refuse_policy(rec, key, reason)
            return
        self.policy_change = rec.event
        if self.unverifiable_policy is not None and rec.offset > self._unverifiable_policy_offset:
            # An operator with a trusted key set the policy after the record nobody
            # can verify: that change decides (a replayed old change cannot: it does
            # not supersede the one in force, so it is refused above).
            log.warning(
                "authority: %s no longer holds admissions: policy version %d set by %s after it",
                self.unverifiable_policy,
                rec.event.version,
                rec.event.set_by,
            )
            self.unverifiable_policy = None

    def refuse_policy(self, rec: Record, key: str, reason: str) -> None:
        """A policy change that does not take over: logged, and a ``BAD_INPUT`` operating event."""
        log.error("authority: %s", reason)
        self._notes.append(
            (
                Topic.OPERATING_EVENTS,
                key,
                record_event("authority", rec, "BAD_INPUT", reason, id_suffix="POLICY"),
            )
        )

    def unverifiable_row(self, key: str, msg: Message, problem: str) -> None:
        """An approval or use record sealed by a key this kernel does not hold holds its approval.

        It may be authentic evidence (a use made before the keys were lost):
        reading it as absent would let a consumed approval pay again. The
        record itself is reported once, as an ``UNVERIFIABLE`` operating
        event, by :meth:`bad_table_value`.
        """
        topic = (msg.topic() or "").removeprefix(self.settings.topic_prefix + ".")
        self.unverifiable.setdefault(key, f"{topic}:{msg.partition()}:{msg.offset()} {problem}")

    def unverifiable_policy_row(self, key: str, msg: Message, problem: str) -> None:
        """A policy record this kernel cannot verify holds every request (fail closed).

        It may be a genuine change whose operator key was lost (read as absent,
        approvals it retired would admit again), or a record of a key nobody ever
        held. Either way the hold lasts until the key is restored or an operator
        sets the policy again with a trusted key: a verified change later in the
        topic than every unverifiable one decides (see :meth:`apply_policy`).
        """
        self._unverifiable_policy_offset = max(self._unverifiable_policy_offset, msg.offset() or 0)
        if self.unverifiable_policy is None:
            self.unverifiable_policy = f"policy:{msg.partition()}:{msg.offset()} {problem}"
            log.error(
                "authority: %s: every admission is held until the key is restored or an "
                "operator sets the policy again ('ledger policy set N --by OPERATOR' with a "
                "version above the one in force)",
                self.unverifiable_policy,
            )

    def unverifiable_held(self) -> dict[str, str]:
        """What this kernel holds for evidence it cannot verify (key -> the record and reason)."""
        held = dict(self.unverifiable)
        if self.unverifiable_policy is not None:
            held["(policy: every approval)"] = self.unverifiable_policy
        return held

    def bad_table_value(self, msg: Message, reason: str, kind: str) -> None:
        """An approval, use or policy record that is refused becomes an operating event.

        It is treated as absent (an intent relying on it is refused: approval
        not found; a forged use or tombstone changes nothing); see
        :meth:`consumers.stage.Stage.table_refusal`.
        """
        key, event = self._refusal(msg, reason, kind, keyed_by_operation=False)
        self._notes.append((Topic.OPERATING_EVENTS, key, event))
