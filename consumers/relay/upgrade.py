"""The upgrade hold: a step the release manifest does not allow is recorded, not sent.

The relay is the one stage that knows the contract it is about to act under,
so it checks each step against the release manifest
(``LEDGER_RELEASE_MANIFEST_FILE``, :mod:`ledger.upgrades`) when the sink's
contract version in the registry differs from the one the step resumes
from; the fold stays pure.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from consumers.relay.attempts import AttemptBook
from consumers.relay.records import Output, Recorder, dispatch_event
from ledger.errors import LocalFileError
from ledger.events import Dispatch
from ledger.topology import Topic
from ledger.upgrades import ReleaseManifest, attempted_version, state_of_step, upgrade_hold
from sinks.registry import SinkEndpoint, load_manifest

log = logging.getLogger("consumers.relay")


class UpgradeGate:
    """Holds the steps the release manifest does not let a new contract version resume.

    Args:
        manifest_file: the release manifest (``None``: none; every change of
            contract version then holds what it meets).
        lock: the relay's lock for what its sink lanes share.
        book: the relay's attempts (which version each attempt was sent under).
        recorder: builds the hold's records.
    """

    def __init__(
        self,
        manifest_file: Path | None,
        lock: threading.RLock,
        book: AttemptBook,
        recorder: Recorder,
    ) -> None:
        self.manifest_file = manifest_file
        self._lock = lock
        self.book = book
        self.recorder = recorder
        self._manifest: ReleaseManifest | None = None
        self._read = False

    def manifest(self) -> ReleaseManifest | None:
        """The release manifest, read once.

        An unreadable manifest counts as none (every change of contract
        version then holds what it meets) and is logged.
        """
        with self._lock:
            if not self._read:
                self._read = True
                if self.manifest_file is not None:
                    try:
                        self._manifest = load_manifest(self.manifest_file)
                    except LocalFileError as exc:
                        log.error("relay: %s", exc.message)
            return self._manifest

    def hold(
        self, d: Dispatch, endpoint: SinkEndpoint, now: int, *, may_have_left: bool
    ) -> list[Output] | None:
        """Hold a step that the release manifest does not allow under the sink's new contract.

        The version the step resumes from is
        :func:`~ledger.upgrades.attempted_version`: for an execution that may
        have left, the version its attempt was sent under; for a readback or
        a postcondition, the version of the operation's latest receipt (any
        dispatch); else the dispatch's (``None``: version 1). When it differs
        from the registry's and the manifest does not let the new version
        resume the step's state (:func:`~ledger.upgrades.upgrade_hold`),
        nothing is sent: an execution is recorded ``AMBIGUOUS`` (the fold
        holds it as UNKNOWN_OUTCOME), a readback or postcondition as observed
        ``UNKNOWN``, each with a ``CONTRACT_UPGRADE_HOLD`` operating event; the
        reason names both versions. When the manifest allows it, the contract
        rules decide the step as always.

        Args:
            d: the dispatch.
            endpoint: the sink's registry entry now.
            now: the relay's clock (ms).
            may_have_left: an earlier request of this dispatch may have reached the sink.

        Returns:
            The outputs of the hold, or ``None`` when the step may go on.
        """
        from_version = attempted_version(
            d,
            may_have_left=may_have_left,
            dispatch_attempt=self.book.attempt_versions.get(d.dispatch_id),
            operation_attempt=self.book.operation_versions.get(d.operation_id),
        )
        reason = upgrade_hold(
            self.manifest(),
            d.sink,
            from_version=from_version,
            to_version=endpoint.contract_version,
            contract=endpoint.contract,
            state=state_of_step(d.kind, may_have_left=may_have_left),
        )
        if reason is None:
            return None
        log.warning("relay: %s held: %s", d.dispatch_id, reason)
        outcome: Output
        if d.kind == "EXECUTE":
            first = self.book.first_attempt(d, now)
            sent = f"the request may have reached {d.sink}" if may_have_left else "nothing was sent"
            outcome = (
                Topic.RECEIPTS,
                d.operation_id,
                # Nothing was sent under the new version: the receipt names the
                # version the effect was attempted under, so that it survives
                # compaction of the earlier receipts (an operation's receipts
                # share its key) as the evidence the next resume is held on.
                self.recorder.receipt(
                    d,
                    "AMBIGUOUS",
                    first,
                    now,
                    f"{sent}; {reason}",
                    on_resume=may_have_left,
                    contract_version=from_version,
                ),
            )
        else:
            outcome = self.recorder.unobserved(d, reason, now)
        return [outcome, dispatch_event(d, "CONTRACT_UPGRADE_HOLD", reason)]
