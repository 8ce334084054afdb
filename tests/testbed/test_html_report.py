"""HTML reports: one self-contained page per mission, comparison or audit,
with every text from the report escaped. Pure: no broker."""

from __future__ import annotations

import copy
import random
import re
from typing import Any

import pytest

from ledger.audit import AuditReport, OpenItem, open_items
from ledger.cli.html import audit_html
from ledger.events import OperationState
from testbed.mission.html import compare_html, mission_html

HOSTILE = '<script>alert("x")</script>'


def mission_report(mode: str = "ledger", seed: int = 7) -> dict[str, Any]:
    """A realistic mission report (the schema documented in testbed.mission.html)."""
    rng = random.Random(seed)
    checkpoint = mode == "checkpoint-only"
    timeline = []
    for t in range(0, 413, 3):
        done = min(1.0, t / 380)
        timeline.append(
            {
                "t_s": float(t),
                "states": {
                    "NOT_ADMITTED": int(300 * (1 - done)),
                    "ADMITTED": int(120 * (1 - done)),
                    "EFFECT_PENDING": int(80 * (1 - done)),
                    "EFFECT_COMMITTED": int(3500 * done),
                    "OUTCOME_VERIFIED": int(3560 * done),
                    "UNKNOWN_OUTCOME": int(12 * done),
                    "ABANDONED": int(40 * done),
                },
            }
        )
    duplicates = 212 if checkpoint else 0
    return {
        "mission": {
            "cases": 4000,
            "seed": seed,
            "crash_rate": 0.05,
            "sink_fault_rate": 0.05,
            "mode": mode,
            "instances": 1,
            "started_at": "2026-11-29T10:00:00Z",
            "wall_s": 412.3,
            "peak_rss_mb": 650.1,
            "ledger": f"mission-ledger-{seed}-abc123",
        },
        "cases": {
            "total": 4000,
            "by_outcome": {
                "refunded and notified": 3500,
                "not eligible": 380,
                "refund rejected by the gateway": 40,
                "refund held (unknown outcome)": 0,
                "notification held (unknown outcome)": 12,
                "refunded, notification pending": 68,
            },
        },
        "operations": {
            "total": 7112,
            "by_state": {
                "OUTCOME_VERIFIED": 3560,
                "EFFECT_COMMITTED": 3500,
                "UNKNOWN_OUTCOME": 12,
                "ABANDONED": 40,
            },
            "by_class": {
                "irreversible": {"OUTCOME_VERIFIED": 3560, "ABANDONED": 40},
                "reversible-external": {"EFFECT_COMMITTED": 3500, "UNKNOWN_OUTCOME": 12},
            },
        },
        "measures": [
            {
                "name": "duplicate effects",
                "count": duplicates,
                "of": 7093,
                "denominator": "operations with an effect at a sink",
                "by_class": {
                    "irreversible": [duplicates, 3553],
                    "reversible-external": [0, 3540],
                },
                "note": "counted by the sinks themselves",
            },
            {
                "name": "unknown outcomes retried blind",
                "count": 0,
                "of": 12,
                "denominator": "operations held in UNKNOWN_OUTCOME",
                "by_class": {"irreversible": [0, 0], "reversible-external": [0, 12]},
            },
            {
                "name": "resumes without a recovery receipt",
                "count": 0,
                "of": 230,
                "denominator": "resumes",
                "by_class": {"irreversible": [0, 131], "reversible-external": [0, 99]},
            },
        ],
        "readback_latency_ms": {
            "count": 180,
            "p50": 850.0,
            "p90": 3300.0,
            "p99": 6100.0,
            "max": 7400.0,
            "samples": [round(rng.lognormvariate(6.8, 0.6), 1) for _ in range(180)],
            "buckets": [{"up_to_ms": 1000, "count": 100}, {"up_to_ms": None, "count": 80}],
        },
        "faults": {
            "kills_by_seam": {
                "before_admission": 31,
                "after_admission_before_dispatch": 30,
                "after_sink_commit_before_receipt": 29,
            },
            "chaos_kills": 8,
            "zombie_pauses": 4,
            "sink_faults_by_mode": {
                "reject": 35,
                "unavailable": 33,
                "timeout_before_commit": 30,
                "commit_then_drop_response": 36,
                "timeout_after_commit": 29,
            },
            "broker_restarts": 1,
            "restarts": 230,
        },
        "timeline": timeline,
        "effects_by_sink": {
            "payments": {
                "consequence": "irreversible",
                "operations": 3600,
                "effects": 3553 + duplicates,
                "cases": 3553,
                "duplicates": duplicates,
                "extra_effects": duplicates,
                "by_effects": {"0": 47, "1": 3553 - duplicates, "2": duplicates},
            },
            "mailer": {
                "consequence": "reversible-external",
                "operations": 3512,
                "effects": 3540,
                "cases": 3540,
                "duplicates": 0,
                "extra_effects": 0,
                "by_effects": {"0": 12, "1": 3540},
            },
        },
        "held_operations": [
            {
                "operation_id": f"notify:{n:05d}:v1",
                "case": n,
                "state": "UNKNOWN_OUTCOME",
                "sink": "mailer",
                "reason": "outcome unknown: mailer: timeout",
                "since_s": 100.0 + n,
                "age_s": 312.3 - n,
            }
            for n in range(12)
        ],
        "timeline_events": [
            {
                "t_s": 12.0,
                "end_s": None,
                "kind": "seam kill",
                "target": "stage relay 0",
                "detail": "after_dispatch_before_send on refund:00003:v1",
            },
            {
                "t_s": 80.0,
                "end_s": None,
                "kind": "chaos kill",
                "target": "processor-1",
                "detail": "",
            },
            {
                "t_s": 150.0,
                "end_s": 163.0,
                "kind": "zombie pause",
                "target": "relay-1",
                "detail": "",
            },
            {
                "t_s": 250.0,
                "end_s": 258.0,
                "kind": "broker restart",
                "target": "broker",
                "detail": "",
            },
        ],  # fmt: skip
        "audit": {
            "before_compaction": {
                "violations": 0,
                "details": [],
                "checked": {"state": 7112, "single-effect": 7093, "admission": 7100},
            },
            "after_compaction": {
                "violations": 0,
                "details": [],
                "checked": {"state": 7112, "single-effect": 7093, "admission": 7100},
            },
        },
        "checks": {"passed": not checkpoint, "failures": []},
    }


