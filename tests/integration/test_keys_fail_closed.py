"""Keys that are lost, missing or not this ledger's, on the real broker.

Evidence that cannot be verified never counts as absent:

* a ledger whose keys folder is lost does not start again: every stage
  refuses, naming the key and the remedy, and creates nothing; ``ledger keys
  init`` refuses too while the ledger holds evidence. Keys made anew by hand
  anyway cannot verify the earlier approval use, so a consumed approval
  pays nothing a second time, and the audit is ``NOT VERIFIED``, naming what
  it could not check;
* one record sealed by a key nobody holds stops only what it covers, and
  keys that vanish while the stages run are not replaced;
* a genuine record copied from another ledger, even one that shares the
  keys on purpose, is refused there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumers.auditor import run_audit
from consumers.reader import current_states, read_topic
from consumers.stage import Record, read_partition
from ledger.authn import ROLE_AUTHORITY, ROLE_OPERATOR, MacKey, SigningKey, seal_headers
from ledger.authority import policy_key
from ledger.contracts import PAYMENT_GATEWAY
from ledger.credentials import keys_dir, provision_keys
from ledger.events import (
    AdmissionDecision,
    Approval,
    ApprovalUse,
    Event,
    OperatingEvent,
    PolicyChange,
)
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.topology import partition_for
from producers.publisher import LedgerPublisher
from testbed.harness import Harness, settings_env
from testbed.people import can_sign
from tests.helpers import replay
from tests.integration.test_stages import PARAMS, REVIEWER, approve, publish

pytestmark = pytest.mark.integration

FIRST = "refund:keys-first:v1"
SECOND = "refund:keys-second:v1"
THIRD = "refund:keys-third:v1"


def _events(settings: LedgerSettings, kind: str) -> list[OperatingEvent]:
    return [
        r.event
        for r in read_topic(settings, "operating-events")
        if isinstance(r.event, OperatingEvent) and r.event.kind == kind
    ]


def _ledger(settings: LedgerSettings, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``ledger ARGS`` as an operator would, with the ledger's settings."""
    return subprocess.run(
        [sys.executable, "-m", "ledger.cli", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _produce(settings: LedgerSettings, topic: str, key: str, event: Event, sealer: object) -> None:
    """Write one record sealed by ``sealer`` (a key the ledger does not hold) on its partition."""
    value = event.to_bytes()
    producer = Producer(producer_config(settings))
    producer.produce(
        settings.topic(topic),
        key=key.encode(),
        value=value,
        headers=seal_headers(sealer, topic, key.encode(), value),  # type: ignore[arg-type]
        partition=partition_for(key, settings.partitions),
    )
    assert producer.flush(30) == 0


def _use(approval_id: str, operation_id: str) -> ApprovalUse:
    return ApprovalUse(
        approval_id=approval_id,
        operation_id=operation_id,
        parameter_digest="0" * 64,
        consumed_at_ms=0,
        decided_by="authority-9",
    )


@contextlib.contextmanager
def _one_refund_verified(
    settings: LedgerSettings, *approvals: str
) -> Iterator[tuple[Harness, LedgerPublisher]]:
    """A running ledger whose refund FIRST, under the first approval, is verified."""
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(settings)
    try:
        for approval in approvals:
            approve(pub, approval)
        publish(pub, FIRST, approval=approvals[0])
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(settings)[FIRST].state == S.OUTCOME_VERIFIED
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def _drop_topics(settings: LedgerSettings) -> None:
    """Delete a second ledger's topics (the fixture drops only its own prefix's)."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    names = [n for n in admin.list_topics(timeout=10).topics if n.startswith(settings.topic(""))]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else ():
        with contextlib.suppress(Exception):  # cleanup must not fail the test
            future.result(timeout=30)


def test_lost_keys_start_nothing_and_a_consumed_approval_pays_nothing_twice(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    folder = keys_dir(settings)
    with _one_refund_verified(settings, "ap-once") as (harness, pub):
        for component in ("processor", "authority", "relay"):
            harness.kill(component)

        # The run folder's keys are lost.
        shutil.rmtree(folder)
        for component in ("processor", "authority", "relay"):
            done = _ledger(settings, component, "--instance", "0")
            assert done.returncode == 1, done.stderr[-2000:]
            assert "stage-keys.json" in done.stderr and "ledger keys init" in done.stderr
            assert str(folder) in done.stderr
        init = _ledger(settings, "keys", "init")
        assert init.returncode == 1, init.stdout + init.stderr
        assert "already holds sealed records" in init.stderr
        assert not folder.exists(), "a command created a key"

        # In depth: keys made anew by hand (as an operator bypassing `keys init`
        # would) verify none of the earlier evidence. The approval's use is
        # unverifiable, so its approval admits nothing; the settled refund's
        # state is unverifiable, so the processor holds it.
        provision_keys(settings)
        harness.restart()
        publish(pub, SECOND, approval="ap-once")
        pub.publish(
            operation_id=THIRD,
            sink="payments",
            action="refund",
            params={**PARAMS, "account": "acct-elsewhere"},
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id="ap-once",
        )
        publish(pub, FIRST, approval="ap-once")  # the settled one, again
        harness.wait_quiescent(90)
        states = current_states(settings)
        for op in (SECOND, THIRD):
            assert states[op].state == S.NEEDS_REAUTHORISATION, states[op]
            assert "cannot be verified" in (states[op].reason or ""), states[op].reason
            assert harness.effects("payments", op) == 0
        assert harness.effects("payments", FIRST) == 1
        held = _events(settings, "UNVERIFIABLE")
        assert any(
            e.component == "authority" and "approval-uses" in e.reason and "unknown key" in e.reason
            for e in held
        ), [e.reason for e in held]
        assert any(e.component == "processor" and e.operation_id == FIRST for e in held)
        status = json.loads((settings.run_dir / "status" / "processor-0.json").read_text())
        assert status["unverifiable_held_count"] >= 1 and FIRST in status["unverifiable_held"]
        said = _ledger(settings, "status")
        assert said.returncode == 1, said.stdout + said.stderr
        assert "processor-0 (this host): HOLDING" in said.stdout, said.stdout
        assert "authority-0 (this host): HOLDING" in said.stdout, said.stdout
        shown = _ledger(settings, "state", FIRST)  # held, never shown as absent
        assert shown.returncode == 1 and "held, not absent" in shown.stderr, shown

        report = run_audit(settings, read_sinks=False)
        assert not report.clean and report.verdict.startswith("NOT VERIFIED"), report.verdict
        unverifiable = {i.operation_id for i in report.open_items if i.state == "UNVERIFIABLE"}
        assert FIRST in unverifiable, report.open_items
        assert not harness.failed()


def test_a_record_sealed_by_a_key_nobody_holds_stops_nothing_else(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    folder = keys_dir(settings)
    with _one_refund_verified(settings, "ap-a", "ap-b", "ap-c") as (harness, pub):
        # The keys vanish while the stages run, and records sealed by keys
        # nobody holds arrive: a use of ap-b (the kernel's table) and an
        # admission (the processor's input). A stage that met them used to
        # make fresh keys and refuse every genuine record from then on.
        backup = settings.run_dir.parent / "keys-backup"
        shutil.copytree(folder, backup)
        shutil.rmtree(folder)
        stranger = SigningKey(
            "authority-kernel-000000000000",
            Ed25519PrivateKey.generate(),
            ROLE_AUTHORITY,
            settings.ledger_identity,
        )
        _produce(settings, "approval-uses", "ap-b", _use("ap-b", "refund:ghost:v1"), stranger)
        _produce(  # any value: the seal is refused before the value matters
            settings,
            "receipts",
            "refund:ghost:v2",
            _use("x", "refund:ghost:v2"),
            MacKey(os.urandom(32), ledger_id=settings.ledger_identity),
        )
        publish(pub, SECOND, approval="ap-c")
        publish(pub, THIRD, approval="ap-b")
        harness.wait_quiescent(90)
        assert not folder.exists(), "a stage made new keys"
        shutil.copytree(backup, folder)  # for this test's own reads
        states = current_states(settings)
        assert states[SECOND].state == S.OUTCOME_VERIFIED, states[SECOND]
        assert harness.effects("payments", SECOND) == 1
        assert states[THIRD].state == S.NEEDS_REAUTHORISATION, states[THIRD]
        assert "cannot be verified" in (states[THIRD].reason or "")
        assert harness.effects("payments", THIRD) == 0
        assert not harness.crashed()


def test_a_decision_copied_from_another_ledger_admits_nothing_there(
    ledger_settings: LedgerSettings,
) -> None:
    mine = ledger_settings
    # Another ledger on the same broker that shares the keys on purpose.
    other = mine.model_copy(
        update={
            "topic_prefix": mine.topic_prefix + "b",
            "run_dir": mine.run_dir.parent / "other",
            "keys_dir": keys_dir(mine),
        }
    )
    provision_keys(other, share=True)
    harness = Harness(mine, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    theirs = Harness(other)
    theirs.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub, pub_other = LedgerPublisher(mine), LedgerPublisher(other)
    try:
        approve(pub, "ap-1")
        publish(pub, FIRST, approval="ap-1")
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(mine)[FIRST].state == S.OUTCOME_VERIFIED

        # The other ledger has the same operation, with no approval of its own.
        publish(pub_other, FIRST, approval="ap-1")
        theirs.start("processor")
        theirs.wait_quiescent(90)
        assert current_states(other)[FIRST].state == S.NOT_ADMITTED

        found: list[Message] = []

        def keep(rec: Record | None, msg: Message) -> None:
            if rec is not None and isinstance(rec.event, AdmissionDecision):
                found.append(msg)

        read_partition(mine, "admissions", None, keep)
        [genuine] = [m for m in found if (m.key() or b"").decode() == FIRST]
        partition, offset = replay(other, "admissions", genuine)
        theirs.wait_quiescent(90)
        assert current_states(other)[FIRST].state == S.NOT_ADMITTED
        assert theirs.effects("payments", FIRST) == 0
        refused = [
            e
            for e in _events(other, "UNAUTHENTICATED")
            if (e.source_topic, e.source_partition, e.source_offset)
            == ("admissions", partition, offset)
        ]
        assert refused and "does not match" in refused[0].reason, refused
        assert not theirs.crashed()
    finally:
        pub.close()
        pub_other.close()
        theirs.stop()
        harness.stop()
        _drop_topics(other)


def test_a_policy_record_of_an_untrusted_operator_is_lifted_by_a_trusted_change(
    ledger_settings: LedgerSettings,
) -> None:
    """A policy change sealed by a key nobody trusts holds every admission (it may be a
    genuine change whose key was lost) until an operator with a trusted key sets the
    policy again; then admissions under that policy flow (new-user trial: nothing lifted
    the hold, and `ledger policy show` said nothing of it)."""
    settings = ledger_settings
    with _one_refund_verified(settings, "ap-a", "ap-b") as (harness, pub):
        mallory = SigningKey(
            "mallory", Ed25519PrivateKey.generate(), ROLE_OPERATOR, settings.ledger_identity
        )
        change = PolicyChange(version=7, set_by="mallory", effective_at_ms=1)
        _produce(settings, "policy", policy_key(change), change, mallory)
        publish(pub, SECOND, approval="ap-b")
        harness.wait_quiescent(90)
        states = current_states(settings)
        assert states[SECOND].state != S.OUTCOME_VERIFIED, states[SECOND]
        assert harness.effects("payments", SECOND) == 0
        shown = _ledger(settings, "policy", "show")
        assert shown.returncode == 1 and "ledger policy set 2 --by" in shown.stderr, shown
        # The remedy: a trusted operator sets the policy again; a reviewer approves under it.
        can_sign(pub, settings, "ops")
        pub.publish_policy(2, "ops", 2)
        pub.publish_approval(
            REVIEWER.sign(
                Approval(
                    approval_id="ap-c",
                    reviewer="rev",
                    policy_version=2,
                    expires_at_ms=1_000_000,
                    scope_subject="customer-1",
                    scope_max_amount_minor=9000,
                    granted_at_ms=0,
                ),
                ledger_id=settings.ledger_identity,
            )
        )
        publish(pub, THIRD, approval="ap-c")
        harness.wait_quiescent(90)
        assert current_states(settings)[THIRD].state == S.OUTCOME_VERIFIED
        assert harness.effects("payments", THIRD) == 1
        assert _ledger(settings, "policy", "show").returncode == 0
