"""The relay's sink lanes and pass guard (consumers.sinkpool)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from consumers.sinkpool import PassGuard, run_per_sink
from sinks.client import ReadbackResult, SubmitResult


def test_a_blocked_sink_lane_does_not_hold_up_another_sink() -> None:
    b_done = threading.Event()
    seen: list[str] = []

    def a_first() -> None:
        # Waits for B's job: run one after the other, A's first, it would time out.
        seen.append("a1" if b_done.wait(5) else "a1 waited in vain")

    def a_second() -> None:
        seen.append("a2")

    def b() -> None:
        seen.append("b")
        b_done.set()

    run_per_sink([("A", a_first), ("A", a_second), ("B", b)])
    assert seen.index("b") < seen.index("a1")
    assert "a1 waited in vain" not in seen
    assert seen.index("a1") < seen.index("a2")  # one sink's jobs keep their order


def test_every_lane_ends_before_a_failure_is_raised() -> None:
    finished = threading.Event()

    def fails() -> None:
        raise RuntimeError("lane A broke")

    def slow() -> None:
        time.sleep(0.2)
        finished.set()

    with pytest.raises(RuntimeError, match="lane A broke"):
        run_per_sink([("A", fails), ("B", slow)])
    assert finished.is_set()


class Hanging:
    """An adapter whose calls use the whole deadline and get no answer."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.calls = 0

    def submit(self, operation_id: str, *args: Any, **kwargs: Any) -> SubmitResult:
        self.calls += 1
        time.sleep(self.timeout_s)
        return SubmitResult("ambiguous", operation_id, detail="deadline", sent=True)

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        self.calls += 1
        return ReadbackResult("committed", operation_id, effects=1)


def test_a_sink_that_used_its_deadline_is_asked_nothing_more_in_the_pass() -> None:
    inner = Hanging(0.2)
    guard = PassGuard(inner, "slowbank", 0.2)  # type: ignore[arg-type]
    first = guard.submit("op-1", "d", {}, 1, "a", True)
    assert first.status == "ambiguous" and first.sent  # its own meaning is kept
    readback = guard.readback("op-1", 1)
    again = guard.submit("op-2", "d", {}, 1, "a", True)
    assert not readback.sent and readback.status == "ambiguous"
    assert not again.sent and again.status == "unavailable"
    assert "slowbank gave no answer within its deadline" in again.detail
    assert inner.calls == 1
    guard.new_pass()
    assert guard.readback("op-1", 1).status == "committed"
    assert inner.calls == 2


def test_a_quick_failure_does_not_stall_the_sink() -> None:
    inner = Hanging(0.0)
    guard = PassGuard(inner, "bank", 1.0)  # type: ignore[arg-type]
    guard.submit("op-1", "d", {}, 1, "a", True)  # ambiguous at once: a dropped connection
    assert guard.readback("op-1", 1).status == "committed"


def test_the_guard_names_the_adapters_readback_or_the_plain_words() -> None:
    class Named:
        def readback_source(self, operation_id: str) -> str:
            return f"SELECT ... WHERE operation_id = '{operation_id}'"

    named = PassGuard(Named(), "db", 1.0)  # type: ignore[arg-type]
    assert named.readback_source("op-1") == "SELECT ... WHERE operation_id = 'op-1'"
    plain = PassGuard(object(), "mail", 1.0)  # type: ignore[arg-type]
    assert plain.readback_source("op-2") == "readback of op-2"
