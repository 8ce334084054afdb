"""The least-privilege ACL matrix (ledger.acl) against the topology and the names
the stages really use; the ``ledger acl`` commands without a cluster."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

import consumers.runtime.clients
import consumers.stage
import consumers.tables
import ledger.kafka
from consumers import auditor
from consumers.auditor import TopicScan
from consumers.stages import STAGES
from ledger import acl, quotas
from ledger.cli import main
from ledger.cli.acl import compare, concerns, from_binding, to_binding
from ledger.errors import LedgerError
from ledger.settings import LedgerSettings
from ledger.topology import TOPIC_BY_NAME, TOPICS
from tests.helpers import keyed

PREFIX = "tacl"
PLAN = acl.plan(PREFIX)


def _owners(topic: str) -> set[str]:
    """Roles the topology (plus the documented extras) says write ``topic``."""
    spec = next(t for t in TOPICS if t.name == topic)
    owners = {p for role in spec.roles for p in acl.ROLE_PRINCIPALS[role]}
    owners |= {r for r, extra in acl.EXTRA_WRITES.items() if topic in extra}
    return owners


def _entries(**match: str) -> list[acl.Acl]:
    return [a for a in PLAN.acls() if all(getattr(a, k) == v for k, v in match.items())]


@pytest.mark.parametrize("spec", TOPICS, ids=[t.name for t in TOPICS])
def test_every_topic_is_writable_by_exactly_its_writer_roles(spec: Any) -> None:
    writers = {
        a.principal
        for a in _entries(resource_type="TOPIC", operation="WRITE", name=f"{PREFIX}.{spec.name}")
    }
    expected = {f"User:{r}" for r in _owners(spec.name)}
    assert expected, f"{spec.name} has no writer principal"
    assert writers == expected


def test_no_principal_writes_a_topic_it_does_not_own() -> None:
    for grant in PLAN.grants:
        for topic in grant.writes:
            assert grant.role in _owners(topic), f"{grant.role} may write {topic}"
    written = {a.name for a in _entries(operation="WRITE", resource_type="TOPIC")}
    assert written == {f"{PREFIX}.{t.name}" for t in TOPICS}


@pytest.mark.parametrize("topic", acl.PROTECTED_TOPICS)
def test_a_service_cannot_write_the_protected_topics(topic: str) -> None:
    name = f"{PREFIX}.{topic}"
    assert not _entries(principal="User:service", name=name, operation="WRITE")
    # Only the stage that owns it may: the authority kernel or the processor.
    writers = {a.principal for a in _entries(name=name, operation="WRITE")}
    assert writers in ({"User:authority"}, {"User:processor"})


def test_a_service_only_writes_intents_and_reads_only_outcomes() -> None:
    service = PLAN.grant("service")
    assert service.writes == ("intents",)
    assert service.reads == ("outcomes",)
    # Its outcome reader names a group librdkafka looks up; it never joins it.
    assert service.transactional_id_prefix is None and service.group is None
    assert service.helper_groups == (f"{PREFIX}.outcomes",)
    ops = {(a.operation, a.resource_type) for a in _entries(principal="User:service")}
    assert ops == {
        ("WRITE", "TOPIC"),
        ("READ", "TOPIC"),
        ("DESCRIBE", "TOPIC"),
        ("DESCRIBE_CONFIGS", "TOPIC"),
        ("DESCRIBE", "GROUP"),
    }
    read = {a.name for a in _entries(principal="User:service", operation="READ")}
    assert read == {f"{PREFIX}.outcomes"}


def test_outcomes_are_written_by_the_processor_alone_and_signed_by_its_outcome_key() -> None:
    assert PLAN.writers_of("outcomes") == {"processor"}
    spec = TOPIC_BY_NAME["outcomes"]
    assert spec.auth == ("outcome",) and spec.cleanup == "delete" and spec.retention_ms > 0
    assert not spec.audited and "outcomes" not in acl.auditor_topics()


def test_operating_events_are_written_by_the_stages_only() -> None:
    assert PLAN.writers_of("operating-events") == set(acl.STAGE_COMPONENTS)


def test_every_principal_describes_every_topic_and_nothing_else_on_the_cluster() -> None:
    for grant in PLAN.grants:
        described = {
            a.name for a in _entries(principal=grant.principal, operation="DESCRIBE_CONFIGS")
        }
        assert described == {f"{PREFIX}.{t.name}" for t in TOPICS}
    assert not _entries(resource_type="CLUSTER")
    assert "admin" not in acl.ROLES and not _entries(principal="User:admin")


def test_idempotent_write_goes_only_to_producing_principals() -> None:
    with_idem = acl.plan(PREFIX, idempotent_write=True)
    holders = {a.principal for a in with_idem.acls() if a.operation == "IDEMPOTENT_WRITE"}
    assert holders == {f"User:{g.role}" for g in with_idem.grants if g.writes}
    assert "User:auditor" not in holders


def _stage(component: str, settings: LedgerSettings, instance: str) -> Any:
    return STAGES[component](settings, instance)


@pytest.mark.parametrize("component", sorted(STAGES))
def test_transactional_ids_groups_and_inputs_match_the_stages(
    component: str, tmp_path: Path
) -> None:
    settings = keyed(LedgerSettings(run_dir=tmp_path, topic_prefix=PREFIX))
    assert acl.STAGE_COMPONENTS[component] == STAGES[component].component
    grant = PLAN.grant(component)
    for instance in ("0", "relay-7", "2"):
        stage = _stage(component, settings, instance)
        assert stage.transactional_id.startswith(grant.transactional_id_prefix)
        for other in PLAN.grants:
            if other.role != component and other.transactional_id_prefix:
                assert not stage.transactional_id.startswith(other.transactional_id_prefix)
        assert stage.group_id == grant.group
    assert STAGES[component].inputs == acl.STAGE_INPUTS[component]
    assert set(STAGES[component].inputs) <= set(grant.reads)
    prefixed = _entries(principal=f"User:{component}", resource_type="TRANSACTIONAL_ID")
    assert {(a.pattern, a.operation) for a in prefixed} == {
        ("PREFIXED", "WRITE"),
        ("PREFIXED", "DESCRIBE"),
    }
    groups = _entries(principal=f"User:{component}", resource_type="GROUP", operation="READ")
    assert [a.name for a in groups] == [stage.group_id]


def test_only_stages_join_a_group_and_helper_groups_are_describe_only() -> None:
    joined = {(a.principal, a.name) for a in _entries(resource_type="GROUP", operation="READ")}
    assert joined == {(f"User:{c}", f"{PREFIX}.{c}") for c in acl.STAGE_COMPONENTS}
    for grant in PLAN.grants:
        described = {
            a.name
            for a in _entries(
                principal=grant.principal, resource_type="GROUP", operation="DESCRIBE"
            )
        }
        assert described == set(grant.helper_groups)
        assert grant.group not in described


def test_the_table_groups_are_the_ones_the_followers_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named: list[str] = []
    real = ledger.kafka.consumer_config

    def spy(settings: LedgerSettings, group: str, *args: Any, **kwargs: Any) -> Any:
        named.append(group)
        return real(settings, group, *args, **kwargs)

    monkeypatch.setattr(ledger.kafka, "consumer_config", spy)
    settings = keyed(LedgerSettings(run_dir=tmp_path, topic_prefix=PREFIX))
    for component in ("authority", "relay"):
        named.clear()
        stage = _stage(component, settings, "0")
        followers = [
            v for v in vars(stage).values() if isinstance(v, consumers.tables.TableFollower)
        ]
        assert set(named) <= set(PLAN.grant(component).groups())
        assert {f.topic for f in followers} <= set(PLAN.grant(component).reads)
        expected_hw = {f"{PREFIX}.table.{f.topic}.hw" for f in followers}
        assert expected_hw <= set(PLAN.grant(component).groups())


class _Refused(Exception):
    pass


def test_partition_readers_name_the_reader_and_settle_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named: list[str] = []

    def fake_consumer(config: dict[str, Any]) -> Any:
        named.append(config["group.id"])
        raise _Refused

    monkeypatch.setattr(ledger.kafka, "Consumer", fake_consumer)
    settings = keyed(LedgerSettings(run_dir=tmp_path, topic_prefix=PREFIX))
    with pytest.raises(_Refused):
        consumers.stage.read_partition(settings, "state", None, lambda r, m: None)
    with pytest.raises(_Refused):
        consumers.stage.await_settled(settings, "state", {0})
    assert named == [f"{PREFIX}.reader", f"{PREFIX}.settle"]
    for role in acl.WHOLE_TOPIC_READERS:
        assert f"{PREFIX}.reader" in PLAN.grant(role).groups()


def test_the_auditor_reads_exactly_what_the_audit_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scanned: list[str] = []

    def scan(settings: Any, keyring: Any, topic: str, *args: Any, **kwargs: Any) -> TopicScan:
        scanned.append(topic)
        return TopicScan(topic)

    monkeypatch.setattr(auditor, "scan_topic", scan)
    auditor.run_audit(
        keyed(LedgerSettings(run_dir=tmp_path, topic_prefix=PREFIX)), read_sinks=False
    )
    assert set(scanned) == set(acl.auditor_topics())
    # Beyond the replay: the intents the processor has not consumed (keys and times only).
    assert set(PLAN.grant("auditor").reads) == set(acl.auditor_topics()) | {"intents"}
    assert f"{PREFIX}.processor" in PLAN.grant("auditor").helper_groups
    assert not PLAN.grant("auditor").writes


def test_principals_follow_the_format_and_the_mapping() -> None:
    names = acl.principal_names(
        acl.parse_principal_mapping(["relay=User:sa-4kq2"]), "User:ledger-{name}"
    )
    assert names["relay"] == "User:sa-4kq2"
    assert names["processor"] == "User:ledger-processor"
    mapped = acl.plan(PREFIX, {"service": "User:payments-svc"})
    assert {a.principal for a in mapped.acls() if a.name == f"{PREFIX}.intents"} >= {
        "User:payments-svc"
    }
    assert "User:service" not in {a.principal for a in mapped.acls()}


@pytest.mark.parametrize(
    ("items", "fmt", "says"),
    [
        (["relay"], "User:{name}", "ROLE=PRINCIPAL"),
        (["admin=User:x"], "User:{name}", "unknown role"),
        (["relay=x"], "User:{name}", "TYPE:NAME"),
        (["relay=User:a", "relay=User:b"], "User:{name}", "twice"),
        (["relay=User:auditor"], "User:{name}", "its own principal"),
        ([], "User:ledger", "{name}"),
    ],
)
def test_bad_principals_are_refused_with_the_remedy(items: list[str], fmt: str, says: str) -> None:
    with pytest.raises(LedgerError, match=says.replace("{", r"\{").replace("}", r"\}")):
        acl.plan(PREFIX, acl.parse_principal_mapping(items), principal_format=fmt)


def test_kafka_acls_lines_add_exactly_the_plan() -> None:
    added: set[tuple[str, str, str, str, str]] = set()
    for line in acl.kafka_acls_commands(PLAN, bootstrap="b:9092"):
        argv = shlex.split(line)
        assert argv[0] == "kafka-acls.sh" and "--add" in argv
        principal = argv[argv.index("--allow-principal") + 1]
        op = argv[argv.index("--operation") + 1]
        pattern = "PREFIXED" if "--resource-pattern-type" in argv else "LITERAL"
        for i, word in enumerate(argv):
            if word in ("--topic", "--group", "--transactional-id"):
                added.add((principal, op, word, argv[i + 1], pattern))
    expected = {
        (
            a.principal,
            {"READ": "Read", "WRITE": "Write", "DESCRIBE": "Describe"}.get(
                a.operation, "DescribeConfigs"
            ),
            {"TOPIC": "--topic", "GROUP": "--group"}.get(a.resource_type, "--transactional-id"),
            a.name,
            a.pattern,
        )
        for a in PLAN.acls()
    }
    assert added == expected


def test_bindings_round_trip_and_compare_finds_missing_and_extra() -> None:
    entries = PLAN.acls()
    for entry in entries[:20]:
        assert from_binding(to_binding(entry)) == entry
    deny = AclBinding(
        ResourceType.TOPIC,
        f"{PREFIX}.state",
        ResourcePatternType.LITERAL,
        "User:service",
        "*",
        AclOperation.WRITE,
        AclPermissionType.DENY,
    )
    stray = to_binding(acl.Acl("User:service", "TOPIC", f"{PREFIX}.state", "LITERAL", "WRITE"))
    have = [to_binding(e) for e in entries[1:]] + [deny, stray]
    result = compare(PLAN, have)
    assert result.missing == [entries[0]]
    assert len(result.present) == len(entries) - 1
    assert {str(b) for b in result.extra} == {str(deny), str(stray)}


def test_acl_plan_command_prints_the_table_and_the_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", PREFIX)
    runner = CliRunner()
    table = runner.invoke(main, ["acl", "plan"])
    assert table.exit_code == 0, table.output
    service_row = next(r for r in table.output.splitlines() if r.startswith("User:service"))
    assert service_row.split()[1] == "intents"
    as_json = runner.invoke(main, ["acl", "plan", "--json", "--principal", "relay=User:sa-1"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    planned_quotas = data.pop("quotas")
    assert data == acl.plan(PREFIX, {"relay": "User:sa-1"}).to_dict()
    assert {q["role"] for q in planned_quotas} == set(quotas.DEFAULT_QUOTAS)
    bad = runner.invoke(main, ["acl", "plan", "--principal", "relay"])
    assert bad.exit_code == 1 and "ROLE=PRINCIPAL" in bad.output


def _binding(name: str, pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        name,
        pattern,
        "User:service",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )


def test_check_ignores_other_ledgers_but_not_wildcards_or_covering_prefixes() -> None:
    assert not concerns(_binding("other.state"), PREFIX)
    assert not concerns(_binding(f"{PREFIX}x.state"), PREFIX)
    assert concerns(_binding(f"{PREFIX}.state"), PREFIX)
    assert concerns(_binding("*"), PREFIX)
    assert concerns(_binding(PREFIX[:2], ResourcePatternType.PREFIXED), PREFIX)
    assert not concerns(_binding(PREFIX[:2], ResourcePatternType.LITERAL), PREFIX)
    other = acl.plan("other")
    result = compare(PLAN, [to_binding(e) for e in PLAN.acls() + other.acls()])
    assert not result.missing and not result.extra


def _allow(
    principal: str,
    name: str,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    operation: AclOperation = AclOperation.ALL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, pattern, principal, "*", operation, permission)


def test_check_names_a_wildcard_principal_and_principals_outside_the_plan() -> None:
    """Issue 29: `User:*` holding ALLOW ALL on every topic passed `acl check` unreported."""
    planned = [to_binding(e) for e in PLAN.acls()]
    assert compare(PLAN, planned).clean
    everyone = _allow("User:*", "*")
    prefixed = _allow("User:*", f"{PREFIX}.", ResourcePatternType.PREFIXED)
    stranger = _allow("User:mallory", f"{PREFIX}.journal", operation=AclOperation.READ)
    accepted = _allow("User:monitoring", f"{PREFIX}.state", operation=AclOperation.DESCRIBE)
    denied = _allow("User:*", f"{PREFIX}.state", permission=AclPermissionType.DENY)
    elsewhere = _allow("User:*", "other.state")
    result = compare(
        PLAN,
        [*planned, everyone, prefixed, stranger, accepted, denied, elsewhere],
        accepted=["User:monitoring"],
    )
    assert not result.clean
    assert not result.missing and not result.extra
    assert {str(b) for b in result.wildcard} == {str(everyone), str(prefixed)}
    assert [str(b) for b in result.others] == [str(stranger)]
    unaccepted = compare(PLAN, [*planned, accepted])
    assert [str(b) for b in unaccepted.others] == [str(accepted)]
