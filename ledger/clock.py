"""Clocks: the only place a ledger process learns the time.

The pure core never reads a clock; adapters read one of these and pass the
value in as ``now_ms`` (milliseconds). Decisions that depend on time record
the time they were evaluated at, so replay never needs a clock.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Protocol

from ledger.errors import LocalFileError, SettingsError

#: Largest single move of the manual clock (seconds): ten years.
MAX_ADVANCE_S = 10 * 365 * 24 * 3600.0


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
