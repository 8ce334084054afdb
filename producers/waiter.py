"""The publisher's waiter: until the ledger holds an operation in a wanted state.

:class:`OperationWaiter` remembers the parameter digest its publisher last
published for each operation and waits on the processor's ``state`` topic
(:func:`producers.waiting.wait_for_state`) for one of the states asked for;
:meth:`producers.publisher.LedgerPublisher.wait_for` delegates to it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ledger.credentials import load_keyring
from ledger.errors import InvalidInputError
from ledger.events import OperationState
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState
from producers.waiting import wait_for_state


class OperationWaiter:
    """Waits for operations to reach a state, checking the digest last published.

    Args:
        settings: ledger settings (bootstrap servers, topic prefix, whether
            records must be authenticated).

    Attributes:
        published: operation ID -> the parameter digest last published for
            it (what :meth:`wait_for` checks the state against).
    """

    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings
        self.published: dict[str, str] = {}

    def wait_for(
        self,
        operation_id: str,
        states: Iterable[RecoveryState | str],
        timeout_s: float = 60.0,
        parameter_digest: str | None = None,
    ) -> OperationState:
        """Wait until the ledger holds ``operation_id`` in one of ``states``.

        Reads the processor's ``state`` topic (only records sealed by a
        stage) and decides on the latest state once it has read to the end:
        one of ``states`` returns, a resting state that is not one of them
        (:data:`ledger.states.RESTING`: OUTCOME_VERIFIED, ABANDONED,
        NEEDS_REAUTHORISATION, UNKNOWN_OUTCOME) raises at once, any other
        state is waited through. The latest state is what counts: an
        operation published again after NEEDS_REAUTHORISATION is still seen
        there until the processor has decided on the new intent, so wait for
        that decision first (``ledger intent publish`` does).

        Args:
            operation_id: the operation, e.g. ``refund:1842:v3``.
            states: the states to wait for, e.g. ``{"OUTCOME_VERIFIED"}``.
            timeout_s: how long to wait, in seconds.
            parameter_digest: the digest of the intent waited on; default:
                the digest this publisher last published for the operation
                (none: not checked). A state bound to another digest means
                the intent was refused as parameter drift, so its state is
                not an answer.

        Returns:
            The operation's :class:`~ledger.events.OperationState` (its
            ``state`` one of ``states``; ``reason`` says why it moved there).

        Raises:
            LedgerError: ``states`` is empty or names no recovery state.
            OperationEndedElsewhereError: it rests in another state
                (``observed`` names it).
            ParameterDriftError: the operation is bound to another parameter
                digest (``expected`` is the intent's, ``observed`` the state's).
            WaitTimeoutError: none of ``states`` within ``timeout_s``
                (retryable; ``observed`` is the state last seen, or ``None``).
            LocalFileError: a key file is unreadable.
        """
        try:
            wanted = frozenset(RecoveryState(s) for s in states)
        except ValueError as exc:
            raise InvalidInputError(f"wait_for: {exc}", operation_id=operation_id) from exc
        if not wanted:
            raise InvalidInputError("wait_for: name at least one state", operation_id=operation_id)
        keyring = (
            load_keyring(self.settings) if self.settings.require_authenticated_records else None
        )
        digest = parameter_digest or self.published.get(operation_id)
        return wait_for_state(self.settings, operation_id, wanted, timeout_s, keyring, digest)
