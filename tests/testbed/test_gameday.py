"""Game-day scenarios through ``ledger gameday run``'s runner, on the real broker.

Runs the public scenarios (``../shared/scenarios``, beside the checkout) and
the project's own (``tests/testbed/scenarios``), each in its own ledger with real
stage processes and real SIGKILLs.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from consumers.reader import read_topic
from ledger.events import Dispatch, EffectReceipt, Intent, JournalEntry, Readback, decode_event
from ledger.settings import LedgerSettings
from sinks.registry import load_sinks
from testbed.gameday import GameDay, check
from testbed.scenario import ScenarioError, load, parse
from tests.helpers import PROJECT_ROOT

pytestmark = pytest.mark.integration

PUBLIC = Path(os.environ.get("LEDGER_SCENARIOS_DIR", PROJECT_ROOT.parent / "shared" / "scenarios"))
OWN = PROJECT_ROOT / "tests" / "testbed" / "scenarios"
FILES = sorted(PUBLIC.glob("*.json")) + sorted([*OWN.glob("*.json"), *OWN.glob("*.yaml")])

#: Public scenarios written for later issues: each still runs, and is expected to
#: fail until the issue named lands (then the mark goes, or pytest shows XPASS).
AWAITING: dict[str, str] = {}

#: The project's own scenarios that expect what the ledger should do and does
#: not yet: each still runs, its report says what differs (by file stem).
OWN_AWAITING: dict[str, str] = {
    "g43-kernel-clock-runs-ahead": (
        "on the manual ledger clock the kernel takes a two-hour jump ahead for the time "
        "(readings may be ten years ahead of the last) and, once the clock is put right, "
        "refuses the right reading as 7200 s behind (time never goes back, and there is no "
        "witness to confirm it): current approvals are refused as expired until the wrong "
        "time has passed"
    ),
}


def _marks(path: Path) -> list[pytest.MarkDecorator]:
    """A scenario's marks: ``xfail`` while it awaits a change (its reason says which)."""
    marks = []
    if path.parent == PUBLIC and path.stem in AWAITING:
        marks.append(pytest.mark.xfail(reason=AWAITING[path.stem], strict=False))
    if path.parent == OWN and path.stem in OWN_AWAITING:
        marks.append(pytest.mark.xfail(reason=OWN_AWAITING[path.stem], strict=False))
    return marks


PARAMS = [pytest.param(p, marks=_marks(p)) for p in FILES]


def test_scenario_folders_are_found() -> None:
    assert sorted(OWN.glob("*.json")), OWN
    if not PUBLIC.is_dir():
        pytest.skip(f"public scenarios not found at {PUBLIC} (set LEDGER_SCENARIOS_DIR)")
    assert sorted(PUBLIC.glob("*.json")), PUBLIC


def _receipts(game: GameDay) -> list[EffectReceipt]:
    return [
        r.event for r in read_topic(game.settings, "receipts") if isinstance(r.event, EffectReceipt)
    ]


def _stalled_owner_was_fenced(game: GameDay, report: dict[str, Any]) -> None:
    """The stalled relay held the dispatch, woke with the old token, and was refused.

    Evidence from the ledger (receipts, with their observers and tokens) and
    from the sink (its count of requests refused for a stale token), not logs.
    """
    receipts = _receipts(game)
    held = [r for r in receipts if r.observer == "relay-0" and r.status == "ATTEMPTED"]
    assert held, "relay-0 never marked the dispatch attempted: it did not stall holding it"
    old_token = max(r.fencing_token for r in held)
    committed = [r for r in receipts if r.status == "COMMITTED"]
    # The one effect was made by the instance that took over, under the claim's newer token ...
    assert committed, receipts
    assert {(r.observer, r.fencing_token > old_token) for r in committed} == {("relay-1", True)}
    # ... and the stalled owner's send with its old token reached the sink and was refused.
    assert report["totals"]["stale_rejections"] >= 1
    assert not [r for r in receipts if r.observer == "relay-0" and r.status == "COMMITTED"]
    stale = [r for r in receipts if r.status == "STALE_TOKEN"]
    assert all(r.observer == "relay-0" and r.fencing_token == old_token for r in stale), stale


