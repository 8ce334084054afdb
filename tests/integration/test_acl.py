"""Least privilege on the secured cluster: the ledger works under the ACL matrix
(``ledger acl apply``), and the broker refuses a service what is not its own.

Runs on the session's secured three-node cluster (the ``secure_cluster``
fixture of ``tests/conftest.py``: SASL/SCRAM users named after the roles, the
``StandardAuthorizer``, ``User:admin`` the only super user, a client
properties file per user). The matrix is applied as ``admin`` for this
module's own topic prefix; every other client runs as its role's principal.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from consumers.auditor import run_audit
from consumers.reader import current_states, read_topic, wait_for_decision
from consumers.reconciler import reconcile_once
from ledger import acl, quotas
from ledger.cli import main
from ledger.cli.acl import apply_plan, broker_acls, compare, to_binding
from ledger.console import LedgerData
from ledger.contracts import PAYMENT_GATEWAY
from ledger.errors import BrokerError
from ledger.events import Approval
from ledger.kafka import admin_config, file_properties, producer_config
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import RecoveryState as S
from ledger.topics import create_topics
from producers.publisher import LedgerPublisher
from producers.sdk import LedgerService, Refused, Verified
from testbed.harness import Harness
from tests.conftest import LOCAL_KAFKA_HOME, SecureCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OPERATION = "refund:acl:v1"


@dataclass(frozen=True)
class SecuredLedger:
    """One ledger (topic prefix) on the secured cluster with the matrix applied.

    Attributes:
        cluster: the session's ``secure_cluster`` fixture (``tests.conftest.SecureCluster``).
        admin: settings of the super user for this ledger.
        plan: the ACL matrix applied.
    """

    cluster: SecureCluster
    admin: LedgerSettings
    plan: acl.AclPlan

    def as_(self, role: str) -> LedgerSettings:
        """This ledger's settings as ``role``'s principal (its client properties file)."""
        return self.cluster.settings_for(
            role,
            topic_prefix=self.admin.topic_prefix,
            run_dir=self.admin.run_dir,
            partitions=self.admin.partitions,
        )


@pytest.fixture(scope="module")
def secured(
    secure_cluster: SecureCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecuredLedger]:
    """Topics created and the matrix applied as ``admin``; both removed afterwards."""
    admin = secure_cluster.admin_settings(run_dir=tmp_path_factory.mktemp("acl") / "run")
    create_topics(admin)
    plan = acl.plan(admin.topic_prefix)
    created, before = apply_plan(admin, plan)
    assert len(created) == len(plan.acls()) and not before.present
    try:
        yield SecuredLedger(secure_cluster, admin, plan)
    finally:
        _remove(admin, plan)


def _remove(admin: LedgerSettings, plan: acl.AclPlan) -> None:
    """Best effort: drop this ledger's ACLs and topics (the cluster is shared)."""
    client = AdminClient(admin_config(admin))
    with contextlib.suppress(Exception):
        for future in client.delete_acls([to_binding(a) for a in plan.acls()]).values():
            future.result(timeout=30)
    with contextlib.suppress(Exception):
        names = [
            n
            for n in client.list_topics(timeout=10).topics
            if n.startswith(plan.topic_prefix + ".")
        ]
        for future in client.delete_topics(names, operation_timeout=30).values():
            future.result(timeout=30)


REVIEWER = ReviewerKey.generate("acl-reviewer")


def _approve(ledger: SecuredLedger, approval_id: str = "ap-acl") -> None:
    reviewer = ledger.as_("reviewer")
    trust(reviewer.trusted_keys_path(), REVIEWER)
    pub = LedgerPublisher(reviewer)
    pub.credentials.add(REVIEWER)
    try:
        pub.publish_approval(
            REVIEWER.sign(
                Approval(
                    approval_id=approval_id,
                    reviewer="acl-reviewer",
                    policy_version=1,
                    expires_at_ms=1_000_000,
                    scope_subject="customer-1",
                    scope_max_amount_minor=9000,
                    granted_at_ms=0,
                ),
                ledger_id=reviewer.ledger_identity,
            )
        )
    finally:
        pub.close()


def _publish_intent(ledger: SecuredLedger) -> tuple[str, int, int]:
    """Publish the intent as ``service``; returns its (topic, partition, offset)."""
    pub = LedgerPublisher(ledger.as_("service"))
    try:
        pub.publish(
            operation_id=OPERATION,
            sink="payments",
            action="refund",
            params={"account": "acct-1", "amount_minor": 5000, "currency": "GBP"},
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id="ap-acl",
        )
        assert pub.last_position is not None
        return pub.last_position
    finally:
        pub.close()


