"""``ledger topics ...``: create, check, list and compact the ledger's topics."""

from __future__ import annotations

import click

from ledger import topics
from ledger.cli.common import current_settings
from ledger.topology import TOPICS

_TOPICS_HELP = """Create, check, list and compact the ledger's topics.

\b
Topics are named {LEDGER_TOPIC_PREFIX}.{name} (default prefix `ledger`), one
per entry of ledger.topology.TOPICS. Operation-keyed topics have
LEDGER_PARTITIONS partitions (default 3) and are co-partitioned; control
topics have one. Compacted topics keep the latest record per key; audited
delete topics keep everything (retention.ms=-1).

\b
Environment:
  LEDGER_BOOTSTRAP_SERVERS / KAFKA_BOOTSTRAP_SERVERS   broker (127.0.0.1:$LEDGER_KAFKA_PORT, 19092)
  LEDGER_TOPIC_PREFIX   topic name prefix (default ledger)
  LEDGER_PARTITIONS     partitions of operation-keyed topics (default 3)
"""


@click.group("topics", help=_TOPICS_HELP)
def topics_group() -> None:
    """Manage the ledger's topics (see the group help)."""


@topics_group.command("create")
def topics_create() -> None:
    """Create the missing ledger topics, then check them all.

    Idempotent: existing topics are left exactly as they are (never altered);
    the check that follows reports any that are configured unsafely.
    """
    settings = current_settings()
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
def topics_check(names: tuple[str, ...]) -> None:
    """Check the ledger topics (or only NAMES, short names like `journal`).

    Fails (exit status 1) naming topic and setting when a topic is missing,
    when an audited topic could lose records to retention (cleanup.policy
    compact,delete, or delete with retention.ms/retention.bytes other than -1),
    when a policy differs from ledger.topology, or when partition counts break
    co-partitioning. Every ledger component runs this check at start-up.
    """
    checked = topics.check_topics(current_settings(), names or None)
    click.echo(f"ok: {len(checked)} topics checked")


@topics_group.command("list")
def topics_list() -> None:
    """List the ledger topics with partitions, cleanup policy and retention.

    Topics that do not exist yet are shown as `missing`.
    """
    click.echo(f"{'topic':<40} {'parts':>5}  {'cleanup.policy':<15} {'retention.ms':>13}  audited")
    for info in topics.describe_ledger_topics(current_settings()):
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
def topics_compact(names: tuple[str, ...], timeout_s: float) -> None:
    """Make the broker compact the compacted topics now (or only NAMES).

    Temporarily sets segment.ms=100, min.cleanable.dirty.ratio=0.001,
    delete.retention.ms=100 on them, appends a `__compaction__` tombstone per
    non-empty partition so the active segment rolls (readers skip that key),
    waits until no key repeats below it, then restores the configs. Takes a
    second or two on the local broker. Run it while writers are quiet.
    """
    for res in topics.force_compaction(
        current_settings(), timeout_s=timeout_s, names=names or None
    ):
        click.echo(
            f"{res.topic:<40} {res.records_before:>7} -> {res.records_after:<7} "
            f"records  ({res.elapsed_s:.1f} s)"
        )
