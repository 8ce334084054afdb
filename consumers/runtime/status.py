"""A stage's status file: whether it is ready, what it waits for, what it holds.

``run_dir/status/{component}-{instance}.json``, read by harnesses, ``ledger
status`` and ``ledger console``; written atomically (a temporary file
replaced), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_status(
    path: Path,
    *,
    ready: bool,
    waiting: dict[str, Any] | None,
    metrics_port: int | None,
    held: dict[str, str],
) -> None:
    """Write ``{"pid", "ready", "waiting", "metrics_port", "unverifiable_held", ...}``.

    Args:
        path: the status file.
        ready: the process has its partitions and nothing left from start-up.
        waiting: ``None``, or what it waits for while Kafka does not answer
            (``{"for", "error", "since"}``, since in Unix seconds, see
            :attr:`consumers.retry.KafkaRetry.waiting`).
        metrics_port: where it serves ``/metrics``, ``/healthz``, ``/readyz``
            (``None``: not serving); ``ledger console`` probes it on this host.
        held: keys held for evidence the stage cannot verify (key -> record
            and reason); up to 50 are written, with the full count
            (``unverifiable_held_count``).

    Raises:
        OSError: the run folder cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    status = {
        "pid": os.getpid(),
        "ready": ready,
        "waiting": waiting,
        "metrics_port": metrics_port,
        "unverifiable_held": dict(sorted(held.items())[:50]),
        "unverifiable_held_count": len(held),
    }
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def status_path(run_dir: Path, component: str, instance: str) -> Path:
    """Where an instance says it is ready: ``run_dir/status/{component}-{instance}.json``."""
    return run_dir / "status" / f"{component}-{instance}.json"


class StatusFile:
    """One stage instance's status file, rewritten when what it says changes.

    Args:
        path: the file (see :func:`status_path`).
        waiting: what the stage waits for now (``None``: nothing; see
            :attr:`consumers.retry.KafkaRetry.waiting`).
        metrics_port: where the stage serves its metrics (``None``: not serving).
        held: keys held for evidence the stage cannot verify (key -> record and reason).
    """

    def __init__(
        self,
        path: Path,
        waiting: Callable[[], dict[str, Any] | None],
        metrics_port: Callable[[], int | None],
        held: Callable[[], dict[str, str]],
    ) -> None:
        self.path = path
        #: the stage has its partitions and nothing left from start-up (as last written).
        self.ready = False
        self._waiting = waiting
        self._metrics_port = metrics_port
        self._held = held
        #: how many keys ``held`` named at the last write.
        self._held_written = 0

    def write(self) -> None:
        """Write the file (:func:`write_status`).

        Raises:
            OSError: the run folder cannot be written.
        """
        write_status(
            self.path,
            ready=self.ready,
            waiting=self._waiting(),
            metrics_port=self._metrics_port(),
            held=self._held(),
        )

    def report_ready(self, seen: bool, settled: Callable[[], bool]) -> None:
        """Say the stage is ready once it has seen its assignment and ``settled()``.

        Also rewrites the file when the number of keys held changed.

        Args:
            seen: the member has received an assignment.
            settled: the stage's start-up work after it is done (asked only
                while not yet ready, with an assignment seen).
        """
        held = len(self._held())
        if held != self._held_written:
            self._held_written = held
            self.write()
        if self.ready or not seen or not settled():
            return
        self.ready = True
        self.write()
