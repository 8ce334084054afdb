"""``ledger topics ...``: create, check, list, compact and export the ledger's topics."""

from __future__ import annotations

import json

import click
import yaml

from ledger import topics
from ledger.cli.common import bootstrap_in_force, current_settings, echo_json
from ledger.errors import SettingsError
from ledger.topology import TOPICS

_TOPICS_HELP = f"""Create, check, list and compact the ledger's topics, or print their manifest.

\b
Topics are named {{LEDGER_TOPIC_PREFIX}}.{{name}} (default prefix `ledger`), one
per entry of ledger.topology.TOPICS. Operation-keyed topics have
LEDGER_PARTITIONS partitions (default 3) and are co-partitioned; control
topics have one. Compacted topics keep the latest record per key; audited
delete topics keep everything (retention.ms=-1). Every topic is replicated
(LEDGER_REPLICATION_FACTOR, LEDGER_MIN_INSYNC_REPLICAS; unset: 3 and 2 on a
cluster of three or more brokers, else 1 and 1) with unclean leader election
off.

\b
Environment:
  LEDGER_BOOTSTRAP_SERVERS / KAFKA_BOOTSTRAP_SERVERS   broker (default
                        127.0.0.1:$LEDGER_KAFKA_PORT; in force: {bootstrap_in_force()})
  LEDGER_TOPIC_PREFIX   topic name prefix (default ledger)
  LEDGER_PARTITIONS     partitions of operation-keyed topics (default 3)
  LEDGER_REPLICATION_FACTOR    replicas per partition (default: from the cluster)
  LEDGER_MIN_INSYNC_REPLICAS   min.insync.replicas (default: 2 if the factor is 3+, else 1)
"""


@click.group("topics", help=_TOPICS_HELP)
def topics_group() -> None:
    """Manage the ledger's topics (see the group help)."""


@topics_group.command("create")
def topics_create() -> None:
    """Create the missing ledger topics, then check them all.

    New topics get the replication factor and min.insync.replicas in force
    (LEDGER_REPLICATION_FACTOR and LEDGER_MIN_INSYNC_REPLICAS, else derived
    from the number of brokers that answer: 3 and 2 from three brokers, else
    1 and 1) and unclean.leader.election.enable=false. Idempotent: existing
    topics are left exactly as they are (never altered); the check that
    follows reports any that are configured unsafely, with the fix.
    """
    settings = current_settings()
    created = topics.create_topics(settings)
    total = len(TOPICS)
    click.echo(
        f"created {len(created)} of {total} topics"
        + (f": {', '.join(created)}" if created else " (all existed)")
    )
    topics.check_topics(settings)
    wanted = topics.cluster_replication(settings)
    click.echo(
        f"all {total} topics with prefix {settings.topic_prefix!r} are configured safely "
        f"(replication factor {wanted.replication_factor}: {wanted.factor_origin}; "
        f"min.insync.replicas {wanted.min_insync_replicas}: {wanted.min_insync_origin})"
    )


@topics_group.command("check")
@click.argument("names", nargs=-1)
def topics_check(names: tuple[str, ...]) -> None:
    """Check the ledger topics (or only NAMES, short names like `journal`).

    Fails (exit status 1) naming topic, setting and fix when a topic is
    missing, when an audited topic could lose records to retention
    (cleanup.policy compact,delete, or delete with retention.ms/retention.bytes
    other than -1), when a policy differs from ledger.topology, when partition
    counts break co-partitioning, or when replication could lose evidence or
    stop writes (replication factor or min.insync.replicas below the settings,
    min.insync.replicas not below the replication factor, unclean leader
    election enabled). Every ledger component runs this check at start-up.
    """
    checked = topics.check_topics(current_settings(), names or None)
    click.echo(f"ok: {len(checked)} topics checked")


