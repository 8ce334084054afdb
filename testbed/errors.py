"""The testbed's own errors, under the ledger's root :class:`~ledger.errors.LedgerError`.

Only the testbed raises these: a malformed game-day scenario, a reference
sink's database that cannot be used, a reference sink (or a real system the
adapters are tried against) that does not start. They live here, not in
:mod:`ledger.errors`, so the product carries none of the testbed. A
``ledger`` command says them as it says every ``LedgerError``: ``Error: ...``
with exit status 1.

The hierarchy::

    LedgerError
    ├── ScenarioError
    └── SinkError
        ├── SinkStoreError
        └── SinkStartError
"""

from __future__ import annotations

from ledger.errors import LedgerError, SinkError


class ScenarioError(LedgerError):
    """A game-day scenario is malformed (the message names the bad key or value).

    Args:
        message: the file, the bad key or value, and what is wanted instead.
        source: the scenario's file (or ``<scenario>`` for an object).

    Attributes:
        source: as given.
    """

    def __init__(self, message: str, *, source: str | None = None) -> None:
        super().__init__(message)
        self.source = source


class SinkStoreError(SinkError):
    """A sink's database cannot be used (another sink's file, a newer schema).

    Args:
        message: the problem and the remedy (e.g. another ``--db``).
        sink: the sink that tried to open it.
        path: the database file.

    Attributes:
        path: as given.
    """

    def __init__(self, message: str, *, sink: str | None = None, path: str | None = None) -> None:
        super().__init__(message, sink=sink)
        self.path = path


class SinkStartError(SinkError):
    """A reference sink process is not running as asked; the message quotes its log.

    Raised when it was never started, is already running, exits during
    start-up or does not answer ``/health`` in time.
    """
