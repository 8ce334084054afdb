"""A stage's status file (consumers.runtime.status.StatusFile)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from consumers.runtime.status import StatusFile, status_path


def _read(status: StatusFile) -> dict[str, Any]:
    return dict(json.loads(status.path.read_text()))


def test_ready_is_written_once_the_assignment_is_seen_and_start_up_settled(tmp_path: Path) -> None:
    settled = [False]
    asked: list[bool] = []

    def is_settled() -> bool:
        asked.append(True)
        return settled[0]

    status = StatusFile(status_path(tmp_path, "processor", "1"), lambda: None, lambda: 9100, dict)
    status.report_ready(False, is_settled)
    assert not status.path.exists() and asked == []  # nothing seen: settled is not asked
    status.report_ready(True, is_settled)
    assert not status.path.exists() and asked == [True]
    settled[0] = True
    status.report_ready(True, is_settled)
    assert _read(status)["ready"] is True and _read(status)["metrics_port"] == 9100
    assert status.path == tmp_path / "status" / "processor-1.json"
    status.report_ready(True, is_settled)
    assert asked == [True, True]  # ready already: not asked again


def test_a_change_in_what_is_held_rewrites_the_file_before_ready(tmp_path: Path) -> None:
    held: dict[str, str] = {}
    status = StatusFile(tmp_path / "s.json", lambda: {"for": "x"}, lambda: None, lambda: held)
    status.report_ready(False, lambda: True)
    assert not status.path.exists()
    held["op-1"] = "unverifiable:0:3 key unknown"
    status.report_ready(False, lambda: True)
    written = _read(status)
    assert written["ready"] is False and written["waiting"] == {"for": "x"}
    assert written["unverifiable_held"] == held and written["unverifiable_held_count"] == 1
