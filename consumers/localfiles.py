"""Local files a running stage reads, kept through a corruption.

A stage reads a few small files beside the ledger: the sink registry
(``sinks.json``), the trusted reviewer keys and the manual ledger clock.
:class:`LastGoodClock` also refuses a clock reading far from the stage's
other sources of time (:func:`ledger.clock.judge_reading`). A
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
import uuid
from collections.abc import Callable
from typing import Generic, TypeVar, cast

from ledger.clock import DEFAULT_MAX_SKEW_S, Clock, ClockVerdict, judge_reading, reading_bounds
from ledger.errors import LocalFileError
from ledger.events import OperatingEvent

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
    """A :class:`~ledger.clock.Clock` that survives a corrupted clock file and a wild reading.

    It reads ``clock`` through :class:`LastGood`: when the file is corrupted
    the time last read well stands (a manual clock only moves forward, so it
    is the latest time known to have been reached) until the file is fixed.

    Each reading is then judged against the stage's other sources of time
    (:func:`ledger.clock.judge_reading`): the time it last decided with,
    moved on by the process's monotonic clock (a system clock; a manual one
    moves only when the testbed moves it), and, for the system clock, the
    Kafka timestamp of the record it read last (:meth:`observe`), moved on
    the same way. A reading beyond year 3000, or further from them than
    ``max_skew_s`` (the manual clock: up to :data:`~ledger.clock.MAX_ADVANCE_S`
    ahead, the largest ``ledger clock advance``), is refused: it is never
    stored as the new time, the stage decides with the expected time, and
    ``on_refused`` hears of it (once per run of refused readings; every
    refused reading is counted in :attr:`refused`). The next sane reading is
    accepted: one reading of 2^62 ms cannot latch the stage. Readings never
    move the time back, except a reading the records' time confirms (the
    stage's own time was the wrong one).

    Args:
        clock: the clock the settings name (a manual clock reads a file).
        component: the stage, for log lines.
        on_problem: see :class:`LastGood`.
        kind: ``system`` or ``manual`` (``LEDGER_CLOCK``): which bounds apply
            (:func:`ledger.clock.reading_bounds`).
        max_skew_s: ``LEDGER_CLOCK_MAX_SKEW_S`` (seconds).
        on_refused: called with the refused reading (ms) and the verdict when
            a run of refused readings starts (e.g. to publish a
            ``CLOCK_REFUSED`` operating event).
        on_each_refusal: called for every refused reading (e.g. a metric).
        monotonic: the process's monotonic clock (seconds); tests pass their own.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        component: str,
        on_problem: Callable[[LocalFileError], None] | None = None,
        kind: str = "system",
        max_skew_s: float = DEFAULT_MAX_SKEW_S,
        on_refused: Callable[[int, ClockVerdict], None] | None = None,
        on_each_refusal: Callable[[], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.file = LastGood(
            "ledger clock", clock.now_ms, component=component, on_problem=on_problem
        )
        self.component = component
        self.kind = kind
        self._behind_ms, self._ahead_ms, self._elapses = reading_bounds(kind, max_skew_s)
        self.on_refused = on_refused
        self.on_each_refusal = on_each_refusal
        self._monotonic = monotonic
        #: the time last decided with and the monotonic time it was taken at.
        self._last: int | None = None
        self._last_at = 0.0
        #: the latest record's Kafka timestamp (ms) and the monotonic time it was read at.
        self._witness: tuple[int, float] | None = None
        #: the verdict on the latest refused reading while refusals last (``None``: accepting).
        self.refusing: ClockVerdict | None = None
        #: readings refused since start.
        self.refused = 0
        self._logged_at = 0.0

    def observe(self, timestamp_ms: int | None) -> None:
        """Note the Kafka timestamp of a record just read (a witness of the time; system clock).

        Args:
            timestamp_ms: the record's timestamp (Unix ms); ``None`` or not
                positive: none (ignored).
        """
        if timestamp_ms is not None and timestamp_ms > 0:
            self._witness = (timestamp_ms, self._monotonic())

    def now_ms(self) -> int:
        """The ledger time in milliseconds: the reading, unless it is refused.

        Returns:
            The accepted reading (or the last time, when the reading is a
            little behind it); for a refused reading, the expected time (see
            :func:`ledger.clock.judge_reading`).

        Raises:
            LocalFileError: the clock file is corrupted and was never read well.
        """
        reading = self.file.read()
        mono = self._monotonic()
        elapsed_ms = int((mono - self._last_at) * 1000) if self._elapses else 0
        witness = None
        if self._elapses and self._witness is not None:
            stamp, seen = self._witness
            witness = stamp + int((mono - seen) * 1000)
        verdict = judge_reading(
            reading,
            last_ms=self._last,
            elapsed_ms=elapsed_ms,
            witness_ms=witness,
            max_behind_ms=self._behind_ms,
            max_ahead_ms=self._ahead_ms,
        )
        if verdict.keep:
            self._last, self._last_at = verdict.now_ms, mono
        if verdict.accepted:
            if self.refusing is not None:
                log.warning(
                    "%s: the %s clock reads %d ms, accepted again",
                    self.component,
                    self.kind,
                    reading,
                )
                self.refusing = None
            return verdict.now_ms
        self.refused += 1
        if self.on_each_refusal is not None:
            self.on_each_refusal()
        first = self.refusing is None
        self.refusing = verdict
        if first or mono - self._logged_at >= REPEAT_LOG_S:
            log.error(
                "%s: %s clock reading refused: %s; deciding with %d ms",
                self.component,
                self.kind,
                verdict.reason,
                verdict.now_ms,
            )
            self._logged_at = mono
        if first and self.on_refused is not None:
            self.on_refused(reading, verdict)
        return verdict.now_ms


def clock_refused_event(
    writer: str, component: str, kind: str, reading_ms: int, verdict: ClockVerdict
) -> OperatingEvent:
    """The ``CLOCK_REFUSED`` operating event about a refused reading (keyed ``clock``).

    Args:
        writer: ``{component}-{instance}``, the start of the event ID.
        component: the stage.
        kind: the clock (``system`` or ``manual``).
        reading_ms: the refused reading.
        verdict: :func:`ledger.clock.judge_reading`'s verdict on it.
    """
    return OperatingEvent(
        event_id=f"{writer}:CLOCK_REFUSED:{uuid.uuid4().hex[:12]}",
        component=component,
        kind="CLOCK_REFUSED",
        reason=(
            f"{kind} clock reading {reading_ms} ms refused ({verdict.reason}); "
            f"deciding with {verdict.now_ms} ms, reference {verdict.reference_ms} ms. "
            "Check the host's clock (or the manual ledger clock file); the next "
            "reading that agrees with the stage's time is accepted"
        ),
    )
