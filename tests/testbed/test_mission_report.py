"""Assembly of the mission report from constructed facts (pure: no broker).

Held operations named with their state, sink, reason and age; effects per
sink (a refund and its notification are not a duplicate); every kill, zombie
pause, broker restart and broker fault on the timeline, on the timeline's
clock; readback latency as a distribution.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from ledger.audit import AuditReport
from ledger.events import JournalEntry, OperationState
from ledger.fold import decide, journal_entry, replay
from testbed.mission.answers import (
    effects_by_sink,
    fault_marks,
    held_operations,
    latency_distribution,
)
from testbed.mission.html import compare_html, mission_html
from testbed.mission.plan import Case, MissionOptions, OpFaults
from testbed.mission.report import JournalRow, MissionFacts, build, compare_text, render_text
from tests.helpers import admission, intent, receipt

T0 = 1_800_000_000.0  # the mission's start (Unix seconds)


def _journal(*events: tuple[Any, float]) -> list[JournalRow]:
    """Journal rows for one operation's events, each with its Kafka timestamp (Unix s)."""
    state = None
    rows = []
    for offset, (event, at) in enumerate(events):
        decision = decide(state, event, f"in:0:{offset}")
        entry: JournalEntry = journal_entry(decision, event, event.to_bytes(), "in", 0, offset)
        rows.append(JournalRow.of(entry, at))
        state = decision.state or state
    return rows


def _facts(**changes: Any) -> MissionFacts:
    """Two cases: case 0 refunded (and notified), case 1's refund held in UNKNOWN_OUTCOME."""
    cases = [Case(n, f"customer-{n}", f"acct-{n}", 5000, 50, False, False) for n in range(2)]
    done, held = cases[0].refund_op, cases[1].refund_op
    i0, i1 = intent(done), intent(held)
    journal = _journal(
        (i0, T0 + 1.0), (admission(i0), T0 + 1.1), (receipt(done, f"{done}#1.1"), T0 + 2.0)
    ) + _journal(
        (i1, T0 + 3.0),
        (admission(i1), T0 + 3.1),
        (receipt(held, f"{held}#1.1", status="AMBIGUOUS"), T0 + 30.0),
    )
    states: dict[str, OperationState] = dict(replay(r.entry for r in journal))
    notify = cases[0].notify_op
    states[notify] = states[done].model_copy(
        update={"operation_id": notify, "sink": "mailer", "state": "EFFECT_COMMITTED"}
    )
    facts: dict[str, Any] = {
        "options": MissionOptions(cases=2, seed=1),
        "ledger": "mission-test",
        "started_at": "2027-01-15T08:00:00+00:00",
        "wall_s": 120.0,
        "peak_rss_mb": 100.0,
        "driver_peak_rss_mb": 50.0,
        "cases": cases,
        "outcomes": {0: "refunded and notified", 1: "refund held (unknown outcome)"},
        "eligibility_evaluations": 2,
        "states": states,
        "effects": {"payments": {done: 1, held: 0}, "mailer": {notify: 1}},
        "sink_stats": {},
        "journal": journal,
        "fired": [
            {
                "at": T0 + 12.5,
                "seam": "after_sink_commit_before_receipt",
                "operation_id": held,
                "process": "relay --instance 0",
                "action": "kill",
            }
        ],
        "armed": [],
        "chaos_kills": {"processor": 1},
        "zombie_pauses": {"relay": 1},
        "restarts": 2,
        "broker_restarts": 1,
        "broker_restart_note": "",
        "races": [],
        "nudge_claims": [],
        "stale_dispatches": [],
        "reauth_reasons": {},
        "reconciled": [],
        "timeline": [{"t_s": float(t), "states": {"EFFECT_PENDING": 1}} for t in range(0, 100, 5)],
        "audit_before": AuditReport(),
        "audit_after": AuditReport(),
        "policy_changed_at": 1,
        "stage_errors": {},
        "kafka_fenced": {},
        "t0_unix": T0,
        "as_of_unix": T0 + 100.0,
        "fault_events": [
            {"kind": "chaos kill", "at": T0 + 5.0, "end": None, "target": "processor-0"},
            {"kind": "zombie pause", "at": T0 + 20.0, "end": T0 + 33.0, "target": "relay-1"},
            {"kind": "broker restart", "at": T0 + 40.0, "end": T0 + 48.5, "target": "broker"},
        ],
        "failovers": [
            {"kind": "leader-kill", "target": "node 2", "start": T0 + 60.0, "end": T0 + 71.0},
            {"kind": "partition", "target": "", "start": 0.0, "end": None, "note": "skipped"},
        ],
    }
    facts.update(changes)
    return MissionFacts(**facts)


