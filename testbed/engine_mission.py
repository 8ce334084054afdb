"""The fee-remediation mission on a real engine: LangGraph, a SQLite checkpointer, SIGKILLs.

Each case is a LangGraph graph (one thread per case): ``evidence`` ->
``eligibility`` -> ``review`` (a reviewer's interrupt at or above
:data:`REVIEW_THRESHOLD_MINOR`) -> ``refund`` -> ``notify``. A worker
*process* runs a window of cases at once (one thread each), its checkpoints in
a SQLite file (LangGraph's ``SqliteSaver``, durability ``sync``). Every case
has one kill point (:data:`KILL_POINTS`, in turn): after a node, after a
reviewer's decision, or right after an effect call returned and before the
node's checkpoint is written. A case reaching its point stops there; when
every case of the window has stopped or finished, the worker says so and the
driver SIGKILLs it, restarts it, and the new worker resumes each case from
its own checkpoint (cases already finished are not run again).

Two modes run the same graph and kills:

* ``ledger``: ``refund`` and ``notify`` are performed through
  :class:`producers.sdk.LedgerService` with the LangGraph integration
  (:func:`producers.integrations.langgraph.perform_with_review`); the review
  publishes an operation-bound grant (:class:`~producers.integrations.langgraph.Reviewer`),
  below the threshold the policy engine's key grants it.
* ``control``: the same nodes call the reference sinks directly over HTTP,
  a fresh idempotency key per attempt, as a naive tool does.

The sinks count the effects; the report puts the modes side by side::

    python -m testbed.engine_mission --cases 1000

Simplification: the reviewers' keys are loaded in the worker process (the
review system would run elsewhere); no checkpoint holds a grant or a key.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

from ledger.clock import ManualClock
from ledger.contracts import PAYMENT_GATEWAY
from ledger.errors import LedgerError
from ledger.settings import LedgerSettings
from producers.publisher import build_intent

#: Refunds at or above this amount (minor units) are reviewed by a person.
REVIEW_THRESHOLD_MINOR = 10_000

#: Where a case's worker is killed, one point per case in turn.
KILL_POINTS: tuple[str, ...] = (
    "after:evidence",
    "after:eligibility",
    "grant:review",
    "after:review",
    "call:refund",
    "after:refund",
    "call:notify",
    "after:notify",
)

FEES_MINOR = (1_500, 3_500, 7_500, 12_000, 25_000)
PURPOSE = "fee-remediation"


def facts(case: int, seed: int = 7) -> dict[str, Any]:
    """The evidence of case ``case``: deterministic in ``(case, seed)``."""
    rng = random.Random(f"{seed}:{case}")
    return {
        "fee_minor": rng.choice(FEES_MINOR),
        "eligible": rng.random() >= 0.1,
        "account": f"acct-{case:05d}",
        "customer": f"cust-{case:05d}",
    }


def kill_point(case: int, seed: int = 7) -> str:
    """The kill point of ``case``: :data:`KILL_POINTS` in turn, or one its path reaches."""
    fact = facts(case, seed)
    if not fact["eligible"]:
        reachable: tuple[str, ...] = ("after:evidence", "after:eligibility")
    elif fact["fee_minor"] < REVIEW_THRESHOLD_MINOR:
        reachable = tuple(p for p in KILL_POINTS if p != "grant:review")
    else:
        reachable = KILL_POINTS
    point = KILL_POINTS[case % len(KILL_POINTS)]
    return point if point in reachable else reachable[case % len(reachable)]


def _merge(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> dict[str, Any]:
    return {**(old or {}), **(new or {})}


class Case(TypedDict, total=False):
    case_id: str
    case: int
    fee_minor: int
    eligible: bool
    account: str
    customer: str
    approval_id: str | None
    last: str
    ledger: Annotated[dict[str, dict[str, Any]], _merge]


#: Each mode's cases have operation IDs of their own (both modes share the sinks).
TAGS = {"ledger": "lg", "control": "ct"}


def refund_op(case_id: str) -> str:
    return f"refund:{case_id}:v1"


def notify_op(case_id: str) -> str:
    return f"notify:{case_id}:v1"


def case_id(mode: str, case: int) -> str:
    return f"{TAGS[mode]}{case:05d}"


def calls(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The two effects of a case, by node: sink, action, params, operation ID."""
    case = str(state["case_id"])
    return {
        "refund": {
            "operation_id": refund_op(case),
            "sink": "payments",
            "action": "refund",
            "params": {
                "account": state["account"],
                "amount_minor": state["fee_minor"],
                "currency": "GBP",
            },
        },
        "notify": {
            "operation_id": notify_op(case),
            "sink": "mailer",
            "action": "send_email",
            "params": {
                "to": state["customer"],
                "template": "fee-refund-confirmation",
                "refund_operation_id": refund_op(case),
            },
        },
    }


