"""``ledger processor|authority|relay``: run one stage in the foreground."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import click

from consumers.hooks import NO_FAULTS, FaultHooks
from consumers.stages import STAGES
from ledger.cli.common import current_settings, setup_logging
from ledger.kafka import CLIENT_LOGGER, describe


def run_stage(
    component: str, instance: str, hooks_for: Callable[[Path], FaultHooks] | None = None
) -> None:
    """Run one stage until SIGTERM or Ctrl-C, logging to standard error.

    Args:
        component: a key of :data:`consumers.stages.STAGES`.
        instance: the instance name (part of its transactional ID).
        hooks_for: builds the stage's fault hooks from its run folder; None
            (what every ``ledger`` command passes) gives hooks that never fire.

    Raises:
        LedgerError: when the stage stops on an error it cannot survive.
    """
    setup_logging(True)
    # One line per sink request is noise at this level (the journal and the
    # receipts hold every call's outcome).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    current = current_settings()
    if current.kafka_debug:
        CLIENT_LOGGER.propagate = True
        CLIENT_LOGGER.setLevel(logging.DEBUG)
    # Refuses an unsafe or malformed client properties file before any client
    # is built, and says which properties are in force (secrets masked).
    properties = ", ".join(f"{p.key}={p.value} ({p.source})" for p in describe(current))
    logging.getLogger(__name__).info(
        "%s-%s: Kafka client properties: %s", component, instance, properties
    )
    hooks = hooks_for(current.run_dir) if hooks_for is not None else NO_FAULTS
    STAGES[component](current, instance, hooks).run()


_STAGE_HELP = """
Runs until SIGTERM or Ctrl-C as a consume-transform-produce loop with a
transactional producer (transactional.id {prefix}.{component}.{instance}:
a restarted instance fences its predecessor). Run several instances with
different --instance values to share the partitions (consumer group
{prefix}.{component}, range assignment). Logs go to standard error.
"""

_INSTANCE = click.option(
    "--instance", default="0", show_default=True, help="Instance name (stable per process slot)."
)


@click.command(
    "processor", help="Run the processor: decides every recovery transition.\n" + _STAGE_HELP
)
@_INSTANCE
def processor_cmd(instance: str) -> None:
    """Run the processor stage."""
    run_stage("processor", instance)


@click.command(
    "authority",
    help="Run the authority kernel: admits operations, consumes approvals once.\n" + _STAGE_HELP,
)
@_INSTANCE
def authority_cmd(instance: str) -> None:
    """Run the authority kernel stage."""
    run_stage("authority", instance)


@click.command(
    "relay",
    help="Run the outbox relay: performs dispatches against sinks, reads back first.\n"
    + _STAGE_HELP,
)
@_INSTANCE
def relay_cmd(instance: str) -> None:
    """Run the relay stage."""
    run_stage("relay", instance)


#: The stage commands, in the order ``ledger --help`` lists them.
COMMANDS: tuple[click.Command, ...] = (processor_cmd, authority_cmd, relay_cmd)