def test_the_report_names_each_held_operation_with_its_age_on_one_clock() -> None:
    report = build(_facts())
    assert report["held_operations"] == [
        {
            "operation_id": "refund:00001:v1",
            "case": 1,
            "state": "UNKNOWN_OUTCOME",
            "sink": "payments",
            "reason": "outcome unknown: payments: ambiguous",
            "since_s": 30.0,  # the receipt that made it unknown, on the Kafka clock
            "age_s": 70.0,  # held until the states were read, 100 s after the start
        }
    ]
    text = render_text(report)
    assert "held operations: 1" in text
    assert re.search(r"refund:00001:v1\s+UNKNOWN_OUTCOME\s+payments\s+held\s+70.0 s", text)


def test_an_age_is_never_negative_and_an_unjournaled_hold_has_no_age() -> None:
    facts = _facts()
    held = held_operations(facts.states, facts.journal, {"refund:00001:v1": 1}, T0 + 10.0, T0)
    assert held[0]["age_s"] == 0.0  # read before the receipt's timestamp: clamped, not negative
    held = held_operations(facts.states, [], {"refund:00001:v1": 1}, T0 + 100.0, T0)
    assert held[0]["since_s"] is None and held[0]["age_s"] is None
    # operations that are not the mission's are not listed
    assert held_operations(facts.states, facts.journal, {}, T0 + 100.0, T0) == []


def test_effects_are_counted_per_sink_so_a_refund_and_its_notice_are_not_a_duplicate() -> None:
    report = build(_facts())
    assert "effects_per_case" not in report
    payments, mailer = report["effects_by_sink"]["payments"], report["effects_by_sink"]["mailer"]
    assert payments == {
        "consequence": "irreversible",
        "operations": 2,
        "effects": 1,
        "cases": 1,
        "duplicates": 0,
        "extra_effects": 0,
        "by_effects": {"0": 1, "1": 1},
    }
    assert (mailer["effects"], mailer["cases"], mailer["duplicates"]) == (1, 1, 0)
    # case 0 has two effects in all, one per sink: no duplicate anywhere
    assert next(m for m in report["measures"] if m["name"] == "duplicate effects")["count"] == 0
    # a second refund of case 0 is a duplicate at the payment gateway, and only there
    twice = build(_facts(effects={"payments": {"refund:00000:v1": 2}, "mailer": {}}))
    assert twice["effects_by_sink"]["payments"]["duplicates"] == 1
    assert twice["effects_by_sink"]["payments"]["extra_effects"] == 1
    assert twice["effects_by_sink"]["mailer"]["effects"] == 0
    assert "payments" in render_text(twice) and "duplicates" in render_text(twice)
    side_by_side = compare_text([build(_facts()), twice])
    assert re.search(r"payments: effects / cases with a duplicate\s+1 / 0\s+2 / 1", side_by_side)
    assert re.search(r"held operations\s+1\s+1", side_by_side)


def test_effects_by_sink_counts_cases_without_an_effect() -> None:
    got = effects_by_sink({"s": ["a", "b", "c"]}, {"s": "irreversible"}, {"s": {"a": 3}})
    assert got["s"]["by_effects"] == {"0": 2, "3": 1}
    assert (got["s"]["effects"], got["s"]["duplicates"], got["s"]["extra_effects"]) == (3, 1, 2)


