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
import os
import sys
from typing import Any

import click
from pydantic import ValidationError

from ledger.errors import LedgerError
from ledger.logs import configure_logging
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


def setup_logging(verbose: bool, stage: str | None = None, instance: str | None = None) -> None:
    """Log to standard error: INFO and up when ``verbose``, else WARNING and up.

    The format is ``LEDGER_LOG_FORMAT`` (``text``, the default, or ``json``;
    see :func:`ledger.logs.configure_logging`); an unknown value falls back
    to text with a warning, so that the command still says what it does.

    Args:
        verbose: INFO and up (else WARNING and up).
        stage: the stage this process runs, named on every JSON line.
        instance: its instance name.
    """
    fmt = os.environ.get("LEDGER_LOG_FORMAT", "text").strip().lower() or "text"
    level = logging.INFO if verbose else logging.WARNING
    if fmt not in ("text", "json"):
        configure_logging("text", stage, instance, level=level, stream=sys.stderr)
        logging.getLogger(__name__).warning(
            "LEDGER_LOG_FORMAT=%r is neither text nor json; logging text", fmt
        )
        return
    configure_logging("json" if fmt == "json" else "text", stage, instance, level=level)
