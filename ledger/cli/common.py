"""What every ``ledger`` command shares: settings, logging, and how errors are said.

* :func:`current_settings` -- the one settings helper: the :class:`LedgerSettings` a
  parent command (or a test) put in the click context, else one read from the
  environment (``LEDGER_*``).
* :class:`LedgerGroup` -- the root group's class: a :class:`LedgerError`
  raised by any command becomes ``Error: <message>`` on standard error and
  exit status 1 (the message names the remedy), never a traceback.
* :func:`setup_logging` -- log lines to standard error.
* The exit codes every command uses (:data:`EXIT_CODES`, one table: the
  docs/operating.md, "JSON output and exit codes", repeats it) and :func:`echo_json`,
  how every ``--json`` prints.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from ledger import topics
from ledger.authn import STAGE_KEY_ROLES
from ledger.credentials import keys_dir
from ledger.errors import BrokerUnavailableError, InputBoundsError, LedgerError, TopicConfigError
from ledger.instants import EPOCH_LIKE_MS
from ledger.logs import configure_logging
from ledger.rolekeys import TRUST_FILE
from ledger.settings import LedgerSettings
from ledger.topology import TOPICS

#: Success.
EXIT_OK = 0
#: The work failed with a LedgerError, the processor refused the input, or
#: the audit found a violation.
EXIT_ERROR = 1
#: Bad input: an unknown option, a value of the wrong form (click's usage error, or
#: an InputBoundsError: an operation ID outside the grammar, a negative amount).
EXIT_USAGE = 2
#: What was waited for did not happen in time: no decision within --wait-s,
#: no state of --until within --timeout, a broker that does not run
#: (``ledger broker status``).
EXIT_TIMEOUT = 3
#: ``--until``: the operation came to rest in a state not asked for
#: (NEEDS_REAUTHORISATION, ABANDONED, UNKNOWN_OUTCOME ...).
EXIT_ENDED_ELSEWHERE = 4
#: The operation named is not in the ledger.
EXIT_UNKNOWN_OPERATION = 5
#: Kafka does not answer (retryable: try again once it runs).
EXIT_BROKER_UNREACHABLE = 6
#: The ledger's topics do not exist under this prefix: run ``ledger topics create``.
EXIT_TOPICS_MISSING = 7
#: ``ledger reconcile run``: work it owns is left open (an unknown outcome
#: still unknown, or a stranded operation, :mod:`ledger.stranded`).
EXIT_WORK_OPEN = 8

#: Every exit code and its meaning, in one table (``ledger --help`` and docs/operating.md say it).
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_ERROR: "error, refused input or audit violation",
    EXIT_USAGE: "bad input (usage)",
    EXIT_TIMEOUT: "not in time (no decision, --until timed out, broker not running)",
    EXIT_ENDED_ELSEWHERE: "the operation ended in another state than --until asked",
    EXIT_UNKNOWN_OPERATION: "unknown operation",
    EXIT_BROKER_UNREACHABLE: "broker unreachable",
    EXIT_TOPICS_MISSING: "topics not created (run `ledger topics create`)",
    EXIT_WORK_OPEN: "work left open: unknown or stranded operations remain (reconcile run)",
}


def exit_code_for(error: LedgerError) -> int:
    """The exit code a command ends with when ``error`` stops it.

    Args:
        error: the ledger error raised by the command.

    Returns:
        :data:`EXIT_BROKER_UNREACHABLE` for a broker that does not answer,
        :data:`EXIT_TOPICS_MISSING` for topics not created, :data:`EXIT_USAGE`
        for an input of the wrong form (:class:`~ledger.errors.InputBoundsError`:
        an operation ID outside the grammar, a negative amount, a record
        over the bounds), else :data:`EXIT_ERROR`.
    """
    if isinstance(error, BrokerUnavailableError):
        return EXIT_BROKER_UNREACHABLE
    if isinstance(error, InputBoundsError):
        return EXIT_USAGE
    if isinstance(error, TopicConfigError) and error.config == "existence":
        return EXIT_TOPICS_MISSING
    return EXIT_ERROR


def echo_json(document: Any) -> None:
    """Print ``document`` as indented JSON on standard output (what every ``--json`` does).

    Values JSON does not know (paths, enums) are printed as their text.
    """
    click.echo(json.dumps(document, indent=2, default=str))


def fail(message: str, code: int) -> NoReturn:
    """Say ``Error: message`` on standard error and exit with ``code``.

    Args:
        message: one line naming the problem and the remedy.
        code: one of the ``EXIT_*`` codes.
    """
    raise LedgerExit(message, code)


class LedgerExit(click.ClickException):
    """A one-line error with its own exit code (see :data:`EXIT_CODES`).

    Args:
        message: the line said after ``Error:``.
        code: the exit code.
    """

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        # click declares exit_code on the class; each instance carries its own here.
        setattr(self, "exit_code", code)  # noqa: B010


class LedgerCommandError(click.ClickException):
    """A :class:`LedgerError` said as a CLI error (``Error: ...``).

    The exit code is :func:`exit_code_for`'s: 1, or the documented code of a
    broker that does not answer or of topics not created.

    Args:
        error: the ledger error; its message is shown, with ``(retryable)``
            appended when trying again later can succeed.
    """

    exit_code = EXIT_ERROR

    def __init__(self, error: LedgerError) -> None:
        suffix = " (retryable: try again once the cause is gone)" if error.retryable else ""
        super().__init__(error.message + suffix)
        self.error = error
        setattr(self, "exit_code", exit_code_for(error))  # noqa: B010


class LedgerGroup(click.Group):
    """A click group that translates every :class:`LedgerError` once, for all commands."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the chosen command; a LedgerError becomes :class:`LedgerCommandError`."""
        try:
            return super().invoke(ctx)
        except LedgerError as exc:
            raise LedgerCommandError(exc) from exc