def _rebalance_lost_and_doubled_nothing(game: GameDay, report: dict[str, Any]) -> None:
    """Every input was applied exactly once by the processor across its rebalances."""
    journal = [
        r.event for r in read_topic(game.settings, "journal") if isinstance(r.event, JournalEntry)
    ]
    positions = Counter((e.input_topic, e.input_partition, e.input_offset) for e in journal)
    assert journal and max(positions.values()) == 1, positions.most_common(3)
    intents = Counter(
        e.operation_id
        for e in journal
        if e.outcome == "APPLIED" and isinstance(decode_event(e.input_event), Intent)
    )
    wanted = set(game.scenario.expect.operations)
    assert set(intents) == wanted and set(intents.values()) == {1}, intents


def _reservation_journal(game: GameDay) -> list[tuple[str, str, str]]:
    """(receipt status, reservation end, journal reason) of each reservation receipt journaled."""
    out = []
    for r in read_topic(game.settings, "journal"):
        e = r.event
        if isinstance(e, JournalEntry) and e.kind == EffectReceipt.KIND:
            receipt = decode_event(e.input_event)
            assert isinstance(receipt, EffectReceipt)
            if receipt.reservation is not None:
                out.append((receipt.status, receipt.reservation, e.reason))
    return out


def _hold_expired_then_confirmed(game: GameDay, report: dict[str, Any]) -> None:
    """Both ends of the two holds are journaled: the sink's expiry, then the confirmation."""
    ends = _reservation_journal(game)
    assert [(status, end) for status, end, _ in ends] == [
        ("EXPIRED", "EXPIRED"),
        ("COMMITTED", "CONFIRMED"),
    ], ends
    assert "released the reservation hold by itself" in ends[0][2]
    assert "reservation confirmed" in ends[1][2]


def _cancelled_on_policy_then_confirmed(game: GameDay, report: dict[str, Any]) -> None:
    """The cancellation names the policy change; the reauthorised operation is confirmed."""
    ends = _reservation_journal(game)
    assert [(status, end) for status, end, _ in ends] == [
        ("CANCELLED", "CANCELLED"),
        ("COMMITTED", "CONFIRMED"),
    ], ends
    assert "policy version changed" in ends[0][2]


def _versions_travel_and_the_hold_names_them(game: GameDay, report: dict[str, Any]) -> None:
    """The dispatch carried contract version 1; the resume under version 2 was held, unsent.

    The hold's receipt names version 1, the version the effect was attempted
    under (nothing was sent under 2): after compaction it is the only receipt
    of the operation left, and the evidence a later resume is held on.
    """
    dispatches = [
        r.event for r in read_topic(game.settings, "dispatches") if isinstance(r.event, Dispatch)
    ]
    assert dispatches and {d.contract_version for d in dispatches} == {1}, dispatches
    versions = json.loads(dispatches[0].schema_versions_json or "{}")
    assert versions.get("Dispatch", 0) >= 3 and "EffectReceipt" in versions, versions
    receipts = _receipts(game)
    assert [r.contract_version for r in receipts if r.status == "ATTEMPTED"][:1] == [1], receipts
    held = [r for r in receipts if r.status == "AMBIGUOUS" and r.on_resume]
    assert held and held[-1].contract_version == 1, receipts
    assert "version 1" in held[-1].detail and "version 2" in held[-1].detail, held[-1].detail
    assert not [r for r in receipts if r.status == "COMMITTED" and r.on_resume]


def _adapter_of(game: GameDay, sink: str) -> str:
    return load_sinks(game.settings.sinks_path())[sink].adapter


def _lost_commit_answer_read_back_from_postgres(game: GameDay, report: dict[str, Any]) -> None:
    """The relay reached PostgreSQL through the wire fault: its answer lost, it read the
    row back (no second submit), and the database holds one credit."""
    assert _adapter_of(game, "payments") == "postgres"
    assert not game.harness.sinks  # no reference gateway ran
    readbacks = [
        r.event
        for r in read_topic(game.settings, "readbacks")
        if isinstance(r.event, Readback) and r.event.kind == "EFFECT"
    ]
    assert [(r.status, r.operation_id) for r in readbacks] == [("COMMITTED", "refund:s15:v1")]
    assert not [r for r in _receipts(game) if r.status == "COMMITTED"]  # its answer never came
    assert game.harness.real_sinks["payments"].effects() == {"refund:s15:v1": 1}