def test_every_fault_is_marked_on_the_timeline_in_seconds_since_the_start() -> None:
    marks = build(_facts())["timeline_events"]
    assert [(m["t_s"], m["end_s"], m["kind"], m["target"]) for m in marks] == [
        (5.0, None, "chaos kill", "processor-0"),
        (12.5, None, "seam kill", "relay-0"),
        (20.0, 33.0, "zombie pause", "relay-1"),
        (40.0, 48.5, "broker restart", "broker"),
        (60.0, 71.0, "broker fault", "node 2"),  # the skipped partition never started
    ]
    assert marks[1]["detail"] == "after_sink_commit_before_receipt on refund:00001:v1"
    assert marks[4]["detail"] == "leader-kill"
    text = render_text(build(_facts()))
    assert re.search(r"20.0 -> 33.0\s+zombie pause\s+relay-1", text)


def test_a_pause_hook_and_a_failed_broker_fault_are_marked_as_such() -> None:
    marks = fault_marks(
        [{"at": T0 + 1, "seam": "s", "operation_id": "o", "process": "p", "action": "pause"}],
        [],
        [{"kind": "full-restart", "start": T0 + 2, "end": None, "error": "TimeoutError: x"}],
        T0,
    )
    assert [m["kind"] for m in marks] == ["seam pause", "broker fault"]
    assert marks[1]["end_s"] is None and marks[1]["detail"] == "full-restart: TimeoutError: x"


def test_readback_latency_is_a_distribution_with_buckets_and_p90() -> None:
    dist = latency_distribution([10.0, 50.0, 60.0, 700.0, 40_000.0] + [200.0] * 5)
    assert (dist["count"], dist["p50"], dist["p90"], dist["p99"], dist["max"]) == (
        10,
        200.0,
        700.0,
        40_000.0,
        40_000.0,
    )
    counts = {b["up_to_ms"]: b["count"] for b in dist["buckets"]}
    assert counts[50] == 2 and counts[100] == 1 and counts[250] == 5 and counts[1000] == 1
    assert counts[None] == 1  # past the last bound
    assert sum(counts.values()) == 10
    empty = latency_distribution([])
    assert empty["p90"] is None and all(b["count"] == 0 for b in empty["buckets"])


def test_the_page_shows_held_operations_sinks_and_fault_marks() -> None:
    report = build(_facts())
    page = mission_html(report)
    held = page[page.index('id="held"') : page.index('id="effects"')]
    assert "<code>refund:00001:v1</code>" in held and "outcome unknown: payments: ambiguous" in held
    assert '<td class="num">70</td>' in held
    effects = page[page.index('id="effects"') : page.index('id="timeline"')]
    assert "<code>payments</code>" in effects and "<code>mailer</code>" in effects
    assert "cases with a duplicate" in effects
    timeline = page[page.index('id="timeline"') : page.index('id="faults-on-the-timeline"')]
    for legend in ("chaos kill (1)", "seam kill (1)", "zombie pause (1)", "broker restart (1)"):
        assert legend in timeline  # the plot's legend (SVG text)
    table = page[page.index('id="faults-on-the-timeline"') : page.index("<h2>Faults injected")]
    assert table.count("<tr>") == 1 + 5 and "leader-kill" in table
    compare = compare_html([report, report])
    assert "held operations" in compare and "<code>payments</code> effects" in compare


def _side_facts(*, reversal: str | None, upgrade: bool = True) -> MissionFacts:
    """Case 2 has a goodwill credit, its refund was refused, and it booked a callback.

    ``reversal``: the final state of the credit's compensation, or ``None``
    when none was published.
    """
    base = _facts()
    credit_case = Case(
        2, "customer-2", "acct-2", 5000, 50, False, False, goodwill=OpFaults(), callback=OpFaults()
    )
    states = dict(base.states)
    template = states["refund:00000:v1"]

    def state(op: str, sink: str, st: str, **more: Any) -> OperationState:
        return template.model_copy(update={"operation_id": op, "sink": sink, "state": st, **more})

    states[credit_case.refund_op] = state(credit_case.refund_op, "payments", "ABANDONED")
    states[credit_case.goodwill_op] = state(credit_case.goodwill_op, "credits", "OUTCOME_VERIFIED")
    states[credit_case.callback_op] = state(
        credit_case.callback_op, "callbacks", "EFFECT_COMMITTED"
    )
    if reversal is not None:
        states[credit_case.reversal_op] = state(
            credit_case.reversal_op, "credits", reversal, compensates=credit_case.goodwill_op
        )
    held = base.cases[1].refund_op
    return _facts(
        cases=[*base.cases, credit_case],
        outcomes={**base.outcomes, 2: "refund rejected by the gateway"},
        states=states,
        effects={
            **base.effects,
            "credits": {credit_case.goodwill_op: 1, credit_case.reversal_op: int(bool(reversal))},
            "callbacks": {credit_case.callback_op: 1},
        },
        sink_stats={"callbacks": {"reservations_released": 1}},
        upgrade=(
            {
                "at_case": 1,
                "from_version": 1,
                "to_version": 4,
                "in_flight": {held: "EFFECT_PENDING", "refund:00000:v1": "ADMITTED"},
            }
            if upgrade
            else None
        ),
        upgrade_holds=[
            {"operation_id": held, "reason": "payments contract 1 -> 4 does not resume it"},
            {"operation_id": held, "reason": "payments contract 1 -> 4 does not resume it"},
        ],
    )