#: What a reader says when the ledger it was pointed at may be the wrong one.
OTHER_LEDGER_HINT = (
    "to read another ledger, set LEDGER_TOPIC_PREFIX and LEDGER_RUN_DIR to its topic prefix "
    "and run folder (`ledger demo` and `ledger gameday run` print theirs at the end)"
)


def reader_ready(settings: LedgerSettings) -> None:
    """What a command that only reads the ledger checks first; it creates nothing.

    Checks that the topics exist (else exit 7, "topics not created"), and
    that the keys that authenticate its records are there: a run folder
    without the stage roles' public keys (``stage-keys.json``) or an earlier
    release's deployment key can authenticate no record, so when the
    topics hold records that is said (exit 1) instead of reporting a ledger
    that looks empty. Nothing is written: no key, no trusted-keys file.

    Args:
        settings: the command's settings (``topic_prefix``, ``run_dir``, ``keys_dir``).

    Raises:
        TopicConfigError: the topics do not exist or are unsafe (exit 7 or 1).
        BrokerUnavailableError: the broker does not answer (exit 6).
        LedgerExit: no stage keys for a ledger that holds records (exit 1).
    """
    topics.check_topics(settings)
    key = keys_dir(settings) / TRUST_FILE
    if key.exists() or (keys_dir(settings) / "deployment.key").exists():
        return
    # Records the run folder's keys seal: the stage roles' and the authority
    # kernel's. Intents (unsealed) and people's signed records are checked
    # without them.
    sealed = [
        t.name for t in TOPICS if "authority" in t.auth or any(r in STAGE_KEY_ROLES for r in t.auth)
    ]
    held = topics.non_empty_topics(settings, sealed)
    if held:
        fail(
            f"no stage keys at {key}, so no record the stages sealed in the ledger with "
            f"topic prefix {settings.topic_prefix!r} (records in {', '.join(held)}) can be "
            "authenticated and every reader would refuse them: LEDGER_RUN_DIR (or "
            "LEDGER_KEYS_DIR) must name the run folder of the stages that wrote this ledger "
            f"(in force: {settings.run_dir}); {OTHER_LEDGER_HINT}",
            EXIT_ERROR,
        )


def instant_text(at_ms: int, now_ms: int) -> str:
    """A ledger-clock instant for people.

    A ledger-clock instant for people: ``2026-12-01T23:10:00Z (in 3600 s)``
    on the system clock, ``3600 s (in 3600 s)`` on a manual clock.

    Args:
        at_ms: the instant, milliseconds on the ledger clock.
        now_ms: now on the same clock, milliseconds.
    """
    delta_s = (at_ms - now_ms) / 1000
    relative = f"in {delta_s:.0f} s" if delta_s >= 0 else f"{-delta_s:.0f} s ago"
    if at_ms >= EPOCH_LIKE_MS:  # a wall-clock instant (ledger.instants)
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


def bootstrap_in_force(environ: Mapping[str, str] | None = None) -> str:
    """The broker clients go to as the environment says, and why: for help texts.

    Read without building the settings, so that ``--help`` works whatever
    the environment holds. ``bootstrap.servers`` in LEDGER_KAFKA_CONFIG_FILE
    still wins over it (``ledger config`` says which is in force).

    Args:
        environ: the environment (default ``os.environ``).

    Returns:
        e.g. ``127.0.0.1:39292 (LEDGER_KAFKA_PORT)`` or
        ``127.0.0.1:19092 (default port)``.
    """
    env = os.environ if environ is None else environ
    for variable in ("LEDGER_BOOTSTRAP_SERVERS", "KAFKA_BOOTSTRAP_SERVERS"):
        if env.get(variable):
            return f"{env[variable]} ({variable})"
    port = env.get("LEDGER_KAFKA_PORT")
    if port:
        return f"127.0.0.1:{port} (LEDGER_KAFKA_PORT)"
    return f"127.0.0.1:{LedgerSettings.model_fields['kafka_port'].default} (default port)"


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
