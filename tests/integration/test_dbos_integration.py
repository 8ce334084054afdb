"""A DBOS workflow killed at every step resumes into the same operations (real DBOS, real broker).

The workflow (``tests/integration/dbos_workflow.py``: evidence, refund,
notify) runs in a process of its own with DBOS on a SQLite file, as a
service host holding only the outcome public key. The process is SIGKILLed
at each point in turn -- inside the evidence step, and for each ledger step
before the ledger call, after the publish, after the answer but before DBOS
recorded the step -- and launched again on the same database, so that DBOS
recovers the workflow. At the end the workflow has completed, each sink
holds exactly one effect for its operation, and the ledger dispatched each
operation once although its intent was published again on resume. A
second workflow, whose refund nobody approved, gets ``NeedsReauthorisation``
as a value and branches on it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from consumers.reader import read_topic
from ledger.contracts import PAYMENT_GATEWAY
from ledger.events import Dispatch, Intent
from ledger.settings import LedgerSettings
from ledger.signing import trust
from producers.integrations.dbos_steps import operation_id_for
from producers.publisher import LedgerPublisher, build_intent
from producers.review import grant_for
from testbed.harness import Harness, settings_env
from tests.helpers import PROJECT_ROOT
from tests.integration import dbos_workflow as script
from tests.integration.test_outcome_channel import service_settings
from tests.integration.test_stages import REVIEWER, of_operation

pytestmark = pytest.mark.integration

#: Where the workflow process dies, in order: one run per point, then one that completes.
CRASH_POINTS = [
    "evidence",
    "refund:before",
    "refund:published",
    "refund:answered",
    "notify:before",
    "notify:published",
    "notify:answered",
]

#: Longest one workflow process may run (seconds).
RUN_TIMEOUT_S = 60.0


def approve_operations(settings: LedgerSettings, workflow_id: str, case_id: str) -> list[str]:
    """Publish a grant bound to each ledger step's operation (as a review system would).

    Returns:
        The operation IDs, in the workflow's order.
    """
    trust(settings.trusted_keys_path(), REVIEWER)
    reviewer = LedgerPublisher(settings)
    reviewer.credentials.add(REVIEWER)
    operations = []
    try:
        for name, request in script.requests(case_id, script.evidence_of(case_id)).items():
            intent = build_intent(
                operation_id=operation_id_for(workflow_id, name),
                actor=script.ACTOR,
                decision_version=1,
                **request,
            )
            reviewer.publish_approval(
                grant_for(
                    REVIEWER,
                    intent,
                    approval_id=request["approval_id"],
                    expires_at_ms=3_600_000,
                    granted_at_ms=0,
                    policy_version=1,
                    ledger_id=settings.ledger_identity,
                )
            )
            operations.append(intent.operation_id)
    finally:
        reviewer.close()
    return operations


def run_workflow(
    service: LedgerSettings, tmp_path: Path, workflow_id: str, case_id: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """One process of the workflow script (``args``: ``--start``, ``--crash-at POINT``)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.dbos_workflow",
            "--db",
            str(tmp_path / "dbos.sqlite"),
            "--workflow-id",
            workflow_id,
            "--case-id",
            case_id,
            "--markers",
            str(tmp_path / "markers"),
            *args,
        ],
        cwd=PROJECT_ROOT,
        env=settings_env(service),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def test_a_workflow_killed_at_every_step_resumes_into_the_same_operations(
    ledger_settings: LedgerSettings, tmp_path: Path
) -> None:
    settings = ledger_settings
    harness = Harness(settings, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    harness.start_sink("mail", PAYMENT_GATEWAY, hang_s=1.0)
    service = service_settings(settings, tmp_path)
    (tmp_path / "markers").mkdir()
    workflow_id, case_id = "remediation-7", "7"
    try:
        refund_op, notify_op = approve_operations(settings, workflow_id, case_id)
        harness.start_all()
        for n, point in enumerate(CRASH_POINTS):
            crash = ("--start",) * (n == 0) + ("--crash-at", point)
            died = run_workflow(service, tmp_path, workflow_id, case_id, *crash)
            assert died.returncode == -signal.SIGKILL, (point, died.stdout, died.stderr[-3000:])
            assert (tmp_path / "markers" / point).exists(), f"the run did not reach {point}"
        done = run_workflow(service, tmp_path, workflow_id, case_id)
        assert done.returncode == 0, (done.stdout, done.stderr[-3000:], harness.log_tail(10))
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])

        assert report["result"]["refund"] == "Verified", report
        assert report["result"]["notify"] == "Verified", report
        assert report["steps"] == ["gather_evidence", "ledger:refund", "ledger:notify"], report
        # One effect per operation at the sinks themselves ...
        assert harness.effects("payments", refund_op) == 1
        assert harness.effects("mail", notify_op) == 1
        assert report["result"]["refund_effect"]
        # ... although each intent was published again by the resumed workflow
        # (after the publish and after the answer), and dispatched once.
        for op in (refund_op, notify_op):
            published = [
                r.event
                for r in read_topic(settings, "intents")
                if isinstance(r.event, Intent) and r.event.operation_id == op
            ]
            assert len(published) >= 3, (op, len(published))
            assert {i.parameter_digest for i in published} == {published[0].parameter_digest}
            dispatched = of_operation(settings, op, "dispatches", Dispatch)
            assert [d.kind for d in dispatched] == ["EXECUTE"], (op, dispatched)

        # A workflow whose refund nobody approved gets NeedsReauthorisation as
        # a value, branches on it (no notice), and nothing is paid.
        other = run_workflow(service, tmp_path, "remediation-8", "8", "--start")
        assert other.returncode == 0, (other.stdout, other.stderr[-3000:])
        refused = json.loads(other.stdout.strip().splitlines()[-1])
        assert refused["result"]["refund"] == "NeedsReauthorisation", refused
        assert refused["result"]["approval_id"] == "review-refund-8", refused
        assert refused["steps"] == ["gather_evidence", "ledger:refund"], refused
        assert harness.effects("payments", operation_id_for("remediation-8", "refund")) == 0
        assert not harness.failed(), harness.log_tail(20)
    finally:
        harness.stop()