def _settled_state(settings: LedgerSettings, harness: Harness, timeout_s: float = 60) -> str:
    """The operation's state once it is final (or the last one seen at the deadline).

    Quiescence can be seen in the instant between a transaction's offset
    commit and the commit marker on its output partition (the coordinator
    writes them one after the other); the state read as the operator then
    lags by one step, so wait for the final state itself.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        state = current_states(settings).get(OPERATION)
        seen = state.state if state is not None else "(none)"
        if seen == S.OUTCOME_VERIFIED or time.monotonic() > deadline:
            return seen
        harness.wait_quiescent(60)


def _service_learns_outcomes(secured: SecuredLedger, harness: Harness, tmp_path: Path) -> None:
    """The service principal, with the exported outcome public key and no keys folder,
    performs a refund through the SDK and gets Verified, and a typo'd sink Refused."""
    exported = CliRunner().invoke(
        main,
        ["keys", "export", "--outcome-public"],
        env={
            "LEDGER_RUN_DIR": str(secured.admin.run_dir),
            "LEDGER_TOPIC_PREFIX": secured.admin.topic_prefix,
        },
    )
    assert exported.exit_code == 0, exported.output
    public = tmp_path / "outcome.pub"
    public.write_text(exported.output)
    settings = secured.as_("service").model_copy(
        update={"run_dir": tmp_path / "service-run", "outcome_public_key_file": public}
    )
    _approve(secured, "ap-acl-sdk")
    service = LedgerService(settings, actor="svc")
    try:
        refund = {
            "sink": "payments",
            "action": "refund",
            "params": {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"},
            "subject": "customer-1",
            "purpose": "fee-remediation",
        }
        verified = service.perform(
            operation_id="refund:acl-sdk:v1", approval_id="ap-acl-sdk", wait_s=60.0, **refund
        )
        assert isinstance(verified, Verified), (verified, harness.log_tail())
        assert verified.effect_id and harness.effects("payments", "refund:acl-sdk:v1") == 1
        started = time.monotonic()
        typo = service.perform(
            operation_id="refund:acl-typo:v1", approval_id="ap-acl-sdk", wait_s=30.0,
            **{**refund, "sink": "paymnets"},
        )  # fmt: skip
        assert isinstance(typo, Refused) and typo.kind == "UNKNOWN_SINK", typo
        assert time.monotonic() - started < 10.0
    finally:
        service.close()
    assert not (tmp_path / "service-run").exists()  # the service host made no key


def test_the_ledger_reaches_a_verified_outcome_under_its_principals(
    secured: SecuredLedger, tmp_path: Path
) -> None:
    harness = Harness(secured.admin, create=False)
    for component in acl.STAGE_COMPONENTS:
        harness.stage_env[component] = {
            "LEDGER_KAFKA_CONFIG_FILE": str(secured.as_(component).kafka_config_file)
        }
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    try:
        _approve(secured)
        topic, partition, offset = _publish_intent(secured)
        harness.start_all()
        harness.wait_quiescent(120)
        assert not harness.crashed(), harness.log_tail()
        state = _settled_state(secured.as_("operator"), harness)
        assert state == S.OUTCOME_VERIFIED, harness.log_tail()
        assert harness.effects("payments", OPERATION) == 1
        # What the operator's and reviewer's commands read: the decision on a
        # published input (the journal, followed), the grant `ledger revoke` reads.
        decision = wait_for_decision(secured.as_("operator"), topic, partition, offset, 60)
        assert decision is not None and decision.outcome == "APPLIED"
        grants = read_topic(secured.as_("reviewer"), "approvals")
        assert [r.key for r in grants] == ["ap-acl"]
        # The reconciler reads its queue and the states (nothing is held here).
        assert reconcile_once(secured.as_("reconciler")) == []
        report = run_audit(secured.as_("auditor"))
        assert report.violations == [] and report.unauthenticated_records == []
        # It looked for intents the processor has not consumed (its READ on
        # intents, DESCRIBE on the processor's group): not NOT VERIFIED for want of them.
        assert report.unverified == [] and report.stranded == [], report.unverified
        assert report.operations == 1
        _service_learns_outcomes(secured, harness, tmp_path)
    finally:
        harness.stop()
    # Nothing was granted on the way that the plan does not hold.
    now = compare(
        secured.plan, broker_acls(secured.admin, (g.principal for g in secured.plan.grants))
    )
    assert not now.missing and not now.extra


def test_a_principal_refused_a_read_is_told_at_once(secured: SecuredLedger) -> None:
    # The service may describe the ledger's topics but read none: a read of a
    # non-empty topic, and an audit, fail at once naming the refusal, instead
    # of waiting out their timeout and blaming the broker.
    if not read_topic(secured.admin, "approvals"):
        _approve(secured)
    service = secured.as_("service")
    refused = "refuses this client.s principal .[A-Z_]*AUTHORIZATION_FAILED"
    with pytest.raises(BrokerError, match=refused):
        read_topic(service, "approvals")
    with pytest.raises(BrokerError, match=refused):
        run_audit(service, read_sinks=False)


def test_a_service_may_not_write_what_the_stages_own(secured: SecuredLedger) -> None:
    service = secured.as_("service")
    results: dict[str, list[KafkaError | None]] = {t: [] for t in acl.PROTECTED_TOPICS}
    producers = []
    for topic in acl.PROTECTED_TOPICS:
        producer = Producer(producer_config(service, **{"message.timeout.ms": 60000}))
        producer.produce(
            service.topic(topic),
            key=OPERATION.encode(),
            value=b"forged",
            on_delivery=lambda err, _msg, topic=topic: results[topic].append(err),
        )
        producers.append(producer)
    for producer in producers:
        producer.flush(90)
    codes = {t: (errs[0].code() if errs and errs[0] else errs) for t, errs in results.items()}
    assert codes == {t: KafkaError.TOPIC_AUTHORIZATION_FAILED for t in acl.PROTECTED_TOPICS}


def test_a_service_may_not_take_a_stages_transactional_id(secured: SecuredLedger) -> None:
    service = secured.as_("service")
    producer = Producer(
        producer_config(service, **{"transactional.id": f"{service.topic_prefix}.processor.0"})
    )
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(60)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_acl_apply_is_idempotent_and_check_is_clean(
    secured: SecuredLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", secured.admin.bootstrap_servers)
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", secured.admin.topic_prefix)
    monkeypatch.setenv("LEDGER_KAFKA_CONFIG_FILE", str(secured.admin.kafka_config_file))
    runner = CliRunner()
    again = runner.invoke(main, ["acl", "apply"])
    assert again.exit_code == 0, again.output
    assert f"created 0 ACLs, {len(secured.plan.acls())} already present" in again.output
    check = runner.invoke(main, ["acl", "check"])
    assert check.exit_code == 0, check.output
    # Not as a principal of the matrix: refused with the remedy.
    monkeypatch.setenv("LEDGER_KAFKA_CONFIG_FILE", str(secured.as_("operator").kafka_config_file))
    refused = runner.invoke(main, ["acl", "apply"])
    assert refused.exit_code == 1 and "admin principal" in refused.output


def _admin_cli(secured: SecuredLedger, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A CLI runner whose commands run as ``admin`` on this module's ledger."""
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", secured.admin.bootstrap_servers)
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", secured.admin.topic_prefix)
    monkeypatch.setenv("LEDGER_KAFKA_CONFIG_FILE", str(secured.admin.kafka_config_file))
    return CliRunner()


def test_acl_check_names_a_wildcard_principal_and_a_stranger(
    secured: SecuredLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: `User:*` holding ALLOW ALL on ledger topics went unreported by `acl check`.

    The grants go to a topic of this ledger that does not exist, so that they
    widen nothing the other tests rely on while the broker still lists them.
    """
    runner = _admin_cli(secured, monkeypatch)
    unused = secured.admin.topic("no-such-topic")
    stray = [
        AclBinding(
            ResourceType.TOPIC,
            unused,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for principal, operation in (
            ("User:*", AclOperation.ALL),
            ("User:mallory", AclOperation.READ),
        )
    ]
    client = AdminClient(admin_config(secured.admin))
    for future in client.create_acls(stray, request_timeout=30).values():
        future.result()
    try:
        deadline = time.monotonic() + 60
        while True:  # the broker lists new bindings once its authorizer loaded them
            check = runner.invoke(main, ["acl", "check"])
            if "User:mallory" in check.output or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert check.exit_code == 1, check.output
        wildcard = [line for line in check.output.splitlines() if line.startswith("wildcard")]
        assert len(wildcard) == 1 and "User:*" in wildcard[0] and unused in wildcard[0]
        assert "principal outside the plan" in check.output and "--accept User:mallory" in (
            check.output
        )
        accepted = runner.invoke(main, ["acl", "check", "--accept", "User:mallory", "--json"])
        assert accepted.exit_code == 1
        data = json.loads(accepted.output)
        assert data["other_principals"] == [] and len(data["wildcard"]) == 1
        assert not data["missing"] and not data["not_in_plan"]
    finally:
        filters = [
            AclBindingFilter(
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )
            for b in stray
        ]
        for future in client.delete_acls(filters, request_timeout=30).values():
            future.result()
    deadline = time.monotonic() + 60
    while (clean := runner.invoke(main, ["acl", "check"])).exit_code != 0:
        assert time.monotonic() < deadline, clean.output
        time.sleep(0.5)


def test_the_operator_runs_status_and_sees_the_stages_groups(
    secured: SecuredLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: under the plan the operator's `ledger status` failed with
    GROUP_AUTHORIZATION_FAILED, shown as "is it running?"."""
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", secured.admin.bootstrap_servers)
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", secured.admin.topic_prefix)
    monkeypatch.setenv("LEDGER_RUN_DIR", str(secured.admin.run_dir))
    operator = secured.as_("operator")
    monkeypatch.setenv("LEDGER_KAFKA_CONFIG_FILE", str(operator.kafka_config_file))
    status = CliRunner().invoke(main, ["status", "--json"])
    # Exit 1 when no stage runs: the answer itself is what is asked for here.
    assert status.exit_code in (0, 1), status.output
    stages = json.loads(status.output)["stages"]
    assert [st["component"] for st in stages] == ["processor", "authority", "relay"]
    for st in stages:
        assert len(st["partitions"]) > 0
    rows = LedgerData(operator).stages()
    groups = [r for r in rows if r.source == "consumer group"]
    assert [r.name for r in groups] == [st["group"] for st in stages], groups
    # A principal without the grants hears that it is not authorised, and how to be.
    monkeypatch.setenv("LEDGER_KAFKA_CONFIG_FILE", str(secured.as_("service").kafka_config_file))
    refused = CliRunner().invoke(main, ["status"])
    assert refused.exit_code != 0
    assert "GROUP_AUTHORIZATION_FAILED" in refused.output, refused.output
    assert "not authorised" in refused.output and "ledger acl apply" in refused.output
    assert "is it running" not in refused.output


def _kafka_configs_tool(folder: Path) -> Path:
    """Kafka's ConfigCommand (what kafka-configs.sh runs) from the checkout's jars."""
    tool = folder / "kafka-configs"
    libs = LOCAL_KAFKA_HOME / "libs"
    tool.write_text(
        f'#!/bin/sh\nexec java -Xmx256m -cp "{libs}/*" kafka.admin.ConfigCommand "$@"\n'
    )
    tool.chmod(0o755)
    return tool


def _java_admin_properties(secured: SecuredLedger, folder: Path) -> Path:
    """The admin's client properties as Java clients take them (the tool is Java)."""
    assert secured.admin.kafka_config_file is not None
    props = {p.key: str(p.value) for p in file_properties(secured.admin.kafka_config_file).values()}
    lines = [
        f"security.protocol={props['security.protocol']}",
        f"sasl.mechanism={props['sasl.mechanism']}",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{props["sasl.username"]}" password="{props["sasl.password"]}";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={props['ssl.ca.location']}",
    ]
    path = folder / "admin-java.properties"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def test_acl_apply_sets_the_client_quotas_and_check_verifies_them(
    secured: SecuredLedger, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 29: the plan set no client quota, so a service could grow the journal at will."""
    runner = _admin_cli(secured, monkeypatch)
    tool = str(_kafka_configs_tool(tmp_path))
    java = str(_java_admin_properties(secured, tmp_path))
    with_tool = ["--kafka-configs", tool, "--tool-config", java]
    planned = quotas.plan_quotas(acl.principal_names())
    try:
        before = runner.invoke(main, ["acl", "check", *with_tool])
        assert before.exit_code == 1, before.output
        assert "quota: User:service: no producer_byte_rate quota" in before.output
        applied = runner.invoke(main, ["acl", "apply", *with_tool])
        assert applied.exit_code == 0, applied.output
        assert "set quota: User:service" in applied.output
        deadline = time.monotonic() + 60
        while (after := runner.invoke(main, ["acl", "check", *with_tool])).exit_code:
            assert time.monotonic() < deadline, after.output
            time.sleep(0.5)
        assert "client quotas: 0 not as planned" in after.output
        data = json.loads(runner.invoke(main, ["acl", "check", *with_tool, "--json"]).output)
        assert data["quotas"] == []
    finally:
        for q in planned:
            subprocess.run(
                [tool, "--bootstrap-server", secured.admin.bootstrap_servers]
                + ["--command-config", java, "--alter"]
                + ["--entity-type", "users", "--entity-name", str(q.user)]
                + ["--delete-config", ",".join(q.values)],
                capture_output=True,
                timeout=180,
                check=False,
            )