@topics_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the topics as JSON.")
def topics_list(as_json: bool) -> None:
    """List the ledger topics: partitions, cleanup policy, retention, replication.

    Topics that do not exist yet are shown as `missing`. `rf` is the
    replication factor (of the least replicated partition), `isr` the
    topic's min.insync.replicas, `unclean` its unclean.leader.election.enable.

    \b
    --json: {"topic_prefix", "topics": [{"name", "short_name", "exists",
      "partitions", "cleanup_policy", "retention_ms", "replication_factor",
      "min_insync_replicas", "unclean_leader_election", "audited"}]}
      (null for what a missing topic does not have)
    """
    settings = current_settings()
    if as_json:
        echo_json(
            {
                "topic_prefix": settings.topic_prefix,
                "topics": [
                    {
                        "name": info.name,
                        "short_name": info.spec.name,
                        "exists": info.partitions is not None,
                        "partitions": info.partitions,
                        "cleanup_policy": info.cleanup_policy,
                        "retention_ms": info.retention_ms,
                        "replication_factor": info.replication_factor,
                        "min_insync_replicas": info.min_insync_replicas,
                        "unclean_leader_election": info.unclean_leader_election,
                        "audited": info.spec.audited,
                    }
                    for info in topics.describe_ledger_topics(settings)
                ],
            }
        )
        return
    click.echo(
        f"{'topic':<40} {'parts':>5}  {'cleanup.policy':<15} {'retention.ms':>13}  "
        f"{'rf':>2} {'isr':>3} {'unclean':<7}  audited"
    )
    for info in topics.describe_ledger_topics(settings):
        if info.partitions is None:
            click.echo(
                f"{info.name:<40} {'-':>5}  {'missing':<15} {'-':>13}  {'-':>2} {'-':>3} "
                f"{'-':<7}  {info.spec.audited}"
            )
            continue
        policy = info.cleanup_policy or "?"
        # retention.ms only matters where the policy deletes.
        retention = (info.retention_ms or "?") if "delete" in policy else "-"
        click.echo(
            f"{info.name:<40} {info.partitions:>5}  {policy:<15} {retention:>13}  "
            f"{info.replication_factor!s:>2} {info.min_insync_replicas or '?':>3} "
            f"{info.unclean_leader_election or '?':<7}  {info.spec.audited}"
        )


@topics_group.command("manifest")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "strimzi"]),
    default="json",
    show_default=True,
    help="json: one document listing every topic; strimzi: one KafkaTopic resource per topic.",
)
@click.option(
    "--cluster",
    metavar="NAME",
    help="The Strimzi Kafka resource's name (label strimzi.io/cluster); needed with strimzi.",
)
@click.option("--namespace", metavar="NS", help="metadata.namespace of the KafkaTopic resources.")
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1),
    help="Replicas per partition [default: LEDGER_REPLICATION_FACTOR, else 3].",
)
@click.option(
    "--min-insync-replicas",
    type=click.IntRange(min=1),
    help="min.insync.replicas [default: LEDGER_MIN_INSYNC_REPLICAS, else 2 with 3+ replicas, "
    "else 1].",
)
def topics_manifest(
    fmt: str,
    cluster: str | None,
    namespace: str | None,
    replication_factor: int | None,
    min_insync_replicas: int | None,
) -> None:
    """Print the topic layout for GitOps (no broker needed).

    \b
    Every ledger topic with its full name, partitions, replication factor
    and configs, exactly as `ledger topics create` would make it:
      --format json      {"topic_prefix", "replication_factor",
                          "min_insync_replicas", "topics": [{"name",
                          "partitions", "replication_factor", "config"}]}
      --format strimzi   KafkaTopic resources (kafka.strimzi.io/v1beta2),
                         YAML documents separated by ---, for the Topic
                         Operator of the Kafka resource named by --cluster.
    The replication comes from the options, else LEDGER_REPLICATION_FACTOR
    and LEDGER_MIN_INSYNC_REPLICAS, else 3 and 2 (a cluster of three or more
    brokers: a manifest is written for a replicated cluster).
    """
    if fmt == "strimzi" and not cluster:
        raise click.UsageError(
            "--cluster NAME is needed with --format strimzi: the name of your Strimzi Kafka "
            "resource (the strimzi.io/cluster label the Topic Operator selects on)"
        )
    settings = current_settings()
    overrides: dict[str, int] = {}
    if replication_factor is not None:
        overrides["replication_factor"] = replication_factor
    if min_insync_replicas is not None:
        overrides["min_insync_replicas"] = min_insync_replicas
    settings = settings.model_copy(update=overrides)
    try:
        replication = topics.replication_for(settings, topics.REPLICATED_BROKERS)
    except SettingsError as exc:
        if not overrides:
            raise
        raise click.UsageError(
            f"{exc.message} (here --replication-factor and --min-insync-replicas stand for "
            "those variables)"
        ) from exc
    layouts = topics.manifest(settings, replication)
    if fmt == "json":
        document = {
            "topic_prefix": settings.topic_prefix,
            "replication_factor": replication.replication_factor,
            "min_insync_replicas": replication.min_insync_replicas,
            "topics": [
                {
                    "name": layout.name,
                    "partitions": layout.partitions,
                    "replication_factor": layout.replication_factor,
                    "config": dict(layout.config),
                }
                for layout in layouts
            ],
        }
        click.echo(json.dumps(document, indent=2))
        return
    assert cluster is not None  # checked above
    resources = topics.strimzi_topics(layouts, cluster, namespace)
    click.echo(yaml.safe_dump_all(resources, sort_keys=False), nl=False)
