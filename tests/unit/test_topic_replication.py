"""Replicated evidence, without a broker: replication defaults, problem detection,
the reassignment plan and the GitOps manifest (``ledger topics manifest``)."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from click.testing import CliRunner

from ledger import topics
from ledger.cli import main
from ledger.errors import SettingsError
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from ledger.topics import Replication, replication_for, replication_problems
from ledger.topology import TOPICS

BOOTSTRAP = "kafka-0:9092"


def _settings(**values: object) -> LedgerSettings:
    return LedgerSettings(bootstrap_servers=BOOTSTRAP, **values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- replication_for


@pytest.mark.parametrize(
    ("brokers", "factor", "insync"), [(1, 1, 1), (2, 1, 1), (3, 3, 2), (5, 3, 2)]
)
def test_the_default_replication_follows_the_cluster(
    brokers: int, factor: int, insync: int
) -> None:
    wanted = replication_for(_settings(), brokers)
    assert (wanted.replication_factor, wanted.min_insync_replicas) == (factor, insync)
    assert f"{brokers} broker" in wanted.factor_origin


@pytest.mark.parametrize("brokers", [1, 3, 6])
def test_an_explicit_setting_always_wins(brokers: int) -> None:
    wanted = replication_for(_settings(replication_factor=2), brokers)
    assert (wanted.replication_factor, wanted.min_insync_replicas) == (2, 1)
    assert wanted.factor_origin == "LEDGER_REPLICATION_FACTOR"
    both = replication_for(_settings(replication_factor=5, min_insync_replicas=3), brokers)
    assert (both.replication_factor, both.min_insync_replicas) == (5, 3)
    assert both.min_insync_origin == "LEDGER_MIN_INSYNC_REPLICAS"


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_REPLICATION_FACTOR", "4")
    monkeypatch.setenv("LEDGER_MIN_INSYNC_REPLICAS", "3")
    settings = LedgerSettings()
    assert (settings.replication_factor, settings.min_insync_replicas) == (4, 3)


@pytest.mark.parametrize(
    ("factor", "insync", "effect"),
    [(3, 3, "one replica is down"), (3, 4, "every acks=all write would fail"), (1, 2, "fail")],
)
def test_contradictory_settings_are_refused_with_the_bound(
    factor: int, insync: int, effect: str
) -> None:
    with pytest.raises(SettingsError, match=effect) as caught:
        replication_for(_settings(replication_factor=factor, min_insync_replicas=insync), 3)
    assert f"LEDGER_MIN_INSYNC_REPLICAS to at most {max(1, factor - 1)}" in str(caught.value)


def test_every_producer_waits_for_all_in_sync_replicas() -> None:
    # Even a caller's own properties cannot weaken acks or idempotence.
    config = producer_config(_settings(), acks="1", **{"enable.idempotence": False})
    assert config["acks"] == "all"
    assert config["enable.idempotence"] is True


# ------------------------------------------------------------------------- problem detection

REPLICATED = Replication(3, 2, "the default on a cluster of 3 brokers", "the default")
SAFE = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}


def _replicas(factor: int, partitions: int = 3) -> dict[int, tuple[int, ...]]:
    return {p: tuple(range(1, factor + 1)) for p in range(partitions)}


def test_a_safe_replicated_topic_has_no_problem() -> None:
    assert replication_problems("l.state", _replicas(3), SAFE, REPLICATED, 3, BOOTSTRAP) == []
    # More replicas than wanted is fine too.
    five = {**SAFE, "min.insync.replicas": "3"}
    assert replication_problems("l.state", _replicas(5), five, REPLICATED, 5, BOOTSTRAP) == []


def test_a_single_broker_layout_passes_where_the_setting_is_one() -> None:
    single = replication_for(_settings(), 1)
    cfg = {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}
    assert replication_problems("l.state", _replicas(1), cfg, single, 1, BOOTSTRAP) == []


def test_unclean_leader_election_is_refused_with_the_command_that_fixes_it() -> None:
    cfg = {**SAFE, "unclean.leader.election.enable": "true"}
    [problem] = replication_problems("l.journal", _replicas(3), cfg, REPLICATED, 3, BOOTSTRAP)
    assert (problem.topic, problem.config, problem.expected, problem.observed) == (
        "l.journal",
        "unclean.leader.election.enable",
        "false",
        "true",
    )
    assert problem.message.endswith(
        f"kafka-configs.sh --bootstrap-server {BOOTSTRAP} --alter --entity-type topics "
        "--entity-name l.journal --add-config unclean.leader.election.enable=false"
    )


def test_a_replication_factor_below_the_setting_is_refused() -> None:
    # One partition with a single replica makes the topic's factor 1.
    replicas = {**_replicas(3), 2: (1,)}
    [problem] = replication_problems("l.intents", replicas, SAFE, REPLICATED, 3, BOOTSTRAP)
    assert (problem.config, problem.expected, problem.observed) == ("replication.factor", 3, 1)
    assert "kafka-reassign-partitions.sh" in problem.message
    assert "a lost disk loses evidence" in problem.message


def test_a_factor_the_cluster_cannot_hold_says_to_add_brokers_or_lower_the_setting() -> None:
    wanted = replication_for(_settings(replication_factor=2), 1)
    cfg = {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}
    [problem] = replication_problems("l.intents", _replicas(1), cfg, wanted, 1, BOOTSTRAP)
    assert problem.config == "replication.factor"
    assert "(LEDGER_REPLICATION_FACTOR)" in problem.message
    assert "the cluster has only 1 broker" in problem.message
    assert "set LEDGER_REPLICATION_FACTOR=1" in problem.message


def test_min_insync_below_the_setting_is_refused() -> None:
    cfg = {**SAFE, "min.insync.replicas": "1"}
    [problem] = replication_problems("l.state", _replicas(3), cfg, REPLICATED, 3, BOOTSTRAP)
    assert (problem.config, problem.expected, problem.observed) == ("min.insync.replicas", 2, 1)
    assert problem.message.endswith("--entity-name l.state --add-config min.insync.replicas=2")


@pytest.mark.parametrize(("insync", "effect"), [("3", "one replica is down"), ("4", "fails")])
def test_min_insync_not_below_the_factor_is_refused(insync: str, effect: str) -> None:
    cfg = {**SAFE, "min.insync.replicas": insync}
    [problem] = replication_problems("l.state", _replicas(3), cfg, REPLICATED, 3, BOOTSTRAP)
    assert (problem.config, problem.expected, problem.observed) == (
        "min.insync.replicas",
        2,
        int(insync),
    )
    assert effect in problem.message
    assert problem.message.endswith("--add-config min.insync.replicas=2")


def test_every_problem_of_a_topic_is_named_once() -> None:
    cfg = {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}
    found = replication_problems("l.claims", _replicas(1), cfg, REPLICATED, 3, BOOTSTRAP)
    assert [p.config for p in found] == [
        "replication.factor",
        "min.insync.replicas",
        "unclean.leader.election.enable",
    ]
    assert "(after adding the replicas)" in found[1].message


def test_the_reassignment_plan_keeps_replicas_and_spreads_new_ones() -> None:
    plan = topics.reassignment_plan(
        {"l.a": {0: (1,), 1: (2,), 2: (3,)}, "l.b": {0: (1, 2, 3)}}, [3, 1, 2], 3
    )
    assert plan["version"] == 1
    moves = {(m["topic"], m["partition"]): m["replicas"] for m in plan["partitions"]}
    assert set(moves) == {("l.a", 0), ("l.a", 1), ("l.a", 2)}  # l.b has its replicas
    for (_, part), replicas in moves.items():
        assert replicas[0] == part + 1  # the preferred leader stays first
        assert sorted(replicas) == [1, 2, 3]


# ------------------------------------------------------------------------- manifest


def test_the_manifest_has_every_topic_with_the_configs_create_sets() -> None:
    settings = _settings(topic_prefix="prod", partitions=6)
    wanted = replication_for(settings, topics.REPLICATED_BROKERS)
    layouts = topics.manifest(settings, wanted)
    assert [t.name for t in layouts] == [f"prod.{s.name}" for s in TOPICS]
    for layout in layouts:
        assert layout.partitions == (1 if layout.spec.single_partition else 6)
        assert layout.replication_factor == 3
        assert dict(layout.config) == topics.topic_config(layout.spec, wanted)
        assert layout.config["unclean.leader.election.enable"] == "false"
        assert layout.config["min.insync.replicas"] == "2"


def test_ledger_topics_manifest_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", "gitops")
    # No broker answers at this address: the manifest needs none.
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    result = CliRunner().invoke(main, ["topics", "manifest", "--format", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert (document["replication_factor"], document["min_insync_replicas"]) == (3, 2)
    by_name = {t["name"]: t for t in document["topics"]}
    assert set(by_name) == {f"gitops.{s.name}" for s in TOPICS}
    wanted = Replication(3, 2, "", "")
    for spec in TOPICS:
        entry = by_name[f"gitops.{spec.name}"]
        assert entry["partitions"] == (1 if spec.single_partition else 3)
        assert entry["replication_factor"] == 3
        assert entry["config"] == topics.topic_config(spec, wanted)


def test_ledger_topics_manifest_strimzi_is_valid_yaml_for_every_topic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", "Ledger_Prod")  # not a Kubernetes name as it is
    monkeypatch.setenv("LEDGER_REPLICATION_FACTOR", "5")  # an option overrides it below
    result = CliRunner().invoke(
        main,
        [
            "topics",
            "manifest",
            "--format",
            "strimzi",
            "--cluster",
            "ledger-kafka",
            "--namespace",
            "kafka",
            "--replication-factor",
            "4",
            "--min-insync-replicas",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    resources = list(yaml.safe_load_all(result.output))
    assert len(resources) == len(TOPICS)
    wanted = Replication(4, 3, "", "")
    names = set()
    for spec, resource in zip(TOPICS, resources, strict=True):
        assert resource["apiVersion"] == "kafka.strimzi.io/v1beta2"
        assert resource["kind"] == "KafkaTopic"
        meta = resource["metadata"]
        assert meta["labels"] == {"strimzi.io/cluster": "ledger-kafka"}
        assert meta["namespace"] == "kafka"
        assert re.fullmatch(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?", meta["name"]), meta["name"]
        names.add(meta["name"])
        body = resource["spec"]
        assert body["topicName"] == f"Ledger_Prod.{spec.name}"
        assert body["partitions"] == (1 if spec.single_partition else 3)
        assert body["replicas"] == 4
        config = {k: str(v).lower() for k, v in body["config"].items()}
        assert config == {k: v.lower() for k, v in topics.topic_config(spec, wanted).items()}
    assert len(names) == len(TOPICS)


def test_ledger_topics_manifest_strimzi_needs_the_cluster_name() -> None:
    result = CliRunner().invoke(main, ["topics", "manifest", "--format", "strimzi"])
    assert result.exit_code == 2
    assert "--cluster NAME is needed" in result.output


def test_ledger_topics_manifest_refuses_contradictory_replication_options() -> None:
    result = CliRunner().invoke(
        main, ["topics", "manifest", "--replication-factor", "2", "--min-insync-replicas", "2"]
    )
    assert result.exit_code == 2
    assert "at most 1" in result.output and "--min-insync-replicas" in result.output
