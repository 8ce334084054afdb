"""Local files a running stage reads, kept through a corruption.

A stage reads a few small files beside the ledger: the sink registry
(``sinks.json``), the trusted reviewer keys and the manual ledger clock. A
loader raises :class:`~ledger.errors.LocalFileError` (naming the file and the
remedy) when one is corrupted. A one-shot command says that error and exits;
a running stage must not die of it (a supervisor would restart it into the
same error for ever). :class:`LastGood` gives the stage the content it last
read well, logs the problem with its remedy, and reports it once as an
operating event; at start, before anything was read well, the stage waits
and retries (:meth:`LastGood.wait`) instead of crash-looping.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar, cast

from ledger.clock import Clock
from ledger.errors import LocalFileError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between two attempts to read a file that is unreadable at start.
RETRY_S = 2.0
#: Seconds between two log lines about the same persisting problem.
REPEAT_LOG_S = 60.0


class LastGood(Generic[T]):
    """A local file as last read well.

    Args:
        what: what the file is, for log lines (e.g. ``sink registry``).
        load: reads and parses the file; raises :class:`LocalFileError` when
            it is corrupted (a missing file is the loader's to define).
        component: the stage reading it, for log lines.
        on_problem: called once when a problem starts, or its message
            changes, with the error (e.g. to publish an operating event);
            not called again while the same problem persists.
        retry_s: seconds between attempts in :meth:`wait`.
    """

    def __init__(
        self,
        what: str,
        load: Callable[[], T],
        *,
        component: str,
        on_problem: Callable[[LocalFileError], None] | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        self.what = what
        self._load = load
        self.component = component
        self.on_problem = on_problem
        self.retry_s = retry_s
        self._value: T | None = None
        self._has = False
        #: message of the problem in force, ``None`` while the file reads well.
        self.problem: str | None = None
        self._logged_at = 0.0

    @property
    def loaded(self) -> bool:
        """Whether the file has been read well at least once."""
        return self._has

    def read(self) -> T:
        """Read the file now; on a corruption, the content last read well.

        Returns:
            The freshly read content, or, when the file is corrupted, what it
            held when last read well (the problem is logged and reported).

        Raises:
            LocalFileError: the file is corrupted and was never read well
                (call :meth:`wait` at start so that this cannot happen).
        """
        try:
            value = self._load()
        except LocalFileError as exc:
            self._complain(exc, keeping=self._has)
            if not self._has:
                raise
            return cast(T, self._value)
        if self.problem is not None:
            log.warning("%s: the %s is readable again", self.component, self.what)
            self.problem = None
        self._value, self._has = value, True
        return value

    def wait(self, stopping: Callable[[], bool] = lambda: False) -> T | None:
        """Read the file until it reads well: for start-up, before any good content.

        Each failed attempt logs the error (which names the file and the
        remedy) at most every :data:`REPEAT_LOG_S` seconds, then sleeps
        ``retry_s``.

        Args:
            stopping: polled between attempts; when it says ``True`` the wait ends.

        Returns:
            The content, or ``None`` when ``stopping`` ended the wait first.
        """
        while True:
            try:
                return self.read()
            except LocalFileError:
                if stopping():
                    return None
                time.sleep(self.retry_s)

    def _complain(self, exc: LocalFileError, *, keeping: bool) -> None:
        now = time.monotonic()
        new = exc.message != self.problem
        if new or now - self._logged_at >= REPEAT_LOG_S:
            then = (
                "keeping the content last read well"
                if keeping
                else f"waiting for it (retry every {self.retry_s:g} s)"
            )
            log.error("%s: %s; %s", self.component, exc.message, then)
            self._logged_at = now
        if new:
            self.problem = exc.message
            if self.on_problem is not None:
                self.on_problem(exc)


class LastGoodClock:
    """A :class:`~ledger.clock.Clock` that survives a corrupted clock file.

    It reads ``clock`` through :class:`LastGood`: when the file is corrupted
    the time last read well stands (a manual clock only moves forward, so it
    is the latest time known to have been reached) until the file is fixed.
    Readings never go back.

    Args:
        clock: the clock the settings name (a manual clock reads a file).
        component: the stage, for log lines.
        on_problem: see :class:`LastGood`.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        component: str,
        on_problem: Callable[[LocalFileError], None] | None = None,
    ) -> None:
        self.file = LastGood(
            "ledger clock", clock.now_ms, component=component, on_problem=on_problem
        )
        self._last = 0

    def now_ms(self) -> int:
        """The ledger time in milliseconds (the last good reading while the file is corrupted).

        Raises:
            LocalFileError: the clock file is corrupted and was never read well.
        """
        self._last = max(self._last, self.file.read())
        return self._last
