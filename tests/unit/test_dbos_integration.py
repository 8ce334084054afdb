"""producers.integrations.dbos_steps: a DBOS step that performs one operation through the ledger.

DBOS runs for real (SQLite in a temporary folder, no Kafka); the ledger
service is a fake that records what it was asked and answers from a script.
The step derives the operation ID from the workflow, returns final outcomes
as values (performed once), performs again while the answer is not final,
and DBOS records the outcome under the step's name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID

from ledger.errors import DeliveryUnknownError, LedgerError
from producers.integrations.dbos_steps import LedgerSteps, operation_id_for
from producers.sdk import Held, NeedsReauthorisation, Outcome, Pending, Refused, Verified

OP = "refund:wf-{n}:v1"
REQUEST: dict[str, Any] = {
    "sink": "payments",
    "action": "refund",
    "params": {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"},
    "subject": "customer-1",
    "purpose": "fee-remediation",
    "approval_id": "review-1",
}


class FakeService:
    """Answers each perform with the next scripted answer (an outcome or an error to raise)."""

    actor = "svc-test"

    def __init__(self, *answers: Outcome | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    def perform(self, **kwargs: Any) -> Outcome:
        self.calls.append(kwargs)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


#: The steps the workflows below use (set by each test before it starts one).
CURRENT: dict[str, LedgerSteps] = {}


@DBOS.workflow()
def refund_workflow(params: Mapping[str, Any]) -> Outcome:
    return CURRENT["steps"].perform("refund", **{**REQUEST, "params": dict(params)})


@DBOS.step()
def nested_step() -> Outcome:
    return CURRENT["steps"].perform("refund", **REQUEST)


@DBOS.workflow()
def nested_workflow() -> Outcome:
    return nested_step()


@DBOS.workflow()
def reauthorising_workflow() -> Outcome:
    """The docs' pattern: on NeedsReauthorisation wait for a new approval's ID, perform again."""
    steps = CURRENT["steps"]
    outcome = steps.perform("refund", **REQUEST)
    if isinstance(outcome, NeedsReauthorisation):
        approval_id = DBOS.recv("approval", timeout_seconds=30)
        if approval_id is None:
            return outcome
        outcome = steps.perform("refund", **{**REQUEST, "approval_id": approval_id})
    return outcome


@pytest.fixture(scope="module")
def dbos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    db = tmp_path_factory.mktemp("dbos") / "system.sqlite"
    DBOS(
        config={
            "name": "ledger-steps-unit",
            "system_database_url": f"sqlite:///{db}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    yield
    DBOS.destroy(workflow_completion_timeout_sec=0)


def run(workflow_id: str, service: FakeService, **options: float) -> Outcome:
    """Run ``refund_workflow`` under ``workflow_id`` with ``service``; its result."""
    CURRENT["steps"] = LedgerSteps(service, **options)
    with SetWorkflowID(workflow_id):
        result: Outcome = refund_workflow(REQUEST["params"])
    return result


def verified(op: str) -> Verified:
    return Verified(op, "payments-1", "payments GET: VERIFIED", 1, "verified")


def test_the_operation_id_is_the_step_name_the_workflow_and_the_decision_version() -> None:
    assert operation_id_for("remediation-1842", "refund") == "refund:remediation-1842:v1"
    assert operation_id_for("remediation-1842", "notify-2", 3) == "notify-2:remediation-1842:v3"


@pytest.mark.parametrize(
    ("workflow_id", "name", "says"),
    [
        ("wf-1", "", "non-empty name"),
        ("wf-1", "refund:2", "without ':'"),
        ("case 1842", "refund", "printable ASCII"),
        ("x" * 300, "refund", "at most 200"),
    ],
)
def test_a_name_or_workflow_id_outside_the_grammar_is_refused_with_the_remedy(
    workflow_id: str, name: str, says: str
) -> None:
    with pytest.raises(LedgerError) as caught:
        operation_id_for(workflow_id, name)
    assert says in caught.value.message


def test_a_verified_outcome_is_what_the_step_returns_and_dbos_records(dbos: None) -> None:
    op = OP.format(n=1)
    service = FakeService(verified(op))
    assert run("wf-1", service) == verified(op)
    assert [c["operation_id"] for c in service.calls] == [op]
    assert service.calls[0]["approval_id"] == "review-1"
    assert service.calls[0]["params"] == REQUEST["params"]
    steps = DBOS.list_workflow_steps("wf-1")
    assert [(s["function_name"], s["output"]) for s in steps] == [("ledger:refund", verified(op))]


@pytest.mark.parametrize(
    "answer",
    [
        NeedsReauthorisation(OP.format(n=2), "approval expired", "review-1", 1, "approve again"),
        Held(OP.format(n=2), "reconciliation", "a readback", "timed out", None),
        Refused(OP.format(n=2), "UNKNOWN_SINK", "no sink payments", "register the sink"),
    ],
    ids=lambda a: type(a).__name__,
)
def test_other_final_outcomes_are_values_performed_once(dbos: None, answer: Outcome) -> None:
    workflow_id = f"wf-2-{type(answer).__name__}"
    service = FakeService(answer, verified(answer.operation_id))
    assert run(workflow_id, service) == answer
    assert len(service.calls) == 1  # not retried blindly


def test_an_answer_not_final_yet_is_performed_again_under_the_same_operation(dbos: None) -> None:
    op = OP.format(n=3)
    service = FakeService(
        Pending(op, "ADMITTED", "the wait ran out"),
        DeliveryUnknownError("not acknowledged in time", operation_id=op),
        verified(op),
    )
    assert run("wf-3", service, wait_s=5.0) == verified(op)
    assert [c["operation_id"] for c in service.calls] == [op, op, op]
    assert all(c["wait_s"] <= 5.0 for c in service.calls)


def test_past_settle_s_the_step_returns_pending_and_says_why(dbos: None) -> None:
    op = OP.format(n=4)
    service = FakeService(DeliveryUnknownError("not acknowledged in time", operation_id=op))
    result = run("wf-4", service, settle_s=0.0)
    assert isinstance(result, Pending) and result.operation_id == op
    assert "delivery is unknown" in result.reason and "perform the same" in result.reason
    assert len(service.calls) == 1


def test_a_workflow_started_again_replays_the_recorded_outcome(dbos: None) -> None:
    op = OP.format(n=5)
    service = FakeService(verified(op))
    first = run("wf-5", service)
    again = run("wf-5", FakeService(RuntimeError("the ledger must not be asked again")))
    assert again == first and len(service.calls) == 1


def test_a_new_approval_sent_to_the_workflow_performs_the_same_operation_again(
    dbos: None,
) -> None:
    op = OP.format(n=7)
    service = FakeService(
        NeedsReauthorisation(op, "approval expired", "review-1", 1, "approve again"), verified(op)
    )
    CURRENT["steps"] = LedgerSteps(service)
    with SetWorkflowID("wf-7"):
        handle = DBOS.start_workflow(reauthorising_workflow)
    DBOS.send("wf-7", "review-2", topic="approval")
    assert handle.get_result(polling_interval_sec=0.05) == verified(op)
    assert [(c["operation_id"], c["approval_id"]) for c in service.calls] == [
        (op, "review-1"),
        (op, "review-2"),
    ]
    names = [s["function_name"] for s in DBOS.list_workflow_steps("wf-7")]
    assert names[0] == "ledger:refund" and names[-1] == "ledger:refund", names


def test_outside_a_workflow_or_inside_a_step_it_refuses_with_the_remedy(dbos: None) -> None:
    steps = LedgerSteps(FakeService(verified("x")))
    with pytest.raises(LedgerError, match=r"@DBOS\.workflow\(\)"):
        steps.perform("refund", **REQUEST)
    CURRENT["steps"] = steps
    with SetWorkflowID("wf-6"), pytest.raises(LedgerError, match="inside a DBOS step"):
        nested_workflow()


def test_importing_producers_does_not_import_dbos() -> None:
    import subprocess
    import sys

    probe = "import sys, producers, producers.sdk; print('dbos' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_docs_workflow_compiles_and_imports_what_exists() -> None:
    import ast
    import re

    from tests.helpers import PROJECT_ROOT

    page = (PROJECT_ROOT / "docs" / "use-from-dbos.md").read_text()
    example = re.findall(r"```python\n(.*?)```", page, re.S)[0]
    tree = ast.parse(example)
    imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert imports
    exec(compile(ast.Module(body=imports, type_ignores=[]), "docs", "exec"), {})
    assert "steps.perform(" in example and "LedgerSteps(" in example