def _late_smtp_answer_held_and_not_sent_again(game: GameDay, report: dict[str, Any]) -> None:
    """The SMTP server took the message; its late answer made the send ambiguous, held."""
    assert _adapter_of(game, "mailer") == "smtp"
    statuses = [r.status for r in _receipts(game) if r.status != "ATTEMPTED"]
    assert statuses and set(statuses) == {"AMBIGUOUS"}, statuses
    assert game.harness.real_sinks["mailer"].effects() == {"notify:s16:v1": 1}


def _reset_then_replayed_under_the_same_key(game: GameDay, report: dict[str, Any]) -> None:
    """The reset left the send ambiguous; the resubmit under the same key was replayed."""
    assert _adapter_of(game, "payments") == "http-idempotency-key"
    committed = [r for r in _receipts(game) if r.status == "COMMITTED"]
    assert len(committed) == 1 and committed[0].on_resume, committed  # the resubmit's
    assert game.harness.real_sinks["payments"].effects() == {"refund:s17:v1": 1}


#: Evidence beyond a scenario's own expectations, checked after it ran (by file stem).
EVIDENCE: dict[str, Callable[[GameDay, dict[str, Any]], None]] = {
    "g19-stalled-owner-fenced": _stalled_owner_was_fenced,
    "g20-rebalance-mid-batch": _rebalance_lost_and_doubled_nothing,
    "g21-reservation-expires-then-confirmed": _hold_expired_then_confirmed,
    "g22-reservation-cancelled-on-policy-change-then-reauthorised": (
        _cancelled_on_policy_then_confirmed
    ),
    "u02-upgrade-hold-names-both-versions": _versions_travel_and_the_hold_names_them,
    # public ones: the real systems behind adapters (format 3)
    "s15-postgres-lost-response": _lost_commit_answer_read_back_from_postgres,
    "s16-smtp-ambiguous-send-held": _late_smtp_answer_held_and_not_sent_again,
    "s17-idempotency-key-api-reset-then-keyed-retry": _reset_then_replayed_under_the_same_key,
}


@pytest.mark.parametrize("path", PARAMS, ids=[p.stem for p in FILES])
def test_scenario_passes(path: Path, request: pytest.FixtureRequest) -> None:
    scenario = load(path)
    # A scenario that restarts its broker runs on this test process's own (private_broker).
    uses_broker_restart = any(s.kind == "broker_restart" for s in scenario.steps)
    ledger_settings: LedgerSettings = request.getfixturevalue(
        "private_ledger_settings" if uses_broker_restart else "ledger_settings"
    )
    lines: list[str] = []
    game = GameDay(scenario, ledger_settings, ledger_settings.run_dir, lines.append)
    report = game.run()
    assert report["passed"], json.dumps(report["failures"], indent=2) + "\n" + "\n".join(lines)
    # The report always carries every total and the audit result.
    assert set(report["totals"]) >= {"duplicate_effects", "unknown_outcomes_open"}
    audit_expected = scenario.expect.audit.violations if scenario.expect.audit else None
    if any(s.kind == "audit" for s in scenario.steps) and audit_expected is None:
        assert report["audit"]["violations"] == 0
    if path.stem in EVIDENCE:
        EVIDENCE[path.stem](game, report)


def test_expectations_can_fail() -> None:
    scenario = parse(
        {
            "name": "x",
            "steps": [{"run": {}}, {"claim": {"operation_id": "op", "worker": "w"}}],
            "expect": {
                "operations": {"op": {"state": "OUTCOME_VERIFIED", "effects": {"max": 0}}},
                "totals": {"duplicate_effects": 0, "stale_rejections": {"min": 1}},
            },
        }
    )
    observed = {
        "operations": {"op": {"state": "EFFECT_COMMITTED", "effects": 2, "reason": ""}},
        "claims": [],
        "totals": {"duplicate_effects": 1, "stale_rejections": 0},
        "audit": {"violations": None},
    }
    paths = {f["path"] for f in check(scenario, observed)}
    assert paths == {
        "operations.op.state",
        "operations.op.effects",
        "totals.duplicate_effects",
        "totals.stale_rejections",
    }


