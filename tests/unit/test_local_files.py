"""Local files the ledger reads give a clear error naming the file, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.clock import MAX_ADVANCE_S, ManualClock
from ledger.errors import LocalFileError
from ledger.signing import load_trusted
from sinks.registry import load_sinks


@pytest.mark.parametrize("text", ["not-a-number", "1.5", "{}"])
def test_a_corrupted_clock_names_its_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "clock"
    path.write_text(text)
    with pytest.raises(LocalFileError, match=str(path)):
        ManualClock(path).now_ms()


def test_the_clock_refuses_a_move_it_cannot_mean(tmp_path: Path) -> None:
    clock = ManualClock(tmp_path / "clock")
    for seconds in (float("inf"), float("nan"), MAX_ADVANCE_S + 1, -1):
        with pytest.raises(ValueError):
            clock.advance(seconds)
    assert clock.advance(10) == 10_000


@pytest.mark.parametrize("text", ["{garbage", "[1, 2]", '{"k": "not base64!"}', '{"k": "AAAA"}'])
def test_a_corrupted_trusted_keys_file_names_itself(tmp_path: Path, text: str) -> None:
    path = tmp_path / "trusted_keys.json"
    path.write_text(text)
    with pytest.raises(LocalFileError, match="trusted-keys file"):
        load_trusted(path)


@pytest.mark.parametrize("text", ["{garbage", '{"payments": 7}', '["x"]', '{"p": {"url": 1}}'])
def test_a_corrupted_sink_registry_names_itself(tmp_path: Path, text: str) -> None:
    path = tmp_path / "sinks.json"
    path.write_text(text)
    with pytest.raises(LocalFileError, match="sink registry"):
        load_sinks(path)
