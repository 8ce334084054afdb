"""The ``ledger`` command: operators', auditors' and demo entry points.

Every command reads its settings from the environment (``LEDGER_*``, see
:class:`ledger.settings.LedgerSettings`); ``ledger config`` prints them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from ledger.cli_infra import broker_group, topics_group
from ledger.errors import LedgerError
from ledger.settings import LedgerSettings

_SETTINGS_HELP = """
Settings come from the environment (prefix LEDGER_): LEDGER_BOOTSTRAP_SERVERS
(or KAFKA_BOOTSTRAP_SERVERS; default 127.0.0.1:LEDGER_KAFKA_PORT, 19092), LEDGER_TOPIC_PREFIX
(default 'ledger'), LEDGER_PARTITIONS (3), LEDGER_RUN_DIR (.ledger/),
LEDGER_CLOCK ('manual' ledger clock or 'system'), LEDGER_RELAY_MODE ('ledger'
or 'checkpoint-only'). Run 'ledger config' to see the values in force.
"""


def _settings() -> LedgerSettings:
    return LedgerSettings()


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@click.group(help="Event-sourced recovery ledger on Apache Kafka.\n" + _SETTINGS_HELP)
@click.version_option(package_name="kafka-recovery-ledger")
def main() -> None:
    """Root command group."""


main.add_command(broker_group)
main.add_command(topics_group)


@main.command("config")
def config_cmd() -> None:
    """Print the settings in force (after LEDGER_* environment variables)."""
    for key, value in _settings().model_dump().items():
        click.echo(f"LEDGER_{key.upper()}={value}")


def _run_stage(component: str, instance: str) -> None:
    from consumers.harness import STAGES

    _logging(True)
    # One line per sink request is noise at this level (the journal and the
    # receipts hold every call's outcome).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    settings = _settings()
    if settings.kafka_debug:
        from ledger.broker import CLIENT_LOGGER

        CLIENT_LOGGER.propagate = True
        CLIENT_LOGGER.setLevel(logging.DEBUG)
    stage = STAGES[component](settings, instance)
    try:
        stage.run()
    except LedgerError as exc:
        raise click.ClickException(exc.message) from exc


_STAGE_HELP = """
Runs until SIGTERM or Ctrl-C as a consume-transform-produce loop with a
transactional producer (transactional.id {prefix}.{component}.{instance}:
a restarted instance fences its predecessor). Run several instances with
different --instance values to share the partitions (consumer group
{prefix}.{component}, range assignment). Logs go to standard error.
"""


@main.command(
    "processor", help="Run the processor: decides every recovery transition.\n" + _STAGE_HELP
)
@click.option(
    "--instance", default="0", show_default=True, help="Instance name (stable per process slot)."
)
def processor_cmd(instance: str) -> None:
    """Run the processor stage."""
    _run_stage("processor", instance)


@main.command(
    "authority",
    help="Run the authority kernel: admits operations, consumes approvals once.\n" + _STAGE_HELP,
)
@click.option(
    "--instance", default="0", show_default=True, help="Instance name (stable per process slot)."
)
def authority_cmd(instance: str) -> None:
    """Run the authority kernel stage."""
    _run_stage("authority", instance)


@main.command(
    "relay",
    help="Run the outbox relay: performs dispatches against sinks, reads back first.\n"
    + _STAGE_HELP,
)
@click.option(
    "--instance", default="0", show_default=True, help="Instance name (stable per process slot)."
)
def relay_cmd(instance: str) -> None:
    """Run the relay stage."""
    _run_stage("relay", instance)


@main.command("demo")
@click.option("--verbose", is_flag=True, help="Show each journaled transition as it happens.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
@click.option(
    "--keep-broker",
    is_flag=True,
    help="Leave the local broker running afterwards if the demo started it.",
)
def demo_cmd(verbose: bool, as_json: bool, keep_broker: bool) -> None:
    """Run the article's four interruption cases through real processes on Kafka.

    Starts (or reuses) the local broker, then for each case creates its own
    topics, starts a reference sink and the processor, authority kernel and
    relay as separate processes, kills one of them with SIGKILL at the named
    seam, restarts it, and reads back what happened: effects from the sink,
    phases from ledger.state, claim decisions from the journal. Prints the
    report as JSON and exits 0 only if every value matches the expected one.
    """
    from consumers.demo import EXPECTED, run_demo

    def say(text: str) -> None:
        if not as_json:
            click.echo(text, err=True)

    with _broker(say, keep=keep_broker) as settings:
        t0 = time.monotonic()
        try:
            report = run_demo(settings, say, verbose=verbose)
        except LedgerError as exc:
            raise click.ClickException(exc.message) from exc
        say(f"demo finished in {time.monotonic() - t0:.1f} s")
    click.echo(json.dumps(report, indent=2))
    mismatches = [
        f"{case}.{key}: expected {value!r}, observed {report.get(case, {}).get(key)!r}"
        for case, fields in EXPECTED.items()
        for key, value in fields.items()
        if report.get(case, {}).get(key) != value
    ]
    if mismatches:
        for line in mismatches:
            click.echo(f"MISMATCH {line}", err=True)
        sys.exit(1)


@main.group("gameday")
def gameday_group() -> None:
    """Game days: scenario files (shared/SCENARIOS.md format) run on the real ledger."""


@gameday_group.command("run")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON reports.")
def gameday_run(files: tuple[Path, ...], as_json: bool) -> None:
    """Run scenario FILES (JSON or YAML) one after another.

    Each scenario gets its own topics, run folder and ledger clock, its
    declared reference sinks and the real stage processes; faults are real
    SIGKILLs at the named seams. Starts (or reuses) the local broker. Exits 0
    when every expectation of every file holds, 1 otherwise, 2 for a
    malformed file (the message names the bad key or value).
    """
    from consumers.gameday import run_files
    from ledger.scenario import ScenarioError, load

    for path in files:
        try:
            load(path)
        except ScenarioError as exc:
            click.echo(f"error: {exc.message}", err=True)
            sys.exit(2)

    def say(text: str) -> None:
        if not as_json:
            click.echo(text, err=True)

    with _broker(say) as settings:
        try:
            reports = run_files(list(files), settings, say)
        except LedgerError as exc:
            raise click.ClickException(exc.message) from exc
    if as_json:
        click.echo(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        for report in reports:
            click.echo(f"{'PASS' if report['passed'] else 'FAIL'}  {report['name']}")
    sys.exit(0 if all(r["passed"] for r in reports) else 1)


@contextlib.contextmanager
def _broker(say: Callable[[str], None], keep: bool = False) -> Iterator[LedgerSettings]:
    """Settings for a running broker: the configured one, or the local one started now."""
    from ledger import broker

    settings = _settings()
    started = False
    if settings.bootstrap_servers != broker.local_bootstrap(settings):
        # A broker configured elsewhere (KAFKA_BOOTSTRAP_SERVERS): use it as it is.
        yield settings
        return
    try:
        status = broker.status(settings)
        if not status.running:
            say("starting the local Kafka broker (first run fetches the jars with Maven) ...")
            status = broker.start(settings)
            started = True
        yield settings.model_copy(update={"bootstrap_servers": status.bootstrap})
    except LedgerError as exc:
        raise click.ClickException(exc.message) from exc
    finally:
        if started and not keep:
            broker.stop(settings)


# ---------------------------------------------------------------------- operators

from ledger.cli_mission import mission_group  # noqa: E402
from ledger.cli_ops import register  # noqa: E402

register(main)
main.add_command(mission_group)


if __name__ == "__main__":
    main()
