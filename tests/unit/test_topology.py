"""The topic layout keeps one writer per compacted key wherever a table is rebuilt."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.authority import AuthorityKernel
from consumers.relay import Relay
from ledger.settings import LedgerSettings
from ledger.topology import TOPIC_BY_NAME, TOPICS


@pytest.mark.parametrize("spec", TOPICS, ids=[t.name for t in TOPICS])
def test_a_topic_a_table_is_rebuilt_from_has_one_writer_role(spec) -> None:
    assert spec.roles, f"{spec.name}: name its writer roles"
    if spec.tables:
        assert spec.cleanup == "compact", f"{spec.name}: a table is rebuilt from a compacted topic"
        assert len(spec.roles) == 1, (
            f"{spec.name} is rebuilt as a table by {spec.tables} but written by {spec.roles}: "
            "compaction would let one writer's record erase another's"
        )


def test_consumption_has_its_own_topic_that_only_the_kernel_writes() -> None:
    assert TOPIC_BY_NAME["approval-uses"].roles == ("authority kernel",)
    assert "authority kernel" not in TOPIC_BY_NAME["approvals"].roles


def test_the_tables_the_stages_follow_are_declared(tmp_path: Path) -> None:
    """The layout's ``tables`` names every table a stage really rebuilds."""
    settings = LedgerSettings(run_dir=tmp_path)
    kernel = AuthorityKernel(settings)
    followed = {f.topic for f in (kernel._approvals, kernel._uses, kernel._policy)}
    assert followed == {t.name for t in TOPICS if "authority kernel" in t.tables}
    relay = Relay(settings)
    followed = {f.topic for f in (relay._receipts, relay._approvals, relay._policy)}
    assert followed == {t.name for t in TOPICS if "relay" in t.tables}