# ---------------------------------------------------------------------------- the worker


class Gates:
    """The kill points armed in this worker life: a case reaching its point stops there."""

    def __init__(self, armed: Mapping[int, str]) -> None:
        self.armed = dict(armed)
        self.reached: set[int] = set()
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    def at(self, case: int, point: str) -> None:
        """Stop the calling thread for good when ``point`` is ``case``'s armed point."""
        if self.armed.get(case) != point:
            return
        with self.changed:
            self.reached.add(case)
            self.changed.notify_all()
        threading.Event().wait()  # until the driver's SIGKILL


def say(kind: str, **fields: Any) -> None:
    """One line to the driver (stdout, flushed: it survives the SIGKILL that follows)."""
    sys.stdout.write(json.dumps({"kind": kind, **fields}) + "\n")
    sys.stdout.flush()


def build_graph(
    gates: Gates,
    effects: Callable[[str, dict[str, Any]], dict[str, Any]],
    review_request: Callable[[dict[str, Any]], dict[str, Any]],
) -> Any:
    """The case graph; ``effects(node, state)`` makes a node's effect and returns its record."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def step(name: str, body: Callable[[Case], dict[str, Any]]) -> Callable[[Case], dict[str, Any]]:
        def node(state: Case) -> dict[str, Any]:
            if state.get("last"):
                gates.at(int(state["case"]), f"after:{state['last']}")
            return {**body(state), "last": name}

        return node

    def evidence(state: Case) -> dict[str, Any]:
        return {**facts(int(state["case"])), "ledger": {}}

    def eligibility(state: Case) -> dict[str, Any]:
        return {}

    def review(state: Case) -> dict[str, Any]:
        if state["fee_minor"] < REVIEW_THRESHOLD_MINOR:
            return {"approval_id": None}
        decision = interrupt(review_request(dict(state)))
        return {"approval_id": decision.get("approval_id")}

    graph: Any = StateGraph(Case)
    graph.add_node("evidence", step("evidence", evidence))
    graph.add_node("eligibility", step("eligibility", eligibility))
    graph.add_node("review", step("review", review))
    graph.add_node("refund", step("refund", lambda s: {"ledger": effects("refund", dict(s))}))
    graph.add_node("notify", step("notify", lambda s: {"ledger": effects("notify", dict(s))}))
    graph.add_edge(START, "evidence")
    graph.add_edge("evidence", "eligibility")
    graph.add_conditional_edges(
        "eligibility", lambda s: "review" if s["eligible"] else END, ["review", END]
    )
    graph.add_edge("review", "refund")
    graph.add_edge("refund", "notify")
    graph.add_edge("notify", END)
    return graph


class LedgerEffects:
    """``ledger`` mode: effects through the ledger, reviews as operation-bound grants."""

    def __init__(self, life: Mapping[str, Any], gates: Gates) -> None:
        from ledger.signing import ReviewerKey
        from producers.integrations.langgraph import Reviewer
        from producers.publisher import LedgerPublisher
        from producers.sdk import LedgerService

        stages = LedgerSettings.model_validate_json(life["stages"])
        service = LedgerSettings.model_validate_json(life["service"])
        self.gates = gates
        self.service = LedgerService(service, actor="svc-remediation")
        self.desk = LedgerPublisher(stages)
        clock = ManualClock(stages.run_dir / "clock")
        self.person = Reviewer(
            self.desk,
            ReviewerKey.from_file(Path(life["reviewer_key"])),
            valid_for_s=86_400,
            now_ms=clock.now_ms,
        )
        self.policy = Reviewer(
            self.desk,
            ReviewerKey.from_file(Path(life["policy_key"])),
            valid_for_s=86_400,
            now_ms=clock.now_ms,
        )

    def call(self, node: str, state: dict[str, Any]) -> Any:
        from producers.integrations.langgraph import LedgerCall

        spec = calls(state)[node]
        return LedgerCall(subject=state["customer"], purpose=PURPOSE, **spec)

    def review_request(self, state: dict[str, Any]) -> dict[str, Any]:
        from producers.integrations.langgraph import review_request
        from producers.sdk import NeedsReauthorisation

        needs = NeedsReauthorisation(
            operation_id=refund_op(str(state["case_id"])),
            reason=f"a refund at or above {REVIEW_THRESHOLD_MINOR} minor units is reviewed",
            approval_id=None,
            policy_version=None,
            remedy="a reviewer's grant for it",
        )
        return review_request(self.call("refund", state), self.service.actor, needs, 0)

    def effects(self, node: str, state: dict[str, Any]) -> dict[str, Any]:
        from producers.integrations.langgraph import perform_with_review
        from producers.sdk import NeedsReauthorisation, Pending

        case, given, gates, service = (
            int(state["case"]),
            state.get("approval_id"),
            self.gates,
            self.service,
        )

        class Performer:
            actor = service.actor

            def perform(self, **kw: Any) -> Any:
                if kw.get("approval_id") is None and node == "refund":
                    kw["approval_id"] = given  # the review's grant, by reference
                outcome = service.perform(**kw)
                if not isinstance(outcome, Pending | NeedsReauthorisation):
                    gates.at(case, f"call:{node}")
                return outcome

        record = perform_with_review(Performer(), self.call(node, state), wait_s=60.0)
        return {record["operation_id"]: record}

    def answer(self, case: int, request: Mapping[str, Any]) -> dict[str, Any]:
        """A reviewer's decision for an interrupt: a person above the threshold, else policy."""
        if request.get("refused_approval_id"):
            say(
                "reauthorisation",
                case=case,
                operation_id=request["operation_id"],
                reason=request.get("reason"),
            )
        person = int(request.get("amount_minor") or 0) >= REVIEW_THRESHOLD_MINOR
        return (self.person if person else self.policy).approve(request)

    def close(self) -> None:
        self.service.close()
        self.desk.close()