def test_a_refused_refunds_credit_is_compensated_and_counted_by_class() -> None:
    report = build(_side_facts(reversal="OUTCOME_VERIFIED"))
    comp = report["compensations"]
    assert (comp["credits"], comp["refused_with_credit"], comp["due"]) == (1, 1, 1)
    assert (comp["published"], comp["reversed"], comp["missing"]) == (1, 1, [])
    failures = next(m for m in report["measures"] if m["name"] == "compensation failures")
    assert (failures["count"], failures["of"]) == (0, 1)
    assert failures["by_class"] == {"reversible-internal": [0, 1]}
    by_class = report["operations"]["by_class"]
    assert by_class["reversible-internal"]["OUTCOME_VERIFIED"] == 2  # credit and reversal
    # (the constructed facts fail other checks: their journal is partial)
    assert not any("compensat" in f for f in report["checks"]["failures"])
    text = render_text(report)
    assert "compensations (goodwill credits reversed" in text
    assert "Compensations" in mission_html(report)


def test_a_failed_or_missing_compensation_is_reported() -> None:
    failed = build(_side_facts(reversal="UNKNOWN_OUTCOME"))
    measure = next(m for m in failed["measures"] if m["name"] == "compensation failures")
    assert (measure["count"], measure["of"]) == (1, 1)
    assert failed["compensations"]["failures_by_state"] == {"UNKNOWN_OUTCOME": 1}
    missing = build(_side_facts(reversal=None))
    assert missing["compensations"]["missing"] == ["goodwill:00002:v1"]
    assert any("not compensated" in f for f in missing["checks"]["failures"])


def test_an_upgrade_hold_counts_when_it_moved_the_operation() -> None:
    facts = _side_facts(reversal="OUTCOME_VERIFIED")
    held = facts.cases[1].refund_op
    i1 = intent(held)
    why = (
        "nothing was sent; payments changed its contract from version 1 to version 4 while "
        "the operation was EFFECT_PENDING; release 2026.12 lets version 4 resume only ADMITTED"
    )
    hold = receipt(held, f"{held}#1.1", status="AMBIGUOUS").model_copy(update={"detail": why})
    journal = _journal((i1, T0 + 3.0), (admission(i1), T0 + 3.1), (hold, T0 + 30.0))
    assert journal[-1].entry.outcome == "APPLIED"
    assert "changed its contract" in journal[-1].entry.reason
    report = build(dataclasses.replace(facts, journal=[*facts.journal, *journal]))
    up = report["upgrade"]
    assert (up["held"], up["held_ops"], up["still_held"]) == (1, [held], 1)
    assert list(up["held_by_reason"]) == [why[why.find("payments") :]]
    measure = next(
        m for m in report["measures"] if m["name"] == "operations held by the gateway upgrade"
    )
    assert (measure["count"], measure["of"]) == (1, 2)
    assert measure["by_class"] == {"irreversible": [1, 2]}