def test_format_2_expectations_can_fail() -> None:
    scenario = parse(
        {
            "name": "v2",
            "format": 2,
            "steps": [
                {"forge": {"record": "admission", "operation_id": "op"}},
                {"forge": {"record": "tombstone", "topic": "approval-uses", "approval_id": "a"}},
            ],
            "expect": {
                "operations": {
                    "op": {
                        "operating_events": {"UNAUTHENTICATED": 1},
                        "reason_contains": "CURRENCY",
                    }
                },
                "totals": {
                    "forgeries_refused": {"min": 2},
                    "operating_events_by_kind": {"BAD_INPUT": 0, "UNAUTHENTICATED": {"min": 2}},
                },
                "audit": {"violations": 0, "unauthenticated_records": 2},
            },
        }
    )
    observed = {
        "operations": {
            "op": {
                "state": "NEEDS_REAUTHORISATION",
                "effects": 0,
                "reason": "out of scope: currency EUR",
                "operating_events": {},
            }
        },
        "claims": [],
        "totals": {
            "forgeries_refused": 1,
            "operating_events_by_kind": {"BAD_INPUT": 1, "UNAUTHENTICATED": 1},
        },
        "audit": {"violations": 0, "unauthenticated_records": 1},
    }
    paths = {f["path"] for f in check(scenario, observed)}
    # reason_contains is case-insensitive: "CURRENCY" matches "currency".
    assert paths == {
        "operations.op.operating_events.UNAUTHENTICATED",
        "totals.forgeries_refused",
        "totals.operating_events_by_kind.BAD_INPUT",
        "totals.operating_events_by_kind.UNAUTHENTICATED",
        "audit.unauthenticated_records",
    }


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["steps"][0]["approve"].update(colour="red"), "unknown key 'colour'"),
        (lambda d: d["expect"]["totals"].update(dupes=1), "unknown key 'expect.totals.dupes'"),
        (lambda d: d["steps"].append({"explode": {}}), "unknown step 'explode'"),
        (lambda d: d["steps"].append({"run": {}, "audit": {}}), "exactly one key"),
        (lambda d: d["steps"][0]["approve"].pop("reviewer"), "missing key 'reviewer'"),
        (lambda d: d.update(mode="yolo"), "mode"),
        (lambda d: d["sinks"]["payments"]["contract"].update(idempotent="yes"), "idempotent"),
        (lambda d: d.update(steps=[]), "non-empty list"),
        (
            lambda d: d["expect"]["operations"]["refund:rev:v1"].update(state="DONE"),
            "expect.operations.refund:rev:v1.state",
        ),
        (
            lambda d: d["expect"]["operations"].update({"refund:typo:v1": {"effects": 0}}),
            "'refund:typo:v1' is not named by any step",
        ),
        (
            lambda d: d["steps"].append({"fault": {"seam": "somewhere"}}),
            "steps[9].fault: seam",
        ),
        (
            lambda d: d["steps"].append(
                {"sink_fault": {"sink": "nope", "operation_id": "o", "mode": "reject"}}
            ),
            "sink 'nope' is not declared",
        ),
        (lambda d: d["steps"].append({"forge": {"record": "tombstone"}}), "needs 'topic'"),
        (lambda d: d["steps"].append({"forge": {"record": "admission"}}), "needs 'operation_id'"),
        (lambda d: d["steps"].append({"forge": {"record": "rumour"}}), "steps[9].forge: record"),
        (
            lambda d: d["steps"].append(
                {"upgrade": {"sink": "payments", "contract": {}, "contract_version": 0}}
            ),
            "steps[9].upgrade",
        ),
        (
            lambda d: d["steps"].append({"upgrade": {"sink": "nope", "contract": {}}}),
            "sink 'nope' is not declared",
        ),
        (
            lambda d: d["steps"][0]["approve"].update(policy_version=0),
            "steps[0].approve: policy_version: Input should be greater than or equal to 1",
        ),
        (
            lambda d: d["steps"].append({"policy": {"version": -1}}),
            "steps[9].policy: version: Input should be greater than or equal to 1",
        ),
        (lambda d: d.update(policy_version=0), "policy_version"),
        (
            lambda d: d["steps"].append({"pause": {"component": "sink"}}),
            "steps[9].pause: component",
        ),
        (
            lambda d: d["steps"].append(
                {"pause": {"component": "relay", "seam": "before_admission"}}
            ),
            "needs both 'seam' and 'operation_id'",
        ),
        (
            lambda d: d["steps"].append({"resume": {"component": "relay", "instance": -1}}),
            "steps[9].resume: instance",
        ),
        (
            lambda d: d["steps"].append({"scale": {"component": "relay", "instances": 0}}),
            "steps[9].scale: instances",
        ),
        (lambda d: d["steps"].append({"scale": {"component": "relay"}}), "missing key 'instances'"),
        (lambda d: d.update(format=4), "format"),
        (
            lambda d: d["steps"][0]["approve"]["scope"].update(colour="red"),
            "unknown key 'scope.colour'",
        ),
        (
            lambda d: d["steps"][0]["approve"]["scope"].update(currency=826),
            "scope.currency",
        ),
    ],
)
def test_malformed_scenarios_name_the_bad_key(mutate, message, tmp_path: Path) -> None:
    base = json.loads((OWN / "g01-revoked-before-admission.json").read_text())
    base["steps"] = base["steps"] * 1
    while len(base["steps"]) < 9:
        base["steps"].append({"run": {}})
    mutate(base)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(base))
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(path)