class DirectEffects:
    """``control`` mode: the nodes call the sinks directly, a fresh key per attempt."""

    def __init__(self, life: Mapping[str, Any], gates: Gates) -> None:
        from sinks.client import SinkClient

        self.gates = gates
        self.clients = {
            name: SinkClient(s["url"], timeout_s=2.0, token=s["token"])
            for name, s in life["sinks"].items()
        }

    def review_request(self, state: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "fee-review", "case": state["case"], "amount_minor": state["fee_minor"]}

    def effects(self, node: str, state: dict[str, Any]) -> dict[str, Any]:
        spec = calls(state)[node]
        intent = build_intent(
            actor="svc-remediation",
            subject=state["customer"],
            purpose=PURPOSE,
            decision_version=1,
            **spec,
        )
        result = self.clients[spec["sink"]].submit(
            spec["operation_id"],
            intent.parameter_digest,
            spec["params"],
            1,
            f"attempt-{uuid.uuid4().hex[:8]}",
            True,
            action=spec["action"],
            subject=state["customer"],
            purpose=PURPOSE,
            decision_version=1,
            idempotency_key=f"{spec['operation_id']}:{uuid.uuid4().hex[:8]}",
        )
        self.gates.at(int(state["case"]), f"call:{node}")
        return {
            spec["operation_id"]: {
                "operation_id": spec["operation_id"],
                "outcome": result.status.upper(),
            }
        }

    def answer(self, case: int, request: Mapping[str, Any]) -> dict[str, Any]:
        return {"approved": True, "approval_id": None, "reviewer": "reviewer-alex"}

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def run_case(app: Any, side: Any, gates: Gates, mode: str, case: int) -> None:
    """Run (or resume) one case's thread to its end, answering its interrupts."""
    from langgraph.types import Command

    config = {"configurable": {"thread_id": case_id(mode, case)}}
    for _ in range(50):
        snap = app.get_state(config)
        try:
            if snap.created_at is None:
                start = {"case_id": case_id(mode, case), "case": case}
                app.invoke(start, config, durability="sync")
            elif snap.interrupts:
                decision = side.answer(case, snap.interrupts[0].value)
                gates.at(case, "grant:review")
                app.invoke(Command(resume=decision), config, durability="sync")
            elif snap.next:
                app.invoke(None, config, durability="sync")
            else:
                gates.at(case, f"after:{snap.values.get('last')}")
                say("done", case=case, ledger=snap.values.get("ledger") or {})
                return
        except LedgerError as exc:  # pending or delivery unknown: perform the same again
            if not exc.retryable:
                raise
    raise LedgerError(f"case {case} did not finish in 50 rounds")


