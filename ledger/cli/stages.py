"""``ledger processor|authority|relay``: run one stage in the foreground."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

import click

from consumers.groups import stage_status
from consumers.hooks import NO_FAULTS, FaultHooks
from consumers.liveness import summary
from consumers.stages import STAGES
from consumers.twins import local_presences
from ledger import topics, tracing
from ledger.cli.common import (
    EXIT_ERROR,
    current_settings,
    echo_json,
    instant_text,
    setup_logging,
)
from ledger.clock import check_stage_clock
from ledger.errors import SettingsError
from ledger.kafka import CLIENT_LOGGER, describe
from ledger.logs import configure_logging
from ledger.settings import LedgerSettings

log = logging.getLogger(__name__)

#: What an instance name may hold: it is part of the transactional ID and the
#: static group member ID (``group.instance.id``), which Kafka restricts to these.
INSTANCE_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,100}")

#: The trailing ordinal of a host name, as a Kubernetes StatefulSet names its
#: pods (``relay-2``); matched against the first label of the name.
_ORDINAL = re.compile(r"-(\d+)$")


def resolve_instance(
    given: str | None, from_settings: str | None, hostname: str
) -> tuple[str, str]:
    """Choose a stage's instance name and say where it came from.

    In order: ``--instance``; ``LEDGER_INSTANCE``; the trailing ordinal of the
    host name's first label (``relay-2`` or ``relay-2.relay.ns.svc`` -> ``2``,
    as a StatefulSet names pods); else ``0``. Two live processes of one
    component with the same name share a transactional ID and a static member
    ID and fence each other, so each process slot needs its own.

    Args:
        given: the ``--instance`` option, or None when not given.
        from_settings: the ``instance`` setting (``LEDGER_INSTANCE``), or None.
        hostname: this host's name (``socket.gethostname()``).

    Returns:
        ``(instance, source)``: the name, and a phrase saying where it came
        from (for the log).

    Raises:
        SettingsError: the chosen name is empty or holds characters other than
            letters, digits, ``.``, ``_`` and ``-`` (or is over 100 long).
    """
    if given is not None:
        instance, source = given, "from --instance"
    elif from_settings:
        instance, source = from_settings, "from LEDGER_INSTANCE"
    elif match := _ORDINAL.search(hostname.split(".", 1)[0]):
        instance, source = match.group(1), f"from the ordinal of the host name {hostname!r}"
    else:
        instance = "0"
        source = (
            f"by default: no --instance, no LEDGER_INSTANCE and no trailing ordinal in the "
            f"host name {hostname!r}; a second process of this component with instance 0 "
            "would fence this one"
        )
    if not INSTANCE_PATTERN.fullmatch(instance):
        raise SettingsError(
            f"instance name {instance!r} ({source}) is not 1 to 100 letters, digits, '.', '_' "
            "or '-'; give --instance or LEDGER_INSTANCE such a name (e.g. 0, 1, 2)",
            expected=INSTANCE_PATTERN.pattern,
            observed=instance,
        )
    return instance, source


def run_stage(
    component: str,
    instance: str | None,
    hooks_for: Callable[[Path], FaultHooks] | None = None,
) -> None:
    """Run one stage until SIGTERM or Ctrl-C, logging to standard error.

    Args:
        component: a key of :data:`consumers.stages.STAGES`.
        instance: the instance name (part of its transactional ID); None
            chooses one as :func:`resolve_instance` says, and logs where it
            came from.
        hooks_for: builds the stage's fault hooks from its run folder; None
            (what every ``ledger`` command passes) gives hooks that never fire.

    Raises:
        LedgerError: when the stage stops on an error it cannot survive;
            :class:`SettingsError` for a bad instance name or the manual clock
            outside a testbed.
    """
    setup_logging(True)
    # One line per sink request is noise at this level (the journal and the
    # receipts hold every call's outcome).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    current = current_settings()
    if current.kafka_debug:
        CLIENT_LOGGER.propagate = True
        CLIENT_LOGGER.setLevel(logging.DEBUG)
    # Before the stage is built (which stops on a missing key, creating none).
    check_stage_clock(current.clock, testbed=current.testbed)
    chosen, source = resolve_instance(instance, current.instance, socket.gethostname())
    # From here on every line names the stage and instance (LEDGER_LOG_FORMAT=json).
    configure_logging(current, component, chosen)
    log.info("%s instance %s (%s)", component, chosen, source)
    # Refuses an unsafe or malformed client properties file before any client
    # is built, and says which properties are in force (secrets masked).
    properties = ", ".join(f"{p.key}={p.value} ({p.source})" for p in describe(current))
    log.info("%s-%s: Kafka client properties: %s", component, chosen, properties)
    hooks = hooks_for(current.run_dir) if hooks_for is not None else NO_FAULTS
    # Traces as the OTEL_* variables say (none when unset), flushed when the stage stops.
    tracing.configure(f"ledger-{component}", instance=chosen)
    try:
        STAGES[component](current, chosen, hooks).run()
    finally:
        tracing.shutdown()


_STAGE_HELP = """
Runs until SIGTERM or Ctrl-C as a consume-transform-produce loop with a
transactional producer (transactional.id {prefix}.{component}.{instance}:
a restarted instance fences its predecessor). Run several instances with
different --instance values to share the partitions (consumer group
{prefix}.{component}, range assignment). Logs go to standard error.
Refuses the manual clock (LEDGER_CLOCK=manual) unless LEDGER_TESTBED=true.
"""

#: Help of the ``--instance`` option (``python -m testbed.stage`` shares it).
INSTANCE_HELP = (
    "Instance name, stable per process slot. Default: LEDGER_INSTANCE, else the "
    "trailing ordinal of the host name (relay-2 -> 2, as a StatefulSet names pods), else 0."
)

_INSTANCE = click.option("--instance", default=None, help=INSTANCE_HELP)


@click.command(
    "processor", help="Run the processor: decides every recovery transition.\n" + _STAGE_HELP
)
@_INSTANCE
def processor_cmd(instance: str | None) -> None:
    """Run the processor stage."""
    run_stage("processor", instance)


@click.command(
    "authority",
    help="Run the authority kernel: admits operations, consumes approvals once.\n" + _STAGE_HELP,
)
@_INSTANCE
def authority_cmd(instance: str | None) -> None:
    """Run the authority kernel stage."""
    run_stage("authority", instance)


@click.command(
    "relay",
    help="Run the outbox relay: performs dispatches against sinks, reads back first.\n"
    + _STAGE_HELP,
)
@_INSTANCE
def relay_cmd(instance: str | None) -> None:
    """Run the relay stage."""
    run_stage("relay", instance)


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status_cmd(as_json: bool) -> None:
    """Show each stage's liveness, assignment, lag and last commit, as Kafka sees them.

    From the broker, not from files a dead process leaves behind: the live
    instances are the members of the component's consumer group (one that
    stops heartbeating leaves it within 10 s), each with the input partitions
    assigned to it; the last commit is each input partition's committed
    offset (and the Kafka timestamp of the last input record committed past),
    and the lag its last stable offset minus that. The groups are watched for
    a few seconds: two processes given one instance name take its place in
    turn, and are named with their process IDs and addresses, and the
    summary says how many processes fence each other. A process of this host
    that runs but is not in its group and whose loop has been silent for 10 s
    (stopped, or stuck) is NOT RESPONDING, not DOWN: do not start another
    with its name; inspect or kill it first. Exit status 0 when every stage
    has a live instance and nothing is wrong, 1 when one has none, two
    processes share an instance name, or a process does not respond.

    \b
    --json: {"topic_prefix", "stages": [{"component", "group", "group_state",
      "live", "lag", "last_commit_ms", "members": [{"instance", "host",
      "member_id", "partitions": ["intents[0]", ...]}], "partitions":
      [{"topic", "partition", "committed", "end", "lag", "last_input_ms"}],
      "twins": {"relay-0": ["relay-0.4711 at /10.0.0.5", ...]}, "summary":
      "live, 1 instance(s)"}]}
    """
    settings = current_settings()
    topics.check_topics(settings)
    stages = stage_status(settings)
    held = held_on_this_host(settings)
    now_ms = int(time.time() * 1000)
    local = local_presences(settings.run_dir)
    words = {
        st.component: summary(
            [m.instance for m in st.members],
            st.twins,
            [p for p in local if p.name.rpartition("-")[0] == st.component],
            now_ms,
        )
        for st in stages
    }
    if as_json:
        echo_json(
            {
                "topic_prefix": settings.topic_prefix,
                "stages": [{**s.to_dict(), "summary": words[s.component][0]} for s in stages],
                "unverifiable_held": held,
            }
        )
    else:
        for st in stages:
            committed = sum(p.committed or 0 for p in st.partitions)
            end = sum(p.end for p in st.partitions)
            last = st.last_commit_ms
            click.echo(
                f"{st.component}: {words[st.component][0]}, group {st.group} {st.group_state}, "
                f"lag {st.lag} (committed {committed} of {end} input offsets; last input "
                f"committed past: {instant_text(last, now_ms) if last is not None else 'none'})"
            )
            for m in st.members:
                click.echo(
                    f"  {m.instance} at {m.host}: {len(m.partitions)} partition(s) "
                    f"{' '.join(m.partitions)}"
                )
            for name, processes in sorted(st.twins.items()):
                click.echo(twin_text(name, processes))
            if st.unseen:
                click.echo(
                    f"  (last input times not shown for {', '.join(st.unseen)}: this "
                    "client's principal may not read them; committed offsets and lag are "
                    "complete)"
                )
        for name, (count, sample) in sorted(held.items()):
            shown = "; ".join(f"{k}: {v}" for k, v in list(sample.items())[:3])
            click.echo(
                f"{name} (this host): HOLDING {count} key(s) on evidence its keys cannot verify "
                f"({shown}); restore the keys folder the ledger's records were sealed with, "
                "then restart it"
                + (
                    "; a policy record nobody can verify is lifted by setting the policy "
                    "again with a trusted key (see `ledger policy show`)"
                    if "(policy: every approval)" in sample
                    else ""
                )
            )
    if not all(healthy for _, healthy in words.values()) or held:
        raise click.exceptions.Exit(EXIT_ERROR)


def twin_text(name: str, processes: tuple[str, ...]) -> str:
    """The line ``ledger status`` gives a member name several processes held while it looked."""
    return (
        f"  TWO LIVE PROCESSES named {name}: {'; '.join(processes)} held it in turn while "
        "status looked; they fence each other (each join takes the other's place and "
        "transactional ID). Give each its own --instance or LEDGER_INSTANCE (a process "
        "restarted just now also shows twice: ask again)"
    )


def held_on_this_host(settings: LedgerSettings) -> dict[str, tuple[int, dict[str, str]]]:
    """What the live stage instances of this host hold for evidence they cannot verify.

    Read from their status files (``LEDGER_RUN_DIR/status``): the stages of
    another host say it in their own ``/readyz`` and the
    ``ledger_unverifiable_held`` gauge.

    Returns:
        ``component-instance`` -> (how many keys, up to 50 of them: key ->
        record and reason), for instances whose process runs and holds any.
    """
    found: dict[str, tuple[int, dict[str, str]]] = {}
    folder = settings.run_dir / "status"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            status = json.loads(path.read_text())
            pid, count = int(status["pid"]), int(status.get("unverifiable_held_count") or 0)
            sample = {
                str(k): str(v) for k, v in dict(status.get("unverifiable_held") or {}).items()
            }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass  # another user's process: it runs
        if count:
            found[path.stem] = (count, sample)
    return found


#: The stage commands, in the order ``ledger --help`` lists them.
COMMANDS: tuple[click.Command, ...] = (processor_cmd, authority_cmd, relay_cmd, status_cmd)
