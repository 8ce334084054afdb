"""What every ``ledger`` command shares: settings, logging, and how errors are said.

* :func:`current_settings` -- the one settings helper: the :class:`LedgerSettings` a
  parent command (or a test) put in the click context, else one read from the
  environment (``LEDGER_*``).
* :class:`LedgerGroup` -- the root group's class: a :class:`LedgerError`
  raised by any command becomes ``Error: <message>`` on standard error and
  exit status 1 (the message names the remedy), never a traceback.
* :func:`setup_logging` -- log lines to standard error.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click
from pydantic import ValidationError

from ledger.errors import LedgerError
from ledger.settings import LedgerSettings

#: Exit status of a command whose work failed with a LedgerError.
EXIT_ERROR = 1


class LedgerCommandError(click.ClickException):
    """A :class:`LedgerError` said as a CLI error (``Error: ...``, exit status 1).

    Args:
        error: the ledger error; its message is shown, with ``(retryable)``
            appended when trying again later can succeed.
    """

    exit_code = EXIT_ERROR

    def __init__(self, error: LedgerError) -> None:
        suffix = " (retryable: try again once the cause is gone)" if error.retryable else ""
        super().__init__(error.message + suffix)
        self.error = error


class LedgerGroup(click.Group):
    """A click group that translates every :class:`LedgerError` once, for all commands."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the chosen command; a LedgerError becomes :class:`LedgerCommandError`."""
        try:
            return super().invoke(ctx)
        except LedgerError as exc:
            raise LedgerCommandError(exc) from exc


#: Ledger-clock instants at or after this (2001-09-09 in Unix milliseconds) are
#: wall-clock times; a manual clock (game days, demos) counts from 0.
_EPOCH_LIKE_MS = 1_000_000_000_000


def instant_text(at_ms: int, now_ms: int) -> str:
    """A ledger-clock instant for people: ``2026-12-01T23:10:00Z (in 3600 s)``
    on the system clock, ``3600 s (in 3600 s)`` on a manual clock.

    Args:
        at_ms: the instant, milliseconds on the ledger clock.
        now_ms: now on the same clock, milliseconds.
    """
    from datetime import UTC, datetime

    delta_s = (at_ms - now_ms) / 1000
    relative = f"in {delta_s:.0f} s" if delta_s >= 0 else f"{-delta_s:.0f} s ago"
    if at_ms >= _EPOCH_LIKE_MS:
        when = datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    else:
        when = f"{at_ms / 1000:.3f}".rstrip("0").rstrip(".") + " s"
    return f"{when} ({relative})"


def current_settings() -> LedgerSettings:
    """The settings of this command: from the click context if set there, else the environment.

    Returns:
        A :class:`LedgerSettings` (``LEDGER_*`` environment variables, see
        ``ledger config``).

    Raises:
        click.ClickException: a ``LEDGER_*`` variable holds an invalid value
            (e.g. ``LEDGER_POLICY_VERSION=0``); the message names it.
    """
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(LedgerSettings) if ctx is not None else None
    if found is not None:
        return found
    try:
        return LedgerSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"LEDGER_{'_'.join(str(p) for p in err['loc']).upper()}={err.get('input')!r}: "
            f"{err['msg']}"
            for err in exc.errors()
        )
        raise click.ClickException(
            f"invalid setting {problems}; fix the environment variable (see 'ledger --help')"
        ) from None


def setup_logging(verbose: bool) -> None:
    """Log to standard error: INFO and up when ``verbose``, else WARNING and up."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
