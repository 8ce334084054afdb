"""The operator console in a real browser on a real ledger.

A real broker, the real stages (processor, authority kernel, relay) and the
reference gateway sink twice: as the payment gateway, where two refunds
complete, and as a mailer without readback, where a notification is held in
UNKNOWN_OUTCOME (the sink commits it and then times out; nothing can read it
back, so only a person can release it). ``ledger
console`` runs as its own process; headless Chromium (Debian's ``chromium``
through ``chromedriver``, driven by Selenium) finds the held operation in the
queue, opens its timeline, disposes it with the form, and sees it leave the
queue; the ledger then holds the operator's signed disposition.

Without chromium and chromedriver the test is skipped, unless
``LEDGER_REQUIRE_BROWSER=1`` (``.ci/run`` sets it): then it fails.
``LEDGER_CONSOLE_SCREENSHOT=FILE.png`` also saves the queue page there and the
held operation's timeline as ``FILE-timeline.png`` (``make console-screenshot``
writes docs/console.png and docs/console-timeline.png).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from consumers.reader import current_states, read_topic
from consumers.reconciler import open_items
from ledger.contracts import PAYMENT_GATEWAY, EffectContract
from ledger.credentials import add_person
from ledger.events import Approval, Disposition
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, trust
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness, settings_env

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HELD = "notify:1842:v1"
DONE = ["refund:1842:v1", "refund:1843:v1"]
OPERATOR = "alex"
REVIEWER = ReviewerKey.generate("reviewer-console")


def _browser_missing() -> str | None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (Path(p).exists() or shutil.which(p))]
    return (
        f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        if missing
        else None
    )


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Chromium through chromedriver (skipped, or failed under CI, without it)."""
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("LEDGER_REQUIRE_BROWSER") == "1":
            pytest.fail(f"the console's browser test needs a browser: {missing}", pytrace=False)
        pytest.skip(f"no browser for the console test: {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,860",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Any, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # polling a condition read from Kafka


def _approve(pub: LedgerPublisher, op: str) -> None:
    pub.publish_approval(
        REVIEWER.sign(
            Approval(
                approval_id=f"ap-{op}",
                reviewer="reviewer-console",
                policy_version=1,
                expires_at_ms=10_000_000,
                scope_subject="customer-1842",
                scope_max_amount_minor=9000,
                scope_operation_id=op,
                granted_at_ms=0,
            ),
            ledger_id=pub.settings.ledger_identity,
        )
    )


def _publish(pub: LedgerPublisher, op: str, amount: int) -> None:
    refund = op.startswith("refund:")
    pub.publish(
        operation_id=op,
        sink="payments" if refund else "mailer",
        action="refund" if refund else "send_email",
        params={"account": "acct-1842", "amount_minor": amount, "currency": "GBP"}
        if refund
        else {"to": "customer-1842", "amount_minor": 0},
        actor="fee-remediation-service",
        subject="customer-1842",
        purpose="fee-remediation",
        decision_version=1,
        approval_id=f"ap-{op}",
    )


@pytest.fixture
def ledger(ledger_settings: LedgerSettings) -> Iterator[Harness]:
    """Two refunds verified and a notification held in UNKNOWN_OUTCOME, the stages running."""
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    harness.start_sink("mailer", EffectContract(), hang_s=2 * settings.sink_timeout_s)
    pub = LedgerPublisher(settings)
    try:
        trust(settings.trusted_keys_path(), REVIEWER)
        pub.credentials.add(REVIEWER)
        add_person(settings, "operator", OPERATOR)  # as `ledger operator add alex`
        with harness.sinks["mailer"].client() as client:
            client.arm_fault(HELD, "timeout_after_commit")
        for n, op in enumerate([*DONE, HELD]):
            _approve(pub, op)
            _publish(pub, op, 2500 + 500 * n)
        harness.start_all()

        def settled() -> bool:
            states = current_states(settings)
            return getattr(states.get(HELD), "state", None) == S.UNKNOWN_OUTCOME and all(
                getattr(states.get(op), "state", None) == S.OUTCOME_VERIFIED for op in DONE
            )

        _wait("two refunds verified and one held", settled)
        harness.advance(42)  # the held item has an age on the ledger clock
        yield harness
    finally:
        pub.close()
        harness.stop()


@pytest.fixture
def console(ledger: Harness) -> Iterator[str]:
    """``ledger console`` as its own process on a free loopback port; its base URL."""
    port = _free_port()
    log = open(ledger.run_dir / "logs" / "console.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledger.cli", "console", "--port", str(port)],
        env=settings_env(ledger.settings),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"the console exited: {ledger.log_tail()}"
        try:
            return httpx.get(f"{base}/stages", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait("the console to answer", up, 60)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)
        log.close()


def test_an_operator_disposes_a_held_operation_in_the_browser(
    ledger: Harness, console: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    wait = WebDriverWait(browser, 60, poll_frequency=0.2)
    held_row = (By.CSS_SELECTOR, f'#queue tr[data-operation="{HELD}"]')

    # Every operation is listed; the search finds one by a piece of its ID.
    browser.get(f"{console}/operations")
    wait.until(ec.presence_of_element_located((By.ID, "operations")))
    listed = {a.text for a in browser.find_elements(By.CSS_SELECTOR, "#operations td a")}
    assert listed == {*DONE, HELD}
    search = browser.find_element(By.NAME, "q")
    search.send_keys("notify")
    search.submit()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#operations tbody tr")) == 1)
    assert browser.find_element(By.CSS_SELECTOR, "#operations td a").text == HELD

    # The queue holds it, with its age on the ledger clock.
    browser.find_element(By.ID, "nav-queue").click()
    row = wait.until(ec.presence_of_element_located(held_row))
    assert "mailer" in row.text and "42 s" in row.text
    shot = os.environ.get("LEDGER_CONSOLE_SCREENSHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(shot), f"no screenshot written to {shot}"

    # Its timeline: the operation's history, in UNKNOWN_OUTCOME, the five answers on top.
    row.find_element(By.LINK_TEXT, HELD).click()
    wait.until(ec.title_contains(HELD))
    assert "UNKNOWN_OUTCOME" in browser.find_element(By.TAG_NAME, "h1").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#answers dt")) == 5
    kinds = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#timeline td:nth-child(4)")]
    # The approval it rests on may come first (granted before the intent).
    assert kinds.index("Intent") < kinds.index("Dispatch") and "Disposition" not in kinds
    if shot:
        timeline_shot = Path(shot).with_name(f"{Path(shot).stem}-timeline.png")
        assert browser.save_screenshot(str(timeline_shot)), f"no screenshot written to {shot}"
    browser.back()

    # Dispose it with the form: committed, signed by alex, with evidence.
    row = wait.until(ec.presence_of_element_located(held_row))
    Select(row.find_element(By.NAME, "decision")).select_by_value("committed")
    Select(row.find_element(By.NAME, "by")).select_by_value(OPERATOR)
    row.find_element(By.NAME, "evidence").send_keys("gateway settlement file lists the refund")
    row.find_element(By.CSS_SELECTOR, "form.dispose button[type=submit]").click()

    def gone(driver: Any) -> bool:
        if driver.find_elements(*held_row):
            driver.refresh()
            return False
        return True

    wait.until(gone)
    said = browser.find_element(By.ID, "done").text
    assert said.startswith("APPLIED") and HELD in said and "UNKNOWN_OUTCOME ->" in said

    # The ledger holds the operator's disposition and has released the operation.
    settings = ledger.settings
    assert [st.operation_id for st in open_items(settings)] == []
    assert current_states(settings)[HELD].state != S.UNKNOWN_OUTCOME
    dispositions = [
        r.event for r in read_topic(settings, "dispositions") if isinstance(r.event, Disposition)
    ]
    assert [(d.operation_id, d.decision, d.by) for d in dispositions] == [
        (HELD, "COMMITTED", OPERATOR)
    ]
    assert ledger.effects("mailer", HELD) == 1

    # Its timeline now ends with the disposition.
    browser.get(f"{console}/operations")
    wait.until(ec.presence_of_element_located((By.LINK_TEXT, HELD))).click()
    wait.until(ec.title_contains(HELD))
    kinds = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#timeline td:nth-child(4)")]
    assert "Disposition" in kinds

    # The audit, run from its page: clean, nothing held any more.
    browser.find_element(By.ID, "nav-audit").click()
    wait.until(ec.presence_of_element_located((By.ID, "run-audit"))).click()
    result = wait.until(ec.presence_of_element_located((By.ID, "audit-result"))).text
    assert result.startswith("CLEAN") and "sink readback" in result
    assert "3 operation(s)" in browser.find_element(By.ID, "audit-facts").text
    assert browser.find_elements(By.ID, "offsets")  # the topic offsets it covered
    assert not browser.find_elements(By.CSS_SELECTOR, "#open-items td")

    # Stage health: each stage's consumer group has its member; no metrics endpoint here.
    browser.find_element(By.ID, "nav-stages").click()
    wait.until(ec.presence_of_element_located((By.ID, "stages")))
    assert browser.find_elements(By.ID, "no-metrics")
    groups = {
        cells[0].text: cells[4].text
        for tr in browser.find_elements(By.CSS_SELECTOR, "#stages tbody tr")
        if (cells := tr.find_elements(By.TAG_NAME, "td"))[1].text == "consumer group"
    }
    prefix = settings.topic_prefix
    assert set(groups) == {f"{prefix}.{c}" for c in ("processor", "authority", "relay")}
    assert all("1 member(s)" in detail for detail in groups.values()), groups
