"""Stranded operations on the real broker: each kind is an audit open item, a metric,
a console queue entry and a non-zero ``ledger reconcile run``; a stranded committed
effect is verified again without a person (never sent twice).

The bounds (``LEDGER_STRANDED_*_S``) are set to one second so that an operation
left where it is becomes stranded within the test; every wait polls a condition.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from prometheus_client.parser import text_string_to_metric_families
from starlette.exceptions import StarletteDeprecationWarning

from consumers.auditor import run_audit
from consumers.reader import current_states, read_topic
from consumers.stranding import ledger_stranded
from consumers.unconsumed import intent_offsets
from ledger.cli import main
from ledger.console import LedgerData, create_app
from ledger.contracts import PAYMENT_GATEWAY, EffectContract
from ledger.credentials import provision_keys
from ledger.events import Disposition, Readback
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from sinks.registry import SinkEndpoint, load_sinks, save_sinks
from testbed.harness import Harness, settings_env
from testbed.people import can_sign
from tests.integration.test_stages import PARAMS, approve, publish

with warnings.catch_warnings():  # starlette would rather have httpx2; httpx is what we ship
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "stranded-test-token"

#: A sink that can verify (a postcondition query) but offers neither readback
#: nor an idempotency key: an ambiguous failure is an unknown outcome.
NOTARY = EffectContract(postcondition=True, consequence="irreversible")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _stranded_metric(port: int, reason: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "ledger_stranded_operations" and s.labels.get("reason") == reason
    )


def _reconcile_run(settings: LedgerSettings) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledger.cli", "reconcile", "run"],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=240,
    )


def _state(settings: LedgerSettings, op: str) -> str | None:
    found = current_states(settings).get(op)
    return None if found is None else str(found.state)


def _verifications(settings: LedgerSettings, op: str) -> list[Readback]:
    """The postcondition readbacks recorded for ``op``."""
    return [
        r.event
        for r in read_topic(settings, "readbacks")
        if isinstance(r.event, Readback)
        and r.event.operation_id == op
        and r.event.kind == "POSTCONDITION"
    ]


def _stranded_as(settings: LedgerSettings, op: str, reason: str) -> bool:
    return any(s.operation_id == op and s.reason == reason for s in ledger_stranded(settings))


def assert_seen_everywhere(
    settings: LedgerSettings, op: str, reason: str, metrics_port: int
) -> subprocess.CompletedProcess[str]:
    """The stranded ``op`` is an audit open item, a metric, a console queue entry and
    a non-zero ``reconcile run``; returns that run."""
    _until(f"{op} stranded ({reason})", lambda: _stranded_as(settings, op, reason))
    report = run_audit(settings, read_sinks=False)
    assert not report.clean and not report.violations, report.violations
    (item,) = [i for i in report.open_items if i.operation_id == op]
    if reason == "held_refused_record":  # evidence the audit cannot verify: said as such
        assert report.verdict.startswith("NOT VERIFIED") and item.state == "UNVERIFIABLE"
    else:
        assert report.verdict.startswith("STRANDED"), report.verdict
        assert f"stranded ({reason})" in item.reason and item.age_s is not None
        assert op in {s.operation_id for s in report.stranded}

    # The processor judges its own partitions with the same definition.
    _until(
        f"ledger_stranded_operations{{reason={reason}}}",
        lambda: _stranded_metric(metrics_port, reason) >= 1,
    )

    console = TestClient(
        create_app(LedgerData(settings), title=settings.topic_prefix, token=TOKEN),
        base_url="http://127.0.0.1:8088",
    )
    page = console.get("/queue").text
    table = re.search(r'<table id="stranded">(.*?)</table>', page, re.S)
    assert table is not None, page
    assert f'data-operation="{op}" data-reason="{reason}"' in table.group(1)
    assert re.search(r'id="nav-counts"[^>]*>\(\d+ stranded', page)
    (row,) = [r for r in table.group(1).split("<tr ") if f'data-operation="{op}"' in r]
    # "Read back now" only where a readback can move it (a verification).
    assert ('action="/read-back"' in row) == (reason == "committed_unverified"), row
    assert page.index('id="stranded"') < page.index("<h2>Unknown outcomes</h2>")

    run = _reconcile_run(settings)
    assert run.returncode == 8, run.stderr[-3000:]
    assert op in run.stderr and f"stranded ({reason})" in run.stderr
    return run


@pytest.fixture
def stranding(ledger_settings: LedgerSettings) -> Iterator[tuple[Harness, LedgerPublisher, int]]:
    settings = ledger_settings.model_copy(
        update={
            "stranded_in_flight_s": 1.0,
            "stranded_committed_s": 1.0,
            "stranded_not_admitted_s": 1.0,
            "stranded_held_s": 1.0,
            "stranded_intents_s": 1.0,
            "sink_retry_attempts": 1,  # a sink away is given up on at once
        }
    )
    harness = Harness(settings, create=False)
    port = _free_port()
    harness.stage_env["processor"] = {
        "LEDGER_METRICS_PORT": str(port),
        "LEDGER_METRICS_HOST": "127.0.0.1",
    }
    pub = LedgerPublisher(settings)
    try:
        yield harness, pub, port
    finally:
        pub.close()
        harness.stop()


def test_in_flight_without_a_relay_and_not_admitted_without_a_kernel_are_stranded(
    stranding: tuple[Harness, LedgerPublisher, int],
) -> None:
    harness, pub, port = stranding
    settings = harness.settings
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pending, undecided = "refund:stranded-pending:v1", "refund:stranded-undecided:v1"
    approve(pub, "ap-1")
    approve(pub, "ap-2")
    harness.start("processor")
    harness.start("authority")  # no relay: the dispatch has no owner
    publish(pub, pending, approval="ap-1")
    _until(f"{pending} EFFECT_PENDING", lambda: _state(settings, pending) == S.EFFECT_PENDING)
    harness.retire("authority", "0")  # no kernel: the admission is never decided
    publish(pub, undecided, approval="ap-2")
    _until(f"{undecided} recorded", lambda: _state(settings, undecided) == S.NOT_ADMITTED)

    assert_seen_everywhere(settings, pending, "in_flight_without_owner", port)
    run = assert_seen_everywhere(settings, undecided, "not_admitted_undecided", port)
    assert "start the relay" in run.stderr and "authority kernel" in run.stderr

    # Their owners back: both move on by themselves, and nothing is left open.
    harness.start("authority", "1")
    harness.start("relay")
    for op in (pending, undecided):
        _until(f"{op} verified", lambda op=op: _state(settings, op) == S.OUTCOME_VERIFIED)
        assert harness.effects("payments", op) == 1
    assert run_audit(settings, read_sinks=False).clean
    done = _reconcile_run(settings)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("resumed_by", ["reconcile run", "processor restart"])
def test_a_committed_disposition_whose_verification_never_came_is_verified_again(
    stranding: tuple[Harness, LedgerPublisher, int], resumed_by: str
) -> None:
    harness, pub, port = stranding
    settings = harness.settings
    sink = harness.start_sink("notary", NOTARY, hang_s=2 * settings.sink_timeout_s)
    op = "refund:stranded-committed:v1"
    approve(pub)
    with sink.client() as client:
        client.arm_fault(op, "timeout_after_commit")
    pub.publish(
        operation_id=op,
        sink="notary",
        action="refund",
        params=PARAMS,
        actor="svc",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
        approval_id="ap-1",
    )
    harness.start_all()
    _until("UNKNOWN_OUTCOME", lambda: _state(settings, op) == S.UNKNOWN_OUTCOME)
    # The sink goes away; an operator disposes "committed"; the relay performs
    # the verification that follows, which fails (the case).
    sink.stop()
    held = current_states(settings)[op]
    can_sign(pub, settings, "operator-7")
    pub.publish_disposition(
        Disposition(
            disposition_id="d-stranded",
            operation_id=op,
            decision="COMMITTED",
            by="operator-7",
            evidence="the notary's ledger shows the entry",
            disposed_at_ms=harness.clock.now_ms(),
            episode=held.entered_version,
        )
    )
    _until("EFFECT_COMMITTED", lambda: _state(settings, op) == S.EFFECT_COMMITTED)
    _until("the relay's failed verification", lambda: _verifications(settings, op))

    run = assert_seen_everywhere(settings, op, "committed_unverified", port)
    assert "verification UNKNOWN" in run.stderr  # it asked again; the sink did not answer
    # An answer that verifies nothing changes no state: it stays stranded, its age counting.
    assert _state(settings, op) == S.EFFECT_COMMITTED
    assert _stranded_as(settings, op, "committed_unverified")

    # The sink back, it is resumed without a person: by the next scheduled
    # reconcile run, or by the owner of its partition when it restarts (its
    # claim dispatches the verification again, which a relay performs).
    sink.restart()
    registry = load_sinks(settings.sinks_path())
    registry["notary"] = SinkEndpoint(url=sink.url, contract=NOTARY, token=sink.token)
    save_sinks(settings.sinks_path(), registry)
    if resumed_by == "reconcile run":
        done = _reconcile_run(settings)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "verification MATCH" in done.stderr
    else:
        harness.kill("processor")
        assert harness.restart("processor") == ["processor-0"]
    _until("OUTCOME_VERIFIED", lambda: _state(settings, op) == S.OUTCOME_VERIFIED)
    assert harness.effects("notary", op) == 1  # only a query was sent
    assert run_audit(settings, read_sinks=False).clean
    assert _reconcile_run(settings).returncode == 0


def test_an_operation_held_behind_a_record_its_keys_cannot_verify_is_stranded(
    stranding: tuple[Harness, LedgerPublisher, int],
) -> None:
    harness, pub, port = stranding
    settings = harness.settings
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    op = "refund:stranded-held:v1"
    approve(pub)
    publish(pub, op)
    harness.start_all()
    _until(f"{op} verified", lambda: _state(settings, op) == S.OUTCOME_VERIFIED)
    # The keys folder is lost and made anew by hand: the operation's state is
    # sealed by a key no reader holds any more, so every reader holds it.
    for component in ("processor", "authority", "relay"):
        harness.kill(component)
    shutil.rmtree(settings.keys_dir or settings.run_dir / "keys")
    provision_keys(settings)
    harness.restart()

    run = assert_seen_everywhere(settings, op, "held_refused_record", port)
    assert "restore the keys folder" in run.stderr


def _ledger(settings: LedgerSettings, *args: str) -> Result:
    """One ``ledger`` command in this process (``output`` holds stdout and stderr)."""
    return CliRunner().invoke(main, list(args), env=settings_env(settings))


def _all_consumed(settings: LedgerSettings) -> bool:
    found = intent_offsets(settings)
    if found is None:
        return False
    committed, ends = found
    return all((committed.get(p) or 0) >= end for p, end in ends.items()) and any(ends.values())


def test_an_intent_the_processor_has_not_consumed_is_stranded_and_not_called_refused(
    stranding: tuple[Harness, LedgerPublisher, int],
) -> None:
    harness, pub, _port = stranding
    settings = harness.settings
    first, waiting = "refund:stranded-consumed:v1", "refund:stranded-unconsumed:v1"
    # The processor consumes one intent and is stopped; the next one waits for it.
    harness.start("processor")
    publish(pub, first)
    _until("the processor's commit past the first intent", lambda: _all_consumed(settings))
    harness.retire("processor", "0")
    publish(pub, waiting)

    reason = "intent_not_consumed"
    _until(f"{waiting} stranded ({reason})", lambda: _stranded_as(settings, waiting, reason))
    report = run_audit(settings, read_sinks=False)
    assert report.verdict.startswith("STRANDED") and not report.violations, report.verdict
    (item,) = [i for i in report.open_items if i.operation_id == waiting]
    assert f"stranded ({reason})" in item.reason and "processor" in item.reason
    assert [s.operation_id for s in report.stranded if s.reason == reason] == [waiting]

    run = _ledger(settings, "reconcile", "run")
    assert run.exit_code == 8 and waiting in run.stderr, run.output[-3000:]
    assert "LEFT OPEN" in run.stdout and waiting in run.stdout, run.stdout  # not a bare []

    state = _ledger(settings, "state", waiting)
    assert state.exit_code == 5 and "not yet processed" in state.stderr, state.output
    assert "refused before admission" not in state.stderr
    assert _ledger(settings, "state", first).exit_code == 0  # consumed: it has a state

    console = TestClient(
        create_app(LedgerData(settings), title=settings.topic_prefix, token=TOKEN),
        base_url="http://127.0.0.1:8088",
    )
    table = re.search(r'<table id="stranded">(.*?)</table>', console.get("/queue").text, re.S)
    assert table is not None and f'data-operation="{waiting}" data-reason="{reason}"' in (
        table.group(1)
    )
