"""A stage's status file: whether it is ready, what it waits for, what it holds.

``run_dir/status/{component}-{instance}.json``, read by harnesses, ``ledger
status`` and ``ledger console``; written atomically (a temporary file
replaced), so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
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