def worker(life_path: Path) -> int:
    """One worker life: run the life's cases until each finished or stopped at its kill point."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    life = json.loads(life_path.read_text())
    gates = Gates({int(c): p for c, p in life["armed"].items()})
    side: Any = (LedgerEffects if life["mode"] == "ledger" else DirectEffects)(life, gates)
    saver = SqliteSaver(sqlite3.connect(life["checkpoints"], check_same_thread=False))
    app = build_graph(gates, side.effects, side.review_request).compile(checkpointer=saver)
    cases = [int(c) for c in life["cases"]]
    pool = ThreadPoolExecutor(max_workers=max(1, len(cases)))
    futures = [pool.submit(run_case, app, side, gates, life["mode"], c) for c in cases]
    with gates.changed:
        while True:
            stopped, finished = len(gates.reached), sum(f.done() for f in futures)
            if stopped + finished >= len(cases):
                break
            gates.changed.wait(0.05)
    failed = [f.exception() for f in futures if f.done() and f.exception() is not None]
    for exc in failed:
        say("error", error=repr(exc))
    if gates.reached:
        say("kill", cases=sorted(gates.reached))
        threading.Event().wait()  # the driver's SIGKILL ends this life
    side.close()
    os._exit(1 if failed else 0)


# ---------------------------------------------------------------------------- the driver


def drive(
    mode: str, cases: int, window: int, work: Path, life_base: dict[str, Any], env: dict[str, str]
) -> dict[str, Any]:
    """Run ``cases`` cases in ``mode`` with one SIGKILL per case; returns the worker's tallies."""
    plan = {c: kill_point(c) for c in range(cases)}
    todo, open_ = list(range(cases)), list[int]()
    done: dict[int, dict[str, Any]] = {}
    fired: dict[str, int] = {}
    killed: set[int] = set()
    reauth, lives, errors = 0, 0, []
    while len(done) < cases:
        open_ = [c for c in open_ if c not in done]
        while len(open_) < window and todo:
            open_.append(todo.pop(0))
        life = {
            **life_base,
            "mode": mode,
            "cases": open_,
            "armed": {str(c): plan[c] for c in open_ if c not in killed},
            "checkpoints": str(work / f"{mode}-checkpoints.sqlite"),
        }
        path = work / f"{mode}-life.json"
        path.write_text(json.dumps(life))
        lives += 1
        proc = subprocess.Popen(
            [sys.executable, "-m", "testbed.engine_mission", "--worker", str(path)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if msg["kind"] == "done":
                done[msg["case"]] = msg["ledger"]
            elif msg["kind"] == "reauthorisation":
                reauth += 1
            elif msg["kind"] == "error":
                errors.append(msg["error"])
            elif msg["kind"] == "kill":
                os.kill(proc.pid, signal.SIGKILL)
                for c in msg["cases"]:
                    killed.add(c)
                    fired[plan[c]] = fired.get(plan[c], 0) + 1
                break
        proc.wait()
        print(
            f"{mode}: {len(done)}/{cases} cases finished, {len(killed)} killed, {lives} lives",
            file=sys.stderr,
            flush=True,
        )
        if len(errors) > 20 or (proc.returncode not in (0, -signal.SIGKILL)):
            raise LedgerError(f"the {mode} worker failed (exit {proc.returncode}): {errors[-3:]}")
    outcomes: dict[str, int] = {}
    for records in done.values():
        for record in records.values():
            outcomes[record["outcome"]] = outcomes.get(record["outcome"], 0) + 1
    return {
        "lives": lives,
        "kills": sum(fired.values()),
        "kills_by_point": fired,
        "reauthorisations": reauth,
        "outcomes": outcomes,
        "errors": errors,
        "held": outcomes.get("HELD", 0),
        "finished": len(done),
    }


def at_sinks(counts: Mapping[str, Mapping[str, int]], mode: str, cases: int) -> dict[str, Any]:
    """Effects the sinks hold for the mode's operations, and the duplicates among them."""
    per = [
        counts[sink].get(op(case_id(mode, c)), 0)
        for c in range(cases)
        for sink, op in (("payments", refund_op), ("mailer", notify_op))
    ]
    return {
        "effects": sum(per),
        "operations_with_duplicates": sum(1 for n in per if n > 1),
        "extra_effects": sum(n - 1 for n in per if n > 1),
    }


@contextmanager
def mission_ledger(
    settings: LedgerSettings, work: Path, modes: list[str], create: bool = True
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """The stages (ledger mode), the two reference sinks, and what a worker needs to reach them."""
    from ledger.signing import ReviewerKey, trust
    from testbed.harness import Harness
    from testbed.mission.plan import MAILER

    harness = Harness(settings, create=create)
    try:
        payments = harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
        mailer = harness.start_sink("mailer", MAILER, hang_s=1.0)
        base: dict[str, Any] = {
            "sinks": {s.name: {"url": s.url, "token": s.token} for s in (payments, mailer)}
        }
        if "ledger" in modes:
            for role, key_id in (
                ("reviewer_key", "reviewer-alex"),
                ("policy_key", "policy-engine"),
            ):
                key = ReviewerKey.generate(key_id)
                key.save(work / f"{key_id}.key")
                trust(settings.trusted_keys_path(), key)
                base[role] = str(work / f"{key_id}.key")
            service = settings.model_copy(
                update={
                    "run_dir": work / "service-host",
                    "keys_dir": None,
                    "outcome_public_key_file": settings.outcome_public_path(),
                }
            )
            base.update(stages=settings.model_dump_json(), service=service.model_dump_json())
            harness.start_all()
        yield harness, base
    finally:
        harness.stop()


def run_mission(
    settings: LedgerSettings,
    cases: int,
    window: int = 25,
    modes: tuple[str, ...] = ("ledger", "control"),
    work: Path | None = None,
    create: bool = True,
) -> dict[str, Any]:
    """Both modes over ``cases`` cases on one ledger; the side-by-side report (JSON object)."""
    work = work or Path(tempfile.mkdtemp(prefix="engine-mission-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    report: dict[str, Any] = {
        "engine": "langgraph",
        "checkpointer": "SqliteSaver (one file per mode)",
        "cases": cases,
        "window": window,
        "kill_points": list(KILL_POINTS),
    }
    with mission_ledger(settings, work, list(modes), create) as (harness, base):
        for mode in modes:
            started = time.monotonic()
            (work / mode).mkdir(exist_ok=True)
            report[mode] = drive(mode, cases, window, work / mode, base, env)
            report[mode]["seconds"] = round(time.monotonic() - started, 1)
        counts = {}
        for name in ("payments", "mailer"):
            with harness.sinks[name].client() as client:
                counts[name] = client.effects()
    for mode in modes:
        report[mode]["at_sinks"] = at_sinks(counts, mode, cases)
    rows: tuple[tuple[str, Callable[[dict[str, Any]], int]], ...] = (
        ("cases finished", lambda r: r["finished"]),
        ("worker kills (SIGKILL)", lambda r: r["kills"]),
        ("effects at the sinks", lambda r: r["at_sinks"]["effects"]),
        (
            "operations with a duplicate effect",
            lambda r: r["at_sinks"]["operations_with_duplicates"],
        ),
        (
            "duplicate effects (extra, counted by the sinks)",
            lambda r: r["at_sinks"]["extra_effects"],
        ),
        ("reauthorisations", lambda r: r["reauthorisations"]),
        ("unknown outcomes held", lambda r: r["held"]),
        (
            "unknown answers not held (retried blindly)",
            lambda r: r["outcomes"].get("AMBIGUOUS", 0),
        ),
    )
    report["side_by_side"] = {
        name: {mode: pick(report[mode]) for mode in modes} for name, pick in rows
    }
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.engine_mission --cases N``: run both modes, print the JSON report.

    Exits 0 when the ledger mode shows no duplicate effect and the control shows some.
    """
    parser = argparse.ArgumentParser(prog="python -m testbed.engine_mission")
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--window", type=int, default=25, help="cases per worker life")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker(args.worker)
    from ledger.cli.common import current_settings
    from testbed.broker import running_broker

    base = current_settings()
    base = base.model_copy(
        update={
            "topic_prefix": f"engine-{uuid.uuid4().hex[:8]}",
            "clock": "manual",
            "testbed": True,
            "run_dir": Path(tempfile.mkdtemp(prefix="engine-mission-")) / "run",
        }
    )
    with running_broker(base, lambda line: print(line, file=sys.stderr)) as settings:
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        report = run_mission(
            settings, args.cases, args.window, work=settings.run_dir.parent / "work"
        )
    print(json.dumps(report, indent=2))
    ok = (
        report["ledger"]["at_sinks"]["extra_effects"]
        == 0
        < report["control"]["at_sinks"]["extra_effects"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
