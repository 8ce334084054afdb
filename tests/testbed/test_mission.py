"""The fee-remediation mission on the real broker, at a size that fits ``make test``.

One 120-case mission in ledger mode with two instances of every stage
(kills at every seam, sink faults, resumer races, zombies, a broker
restart when the broker is ours) and its checkpoint-only control with the
same seed (60 cases: enough for its duplicates to show). Every fault kind
and seam comes early in the plan; the long runs are ``make mission``
(4,000 cases by default) and ``make mission-chaos``. Both reports are
built from what the sinks and the ledger hold.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient

from ledger.cli import main
from ledger.settings import LedgerSettings
from testbed import broker
from testbed.mission.answers import HELD_STATES
from testbed.mission.plan import SEAM_STAGE, MissionOptions, plan
from testbed.mission.run import Mission

#: The ledger mission restarts its broker: this test process's own (``private_broker_home``).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

CASES = 120
#: The checkpoint-only control needs only enough cases for its duplicates to show
#: (every sink-fault mode and seam comes early in the plan): half the run.
CONTROL_CASES = 60


def _drop_topics(bootstrap: str, prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=broker.CLIENT_LOGGER)
    doomed = [n for n in admin.list_topics(timeout=10).topics if n.startswith(prefix + ".")]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            with contextlib.suppress(Exception):
                future.result(timeout=30)


def _run(options: MissionOptions, own: LedgerSettings, root: Path) -> dict[str, Any]:
    bootstrap = own.bootstrap_servers
    base = own.model_copy(update={"run_dir": root, "partitions": 3})
    mission = Mission(options, base)
    try:
        report = mission.run()
    finally:
        mission.close()
        _drop_topics(bootstrap, mission.settings.topic_prefix)
    (root / f"{options.mode}.json").write_text(json.dumps(report))
    return report


@pytest.fixture(scope="module")
def missions(
    private_broker_home: LedgerSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Any], dict[str, Any], Path]]:
    own = private_broker_home
    broker.start(own)
    root = tmp_path_factory.mktemp("missions")
    ledger = _run(
        MissionOptions(cases=CASES, crash_rate=0.05, seed=11, instances=2, chaos_every=40),
        own,
        root,
    )
    control = _run(
        MissionOptions(
            cases=CONTROL_CASES,
            crash_rate=0.05,
            seed=11,
            mode="checkpoint-only",
            broker_restart=False,
        ),
        own,
        root,
    )
    yield ledger, control, root


def _measure(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["measures"] if m["name"] == name)


def test_ledger_mode_survives_crashes_everywhere(missions: Any) -> None:
    ledger, _control, _root = missions
    assert ledger["checks"] == {"passed": True, "failures": []}
    assert sum(ledger["cases"]["by_outcome"].values()) == CASES
    assert ledger["cases"]["by_outcome"].get("refunded and notified", 0) > CASES // 2
    dup = _measure(ledger, "duplicate effects")
    assert dup["count"] == 0 and dup["of"] > CASES
    for sink in ("payments", "mailer"):  # one effect per case at each sink at most
        effects = ledger["effects_by_sink"][sink]
        assert effects["duplicates"] == 0 and max(int(k) for k in effects["by_effects"]) <= 1
        assert 0 < effects["cases"] == effects["effects"] <= effects["operations"]
    held = ledger["held_operations"]
    assert len(held) == sum(ledger["operations"]["by_state"].get(s, 0) for s in HELD_STATES)
    assert all(h["age_s"] is not None and h["age_s"] >= 0 for h in held)
    for key in ("before_compaction", "after_compaction"):
        audit = ledger["audit"][key]
        assert audit["violations"] == 0, audit["details"]
        assert (
            audit["checked"]["fencing"] > 0
            and audit["checked"]["state"] == ledger["operations"]["total"]
        )


def test_every_fault_was_injected_and_accounted_for(missions: Any) -> None:
    ledger, _control, _root = missions
    faults = ledger["faults"]
    options = MissionOptions(cases=CASES, crash_rate=0.05, seed=11)
    planned = sum(
        sum(
            f.seam is not None
            for f in (c.refund, c.notify, c.goodwill, c.reversal, c.callback)
            if f
        )
        for c in plan(options)
    )
    fired = sum(faults["kills_by_seam"].values())
    unreached = sum(faults["hooks_never_reached"].values())
    # a hook is either fired or still armed (its operation never got there)
    assert 0 < fired <= planned and fired + unreached <= planned
    assert sum(1 for s in SEAM_STAGE if faults["kills_by_seam"][s] > 0) >= 5
    assert sum(faults["sink_faults_by_mode"].values()) >= 5 and faults["sink_faults_fired"] > 0
    assert faults["zombie_pauses"] >= 1 and faults["chaos_kills"] >= 1
    assert faults["restarts"] >= fired
    assert faults["resumer_races"] > 0
    # every kill and zombie pause is on the timeline, within the mission's time
    kinds = Counter(m["kind"] for m in ledger["timeline_events"])
    assert kinds["seam kill"] + kinds["seam pause"] >= fired
    assert kinds["chaos kill"] == faults["chaos_kills"]
    assert kinds["zombie pause"] == faults["zombie_pauses"]
    assert kinds["broker restart"] == faults["broker_restarts"]
    end = ledger["mission"]["wall_s"] + 1
    assert all(0 <= m["t_s"] <= end for m in ledger["timeline_events"])


def test_credits_bookings_and_the_gateway_upgrade_are_accounted_for(missions: Any) -> None:
    ledger, _control, _root = missions
    comp = ledger["compensations"]
    assert comp["credits"] > 0 and comp["missing"] == [] and comp["wrongly_compensated"] == []
    assert comp["published"] == comp["due"]
    failures = _measure(ledger, "compensation failures")
    assert failures["of"] == comp["published"]
    assert failures["count"] == comp["published"] - comp["reversed"]
    res = ledger["reservations"]
    assert res["bookings"] > 0 and res["ends"]["CONFIRMED"] > 0
    unconfirmed = _measure(ledger, "reservations not confirmed")
    assert unconfirmed["of"] == res["bookings"]
    upgrade = ledger["upgrade"]
    assert upgrade is not None and upgrade["to_version"] == 4
    assert ledger["effects_by_sink"]["credits"]["duplicates"] == 0
    assert ledger["effects_by_sink"]["callbacks"]["duplicates"] == 0


def test_losing_resumers_are_fenced_and_unknowns_are_held(missions: Any) -> None:
    ledger, _control, _root = missions
    stale = _measure(ledger, "stale-resumer rejections")
    assert stale["of"] > 0 and stale["count"] == stale["of"]
    unknown = _measure(ledger, "unresolved unknown outcomes")
    held = ledger["operations"]["by_state"].get("UNKNOWN_OUTCOME", 0)
    assert unknown["count"] == held <= unknown["of"]
    unverified = _measure(ledger, "notifications describing an unverified refund")
    assert unverified["count"] == 0 and unverified["of"] > 0
    latency = ledger["readback_latency_ms"]
    assert latency["count"] > 0 and 0 <= latency["p50"] <= latency["p99"] <= latency["max"]


def test_the_page_names_held_operations_and_marks_faults_on_the_timeline(missions: Any) -> None:
    from testbed.mission.html import mission_html

    ledger, _control, _root = missions
    page = mission_html(ledger)
    for held in ledger["held_operations"]:
        assert f"<code>{held['operation_id']}</code>" in page
    for kind in {m["kind"] for m in ledger["timeline_events"]}:
        n = sum(1 for m in ledger["timeline_events"] if m["kind"] == kind)
        assert f"{kind} ({n})" in page  # the timeline's legend
    assert "<code>payments</code>" in page and "<code>mailer</code>" in page
    assert f"p90 {ledger['readback_latency_ms']['p90']:.0f} ms" in page


def test_checkpoint_only_control_shows_its_duplicates(missions: Any) -> None:
    ledger, control, root = missions
    dup = _measure(control, "duplicate effects")
    assert dup["count"] > 0
    # the duplicates are at a sink, not a refund and its notification added up
    per_sink = control["effects_by_sink"]
    assert sum(e["duplicates"] for e in per_sink.values()) == dup["count"]
    # the auditor sees them too
    details = control["audit"]["before_compaction"]["details"]
    assert any(d.startswith("single-effect") for d in details)
    result = CliRunner().invoke(
        main,
        [
            "mission",
            "compare",
            str(root / "ledger.json"),
            str(root / "checkpoint-only.json"),
            "--html",
            str(root / "compare.html"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "duplicate effects" in result.output and "checkpoint-only" in result.output
    assert (root / "compare.html").read_text().count("<svg") >= 2