def test_format_2_scope_fields_reach_the_approval() -> None:
    scenario = load(PUBLIC / "s11-scope-currency.json") if PUBLIC.is_dir() else None
    if scenario is None:
        pytest.skip(f"public scenarios not found at {PUBLIC}")
    assert scenario.format == 2
    scope = scenario.steps[0].args.scope
    assert (scope.currency, scope.account, scope.action) == ("GBP", None, None)


def test_yaml_scenarios_are_read(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: y\nsteps:\n  - run: {}\n  - advance: {seconds: 5}\n")
    scenario = load(path)
    assert [s.kind for s in scenario.steps] == ["run", "advance"]


def test_format_2_pause_resume_scale_parse() -> None:
    scenario = parse(
        {
            "name": "v2-processes",
            "format": 2,
            "steps": [
                {"run": {}},
                {"pause": {"component": "relay"}},
                {
                    "pause": {
                        "component": "relay",
                        "instance": 1,
                        "seam": "after_dispatch_before_send",
                        "operation_id": "op",
                    }
                },
                {"resume": {"component": "relay"}},
                {"scale": {"component": "processor", "instances": 3}},
            ],
        }
    )
    kinds = [(s.kind, s.args.model_dump(exclude_none=True)) for s in scenario.steps[1:]]
    assert kinds == [
        ("pause", {"component": "relay", "instance": 0}),
        (
            "pause",
            {
                "component": "relay",
                "instance": 1,
                "seam": "after_dispatch_before_send",
                "operation_id": "op",
            },
        ),
        ("resume", {"component": "relay", "instance": 0}),
        ("scale", {"component": "processor", "instances": 3}),
    ]


def test_reservation_expectations_can_fail() -> None:
    scenario = parse(
        {
            "name": "x",
            "format": 2,
            "steps": [{"claim": {"operation_id": f"op:{n}:v1", "worker": "w"}} for n in (1, 2, 3)],
            "expect": {
                "operations": {
                    "op:1:v1": {"reservation": "released"},
                    "op:2:v1": {"reservation": None},
                    "op:3:v1": {},
                },
                "totals": {"reservations_released": 1},
            },
        }
    )
    observed = {
        "operations": {
            "op:1:v1": {"reservation": "held"},
            "op:2:v1": {"reservation": "confirmed"},
            "op:3:v1": {"reservation": "held"},
        },
        "claims": [],
        "totals": {"reservations_released": 0},
        "audit": {},
    }
    paths = {f["path"] for f in check(scenario, observed)}
    # op:3 names no reservation expectation: its hold is not checked.
    assert paths == {
        "operations.op:1:v1.reservation",
        "operations.op:2:v1.reservation",
        "totals.reservations_released",
    }


def test_recovery_receipt_expectation_checks_fields_and_absence() -> None:
    scenario = parse(
        {
            "name": "rr",
            "format": 2,
            "steps": [{"claim": {"operation_id": o, "worker": "w"}} for o in "abcd"],
            "expect": {
                "operations": {
                    "a": {"recovery_receipt": {"action": "complete", "checkpoint_version": 3}},
                    "b": {"recovery_receipt": {"claimant": "processor"}},
                    "c": {"recovery_receipt": None},
                    "d": {"state": "OUTCOME_VERIFIED"},
                }
            },
        }
    )
    receipt = {"action": "COMPLETE", "checkpoint_version": 4, "claimant": "relay-0"}
    observed = {
        "operations": {
            "a": {"recovery_receipt": receipt},
            "b": {"recovery_receipt": None},
            "c": {"recovery_receipt": receipt},
            "d": {"state": "OUTCOME_VERIFIED", "recovery_receipt": receipt},
        },
        "claims": [],
        "totals": {},
        "audit": {"violations": 0},
    }
    paths = {f["path"] for f in check(scenario, observed)}
    assert paths == {
        "operations.a.recovery_receipt.checkpoint_version",
        "operations.b.recovery_receipt",
        "operations.c.recovery_receipt",
    }
    observed["operations"]["a"]["recovery_receipt"] = {**receipt, "checkpoint_version": 3}
    assert "operations.a.recovery_receipt.checkpoint_version" not in {
        f["path"] for f in check(scenario, observed)
    }


def test_recovery_receipt_expectation_refuses_unknown_fields() -> None:
    with pytest.raises(ScenarioError, match="recovery_receipt names unknown field"):
        parse(
            {
                "name": "rr",
                "steps": [{"claim": {"operation_id": "a", "worker": "w"}}],
                "expect": {"operations": {"a": {"recovery_receipt": {"colour": "red"}}}},
            }
        )


def test_format_3_steps_parse() -> None:
    scenario = parse(
        {
            "name": "v3-steps",
            "format": 3,
            "steps": [
                {"wait": {"seconds": 25}},
                {"offsets_reset": {"component": "relay", "to": "deleted"}},
                {"topic_config": {"topic": "journal", "config": {"retention.ms": 3600000}}},
                {"skew": {"component": "authority", "seconds": -90.5}},
            ],
        }
    )
    assert [(s.kind, s.args.model_dump()) for s in scenario.steps] == [
        ("wait", {"seconds": 25}),
        ("offsets_reset", {"component": "relay", "to": "deleted"}),
        ("topic_config", {"topic": "journal", "config": {"retention.ms": 3600000}}),
        ("skew", {"component": "authority", "seconds": -90.5}),
    ]


@pytest.mark.parametrize(
    "step, message",
    [
        ({"wait": {"seconds": -1}}, "steps[0].wait: seconds"),
        ({"wait": {"seconds": 3600}}, "steps[0].wait: seconds"),
        ({"offsets_reset": {"component": "relay", "to": "middle"}}, "steps[0].offsets_reset: to"),
        ({"offsets_reset": {"component": "sink", "to": "latest"}}, "offsets_reset: component"),
        ({"offsets_reset": {"component": "relay"}}, "missing key 'to'"),
        ({"topic_config": {"topic": "ledger.journal", "config": {"a": 1}}}, "not a ledger topic"),
        ({"topic_config": {"topic": "journal", "config": {}}}, "topic_config: config"),
        ({"topic_config": {"topic": "journal", "config": {"a": [1]}}}, "topic_config: config"),
        ({"skew": {"component": "relay"}}, "missing key 'seconds'"),
        ({"skew": {"component": "relay", "seconds": 1, "by": "x"}}, "unknown key 'by'"),
    ],
)
def test_malformed_format_3_steps_name_the_bad_key(step: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse({"name": "bad", "format": 3, "steps": [step]})


@pytest.mark.parametrize("kind", ["wait", "offsets_reset", "topic_config", "skew"])
def test_format_3_steps_need_format_3(kind: str) -> None:
    args = {
        "wait": {"seconds": 1},
        "offsets_reset": {"component": "relay", "to": "latest"},
        "topic_config": {"topic": "journal", "config": {"retention.ms": 1}},
        "skew": {"component": "relay", "seconds": 1},
    }[kind]
    with pytest.raises(ScenarioError, match=f"step '{kind}' needs \"format\": 3"):
        parse({"name": "old", "format": 2, "steps": [{kind: args}]})


def test_topic_layout_problems_count_as_audit_violations() -> None:
    """A scenario can expect the audit to name an unsafe topic layout (g42): the default
    check of a clean audit steps aside when the scenario names the violations it expects."""
    scenario = load(OWN / "g42-retention-on-audited-topic.yaml")
    assert scenario.expect.audit is not None
    observed = {
        "operations": {},
        "claims": [],
        "totals": {},
        "audit": {"violations": 0, "unauthenticated_records": 0},
    }
    assert [f["path"] for f in check(scenario, observed) if f["path"].startswith("audit")] == [
        "audit.violations"
    ]
