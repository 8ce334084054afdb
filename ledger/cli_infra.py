"""Command-line groups for the infrastructure: ``ledger broker ...`` and ``ledger topics ...``.

The root ``ledger`` command adds these groups (``main.add_command(broker_group)``).
Settings come from :class:`ledger.settings.LedgerSettings` (environment,
prefix ``LEDGER_``), or from a ``LedgerSettings`` the root command put in the
click context object.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import click

from ledger import broker, topics
from ledger.errors import LedgerError
from ledger.settings import LedgerSettings
from ledger.topology import TOPICS

P = ParamSpec("P")
R = TypeVar("R")

_BROKER_HELP = """Run the local single-node Kafka 4 broker (KRaft) from Maven jars.

\b
No Docker, no tarball: Java 17+ and Maven are enough. Everything lives in
LEDGER_KAFKA_HOME (default <project>/.cache/kafka):
  libs/             broker jars (fetched once by Maven)
  config/           server.properties, log4j2.properties (rewritten on start)
  data/             topics, offsets, transactions (kept across restarts)
  logs/server.log   the broker's log        logs/broker.out  java stdout/stderr
  broker.pid        PID of the broker `start` launched

\b
Environment:
  LEDGER_KAFKA_HOME   broker folder (above)
  LEDGER_KAFKA_PORT   client port on 127.0.0.1 (default 19092; controller +1)

\b
Clients use LEDGER_BOOTSTRAP_SERVERS or KAFKA_BOOTSTRAP_SERVERS (default
127.0.0.1:19092). With Docker instead: `docker compose up -d` and
KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092.
"""

_TOPICS_HELP = """Create, check, list and compact the ledger's topics.

\b
Topics are named {LEDGER_TOPIC_PREFIX}.{name} (default prefix `ledger`), one
per entry of ledger.topology.TOPICS. Operation-keyed topics have
LEDGER_PARTITIONS partitions (default 3) and are co-partitioned; control
topics have one. Compacted topics keep the latest record per key; audited
delete topics keep everything (retention.ms=-1).

\b
Environment:
  LEDGER_BOOTSTRAP_SERVERS / KAFKA_BOOTSTRAP_SERVERS   broker (127.0.0.1:19092)
  LEDGER_TOPIC_PREFIX   topic name prefix (default ledger)
  LEDGER_PARTITIONS     partitions of operation-keyed topics (default 3)
