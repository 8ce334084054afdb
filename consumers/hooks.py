"""The fault-hooks port: where a stage lets a test harness break it.

Every stage calls ``self.hooks.seam(name, operation_id)`` at each named seam
(SCENARIOS.md: ``before_admission`` ... ``after_commit_before_verification``).
In production the hooks are :data:`NO_FAULTS`, which does nothing: a stage
started as an operator starts it (``ledger processor``) cannot be made to
crash by a file in its run folder or by anything else outside its process.
Only the testbed (``python -m testbed.stage``) hands a stage hooks that fire
(:class:`testbed.faults.ArmedFaults`, SIGKILL at an armed seam), or that
shift the ledger clock a stage reads (a game day's ``skew``: a replica whose
clock runs ahead or behind); production hooks hand the clock back unchanged.
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

from ledger.clock import Clock

#: The named seams (SCENARIOS.md), in the order an operation reaches them: the
#: authority kernel's, the processor's, then the relay's.
Seam = Literal[
    "before_admission",
    "after_admission_before_dispatch",
    "after_dispatch_before_send",
    "after_reserve_before_confirm",
    "after_sink_commit_before_receipt",
    "after_receipt_before_commit",
    "after_commit_before_verification",
]
SEAMS: tuple[str, ...] = get_args(Seam)


class FaultHooks(Protocol):
    """What a stage calls at each named seam."""

    def seam(self, name: str, operation_id: str) -> None:
        """Reached seam ``name`` while handling ``operation_id``.

        Args:
            name: the seam, one of SCENARIOS.md's seam names.
            operation_id: the operation being handled.
        """

    def clock(self, base: Clock) -> Clock:
        """The clock the stage reads: ``base`` (the settings' clock), or a testbed's shift of it.

        Args:
            base: the clock ``LEDGER_CLOCK`` names (:func:`ledger.clock.clock_for`).

        Returns:
            The clock to read, in milliseconds.
        """
        ...


class NoFaults:
    """Fault hooks that never fire: the production default."""

    def seam(self, name: str, operation_id: str) -> None:
        """Do nothing (production stages never inject faults)."""

    def clock(self, base: Clock) -> Clock:
        """``base`` itself: a production stage reads the clock its settings name."""
        return base


#: The hooks every stage gets unless a test harness passes its own.
NO_FAULTS: FaultHooks = NoFaults()
