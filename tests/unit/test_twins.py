"""Two processes with one instance name are told apart by their client IDs (issue 29).

Each join fences the other, so the group lists one member at any instant;
watching it for a few seconds shows both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError

from consumers.twins import (
    PROCESSES_DIR,
    Incarnation,
    announce,
    client_id,
    fenced_out,
    fenced_out_text,
    incarnations,
    local_processes,
    twins,
    withdraw,
)


@dataclass(frozen=True)
class FakeMember:
    group_instance_id: str | None
    client_id: str
    host: str


@dataclass(frozen=True)
class FakeGroup:
    members: tuple[FakeMember, ...]


def _relay(pid: int, host: str = "/10.0.0.5") -> FakeGroup:
    return FakeGroup((FakeMember("relay-0", client_id("relay", "0", pid), host),))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_name_held_in_turn_by_two_processes_is_named_with_both() -> None:
    answers = iter([{"g": _relay(2)}, {"g": _relay(1)}, {"g": _relay(2)}, {"g": _relay(1)}])
    clock = Clock()
    seen = incarnations(
        lambda: next(answers),
        {"g": _relay(1)},
        look_s=2.0,
        every_s=0.5,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
    )
    assert clock.now - 100.0 <= 2.0  # bounded
    found = twins(seen["g"])
    assert list(found) == ["relay-0"]
    assert [who.client_id for who in found["relay-0"]] == ["relay-0.1", "relay-0.2"]
    assert str(found["relay-0"][0]) == "relay-0.1 at /10.0.0.5"


def test_one_process_per_name_is_no_twin() -> None:
    steady: dict[str, Any] = {
        "g": FakeGroup(
            (
                FakeMember("relay-0", "relay-0.1", "/10.0.0.5"),
                FakeMember("relay-1", "relay-1.1", "/10.0.0.6"),
            )
        )
    }
    clock = Clock()
    seen = incarnations(
        lambda: steady, steady, look_s=2.0, monotonic=clock.monotonic, sleep=clock.sleep
    )
    assert twins(seen["g"]) == {}
    # The same process ID on two hosts is two processes.
    assert twins({"relay-0": [Incarnation("relay-0.1", "/a"), Incarnation("relay-0.1", "/b")]})


def test_no_look_again_when_the_bound_is_zero() -> None:
    def never() -> dict[str, Any]:
        raise AssertionError("asked again")

    assert twins(incarnations(never, {"g": _relay(1)}, look_s=0)["g"]) == {}


def test_processes_of_this_host_are_counted_per_name(tmp_path: Path) -> None:
    mine = announce(tmp_path, "relay", "0")
    other = tmp_path / PROCESSES_DIR / "relay-0.999999.json"
    other.write_text(json.dumps({"pid": 999999, "host": "h", "name": "relay-0"}))
    (tmp_path / PROCESSES_DIR / "junk.json").write_text("{not json")
    alive = {os.getpid(), 999999}
    assert local_processes(tmp_path, alive=lambda pid: pid in alive) == {
        "relay-0": sorted([os.getpid(), 999999])
    }
    alive.discard(999999)  # a crashed process leaves its file; its PID is dead
    assert local_processes(tmp_path, alive=lambda pid: pid in alive) == {"relay-0": [os.getpid()]}
    withdraw(mine)
    assert local_processes(tmp_path, alive=lambda pid: pid in alive) == {}


def test_a_consumer_fenced_out_of_its_static_membership_is_recognised() -> None:
    assert fenced_out(KafkaError(KafkaError.FENCED_INSTANCE_ID))
    assert fenced_out(
        KafkaError(
            KafkaError._FATAL,
            "Fatal consumer error: Broker: Static consumer fenced by other consumer "
            "with same group.instance.id",
            fatal=True,
        )
    )
    assert not fenced_out(KafkaError(KafkaError._TRANSPORT))
    assert "give each its own --instance" in fenced_out_text(
        "relay-0", KafkaError(KafkaError.FENCED_INSTANCE_ID)
    )
