"""The topic layout keeps one writer per compacted key wherever a table is rebuilt."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.authority import AuthorityKernel
from consumers.relay import Relay
from ledger.settings import LedgerSettings
from ledger.topology import TOPIC_BY_NAME, TOPICS
from tests.helpers import keyed


@pytest.mark.parametrize("spec", TOPICS, ids=[t.name for t in TOPICS])
def test_a_topic_a_table_is_rebuilt_from_has_one_writer_role(spec) -> None:
    assert spec.roles, f"{spec.name}: name its writer roles"
    if spec.tables:
        assert spec.cleanup == "compact" or spec.retention_ms == -1, (
            f"{spec.name}: a table is rebuilt from a topic that keeps each key's latest record"
        )
        assert len(spec.roles) == 1, (
            f"{spec.name} is rebuilt as a table by {spec.tables} but written by {spec.roles}: "
            "compaction would let one writer's record erase another's"
        )


@pytest.mark.parametrize("name", ["approvals", "approval-uses", "policy"])
def test_the_tables_of_authority_are_never_compacted(name: str) -> None:
    """Attacker trial: a forged tombstone (or a replayed grant) on these topics is refused by
    every reader, yet compaction deleted the authentic use, revocation or policy change under
    it, and after a restart an approval paid twice, a revoked one paid, the policy rolled
    back. Kafka's cleaner does not check seals: these topics keep every record."""
    spec = TOPIC_BY_NAME[name]
    assert spec.cleanup == "delete" and spec.retention_ms == -1 and spec.audited


def test_consumption_has_its_own_topic_that_only_the_kernel_writes() -> None:
    assert TOPIC_BY_NAME["approval-uses"].roles == ("authority kernel",)
    assert "authority kernel" not in TOPIC_BY_NAME["approvals"].roles


def test_the_tables_the_stages_follow_are_declared(tmp_path: Path) -> None:
    """The layout's ``tables`` names every table a stage really rebuilds."""
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    kernel = AuthorityKernel(settings)
    followed = {f.topic for f in kernel.tables.followers()}
    assert followed == {t.name for t in TOPICS if "authority kernel" in t.tables}
    relay = Relay(settings)
    followed = {
        f.topic
        for f in (
            relay.receipts_table,
            relay.admission.approvals_table,
            relay.admission.policy_table,
        )
    }
    assert followed == {t.name for t in TOPICS if "relay" in t.tables}
