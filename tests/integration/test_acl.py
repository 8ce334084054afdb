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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from consumers.auditor import run_audit
from consumers.reader import current_states, read_topic, wait_for_decision
from consumers.reconciler import reconcile_once
from ledger import acl
from ledger.cli import main
from ledger.cli.acl import apply_plan, broker_acls, compare, to_binding
from ledger.contracts import PAYMENT_GATEWAY
from ledger.errors import BrokerError
from ledger.events import Approval
from ledger.kafka import admin_config, producer_config
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import RecoveryState as S
from ledger.topics import create_topics
from producers.publisher import LedgerPublisher
from producers.sdk import LedgerService, Refused, Verified
from testbed.harness import Harness
from tests.conftest import SecureCluster

pytestmark = pytest.mark.integration

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