def audit_report(violations: int = 2) -> dict[str, Any]:
    found = [
        {
            "invariant": "single-effect",
            "operation_id": "refund:1842:v3",
            "evidence": "the sink holds 2 effects for the operation",
        },
        {
            "invariant": "consume-once",
            "operation_id": None,
            "evidence": "approval review-7 admitted 2 operations: ['refund:1:v1', 'refund:2:v1']",
        },
    ][:violations]
    return {
        "operations": 7112,
        "journal_entries": 48311,
        "checked": {"state": 7112, "single-effect": 7093, "consume-once": 3600, "fencing": 7093},
        "violations": found,
        "ledger": "mission-ledger-7-abc123",
        "compacted": True,
    }


def assert_self_contained(page: str) -> None:
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<html") == 1 and page.rstrip().endswith("</html>")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", page, re.I)
    assert "@import" not in page and "<link" not in page.lower()
    assert "<script" not in page.lower()
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "SVG IDs collide between plots"
    assert len(page.encode()) < 1_000_000


# ---------------------------------------------------------------------- mission


def test_mission_page_is_one_self_contained_document_with_three_plots() -> None:
    page = mission_html(mission_report())
    assert_self_contained(page)
    assert page.count("<svg") == 3
    assert page.count("</svg>") == 3
    assert "PASSED" in page and "FAILED" not in page


def test_mission_page_shows_the_reports_numbers() -> None:
    report = mission_report("checkpoint-only")
    page = mission_html(report)
    duplicates = report["measures"][0]
    assert "duplicate effects" in page
    assert f'<td class="num">{duplicates["count"]}</td>' in page
    assert f'<td class="num">{duplicates["of"]}</td>' in page
    assert "operations with an effect at a sink" in page
    assert "2.99&nbsp;%" in page  # 212 / 7093
    assert "212 / 3553" in page  # per-class split
    for value in ("850", "6100", "7400", "412.3", "650.1", "mission-ledger-7-abc123"):
        assert value in page
    for seam in ("before_admission", "commit_then_drop_response", "zombie pauses"):
        assert seam in page
    assert "refunded and notified" in page and "3500" in page
    # held operations named, latency as a distribution with its marks, faults on the timeline
    assert "<code>notify:00011:v1</code>" in page and "outcome unknown: mailer: timeout" in page
    assert "p90 3300 ms" in page and "share of resumes at or below" in page
    assert "zombie pause (1)" in page and "after_dispatch_before_send on refund:00003:v1" in page


def test_mission_page_escapes_report_text() -> None:
    report = mission_report()
    report["cases"]["by_outcome"][HOSTILE] = 3
    report["audit"]["after_compaction"] = {
        "violations": 1,
        "details": [f"single-effect refund:{HOSTILE}:v1: the sink holds 2 effects"],
    }
    report["measures"][0]["note"] = HOSTILE
    report["effects_by_sink"][HOSTILE] = {"effects": 1, "by_effects": {"1": 1}}
    report["held_operations"][0]["reason"] = HOSTILE
    report["timeline_events"][0]["detail"] = HOSTILE
    page = mission_html(report)
    assert "<script" not in page
    # outcome, measure note, audit detail, sink, held reason, fault detail: each escaped
    assert page.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") >= 6
    assert "1 VIOLATION" in page


