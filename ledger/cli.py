"""The ``ledger`` command: operators', auditors' and demo entry points.

Every command reads its settings from the environment (``LEDGER_*``, see
:class:`ledger.config.LedgerSettings`); ``ledger config`` prints them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ledger.cli_infra import broker_group, topics_group
from ledger.config import LedgerSettings
from ledger.errors import LedgerError

_SETTINGS_HELP = """
Settings come from the environment (prefix LEDGER_): LEDGER_BOOTSTRAP_SERVERS
(or KAFKA_BOOTSTRAP_SERVERS; default 127.0.0.1:19092), LEDGER_TOPIC_PREFIX
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


@main.group("intent")
def intent_group() -> None:
    """Publish intents (what services do through producers.IntentPublisher)."""


@intent_group.command("publish")
@click.option("--operation-id", required=True, help="Stable operation ID, e.g. refund:1842:v3.")
@click.option("--sink", required=True, help="Sink name (see the sink registry).")
@click.option("--action", required=True, help="Action, e.g. refund.")
@click.option(
    "--params",
    "params_json",
    required=True,
    help='JSON object, e.g. \'{"account":"a","amount_minor":5000}\'.',
)
@click.option("--actor", required=True)
@click.option("--subject", required=True)
@click.option("--purpose", required=True)
@click.option("--decision-version", type=int, required=True)
@click.option("--approval-id", default=None)
def intent_publish(
    operation_id: str,
    sink: str,
    action: str,
    params_json: str,
    actor: str,
    subject: str,
    purpose: str,
    decision_version: int,
    approval_id: str | None,
) -> None:
    """Publish one intent; prints its operation ID and parameter digest."""
    from producers.intents import IntentPublisher

    try:
        params = json.loads(params_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"--params is not JSON: {exc}") from exc
    if not isinstance(params, dict):
        raise click.BadParameter("--params must be a JSON object")
    pub = IntentPublisher(_settings())
    try:
        result = pub.publish(
            operation_id=operation_id,
            sink=sink,
            action=action,
            params=params,
            actor=actor,
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
            approval_id=approval_id,
        )
    except LedgerError as exc:
        raise click.ClickException(exc.message) from exc
    finally:
        pub.close()
    click.echo(json.dumps(result.__dict__))


@main.command("state")
@click.argument("operation_id", required=False)
def state_cmd(operation_id: str | None) -> None:
    """Show the recovery state of one operation, or of all (from ledger.state)."""
    from consumers.reader import current_states

    try:
        states = current_states(_settings())
    except LedgerError as exc:
        raise click.ClickException(exc.message) from exc
    if operation_id is not None:
        st = states.get(operation_id)
        if st is None:
            raise click.ClickException(f"no operation {operation_id!r} in the ledger")
        click.echo(json.dumps(st.model_dump(mode="json"), indent=2))
        return
    for op, st in sorted(states.items()):
        click.echo(f"{op}\t{st.state}\tv{st.version}\tepoch {st.epoch}\t{st.reason}")


@main.command("claim")
@click.argument("operation_id")
@click.option("--worker", required=True, help="Who claims ownership of the resume.")
@click.option(
    "--expected-version",
    default="current",
    show_default=True,
    help="State version the claimant read ('current' reads it now).",
)
def claim_cmd(operation_id: str, worker: str, expected_version: str) -> None:
    """Claim an operation for resume (compare-and-swap on its version)."""
    from consumers.reader import current_states
    from producers.intents import IntentPublisher

    settings = _settings()
    if expected_version == "current":
        st = current_states(settings).get(operation_id)
        if st is None:
            raise click.ClickException(f"no operation {operation_id!r} in the ledger")
        version = st.version
    else:
        try:
            version = int(expected_version)
        except ValueError as exc:
            raise click.BadParameter("--expected-version takes an int or 'current'") from exc
    pub = IntentPublisher(settings)
    try:
        claim_id = pub.publish_claim(operation_id, worker, version)
    finally:
        pub.close()
    click.echo(json.dumps({"claim_id": claim_id, "expected_version": version}))


@main.group("clock")
def clock_group() -> None:
    """The manual ledger clock (LEDGER_CLOCK=manual): show it or move it forward."""


@clock_group.command("show")
def clock_show() -> None:
    """Print the ledger time in seconds."""
    from ledger.clock import clock_for

    s = _settings()
    click.echo(f"{clock_for(s.clock, s.run_dir).now_ms() / 1000:g}")


@clock_group.command("advance")
@click.argument("seconds", type=float)
def clock_advance(seconds: float) -> None:
    """Move the manual ledger clock forward by SECONDS."""
    from ledger.clock import ManualClock

    s = _settings()
    if s.clock != "manual":
        raise click.ClickException("LEDGER_CLOCK is not 'manual'; the system clock cannot be moved")
    try:
        now = ManualClock(s.run_dir / "clock").advance(seconds)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    click.echo(f"{now / 1000:g}")


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(type(value).__name__)


if __name__ == "__main__":
    main()
