"""Two live processes with one instance name, as the broker shows them.

A stage instance is the static member ``{component}-{instance}`` of its
component's group (KIP-345) and owns the transactional ID
``{prefix}.{component}.{instance}``. Two processes given the same name (a
Deployment where a StatefulSet belongs, a forgotten ``LEDGER_INSTANCE``)
take that place from each other: each join fences the other
(``FENCED_INSTANCE_ID``), which rejoins and fences back, about once a
second. At any instant the group lists one member, so a single look shows
one instance.

What tells them apart is the client ID: a stage's consumer names its
process (``{component}-{instance}.{pid}``), and the broker reports each
member's client ID and address. :func:`incarnations` looks at the groups a
few times over a short bound and keeps every (client ID, address) seen per
member name; :func:`twins` (pure) keeps the names held by more than one
process. A process restarted in the window also shows two incarnations; the
report says so, and a second look tells (a restart leaves one).

The broker shows the alternation only while both processes' consumers keep
rejoining; a consumer fenced out of its static membership
(``FENCED_INSTANCE_ID``) may stay out while its producer goes on fencing
the other's transactions. So each stage process also leaves a file of its
own in the run folder (:func:`announce`): on the host they share, ``ledger
status`` counts the live processes per name (:func:`local_processes`)
whatever the broker shows, and a stage fenced out of its membership logs an
error naming the cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Seconds :func:`incarnations` keeps looking (two fencing rounds at about 1 s each).
LOOK_S = 2.5

#: Seconds between two looks.
LOOK_EVERY_S = 0.5


def client_id(component: str, instance: str, pid: int) -> str:
    """A stage consumer's client ID: its member name and its process (``relay-0.4711``)."""
    return f"{component}-{instance}.{pid}"


@dataclass(frozen=True, order=True)
class Incarnation:
    """One process seen holding a member name.

    Attributes:
        client_id: the client ID it gave (``relay-0.4711``).
        host: the address the broker sees it from.
    """

    client_id: str
    host: str

    def __str__(self) -> str:
        return f"{self.client_id} at {self.host}"


def twins(seen: Mapping[str, Iterable[Incarnation]]) -> dict[str, tuple[Incarnation, ...]]:
    """Member names held by more than one process (pure).

    Args:
        seen: member name (``relay-0``) -> every incarnation seen holding it.

    Returns:
        member name -> its incarnations, sorted, for the names with two or more.
    """
    out: dict[str, tuple[Incarnation, ...]] = {}
    for name, found in seen.items():
        distinct = tuple(sorted(set(found)))
        if len(distinct) > 1:
            out[name] = distinct
    return out


def members_of(description: Any) -> dict[str, Incarnation]:
    """Member name -> who holds it now, from one ``describe_consumer_groups`` answer."""
    return {
        (m.group_instance_id or m.client_id): Incarnation(m.client_id, m.host)
        for m in description.members
    }


def incarnations(
    describe: Callable[[], Mapping[str, Any]],
    first: Mapping[str, Any],
    look_s: float = LOOK_S,
    every_s: float = LOOK_EVERY_S,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, dict[str, set[Incarnation]]]:
    """Look at the groups again for ``look_s`` seconds; collect who held each member name.

    Args:
        describe: asks the broker once: group ID -> its description.
        first: the answer already in hand (looked at first).
        look_s: how long to keep looking (seconds; 0: the first answer only).
        every_s: pause between looks (seconds).
        monotonic: the clock the bound is kept with (injected for tests).
        sleep: how to pause (injected for tests).

    Returns:
        group ID -> member name -> incarnations seen.

    Raises:
        KafkaException: as ``describe`` raises it.
    """
    seen: dict[str, dict[str, set[Incarnation]]] = {}

    def note(answer: Mapping[str, Any]) -> None:
        for group, description in answer.items():
            for name, who in members_of(description).items():
                seen.setdefault(group, {}).setdefault(name, set()).add(who)

    note(first)
    deadline = monotonic() + look_s
    while monotonic() + every_s <= deadline:
        sleep(every_s)
        note(describe())
    return seen


def fenced_out(err: Any) -> bool:
    """Tell whether a consumer error says another member joined with this static member ID.

    librdkafka raises it as ``FENCED_INSTANCE_ID``, or as a fatal error
    (``_FATAL``) whose text names it.
    """
    from confluent_kafka import KafkaError

    if err.code() == KafkaError.FENCED_INSTANCE_ID:
        return True
    text = str(err.str()).lower()
    return bool(err.fatal()) and "fenced" in text and "instance" in text