"""


def _settings() -> LedgerSettings:
    ctx = click.get_current_context()
    found = ctx.find_object(LedgerSettings)
    return found if found is not None else LedgerSettings()


def _friendly(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn a LedgerError into a clean ``Error: ...`` message and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except LedgerError as exc:
            raise click.ClickException(exc.message) from exc

    return wrapper


def _echo_status(st: broker.BrokerStatus) -> None:
    click.echo(st.message)
    click.echo(f"  bootstrap : {st.bootstrap}")
    click.echo(f"  pid       : {st.pid if st.pid is not None else '-'}")
    click.echo(f"  log       : {st.log_file}")
    click.echo(f"  stdout    : {st.stdout_file}")
    click.echo(f"  data      : {st.data_dir}")


# --------------------------------------------------------------------------- broker


@click.group("broker", help=_BROKER_HELP)
def broker_group() -> None:
    """Run the local Kafka broker (see the group help)."""


@broker_group.command("fetch")
@_friendly
def broker_fetch() -> None:
    """Download the broker's jars into LEDGER_KAFKA_HOME/libs (only if missing).

    Runs `mvn dependency:copy-dependencies` on kafka/pom.xml (about 60 MB the
    first time; Maven's output goes to LEDGER_KAFKA_HOME/logs/mvn.log). Does
    nothing when the jars are there and kafka/pom.xml did not change.
    """
    libs = broker.fetch_jars(_settings())
    jars = sum(1 for _ in libs.glob("*.jar"))
    click.echo(f"{jars} jars in {libs}")


@broker_group.command("start")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=90,
    show_default=True,
    help="Seconds to wait until the broker answers.",
)
@_friendly
def broker_start(wait_s: float) -> None:
    """Start the broker in the background, or reuse the one already running.

    Fetches the jars if needed, writes the configs, formats the storage once,
    launches java detached (it keeps running after this command exits) and
    waits until the broker answers. If a broker we started is running, or any
    Kafka answers on LEDGER_KAFKA_PORT, it is reused. Stop it with
    `ledger broker stop`.
    """
    _echo_status(broker.start(_settings(), wait_s=wait_s))


@broker_group.command("stop")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=30,
    show_default=True,
    help="Seconds to wait after SIGTERM before SIGKILL.",
)
@_friendly
def broker_stop(timeout_s: float) -> None:
    """Stop the broker `ledger broker start` launched (by its recorded PID).

    A broker someone else runs on the port is never touched. Without a
    recorded broker this does nothing and says so.
    """
    click.echo(broker.stop(_settings(), timeout_s=timeout_s))


@broker_group.command("restart")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=90,
    show_default=True,
    help="Seconds to wait until the broker answers again.",
)
@_friendly
def broker_restart(wait_s: float) -> None:
    """Stop and start our broker on the same data (game days: broker loss).

    Topics, records, committed offsets and transactions survive; clients see
    the broker vanish for a few seconds.
    """
    _echo_status(broker.restart(_settings(), wait_s=wait_s))


@broker_group.command("status")
@_friendly
def broker_status() -> None:
    """Say whether the broker runs, its PID, address, log and data paths.

    Exit status: 0 when a broker answers on LEDGER_KAFKA_PORT, 3 when not.
    """
    st = broker.status(_settings())
    _echo_status(st)
    if not st.running:
        raise click.exceptions.Exit(3)


# --------------------------------------------------------------------------- topics


@click.group("topics", help=_TOPICS_HELP)
def topics_group() -> None:
    """Manage the ledger's topics (see the group help)."""


@topics_group.command("create")
@_friendly
def topics_create() -> None:
    """Create the missing ledger topics, then check them all.

    Idempotent: existing topics are left exactly as they are (never altered);
    the check that follows reports any that are configured unsafely.
    """
    settings = _settings()
    created = topics.create_topics(settings)
    total = len(TOPICS)
    click.echo(
        f"created {len(created)} of {total} topics"
        + (f": {', '.join(created)}" if created else " (all existed)")
    )
    topics.check_topics(settings)
    click.echo(f"all {total} topics with prefix {settings.topic_prefix!r} are configured safely")


@topics_group.command("check")
@click.argument("names", nargs=-1)
@_friendly
def topics_check(names: tuple[str, ...]) -> None:
    """Check the ledger topics (or only NAMES, short names like `journal`).

    Fails (exit status 1) naming topic and setting when a topic is missing,
    when an audited topic could lose records to retention (cleanup.policy
    compact,delete, or delete with retention.ms/retention.bytes other than -1),
    when a policy differs from ledger.topology, or when partition counts break
    co-partitioning. Every ledger component runs this check at start-up.
    """
    checked = topics.check_topics(_settings(), names or None)
    click.echo(f"ok: {len(checked)} topics checked")


@topics_group.command("list")
@_friendly
def topics_list() -> None:
    """List the ledger topics with partitions, cleanup policy and retention.

    Topics that do not exist yet are shown as `missing`.
    """
    click.echo(f"{'topic':<40} {'parts':>5}  {'cleanup.policy':<15} {'retention.ms':>13}  audited")
    for info in topics.describe_ledger_topics(_settings()):
        if info.partitions is None:
            click.echo(f"{info.name:<40} {'-':>5}  {'missing':<15} {'-':>13}  {info.spec.audited}")
            continue
        policy = info.cleanup_policy or "?"
        # retention.ms only matters where the policy deletes.
        retention = (info.retention_ms or "?") if "delete" in policy else "-"
        click.echo(
            f"{info.name:<40} {info.partitions:>5}  {policy:<15} {retention:>13}  "
            f"{info.spec.audited}"
        )


@topics_group.command("compact")
@click.argument("names", nargs=-1)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=60,
    show_default=True,
    help="Seconds to wait for the log cleaner.",
)
@_friendly
def topics_compact(names: tuple[str, ...], timeout_s: float) -> None:
    """Make the broker compact the compacted topics now (or only NAMES).

    Temporarily sets segment.ms=100, min.cleanable.dirty.ratio=0.001,
    delete.retention.ms=100 on them, appends a `__compaction__` tombstone per
    non-empty partition so the active segment rolls (readers skip that key),
    waits until no key repeats below it, then restores the configs. Takes a
    second or two on the local broker. Run it while writers are quiet.
    """
    for res in topics.force_compaction(_settings(), timeout_s=timeout_s, names=names or None):
        click.echo(
            f"{res.topic:<40} {res.records_before:>7} -> {res.records_after:<7} "
            f"records  ({res.elapsed_s:.1f} s)"
        )
