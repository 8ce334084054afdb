"""The ``ledger`` command: operators', auditors' and stage entry points.

One root group (:data:`main`, a :class:`~ledger.cli.common.LedgerGroup` that
says every :class:`~ledger.errors.LedgerError` as ``Error: ...`` with exit
status 1), one registration list (:data:`COMMANDS`), one settings helper
(:func:`ledger.cli.common.current_settings`).

Other packages add commands through the entry-point group ``ledger.cli``:
each entry names a sequence of click commands. The testbed (local broker,
reference sinks, demo, game days, missions) comes in that way, so the product
never imports it; without the ``kafka-recovery-ledger-testbed`` distribution
those commands are absent.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

import click

from ledger import kafka
from ledger.cli import (
    acl,
    audit,
    console,
    history,
    keys,
    ops,
    reconcile,
    sinks,
    stages,
    topics,
    upgrade,
)
from ledger.cli.common import (
    EXIT_CODES,
    LedgerGroup,
    bootstrap_in_force,
    current_settings,
    echo_json,
)
from ledger.settings import ledger_home, resolved

#: Entry-point group through which other packages add commands to ``ledger``.
PLUGIN_GROUP = "ledger.cli"

_SETTINGS_HELP = f"""
Settings come from the environment (prefix LEDGER_): LEDGER_BOOTSTRAP_SERVERS
(or KAFKA_BOOTSTRAP_SERVERS; default 127.0.0.1:LEDGER_KAFKA_PORT; in force:
{bootstrap_in_force()}), LEDGER_TOPIC_PREFIX
(default 'ledger'), LEDGER_PARTITIONS (3), LEDGER_HOME (run folder .ledger/ and
broker home .cache/kafka/ live under it; default the current directory),
LEDGER_CLOCK ('system', the default, or the 'manual' ledger clock, which a stage
accepts only with LEDGER_TESTBED=true), LEDGER_INSTANCE (a stage's default
--instance; else the host name's trailing ordinal, else 0), LEDGER_RELAY_MODE
('ledger' or 'checkpoint-only'). Kafka client properties (security, SASL, TLS) come from
the Java-style properties file LEDGER_KAFKA_CONFIG_FILE and LEDGER_KAFKA_<PROPERTY>
variables (LEDGER_KAFKA_SASL_PASSWORD is sasl.password). Run 'ledger config' to
see the values in force (secrets masked).
"""


_EXIT_HELP = "\n\b\nExit codes (every command; docs/operating.md):\n" + "\n".join(
    f"  {code}  {meaning}" for code, meaning in EXIT_CODES.items()
)


@click.group(
    cls=LedgerGroup,
    help="Event-sourced recovery ledger on Apache Kafka.\n" + _SETTINGS_HELP + _EXIT_HELP,
)
@click.version_option(package_name="kafka-recovery-ledger")
def main() -> None:
    """Root command group."""


@click.command("config")
@click.option("--json", "as_json", is_flag=True, help="Print the values in force as JSON.")
def config_cmd(as_json: bool) -> None:
    """Print the settings and the Kafka client properties in force (secrets masked).

    Settings come from LEDGER_* environment variables; each line says where
    its value came from (the variable, or the default and how it is derived:
    paths left unset are shown as the path in force). Client properties come
    from the ledger's defaults, then the file LEDGER_KAFKA_CONFIG_FILE, then
    LEDGER_KAFKA_<PROPERTY> variables, then each role's own properties.
    Values of secret keys (passwords, secrets, tokens, private keys) are
    printed as ********.

    \b
    --json: {"ledger_home", "settings": [{"variable", "value", "source"}],
      "kafka": [{"key", "value", "source"}], "role_properties": {role: {key: value}}}
    """
    settings = current_settings()
    rows = resolved(settings)
    properties = kafka.describe(settings)
    if as_json:
        echo_json(
            {
                "ledger_home": str(ledger_home()),
                "settings": [
                    {"variable": v, "value": value, "source": source} for v, value, source in rows
                ],
                "kafka": [{"key": p.key, "value": p.value, "source": p.source} for p in properties],
                "role_properties": kafka.ROLE_PROPERTIES,
            }
        )
        return
    click.echo(f"LEDGER_HOME={ledger_home()}")
    for variable, value, source in rows:
        click.echo(f"{variable}={'' if value is None else value}  # {source}")
    click.echo(
        "# Kafka client properties of every client (ledger defaults < "
        "LEDGER_KAFKA_CONFIG_FILE < LEDGER_KAFKA_<PROPERTY>; secrets masked):"
    )
    for prop in properties:
        click.echo(f"{prop.key}={prop.value}  # {prop.source}")
    for role, props in kafka.ROLE_PROPERTIES.items():
        fixed = " ".join(f"{k}={v}" for k, v in props.items())
        click.echo(f"# every {role} also, whatever the file says: {fixed}")


#: Every command of the product, in one list: ``ledger --help`` shows them all.
COMMANDS: tuple[click.Command, ...] = (
    config_cmd,
    *stages.COMMANDS,
    topics.topics_group,
    *ops.COMMANDS,
    *reconcile.COMMANDS,
    *audit.COMMANDS,
    *history.COMMANDS,
    *keys.COMMANDS,
    *acl.COMMANDS,
    *console.COMMANDS,
    *upgrade.COMMANDS,
    *sinks.COMMANDS,
)


def _load_plugins(group: click.Group) -> None:
    """Add the commands of every installed ``ledger.cli`` entry point.

    A plug-in that fails to import (e.g. the testbed without its extra's
    dependencies) is skipped with a warning naming the remedy; the product's
    own commands keep working.
    """
    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            commands = entry.load()
        except ImportError as exc:
            logging.getLogger(__name__).warning(
                "ledger: commands of %r are unavailable (%s); install or repair "
                "'kafka-recovery-ledger-%s' for them",
                entry.name,
                exc,
                entry.name,
            )
            continue
        for command in commands:
            mine = group.commands.get(command.name or "")
            if mine is None:
                group.add_command(command)
            elif isinstance(mine, click.Group) and isinstance(command, click.Group):
                for sub in command.commands.values():  # a plug-in's own subcommands join ours
                    if sub.name not in mine.commands:
                        mine.add_command(sub)


for _command in COMMANDS:
    main.add_command(_command)
_load_plugins(main)


if __name__ == "__main__":
    main()