def fenced_out_text(name: str, err: Any) -> str:
    """The error a stage logs when it was fenced out of its static membership."""
    return (
        f"{name}: another process took this instance's place in its group ({err}): two "
        "live processes share the instance name and fence each other; give each its own "
        "--instance or LEDGER_INSTANCE (`ledger status` names them)"
    )


# ------------------------------------------------------------- on this host

#: Folder (under the run folder) where each stage process says it lives.
PROCESSES_DIR = "status/processes"


def announce(run_dir: Path, component: str, instance: str) -> Path:
    """Say that this process runs ``{component}-{instance}`` (a file of its own).

    The stage's status file (``status/{component}-{instance}.json``) is one per
    instance name, so two processes with one name overwrite each other's;
    this file is one per process, so ``ledger status`` on this host counts them.

    Returns:
        The file written (``status/processes/{component}-{instance}.{pid}.json``),
        for :func:`withdraw`.
    """
    folder = run_dir / PROCESSES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{component}-{instance}.{os.getpid()}.json"
    path.write_text(
        json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "name": f"{component}-{instance}"}
        )
    )
    return path


def withdraw(path: Path | None) -> None:
    """Remove this process's file (a clean stop; a crash leaves it, and its PID is dead)."""
    if path is not None:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it runs
    return True


def local_processes(run_dir: Path, alive: Callable[[int], bool] = _alive) -> dict[str, list[int]]:
    """Member name (``relay-0``) -> PIDs of the live processes on this host that run it.

    Args:
        run_dir: the run folder the stages share.
        alive: tells whether a PID runs (injected for tests).
    """
    out: dict[str, list[int]] = {}
    folder = run_dir / PROCESSES_DIR
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            name, pid = str(data["name"]), int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(pid):
            out.setdefault(name, []).append(pid)
    return {name: sorted(pids) for name, pids in out.items()}


#: Seconds between two touches of a process's file (:class:`Presence`).
BEAT_EVERY_S = 1.0


class Presence:
    """A stage process's file (:func:`announce`), touched as its loop goes round.

    The file's modification time is the process's last heartbeat on this
    host: ``ledger status`` tells a process that is alive but silent
    (stopped with SIGSTOP, or stuck) from one that is gone.

    Args:
        path: the file :func:`announce` wrote.
        every_s: touch it at most this often (seconds).
        monotonic: the clock the interval is kept with (injected for tests).
    """

    def __init__(
        self,
        path: Path,
        every_s: float = BEAT_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.every_s = every_s
        self._monotonic = monotonic
        self._last = monotonic()

    def beat(self) -> None:
        """Touch the file if ``every_s`` has passed since the last touch (never raises)."""
        now = self._monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        # The run folder gone: status then sees no file; never a crash of the loop.
        with contextlib.suppress(OSError):
            os.utime(self.path)


@dataclass(frozen=True)
class LocalProcess:
    """A live stage process of this host, from its file (:func:`announce`).

    Attributes:
        name: the member name it runs (``relay-0``).
        pid: its process ID.
        beat_ms: when its loop last went round (its file's modification
            time, wall clock, milliseconds).
    """

    name: str
    pid: int
    beat_ms: int


def local_presences(
    run_dir: Path, alive: Callable[[int], bool] = _alive, host: str | None = None
) -> list[LocalProcess]:
    """The live stage processes of this host that announced themselves in ``run_dir``.

    Args:
        run_dir: the run folder the stages share.
        alive: tells whether a PID runs (injected for tests).
        host: this host's name (default ``socket.gethostname()``): a file
            written on another host sharing the folder names a PID of that
            host, which says nothing here.

    Returns:
        One per process whose file names this host and whose PID runs, by name.
    """
    here = socket.gethostname() if host is None else host
    found: list[LocalProcess] = []
    folder = run_dir / PROCESSES_DIR
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            name, pid = str(data["name"]), int(data["pid"])
            beat_ms = int(path.stat().st_mtime * 1000)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if data.get("host", here) == here and alive(pid):
            found.append(LocalProcess(name, pid, beat_ms))
    return sorted(found, key=lambda p: (p.name, p.pid))