def test_failed_mission_shows_the_badge_and_each_failure() -> None:
    report = mission_report()
    report["checks"] = {
        "passed": False,
        "failures": ["duplicate effects: 3 > 0", f"audit after compaction: {HOSTILE}"],
    }
    page = mission_html(report)
    assert "FAILED" in page and "PASSED" not in page
    assert "duplicate effects: 3 &gt; 0" in page
    assert "audit after compaction: &lt;script&gt;" in page


def test_mission_page_renders_with_only_the_required_keys() -> None:
    page = mission_html({"mission": {"mode": "ledger"}, "checks": {"passed": True}})
    assert_self_contained(page)
    assert "<svg" not in page
    assert "no timeline recorded" in page and "no measures recorded" in page


def test_mission_page_thins_a_long_timeline() -> None:
    report = mission_report()
    report["timeline"] = [
        {"t_s": t / 10, "states": {"ADMITTED": t % 50, "OUTCOME_VERIFIED": t}} for t in range(20000)
    ]
    page = mission_html(report)
    assert_self_contained(page)


# ---------------------------------------------------------------------- comparison


def test_compare_shows_one_column_per_mode() -> None:
    ledger, checkpoint = mission_report("ledger"), mission_report("checkpoint-only")
    page = compare_html([ledger, checkpoint])
    assert_self_contained(page)
    assert '<th class="num">ledger</th>' in page
    assert '<th class="num">checkpoint-only</th>' in page
    assert "0 / 7093" in page and "212 / 7093" in page
    assert page.count("<svg") == 2  # one timeline per report (with its faults)
    assert "cases with a duplicate" in page
    assert "PASSED" in page and "FAILED" in page


def test_compare_labels_reports_of_the_same_mode_apart() -> None:
    page = compare_html([mission_report(seed=1), copy.deepcopy(mission_report(seed=2))])
    assert "ledger #1" in page and "ledger #2" in page
    assert_self_contained(page)


def test_compare_needs_a_report() -> None:
    with pytest.raises(ValueError, match="at least one"):
        compare_html([])


# ---------------------------------------------------------------------- audit


def test_audit_page_lists_each_violation() -> None:
    audit = audit_report()
    audit["violations"].append(
        {"invariant": "state", "operation_id": f"op:{HOSTILE}", "evidence": HOSTILE}
    )
    page = audit_html(audit)
    assert_self_contained(page)
    assert page.count("<svg") == 1
    assert "3 violations" in page and "clean" not in page.lower()
    assert "refund:1842:v3" in page and "the sink holds 2 effects for the operation" in page
    assert "approval review-7 admitted 2 operations" in page
    assert "<script" not in page
    assert "op:&lt;script&gt;" in page
    assert "mission-ledger-7-abc123" in page and "after compaction" in page


def test_audit_page_says_clean_for_zero_violations() -> None:
    page = audit_html(audit_report(violations=0))
    assert_self_contained(page)
    assert "CLEAN" in page and "clean: no violations in 24898 facts checked" in page
    assert "violations of the ledger" not in page
    assert page.count("<svg") == 1  # facts checked per invariant


def test_audit_page_renders_an_empty_dict() -> None:
    page = audit_html({})
    assert_self_contained(page)
    assert "clean" in page


def test_audit_report_to_dict() -> None:
    report = AuditReport(operations=3, journal_entries=11)
    report.checked["state"] += 3
    report.checked["consume-once"] += 2
    report.add("state", "refund:1:v1", "ledger.state holds nothing")
    report.add("consume-once", None, "approval a admitted 2 operations")
    report.authenticity_checked = True
    report.unauthenticated_records.append(
        {"topic": "admissions", "partition": 0, "offset": 7, "reason": "no ledger-auth header"}
    )
    report.started_at_ms = 1_796_000_000_000
    report.took_s = 2.5
    report.offsets = {"journal": {0: 7, 1: 0}}
    report.open_items = [
        OpenItem("refund:2:v1", "UNKNOWN_OUTCOME", "payments", "outcome unknown", 1000, 12.0)
    ]
    data = report.to_dict()
    assert data == {
        "operations": 3,
        "journal_entries": 11,
        "verdict": "2 VIOLATIONS (ledger only, sink readback off)",
        "ran_at": "2026-11-30T00:53:20+00:00",
        "ran_at_ms": 1_796_000_000_000,
        "took_s": 2.5,
        "coverage": {
            "sink_readback": False,
            "facts": 5,
            "ledger_facts": 5,
            "sink_facts": None,
            "sink_unread": [],
        },
        "offsets": {"journal": {"0": 7, "1": 0}},
        "open_items": [
            {
                "operation_id": "refund:2:v1",
                "state": "UNKNOWN_OUTCOME",
                "sink": "payments",
                "reason": "outcome unknown",
                "since_ms": 1000,
                "age_s": 12.0,
                "history": "ledger history refund:2:v1",
            }
        ],
        "authenticity_checked": True,
        "unauthenticated_records": [
            {"topic": "admissions", "partition": 0, "offset": 7, "reason": "no ledger-auth header"}
        ],
        "unverifiable_records": [],
        "replayed_records": [],
        "undecodable_records": [],
        "stranded": [],
        "journal_chain": {},
        "unverified": [],
        "checked": {"state": 3, "consume-once": 2},
        "violations": [
            {
                "invariant": "state",
                "operation_id": "refund:1:v1",
                "evidence": "ledger.state holds nothing",
            },
            {
                "invariant": "consume-once",
                "operation_id": None,
                "evidence": "approval a admitted 2 operations",
            },
        ],
    }
    assert type(data["checked"]) is dict  # not the defaultdict
    page = audit_html(data)
    assert "invariant" in page
    assert "unauthenticated records (refused)" in page
    assert "2026-11-30T00:53:20+00:00, took 2.5 s" in page
    assert "<code>ledger history refund:2:v1</code>" in page
    assert "LEDGER ONLY, SINK READBACK OFF" in page and "1 OPEN" in page


