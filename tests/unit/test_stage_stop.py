"""A stage told to stop leaves within its stop timeout, even when a Kafka close hangs."""

from __future__ import annotations

import threading

from consumers.stage import StopWatchdog, bounded_call


def test_a_close_that_returns_in_time_is_waited_for() -> None:
    calls: list[str] = []
    assert bounded_call(lambda: calls.append("closed"), 5.0, "close")
    assert calls == ["closed"]


def test_a_close_that_hangs_is_left_behind() -> None:
    release = threading.Event()
    try:
        assert not bounded_call(release.wait, 0.05, "hanging close")
    finally:
        release.set()  # let the left-behind thread end


def test_a_close_that_fails_is_only_logged() -> None:
    def fails() -> None:
        raise RuntimeError("broker gone")

    assert bounded_call(fails, 5.0, "failing close")


def test_the_watchdog_exits_when_the_stop_takes_too_long() -> None:
    exited: list[int] = []
    fired = threading.Event()

    def fake_exit(code: int) -> None:
        exited.append(code)
        fired.set()

    StopWatchdog(0.01, "relay-0", exit=fake_exit).start()
    assert fired.wait(10.0)
    assert exited == [1]


def test_a_cancelled_watchdog_does_not_exit() -> None:
    exited: list[int] = []
    dog = StopWatchdog(0.05, "relay-0", exit=exited.append)
    dog.start()
    dog.cancel()
    dog._timer.join(5.0)  # the timer thread ends without calling exit
    assert exited == []
