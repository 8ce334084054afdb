"""A small DBOS workflow (evidence, refund, notify) whose effects go through the ledger.

Run by ``test_dbos_integration.py`` as its own process, which it SIGKILLs at
the point named by ``--crash-at`` (a test-only hook of this script; the
product has none)::

    python -m tests.integration.dbos_workflow --db dbos.sqlite --workflow-id remediation-7 \\
        --case-id 7 --markers markers/ --start --crash-at refund:published

Points: ``evidence`` (inside the evidence step, before DBOS records it) and,
for each ledger step ``refund`` and ``notify``: ``<step>:before`` (before
the ledger is called), ``<step>:published`` (the intent is acknowledged,
the outcome not yet awaited), ``<step>:answered`` (the outcome is in, DBOS
has not recorded the step). The process writes ``markers/<point>`` just
before it kills itself. Without ``--start`` it only launches DBOS, which
recovers the pending workflow, and waits for the workflow's result.

Settings come from ``LEDGER_*`` (a service host's: the outcome public key
only). On completion it prints one JSON object: the workflow's result and
the names of its recorded steps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from ledger.events import Intent
from ledger.settings import LedgerSettings
from producers.integrations.dbos_steps import LedgerSteps
from producers.publisher import LedgerPublisher, PublishedIntent
from producers.sdk import LedgerService, Outcome, Verified

ACTOR = "svc-remediation"
PURPOSE = "fee-remediation"

#: Where this process dies (``--crash-at``) and where it says so first (``--markers``).
CRASH: dict[str, str] = {}


def crash_point(point: str) -> None:
    """Die here (SIGKILL, no clean-up) if this run was told to, after writing the marker."""
    if CRASH.get("at") != point:
        return
    Path(CRASH["markers"], point).write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def evidence_of(case_id: str) -> dict[str, Any]:
    """What the evidence step finds for a case (deterministic: the test binds approvals to it)."""
    return {"account": f"acct-{case_id}", "amount_minor": 4200, "currency": "GBP"}


def requests(case_id: str, evidence: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The ledger steps' arguments by step name, derived from the case and its evidence."""
    return {
        "refund": {
            "sink": "payments",
            "action": "refund",
            "params": dict(evidence),
            "subject": f"customer-{case_id}",
            "purpose": PURPOSE,
            "approval_id": f"review-refund-{case_id}",
        },
        "notify": {
            "sink": "mail",
            "action": "notify",
            "params": {"account": evidence["account"], "amount_minor": 0, "template": "refunded"},
            "subject": f"customer-{case_id}",
            "purpose": PURPOSE,
            "approval_id": f"review-notify-{case_id}",
        },
    }


class CrashingPublisher(LedgerPublisher):
    """A publisher that can die right after the broker acknowledged an intent."""

    def publish_intent(self, intent: Intent, **kwargs: Any) -> Any:
        published: PublishedIntent | None = super().publish_intent(intent, **kwargs)
        crash_point(intent.operation_id.split(":", 1)[0] + ":published")
        return published


class CrashingService(LedgerService):
    """A service that can die before the ledger call or after its answer."""

    def perform(self, **kwargs: Any) -> Outcome:
        name = str(kwargs["operation_id"]).split(":", 1)[0]
        crash_point(f"{name}:before")
        outcome = super().perform(**kwargs)
        crash_point(f"{name}:answered")
        return outcome


STEPS: dict[str, LedgerSteps] = {}


@DBOS.step()
def gather_evidence(case_id: str) -> dict[str, Any]:
    found = evidence_of(case_id)
    crash_point("evidence")
    return found


@DBOS.workflow()
def remediate(case_id: str) -> dict[str, Any]:
    steps = STEPS["ledger"]
    evidence = gather_evidence(case_id)
    asked = requests(case_id, evidence)
    refund = steps.perform("refund", **asked["refund"])
    if not isinstance(refund, Verified):
        return {
            "refund": type(refund).__name__,
            "reason": getattr(refund, "reason", ""),
            "approval_id": getattr(refund, "approval_id", None),
        }
    notice = steps.perform("notify", **asked["notify"])
    return {
        "refund": type(refund).__name__,
        "refund_effect": refund.effect_id,
        "notify": type(notice).__name__,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True, help="the SQLite system database file")
    parser.add_argument("--workflow-id", required=True)
    parser.add_argument("--case-id", required=True)
    parser.add_argument("--markers", required=True, help="folder for the crash markers")
    parser.add_argument("--crash-at", default="", help="where to die (see the module docstring)")
    parser.add_argument("--start", action="store_true", help="start the workflow (first run)")
    args = parser.parse_args()
    CRASH.update(at=args.crash_at, markers=args.markers)

    settings = LedgerSettings()
    service = CrashingService(settings, actor=ACTOR, publisher=CrashingPublisher(settings))
    STEPS["ledger"] = LedgerSteps(service, wait_s=20.0, settle_s=60.0)
    DBOS(
        config={
            "name": "ledger-dbos-test",
            "system_database_url": f"sqlite:///{args.db}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()  # recovers this executor's pending workflows
    if args.start:
        with SetWorkflowID(args.workflow_id):
            handle = DBOS.start_workflow(remediate, args.case_id)
    else:
        handle = DBOS.retrieve_workflow(args.workflow_id)
    result = handle.get_result(polling_interval_sec=0.05)
    steps = [s["function_name"] for s in DBOS.list_workflow_steps(args.workflow_id)]
    print(json.dumps({"result": result, "steps": steps}), flush=True)
    service.close()
    DBOS.destroy(workflow_completion_timeout_sec=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