def test_audit_page_says_which_coverage_the_verdict_holds_for() -> None:
    """The same ledger audited with and without sink readback: two verdicts, two figures."""
    with_sinks = {
        **audit_report(violations=0),
        "coverage": {"sink_readback": True, "facts": 397, "ledger_facts": 261, "sink_facts": 136},
    }
    without = {
        **audit_report(violations=0),
        "coverage": {"sink_readback": False, "facts": 261, "ledger_facts": 261, "sink_facts": None},
    }
    on, off = audit_html(with_sinks), audit_html(without)
    assert "(ledger and sink readback)" in on and "sink readback off" not in on
    assert "(ledger only, sink readback off)" in off and "(ledger and sink readback)" not in off
    assert "<td>… against sink readback</td><td>136</td>" in on
    assert "<td>… against sink readback</td><td>not read (ledger audit --no-sinks)</td>" in off


def test_audit_page_lists_every_open_item_with_its_history() -> None:
    items = [
        OpenItem(f"refund:{n}:v1", state, "payments", f"reason {n}", 0, float(n))
        for n, state in enumerate(
            ["UNKNOWN_OUTCOME"] * 10 + ["ABANDONED"] * 2 + ["NEEDS_REAUTHORISATION"]
        )
    ]
    page = audit_html({**audit_report(violations=0), "open_items": [i.to_dict() for i in items]})
    assert_self_contained(page)
    assert "13 OPEN" in page
    assert "10 UNKNOWN_OUTCOME, 2 ABANDONED, 1 NEEDS_REAUTHORISATION" in page
    for i in items:
        assert f"<code>ledger history {i.operation_id}</code>" in page
    linked = {**items[0].to_dict(), "history_href": "history/refund_0_v1-1234abcd.html"}
    page = audit_html({**audit_report(violations=0), "open_items": [linked]})
    assert (
        '<a href="history/refund_0_v1-1234abcd.html"><code>ledger history refund:0:v1</code></a>'
        in page
    )
    none = audit_html({**audit_report(violations=0), "open_items": []})
    assert "none: no held unknown outcome" in none and "OPEN" not in none


def test_open_items_are_the_held_reauthorisation_pending_and_abandoned() -> None:
    from tests.helpers import intent

    base = OperationState(
        operation_id="x",
        state="OUTCOME_VERIFIED",
        version=3,
        epoch=1,
        parameter_digest=intent().parameter_digest,
        sink="payments",
        action="refund",
        params_json="{}",
        actor="svc",
        subject="customer-1",
        purpose="p",
        decision_version=1,
        amount_minor=0,
    )
    states = {
        op: base.model_copy(update={"operation_id": op, "state": st, "reason": f"why {op}"})
        for op, st in [
            ("a", "OUTCOME_VERIFIED"),
            ("b", "UNKNOWN_OUTCOME"),
            ("c", "ABANDONED"),
            ("d", "NEEDS_REAUTHORISATION"),
            ("e", "UNKNOWN_OUTCOME"),
        ]
    }
    items = open_items(states, {"b": 9_000, "e": 5_000, "c": 20_000}, now_ms=10_000)
    assert [(i.operation_id, i.state, i.age_s) for i in items] == [
        ("e", "UNKNOWN_OUTCOME", 5.0),
        ("b", "UNKNOWN_OUTCOME", 1.0),
        ("d", "NEEDS_REAUTHORISATION", None),
        ("c", "ABANDONED", 0.0),  # written after the audit started: never a negative age
    ]
    assert items[0].reason == "why e" and items[0].history_command == "ledger history e"
