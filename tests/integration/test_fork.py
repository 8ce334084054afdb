"""Forks on the real broker (issue 14 item 5): ``ledger fork`` and ``LedgerPublisher.fork``.

A fork is a new operation linked to the original: the approval the original
consumed does not admit it, it makes its own effect under its own ID once it
has its own approval, and the original's state and effect are untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from consumers.history import read_history
from consumers.reader import current_states
from ledger.cli import main
from ledger.cli.common import EXIT_ERROR, EXIT_UNKNOWN_OPERATION
from ledger.contracts import PAYMENT_GATEWAY
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_operating_cli import _env
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration

OP = "refund:fork-orig:v1"
FORK = "refund:fork-orig:v1-b"


@pytest.fixture
def ledger(ledger_settings: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher]]:
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    try:
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def test_a_fork_needs_its_own_approval_and_makes_its_own_effect(
    ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness, pub = ledger
    approve(pub)
    publish(pub, OP)
    harness.start_all()
    harness.wait_quiescent(90)
    before = current_states(harness.settings)[OP]
    assert before.state == S.OUTCOME_VERIFIED and harness.effects("payments", OP) == 1

    _env(monkeypatch, harness.settings)
    runner = CliRunner()
    unknown = runner.invoke(main, ["fork", "refund:nobody:v1", "--new-operation-id", FORK])
    assert unknown.exit_code == EXIT_UNKNOWN_OPERATION, unknown.output
    assert "no operation 'refund:nobody:v1'" in unknown.output
    onto = runner.invoke(main, ["fork", OP, "--new-operation-id", OP])
    assert onto.exit_code == EXIT_ERROR and "already exists" in onto.output

    # The fork names the original's approval: consumed by the original, it admits nothing.
    forked = runner.invoke(
        main, ["fork", OP, "--new-operation-id", FORK, "--approval-id", "ap-1", "--wait-s", "60"]
    )
    assert forked.exit_code == 0, forked.output
    assert json.loads(forked.output.splitlines()[0])["forked_from"] == OP
    harness.wait_quiescent(90)
    states = current_states(harness.settings)
    assert states[FORK].state == S.NEEDS_REAUTHORISATION
    assert "consumed" in states[FORK].reason
    assert harness.effects("payments", FORK) == 0

    # Its own approval admits it: its own effect, under its own ID.
    approve(pub, "ap-fork")
    pub.fork(states[OP], FORK, approval_id="ap-fork")
    harness.wait_quiescent(90)
    states = current_states(harness.settings)
    assert states[FORK].state == S.OUTCOME_VERIFIED
    assert harness.effects("payments", FORK) == 1
    # The original is untouched.
    assert states[OP] == before and harness.effects("payments", OP) == 1

    original, fork = read_history(harness.settings, OP), read_history(harness.settings, FORK)
    assert original.forks == (FORK,) and original.forked_from is None
    assert fork.forked_from == OP