def test_reservations_and_the_upgrade_have_their_rows() -> None:
    report = build(_side_facts(reversal="OUTCOME_VERIFIED"))
    res = report["reservations"]
    assert res["bookings"] == 1 and res["by_state"] == {"EFFECT_COMMITTED": 1}
    assert res["released_by_sink"] == 1
    unconfirmed = next(m for m in report["measures"] if m["name"] == "reservations not confirmed")
    assert (unconfirmed["count"], unconfirmed["of"]) == (0, 1)
    up = report["upgrade"]
    # one step held (twice) on the held refund, but no journal entry of it moved it
    assert (up["in_flight"], up["held"], up["to_version"]) == (2, 0, 4)
    assert (up["steps_held"], up["superseded_steps"]) == (2, 2)
    held = next(
        m for m in report["measures"] if m["name"] == "operations held by the gateway upgrade"
    )
    assert (held["count"], held["of"]) == (0, 2)
    assert "gateway upgrade: contract version 1 -> 4" in render_text(report)
    assert "Gateway upgrade" in mission_html(report)
    without = build(_side_facts(reversal="OUTCOME_VERIFIED", upgrade=False))
    assert without["upgrade"] is None
    assert not any(m["name"].startswith("operations held by") for m in without["measures"])


def test_the_mission_says_how_to_inspect_its_ledger(tmp_path: Any) -> None:
    from testbed.cli_mission import _inspect

    report = {"mission": {"ledger": "mission-ledger-seed7-2c-1i-abc123"}, "held_operations": []}
    lines = _inspect(report, tmp_path)
    text = "\n".join(lines)
    assert "LEDGER_TOPIC_PREFIX=mission-ledger-seed7-2c-1i-abc123" in text
    assert f"LEDGER_RUN_DIR={tmp_path}" in text and "LEDGER_CLOCK=manual" in text
    assert "ledger history refund:00000:v1" in text
    held = {**report, "held_operations": [{"operation_id": "notify:00002:v1"}]}
    assert "ledger history notify:00002:v1" in "\n".join(_inspect(held, tmp_path))


def test_a_stale_dispatch_not_sent_is_not_counted_as_sent() -> None:
    """A loser whose refund the upgrade holds is not probed: reported, not a failure."""
    probes = [
        {"operation_id": "refund:00000:v1", "token": 1, "refused": True},
        {
            "operation_id": "refund:00001:v1",
            "token": 1,
            "refused": None,
            "skipped": "held by the gateway upgrade",
        },
    ]
    report = build(_facts(stale_dispatches=probes))
    stale = next(m for m in report["measures"] if m["name"] == "stale-resumer rejections")
    assert (stale["count"], stale["of"]) == (1, 1)
    assert "1 loser(s) not sent a stale dispatch" in stale["note"]
    assert not any("stale dispatches refused" in f for f in report["checks"]["failures"])
    refused_not = build(_facts(stale_dispatches=[{**probes[0], "refused": False}]))
    assert any("0/1 stale dispatches refused" in f for f in refused_not["checks"]["failures"])


def test_a_receipt_carrying_its_postcondition_counts_as_a_postcondition_readback() -> None:
    op = "refund:m:v1"
    i = intent(op)
    checked = receipt(op, f"{op}#1.1").model_copy(
        update={"postcondition_status": "MISMATCH", "postcondition_detail": "two credits"}
    )
    rows = _journal((i, T0), (admission(i), T0 + 0.1), (checked, T0 + 1.0))
    assert [r.postcondition for r in rows] == [None, None, "MISMATCH"]
    assert rows[2].receipt_status == "COMMITTED"


def test_the_report_is_a_typed_model_whose_json_keeps_the_report_keys() -> None:
    from testbed.mission.model import Measure, MissionReport
    from testbed.mission.report import build_model

    model = build_model(_facts())
    assert isinstance(model, MissionReport)
    assert all(isinstance(m, Measure) for m in model.measures)
    report = model.to_json()
    assert list(report) == [
        "mission", "cases", "eligibility", "operations", "measures", "compensations",
        "reservations", "upgrade", "held_operations", "effects_by_sink",
        "readback_latency_ms", "failovers", "faults", "timeline", "timeline_events",
        "reconciled", "audit", "checks",
    ]  # fmt: skip
    assert list(report["measures"][0]) == ["name", "count", "of", "denominator", "by_class", "note"]
    assert report == build(_facts())
    assert json.loads(json.dumps(report)) == json.loads(json.dumps(build(_facts())))
