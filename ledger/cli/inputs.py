"""What the publishing commands share: readiness, the publisher, option checks, the decision.

Used by :mod:`ledger.cli.ops`, :mod:`ledger.cli.reconcile` and
:mod:`ledger.cli.approvals`. The checks run before Kafka is asked, and a
refused value exits 2 with what is expected.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from consumers import reader
from ledger import topics
from ledger.cli.common import EXIT_ERROR, EXIT_TIMEOUT
from ledger.history import journal_move
from ledger.identity import operation_id_problem
from ledger.settings import LedgerSettings
from ledger.tracing import configure
from producers.publisher import LedgerPublisher


def ready(settings: LedgerSettings) -> None:
    """Fail fast, with the remedy, when the broker or the topics are not there."""
    topics.check_topics(settings)


def publisher(settings: LedgerSettings) -> Any:
    """The CLI's :class:`~producers.publisher.LedgerPublisher` (close it after use)."""
    configure("ledger-cli")  # OTEL_* variables: the publish is the trace's first span
    return LedgerPublisher(settings, client_id="ledger-cli")


def non_blank(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse an empty or whitespace-only name or ID (``None``, an omitted option, passes)."""
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty or only white space")
    return value


def in_grammar(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse an operation ID outside the grammar (exit 2, before Kafka is asked)."""
    if value is not None:
        problem = operation_id_problem(value)
        if problem is not None:
            raise click.BadParameter(problem)
    return value


#: A policy version as an operator gives it: 1 or more (0 is refused, never "the default").
POLICY_VERSION = click.IntRange(min=1)

#: A parameter digest as ``ledger intent publish`` prints it: ``v2:`` and 64 lowercase hex
#: digits (SHA-256), or the 64 digits alone of a version-1 digest.
DIGEST = re.compile(r"(v2:)?[0-9a-f]{64}")


def digest(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a value that is not a parameter digest (:data:`DIGEST`)."""
    if value is not None and not DIGEST.fullmatch(value):
        raise click.BadParameter(
            "takes a parameter digest: 'v2:' and 64 lowercase hex digits, as "
            "'ledger intent publish' prints it"
        )
    return value


#: ``--wait-s``: how long a publishing command waits for the processor's decision (seconds).
WAIT_OPTION = click.option(
    "--wait-s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="How long to wait for the processor's decision; 0 publishes without waiting.",
)


def report_decision(
    settings: LedgerSettings, position: tuple[str, int, int], wait_s: float
) -> None:
    """Print the processor's journaled decision on an input.

    Exits :data:`~ledger.cli.common.EXIT_ERROR` when it refused the input,
    :data:`~ledger.cli.common.EXIT_TIMEOUT` when no decision came in time.
    """
    topic, partition, offset = position
    entry = reader.wait_for_decision(settings, topic, partition, offset, wait_s)
    if entry is None:
        click.echo(
            f"no decision within {wait_s:g} s: is the processor running ('ledger processor')?",
            err=True,
        )
        sys.exit(EXIT_TIMEOUT)
    click.echo(f"{entry.outcome}: {entry.operation_id} {journal_move(entry)} ({entry.reason})")
    if entry.outcome == "REFUSED":
        sys.exit(EXIT_ERROR)
