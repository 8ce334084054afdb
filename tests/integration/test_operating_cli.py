"""Operating the ledger from the command line, on the real broker (issue 13, item 2).

``ledger intent publish --until`` exits by where the operation comes to rest,
``ledger status`` follows a stage's life from its consumer group, a fresh
prefix says "topics not created" in one line, and the relay says every send
and outcome at INFO.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ledger.cli import main
from ledger.cli.common import (
    EXIT_ENDED_ELSEWHERE,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_TOPICS_MISSING,
    EXIT_UNKNOWN_OPERATION,
)
from ledger.contracts import PAYMENT_GATEWAY
from ledger.settings import LedgerSettings
from producers.publisher import LedgerPublisher
from testbed.harness import Harness
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration

PARAMS = {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}


def _until(check: Callable[[], Any], what: str, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _env(monkeypatch: pytest.MonkeyPatch, settings: LedgerSettings) -> None:
    for name, value in settings.model_dump().items():
        if value is not None:
            monkeypatch.setenv(f"LEDGER_{name.upper()}", str(value))


def _ledger(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _publish(op: str, *extra: str) -> Result:
    return _ledger(
        "intent",
        "publish",
        "--operation-id",
        op,
        "--sink",
        "payments",
        "--action",
        "refund",
        "--params",
        json.dumps(PARAMS),
        "--actor",
        "svc",
        "--subject",
        "customer-1",
        "--purpose",
        "fee-remediation",
        "--decision-version",
        "1",
        *extra,
    )


@pytest.fixture
def running(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Harness, LedgerPublisher]]:
    _env(monkeypatch, ledger_settings)
    harness = Harness(ledger_settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(ledger_settings)
    try:
        harness.start_all()
        yield harness, pub
    finally:
        pub.close()
        harness.stop()


def test_until_exits_by_where_the_operation_rests_and_the_relay_says_each_request(
    running: tuple[Harness, LedgerPublisher],
) -> None:
    harness, pub = running
    approve(pub, "ap-ok")
    approve(pub, "ap-small", max_amount=100)  # covers 100 minor units: 5000 is out of scope

    verified = _publish(
        "refund:until-ok:v1", "--approval-id", "ap-ok", "--until", "OUTCOME_VERIFIED"
    )
    assert verified.exit_code == EXIT_OK, verified.output + harness.log_tail()
    assert (
        verified.output.strip().splitlines()[-1].startswith("OUTCOME_VERIFIED: refund:until-ok:v1")
    )

    # Admission is refused by the authority after the processor's first
    # decision (NOT_ADMITTED): --until waits through it and exits 4.
    held = _publish(
        "refund:until-held:v1",
        "--approval-id",
        "ap-small",
        "--until",
        "OUTCOME_VERIFIED,EFFECT_COMMITTED",
        "--timeout",
        "90",
    )
    assert held.exit_code == EXIT_ENDED_ELSEWHERE, held.output + harness.log_tail()
    # The processor's answer comes from the signed outcome channel.
    assert "PENDING: refund:until-held:v1 NOT_ADMITTED" in held.output
    assert "ended in NEEDS_REAUTHORISATION" in held.output

    # The publisher's own wait says the same.
    assert pub.wait_for("refund:until-ok:v1", {"OUTCOME_VERIFIED"}, 30).version >= 1
    from ledger.errors import OperationEndedElsewhereError

    with pytest.raises(OperationEndedElsewhereError) as caught:
        pub.wait_for("refund:until-held:v1", {"OUTCOME_VERIFIED"}, 30)
    assert caught.value.observed == "NEEDS_REAUTHORISATION"

    # The relay said its send and the outcome, with operation, sink and token.
    log = (harness.run_dir / "logs" / "relay-0.log").read_text()
    assert "INFO consumers.relay: relay: sending EXECUTE refund:until-ok:v1 at payments" in log
    assert "relay: outcome EXECUTE refund:until-ok:v1 at payments" in log
    assert "receipt COMMITTED" in log and "fencing token " in log
    # ... and the postcondition it read right after the effect, in the same receipt.
    assert "receipt COMMITTED: committed; postcondition MATCH read right after it" in log

    # Every stage is live, and the processor has committed past inputs.
    status = _ledger("status", "--json")
    assert status.exit_code == EXIT_OK, status.output
    stages = {st["component"]: st for st in json.loads(status.output)["stages"]}
    assert all(st["live"] for st in stages.values())
    assert isinstance(stages["processor"]["last_commit_ms"], int)
    assert any(p["committed"] for p in stages["relay"]["partitions"])

    # A sink that refuses connections: one INFO line per request not sent.
    harness.sinks["payments"].stop()
    approve(pub, "ap-down")
    down = _publish("refund:until-down:v1", "--approval-id", "ap-down")
    assert down.exit_code == EXIT_OK, down.output
    _until(
        lambda: (
            "relay: not sent EXECUTE refund:until-down:v1 at payments"
            in (harness.run_dir / "logs" / "relay-0.log").read_text()
        ),
        "the relay logs the refused connection",
    )

    # --json on the lists and shows.
    listed = _ledger("state", "--json")
    assert listed.exit_code == EXIT_OK, listed.output
    states = {o["operation_id"]: o["state"] for o in json.loads(listed.output)["operations"]}
    assert states["refund:until-ok:v1"] == "OUTCOME_VERIFIED"
    assert states["refund:until-held:v1"] == "NEEDS_REAUTHORISATION"
    unknown = _ledger("state", "refund:nobody:v1")
    assert unknown.exit_code == EXIT_UNKNOWN_OPERATION
    open_items = _ledger("reconcile", "list", "--json")
    assert open_items.exit_code == EXIT_OK, open_items.output
    assert isinstance(json.loads(open_items.output)["items"], list)


def _status(name: str) -> dict[str, Any]:
    result = _ledger("status", "--json")
    assert result.exit_code in (EXIT_OK, EXIT_ERROR), result.output
    stages = {s["component"]: s for s in json.loads(result.output)["stages"]}
    return dict(stages[name])


def test_status_shows_a_live_stage_from_its_group_and_not_once_it_stopped(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, ledger_settings)
    harness = Harness(ledger_settings, create=False)
    try:
        before = _status("processor")
        assert not before["live"] and before["members"] == []
        harness.start("processor")
        live = _until(
            lambda: (st := _status("processor"))["live"] and st["members"][0]["partitions"] and st,
            "the processor is a member with partitions",
        )
        member = live["members"][0]
        assert member["instance"] == "processor-0"
        assert "intents[0]" in member["partitions"]
        assert live["lag"] == 0
        text = _ledger("status")
        assert text.exit_code == EXIT_ERROR  # the authority and the relay do not run
        assert "processor: live" in text.output and "relay: DOWN" in text.output
        status_file = harness.run_dir / "status" / "processor-0.json"
        _until(
            lambda: status_file.exists() and json.loads(status_file.read_text())["ready"],
            "the processor says it is ready in its status file",
        )
        harness.kill("processor")
        _until(lambda: not _status("processor")["live"], "the killed processor leaves its group")
        # Its status file still says what it said when it died; `ledger status` did not ask it.
        stale = json.loads((harness.run_dir / "status" / "processor-0.json").read_text())
        assert stale["ready"] is True
    finally:
        harness.stop()


def test_a_fresh_prefix_says_topics_not_created_in_one_line(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path / "run"))
    for command in (
        ["state"],
        ["state", "--json"],
        ["reconcile", "list", "--json"],
        ["status"],
        ["audit"],
        ["topics", "check", "journal"],
    ):
        result = _ledger(*command)
        assert result.exit_code == EXIT_TOPICS_MISSING, (command, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1, (command, result.output)
        assert lines[0].startswith("Error: topics not created: run `ledger topics create`")


def test_until_times_out_with_exit_3_when_no_stage_decides(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, ledger_settings)
    result = _publish(
        "refund:until-nobody:v1", "--wait-s", "0", "--until", "OUTCOME_VERIFIED", "--timeout", "3"
    )
    assert result.exit_code == EXIT_TIMEOUT, result.output
    assert "reached none of OUTCOME_VERIFIED in 3 s (it is not in the ledger yet)" in result.output
