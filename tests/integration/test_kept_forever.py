"""Records deleted with broker rights from a topic the ledger keeps forever.

``approvals`` (grants and revocations), ``approval-uses``, ``policy`` and
``operating-events`` keep every record forever, and nothing of the ledger
deletes from them. An administrator can still cut a partition's head with
DeleteRecords, e.g. a revocation, and write back the grants before it. The
audit names every such partition (its log start above 0), and a stage that
follows the partition does not wait forever for records that are gone.
"""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from consumers.auditor import run_audit
from consumers.chain_audit import KEPT_FOREVER
from consumers.reader import read_topic
from consumers.tables import TableFollower
from ledger.kafka import admin_config
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration


def test_an_approvals_partition_emptied_by_delete_records_is_named_and_followed_through(
    ledger_settings: LedgerSettings,
) -> None:
    settings = ledger_settings
    pub = LedgerPublisher(settings)
    try:
        approve(pub, "ap-kept")
    finally:
        pub.close()
    (grant,) = [r for r in read_topic(settings, "approvals") if r.key == "ap-kept"]
    assert run_audit(settings, read_sinks=False).violations == []

    admin = AdminClient(admin_config(settings))
    tp = TopicPartition(settings.topic("approvals"), grant.partition, grant.offset + 1)
    for future in admin.delete_records([tp]).values():
        future.result(timeout=30)

    # A stage following approvals catches up at once: the partition has nothing to read.
    applied: list[str] = []
    follower = TableFollower(settings, "approvals", lambda key, rec: applied.append(key))
    try:
        follower.follow(set(range(settings.partitions)))
        follower.catch_up(timeout_s=30)
    finally:
        follower.close()
    assert "ap-kept" not in applied

    report = run_audit(settings, read_sinks=False)
    named = [v.evidence for v in report.violations if v.invariant == KEPT_FOREVER]
    assert len(named) == 1, report.violations
    assert named[0].startswith(f"deleted approvals:{grant.partition}:..{grant.offset}")
    assert not report.clean
