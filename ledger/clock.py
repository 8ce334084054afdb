"""Clocks: the only place a ledger process learns the time.

The pure core never reads a clock; adapters read one of these and pass the
value in as ``now_ms`` (milliseconds). Decisions that depend on time record
the time they were evaluated at, so replay never needs a clock.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ledger.errors import LocalFileError, SettingsError

#: Largest single move of the manual clock (seconds): ten years.
MAX_ADVANCE_S = 10 * 365 * 24 * 3600.0

#: Latest time any clock reading may name (milliseconds): 3000-01-01T00:00:00Z.
#: Nothing the ledger decides lies that far ahead, on the wall clock or on the
#: testbed's manual clock (which counts from 0 in steps of at most
#: :data:`MAX_ADVANCE_S`); a reading beyond it (2^62 ms, a corrupted clock file)
#: is refused whatever else the stage knows.
CEILING_MS = 32_503_680_000_000

#: Default of ``LEDGER_CLOCK_MAX_SKEW_S``: how far a reading may stray from the
#: stage's other sources of time before it is refused (seconds).
DEFAULT_MAX_SKEW_S = 300.0


class Clock(Protocol):
    """A source of the current ledger time in milliseconds."""

    def now_ms(self) -> int:
        """Return the current ledger time in milliseconds."""
        ...


class SystemClock:
    """Wall-clock time (Unix epoch, milliseconds)."""

    def now_ms(self) -> int:
        """Return ``time.time()`` in whole milliseconds."""
        return int(time.time() * 1000)


class ManualClock:
    """The ledger clock used by demos and game days.

    It starts at 0 and moves only when :meth:`advance` is called (by
    ``ledger clock advance`` or the game-day runner). Its value lives in a
    small file so that every process on the machine reads the same time.

    Args:
        path: the file holding the time in milliseconds (absent means 0).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def now_ms(self) -> int:
        """Return the time stored in the file (0 when the file is absent).

        Raises:
            LocalFileError: the file does not hold a whole number of milliseconds.
        """
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        except UnicodeDecodeError as exc:
            raise LocalFileError(
                f"the ledger clock {self.path} is not text ({exc}); write the last known "
                "time into it (e.g. 0) or remove it to start at 0",
                observed=str(exc),
            ) from exc
        except OSError as exc:
            raise LocalFileError(
                f"cannot read the ledger clock {self.path}: {exc}; fix its permissions",
                observed=str(exc),
            ) from exc
        try:
            return int(text or "0")
        except ValueError as exc:
            raise LocalFileError(
                f"the ledger clock {self.path} holds {text[:40]!r}, not milliseconds; "
                "write the last known time into it (e.g. 0) or remove it to start at 0",
                observed=text[:40],
            ) from exc

    def set_ms(self, value_ms: int) -> None:
        """Set the clock to ``value_ms`` (atomic replace of the file)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(str(int(value_ms)))
        os.replace(tmp, self.path)

    def advance(self, seconds: float) -> int:
        """Move the clock forward by ``seconds`` and return the new time (ms).

        Raises:
            ValueError: if ``seconds`` is negative (the clock never goes back),
                not finite, or more than :data:`MAX_ADVANCE_S` at once.
        """
        if not math.isfinite(seconds) or seconds > MAX_ADVANCE_S:
            raise ValueError(f"the ledger clock moves at most {MAX_ADVANCE_S:g} seconds at once")
        if seconds < 0:
            raise ValueError("the ledger clock only moves forward")
        new = self.now_ms() + int(round(seconds * 1000))
        self.set_ms(new)
        return new


def clock_for(kind: str, run_dir: Path) -> Clock:
    """Build the clock a settings object names.

    Args:
        kind: ``system`` or ``manual``.
        run_dir: run folder; the manual clock lives in ``run_dir/clock``.

    Raises:
        ValueError: for any other kind.
    """
    if kind == "system":
        return SystemClock()
    if kind == "manual":
        return ManualClock(run_dir / "clock")
    raise ValueError(f"unknown clock {kind!r}: use 'system' or 'manual' (LEDGER_CLOCK)")


def check_stage_clock(kind: str, *, testbed: bool) -> None:
    """Refuse a clock a stage must not run on.

    The manual ledger clock starts at 0 and moves only when someone moves
    it, so on it approvals never expire: it is for testbeds (demo, game days,
    missions, tests), which say so with ``LEDGER_TESTBED=true``.

    Args:
        kind: the ``LEDGER_CLOCK`` setting (``system`` or ``manual``).
        testbed: the ``LEDGER_TESTBED`` setting.

    Raises:
        SettingsError: ``kind`` is ``manual`` and ``testbed`` is false, or
            ``kind`` is neither ``system`` nor ``manual``.
    """
    if kind == "system" or (kind == "manual" and testbed):
        return
    if kind == "manual":
        raise SettingsError(
            "a stage refuses the manual ledger clock (LEDGER_CLOCK=manual) outside a testbed: "
            "it starts at 0 and moves only with 'ledger clock advance', so approvals would "
            "never expire. Unset LEDGER_CLOCK (the system clock is the default), or set "
            "LEDGER_TESTBED=true if this process runs in a testbed (demo, game day, tests)",
            expected="LEDGER_CLOCK=system, or LEDGER_TESTBED=true",
            observed="LEDGER_CLOCK=manual",
        )
    raise SettingsError(
        f"unknown clock {kind!r} (LEDGER_CLOCK): use 'system' (the default) or, in a "
        "testbed, 'manual'",
        expected="system or manual",
        observed=kind,
    )


def age_s(now_ms: int, then_ms: int | None) -> float | None:
    """How long ago ``then_ms`` was at ``now_ms``, in seconds, never negative.

    Both must be read on the same ledger clock (:func:`clock_for`); a
    ``then_ms`` ahead of ``now_ms`` (written on another clock, or a manual
    clock moved back by a new run folder) counts as 0, not as a negative age.

    Args:
        now_ms: the ledger time now, in milliseconds.
        then_ms: the ledger time of the event, in milliseconds, or ``None``.

    Returns:
        Seconds (``>= 0``), or ``None`` when ``then_ms`` is ``None``.
    """
    if then_ms is None:
        return None
    return max(0, now_ms - then_ms) / 1000


@dataclass(frozen=True)
class ClockVerdict:
    """What a stage makes of one clock reading (see :func:`judge_reading`).

    Attributes:
        accepted: the reading agrees with the stage's other sources.
        now_ms: the ledger time to decide with (milliseconds): the reading
            (or the last time, when the reading is a little behind it) when
            accepted; the expected time when refused, never the reading.
        reference_ms: what the reading was compared with (the expected
            time; the witness when the reading was accepted on its word),
            ``None`` for a first reading.
        reason: why it was refused (``None`` when accepted).
        keep: whether ``now_ms`` may be kept as the time the stage last decided
            with. ``False`` only for the fail-closed ceiling of a first reading
            that was refused: deciding with it once is safe (every limit has
            passed), keeping it would latch the stage there, as no later sane
            reading could come close to it.
    """

    accepted: bool
    now_ms: int
    reference_ms: int | None
    reason: str | None = None
    keep: bool = True


def judge_reading(
    reading_ms: int,
    *,
    last_ms: int | None,
    elapsed_ms: int,
    witness_ms: int | None,
    max_behind_ms: int,
    max_ahead_ms: int,
    ceiling_ms: int = CEILING_MS,
) -> ClockVerdict:
    """Accept or refuse one clock reading, given the stage's other sources of time.

    Pure: the caller reads the clocks and keeps the state. The sources:

    * the **expected time**, ``last_ms + elapsed_ms``: the ledger time the
      stage last decided with, moved on by the process's monotonic clock
      since then (a manual clock passes ``elapsed_ms=0``: testbed time moves
      only when someone moves it);
    * a **witness** (system clock only): the Kafka timestamp of the record
      the stage read last, moved on by the monotonic time since it was read
      (the producers' and the broker's clocks, not this host's);
    * the **ceiling** (:data:`CEILING_MS`) and 0, for every reading.

    Rules, in order:

    0. A reading more than ``max_behind_ms`` behind the witness (within
       0..``ceiling_ms``) is refused, and the stage decides with the later
       of the expected time and the witness: records written after the time
       the clock names show it is behind, even a clock wrong since the
       stage started (the expected time only ever agrees with it). Behind
       is the dangerous side: an approval that lapsed would still admit.
       Ahead of the witness is not refused here (a stage reading a backlog
       sees old records).
    1. A reading below 0 or beyond ``ceiling_ms`` is refused. With no
       expected time yet (the stage's first reading), the stage decides
       with the witness, or else with ``ceiling_ms``: fail closed, every
       time limit counts as passed until a sane reading comes (never 0,
       which would make every approval current). That ceiling is never kept
       as the stage's time (``keep`` is ``False``), so the next sane reading
       is a first reading again and is accepted.
    2. A first reading (``last_ms`` is ``None``) is accepted.
    3. A reading from ``max_behind_ms`` behind to ``max_ahead_ms`` ahead of
       the expected time is accepted; time never goes back, so ``now_ms``
       is the larger of the reading and ``last_ms``.
    4. Otherwise a reading within ``max_behind_ms``/``max_ahead_ms`` of the
       witness is accepted as the new time, even behind ``last_ms``: the
       world agrees with it, so the earlier time was the wrong one (a stage
       started on a wrong wall clock that was then corrected). Without this
       rule one wrong first reading would latch the stage as surely as one
       far-future reading does.
    5. Otherwise the reading is refused and the stage decides with the
       expected time: expiries keep falling due on the monotonic clock, and
       nothing refused is ever stored, so the next sane reading is accepted.

    Args:
        reading_ms: the clock's reading (milliseconds).
        last_ms: the time the stage last decided with, ``None`` at first.
        elapsed_ms: monotonic milliseconds since ``last_ms`` was taken (0 for
            a manual clock).
        witness_ms: the witness's time now, or ``None`` when there is none.
        max_behind_ms: how far behind a reference a reading may be.
        max_ahead_ms: how far ahead of a reference a reading may be.
        ceiling_ms: the latest time any reading may name.

    Returns:
        The verdict: accepted or not, and the time to decide with.
    """
    expected = None if last_ms is None else last_ms + max(0, elapsed_ms)
    if reading_ms < 0 or reading_ms > ceiling_ms:
        fallback = next(t for t in (expected, witness_ms, ceiling_ms) if t is not None)
        return ClockVerdict(
            False,
            fallback,
            expected,
            f"reading {reading_ms} ms is outside 0..{ceiling_ms} ms (year 3000)",
            keep=expected is not None or witness_ms is not None,
        )
    sane_witness = witness_ms is not None and 0 <= witness_ms <= ceiling_ms
    if sane_witness and reading_ms < (witness_ms or 0) - max_behind_ms:
        # The records were written after the time this clock names: it is
        # behind (from boot, too: the stage's own time would only agree
        # with it). Deciding with it would keep lapsed approvals current,
        # so the later time decides (fail closed).
        assert witness_ms is not None
        now = witness_ms if expected is None else max(expected, witness_ms)
        return ClockVerdict(
            False,
            now,
            witness_ms,
            f"reading {reading_ms} ms is {(witness_ms - reading_ms) / 1000:.3f} s behind "
            f"the time of the records just read, {witness_ms} ms (allowed: "
            f"{max_behind_ms / 1000:g} s): this host's clock is behind (or a record's "
            "timestamp is ahead); deciding with the later time",
        )
    if last_ms is None:
        return ClockVerdict(True, reading_ms, None)
    assert expected is not None
    if expected - max_behind_ms <= reading_ms <= expected + max_ahead_ms:
        return ClockVerdict(True, max(last_ms, reading_ms), expected)
    if witness_ms is not None and (
        witness_ms - max_behind_ms <= reading_ms <= witness_ms + max_ahead_ms
    ):
        return ClockVerdict(True, reading_ms, witness_ms)
    off_s = (reading_ms - expected) / 1000
    return ClockVerdict(
        False,
        expected,
        expected,
        f"reading {reading_ms} ms is {abs(off_s):.3f} s {'ahead of' if off_s > 0 else 'behind'} "
        f"the expected {expected} ms (allowed: {max_behind_ms / 1000:g} s behind, "
        f"{max_ahead_ms / 1000:g} s ahead)"
        + ("" if witness_ms is None else f" and of the records' time {witness_ms} ms"),
    )


def reading_bounds(kind: str, max_skew_s: float) -> tuple[int, int, bool]:
    """How far a reading of clock ``kind`` may stray, and whether time elapses between readings.

    The system clock is held to ``max_skew_s`` either way of the expected
    time (``LEDGER_CLOCK_MAX_SKEW_S``), and its expected time moves with the
    process's monotonic clock. The manual clock moves only when a testbed
    moves it, forward, in steps of at most :data:`MAX_ADVANCE_S` (``ledger
    clock advance`` refuses more): a reading may be that far ahead of the
    last one (scenarios advance by hours and days), and ``max_skew_s``
    behind it (a reading behind never moves the time back: see
    :func:`judge_reading`).

    Args:
        kind: ``system`` or ``manual``.
        max_skew_s: ``LEDGER_CLOCK_MAX_SKEW_S`` (seconds).

    Returns:
        ``(max_behind_ms, max_ahead_ms, elapses)``.
    """
    skew_ms = int(max_skew_s * 1000)
    if kind == "manual":
        return skew_ms, int(MAX_ADVANCE_S * 1000), False
    return skew_ms, skew_ms, True
