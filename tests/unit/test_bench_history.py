"""The pure parts of the restart-over-history benchmark: log timelines, re-keying."""

from __future__ import annotations

from datetime import datetime

import pytest

from bench.history import dominating, rekey, stage_timeline


def _at(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


LOG = [
    "2026-12-02 15:00:00,000 INFO consumers.stage: relay-0 running (pid 1, group g, ...)",
    "2026-12-02 15:00:10,000 INFO consumers.stage: relay-0 running (pid 2, group g, ...)",
    "2026-12-02 15:00:11,500 INFO consumers.stage: relay-0 assigned partitions [0, 1, 2]",
    "a traceback line without a timestamp",
    "2026-12-02 15:00:14,000 INFO consumers.relay: relay: 4278 receipts filed (applied when ...)",
]


def test_the_timeline_starts_at_the_restart_and_measures_the_restore() -> None:
    t = stage_timeline("relay", LOG, _at("2026-12-02 15:00:09,000"))
    assert t["running_s"] == pytest.approx(1.0)
    assert t["assigned_s"] == pytest.approx(2.5)
    assert t["restored_s"] == pytest.approx(5.0)
    assert t["restore_s"] == pytest.approx(2.5)
    assert t["records"] == 4278


def test_a_missing_restore_line_leaves_the_restore_unknown() -> None:
    t = stage_timeline("processor", LOG, _at("2026-12-02 15:00:09,000"))
    assert t["restore_s"] is None and t["records"] is None


def test_the_authority_counts_approvals_and_uses() -> None:
    line = (
        "2026-12-02 15:00:12,000 INFO consumers.authority: authority: 7 approvals and 5 uses filed"
    )
    t = stage_timeline("authority", [line], _at("2026-12-02 15:00:09,000"))
    assert t["records"] == 12


def test_the_dominating_stage_has_the_longest_restore() -> None:
    stages = {"processor": {"restore_s": 1.0}, "relay": {"restore_s": 3.0}, "authority": {}}
    assert dominating(stages) == "relay"
    assert dominating({"relay": {"restore_s": None}}) is None


def test_rekeying_keeps_lengths() -> None:
    assert rekey(b"\x20refund:000001:v1x", b"refund:000001:v1", b"refund:100001:v1") == (
        b"\x20refund:100001:v1x"
    )
    assert rekey(None, b"a", b"b") is None
    with pytest.raises(ValueError):
        rekey(b"x", b"a", b"bb")
