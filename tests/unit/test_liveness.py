"""``ledger status``'s summary line tells the truth: twins, a silent process, a gone one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from consumers.liveness import SILENT_S, summary
from consumers.twins import PROCESSES_DIR, LocalProcess, Presence, announce, local_presences

NOW = 10_000_000


def test_two_processes_with_one_name_are_counted_on_the_summary_not_one_instance() -> None:
    twins = {"relay-0": ("relay-0.11 at /10.0.0.5", "pid 11 on this host", "pid 12 on this host")}
    words, healthy = summary(["relay-0"], twins, [], NOW)
    assert words == "2 live processes named relay-0, fencing each other" and not healthy
    seen_by_broker_only = {"relay-0": ("relay-0.11 at /10.0.0.5", "relay-0.12 at /10.0.0.6")}
    assert summary(["relay-0"], seen_by_broker_only, [], NOW)[0].startswith("2 live processes")


def test_a_live_process_out_of_its_group_and_silent_is_not_responding_not_down() -> None:
    stopped = LocalProcess("relay-0", 42, NOW - 31_000)
    words, healthy = summary([], {}, [stopped], NOW)
    assert words == (
        "relay-0 NOT RESPONDING (pid 42 alive, silent for 31 s): do not start another; "
        "inspect or kill it first"
    )
    assert not healthy and "DOWN" not in words
    # Another instance live in the group does not hide the silent one.
    words, healthy = summary(["relay-1"], {}, [stopped], NOW)
    assert words.startswith("live, 1 instance(s); relay-0 NOT RESPONDING") and not healthy


def test_a_process_just_started_is_starting_and_none_at_all_is_down() -> None:
    fresh = LocalProcess("relay-0", 43, NOW - int(SILENT_S * 1000) + 500)
    assert summary([], {}, [fresh], NOW) == (
        "STARTING (relay-0 pid 43 alive, not yet in its group)",
        False,
    )
    assert summary([], {}, [], NOW) == ("DOWN (no live instance)", False)
    member = LocalProcess("relay-0", 44, NOW - 60_000)  # in its group: the broker says live
    assert summary(["relay-0"], {}, [member], NOW) == ("live, 1 instance(s)", True)


def test_local_presences_keep_this_hosts_live_processes_with_their_last_beat(
    tmp_path: Path,
) -> None:
    path = announce(tmp_path, "relay", "0")
    old = time.time() - 100
    os.utime(path, (old, old))
    other_host = tmp_path / PROCESSES_DIR / "relay-1.7.json"
    other_host.write_text(json.dumps({"pid": os.getpid(), "host": "elsewhere", "name": "relay-1"}))
    dead = tmp_path / PROCESSES_DIR / "relay-2.8.json"
    dead.write_text(json.dumps({"pid": 8, "name": "relay-2"}))
    found = local_presences(tmp_path, alive=lambda pid: pid == os.getpid())
    assert [(p.name, p.pid) for p in found] == [("relay-0", os.getpid())]
    assert abs(found[0].beat_ms - old * 1000) < 1000

    clock = [0.0]
    beat = Presence(path, every_s=1.0, monotonic=lambda: clock[0])
    beat.beat()  # within the interval: not touched
    assert abs(local_presences(tmp_path)[0].beat_ms - old * 1000) < 1000
    clock[0] = 1.5
    beat.beat()
    assert local_presences(tmp_path)[0].beat_ms > (time.time() - 5) * 1000
    path.unlink()
    clock[0] = 3.0
    beat.beat()  # the file gone: no error
