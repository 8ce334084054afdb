"""Fault hooks: a stage process dies (SIGKILL), or stalls (SIGSTOP), at a named seam when armed.

A game-day runner or the demo arms a hook by writing a small file under
``{run_dir}/faults/``; each stage calls :func:`seam` at every named seam.
When a hook for that seam (and operation, or any operation) is armed, its
remaining count is decremented durably first, then the process sends itself
SIGKILL: a real crash, with no ``finally`` blocks, flushes or commits.

A pause hook (:func:`arm_pause`) names one process (``relay-0``): that
process, reaching the seam for the operation, logs the firing and sends
itself SIGSTOP. It stays alive holding what it held (a dispatch it is about
to send, an open transaction) until someone sends it SIGCONT: a stalled
owner, and a zombie once continued.

A skew (:func:`set_skew`) names one component: from then on every process of
that component reads the ledger clock shifted by that many seconds (a replica
whose clock runs ahead or behind). It is read at every reading, so it takes
effect in running processes too.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import time
from pathlib import Path

from consumers.hooks import SEAMS
from ledger.clock import Clock

ANY = "*"


def _file(run_dir: Path, seam: str, operation_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", operation_id) if operation_id != ANY else "ANY"
    return run_dir / "faults" / f"{seam}--{safe}.json"


def arm(run_dir: Path, seam: str, operation_id: str = ANY, times: int = 1) -> Path:
    """Arm a fault hook.

    Args:
        run_dir: the ledger run folder shared by all processes.
        seam: one of :data:`SEAMS`.
        operation_id: the operation whose arrival at the seam kills the
            process, or ``"*"`` for any operation.
        times: how many times it fires.

    Returns:
        The hook file.

    Raises:
        ValueError: for an unknown seam or a non-positive count.
    """
    if seam not in SEAMS:
        raise ValueError(f"unknown seam {seam!r}; seams are: {', '.join(SEAMS)}")
    if times < 1:
        raise ValueError("times must be at least 1")
    path = _file(run_dir, seam, operation_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"seam": seam, "operation_id": operation_id, "times": times}))
    os.replace(tmp, path)
    return path


def _pause_file(run_dir: Path, process: str, seam: str, operation_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", operation_id)
    return run_dir / "faults" / f"pause--{process}--{seam}--{safe}.json"


def arm_pause(run_dir: Path, process: str, seam: str, operation_id: str) -> Path:
    """Arm a pause hook: ``process`` stops itself (SIGSTOP) at ``seam`` for that operation, once.

    Args:
        run_dir: the ledger run folder shared by all processes.
        process: the stage process, ``{component}-{instance}`` (e.g. ``relay-0``).
        seam: one of :data:`SEAMS`.
        operation_id: the operation whose arrival at the seam stops the process.

    Returns:
        The hook file.

    Raises:
        ValueError: for an unknown seam.
    """
    if seam not in SEAMS:
        raise ValueError(f"unknown seam {seam!r}; seams are: {', '.join(SEAMS)}")
    path = _pause_file(run_dir, process, seam, operation_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"seam": seam, "operation_id": operation_id, "times": 1, "pause": process})
    )
    os.replace(tmp, path)
    return path


def armed(run_dir: Path) -> list[dict[str, object]]:
    """The hooks still armed (for reports)."""
    folder = run_dir / "faults"
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _take(path: Path) -> bool:
    """Claim one firing of the hook at ``path``; True if it should fire."""
    claimed = path.with_suffix(f".claim{os.getpid()}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return False
    try:
        spec = json.loads(claimed.read_text())
        remaining = int(spec.get("times", 1)) - 1
        if remaining > 0:
            spec["times"] = remaining
            claimed.write_text(json.dumps(spec))
            os.replace(claimed, path)
        else:
            claimed.unlink()
        # Make the decrement durable before dying, so a restart does not re-fire.
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except Exception:
        return False
    return True


def seam(run_dir: Path, name: str, operation_id: str, process: str | None = None) -> None:
    """Stall here (SIGSTOP) or die here (SIGKILL) if a hook is armed for this seam and operation.

    A pause hook for this process is taken first: the process stops until
    SIGCONT and then goes on (a kill hook armed too fires after that).

    Args:
        run_dir: the ledger run folder.
        name: the seam reached.
        operation_id: the operation being handled.
        process: this process's name (``relay-0``) for pause hooks; None: none fire.
    """
    folder = run_dir / "faults"
    if not folder.is_dir():
        return
    if process is not None and _take(_pause_file(run_dir, process, name, operation_id)):
        _log_firing(folder, name, operation_id, action="pause")
        os.kill(os.getpid(), signal.SIGSTOP)
    for op in (operation_id, ANY):
        if _take(_file(run_dir, name, op)):
            _log_firing(folder, name, operation_id)
            os.kill(os.getpid(), signal.SIGKILL)


#: One JSON line per firing: ``{"at": unix seconds, "seam", "operation_id", "pid", "process",
#: "action"}`` (``action``: ``kill`` or ``pause``).
FIRED_LOG = "fired.jsonl"


def _log_firing(folder: Path, name: str, operation_id: str, action: str = "kill") -> None:
    line = json.dumps(
        {
            "at": time.time(),
            "seam": name,
            "operation_id": operation_id,
            "pid": os.getpid(),
            "process": " ".join(sys.argv[1:4]),
            "action": action,
        }
    )
    fd = os.open(folder / FIRED_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def fired(run_dir: Path) -> list[dict[str, object]]:
    """Every firing so far, oldest first (see :data:`FIRED_LOG`)."""
    path = run_dir / "faults" / FIRED_LOG
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by the SIGKILL that followed it
    return out


def _skew_file(run_dir: Path, component: str) -> Path:
    return run_dir / "faults" / f"skew--{component}.json"


def set_skew(run_dir: Path, component: str, seconds: float) -> Path:
    """Shift the ledger clock every process of ``component`` reads, from now on.

    Args:
        run_dir: the ledger run folder shared by all processes.
        component: a stage (``authority``, ``relay``, ``processor``); a
            component that reads no clock is unaffected.
        seconds: the shift (positive: the component's clock runs ahead);
            it replaces any earlier skew of the component (0 removes it).

    Returns:
        The skew file.

    Raises:
        ValueError: for a shift that is not a finite number.
    """
    if not math.isfinite(seconds):
        raise ValueError(f"a clock skew is a finite number of seconds, not {seconds!r}")
    path = _skew_file(run_dir, component)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"component": component, "skew_ms": int(round(seconds * 1000))}))
    os.replace(tmp, path)
    return path


def skew_ms(run_dir: Path, component: str) -> int:
    """The shift (milliseconds) of ``component``'s clock now: 0 when none is set.

    A skew file that cannot be read counts as none: a testbed's own file, never
    an input an operator writes.
    """
    try:
        return int(json.loads(_skew_file(run_dir, component).read_text())["skew_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


class SkewedClock:
    """A :class:`~ledger.clock.Clock` read through a component's skew (:func:`set_skew`).

    Args:
        base: the clock the settings name.
        run_dir: the run folder holding the skew files.
        component: whose skew applies.
    """

    def __init__(self, base: Clock, run_dir: Path, component: str) -> None:
        self.base = base
        self.run_dir = run_dir
        self.component = component

    def now_ms(self) -> int:
        """The base clock's reading plus the component's skew now (milliseconds)."""
        return self.base.now_ms() + skew_ms(self.run_dir, self.component)


class ArmedFaults:
    """Fault hooks (:class:`consumers.hooks.FaultHooks`) that fire the hooks armed in a run folder.

    Only the testbed hands these to a stage (``python -m testbed.stage``);
    a production stage gets :data:`consumers.hooks.NO_FAULTS`.

    Args:
        run_dir: the ledger run folder whose ``faults/`` holds armed hooks.
        process: this process's name (``relay-0``), which pause hooks name;
            None: no pause hook fires.
        component: the stage (``relay``), whose clock skew applies; None: none.
    """

    def __init__(
        self, run_dir: Path, process: str | None = None, component: str | None = None
    ) -> None:
        self.run_dir = run_dir
        self.process = process
        self.component = component

    def clock(self, base: Clock) -> Clock:
        """``base`` shifted by this component's skew (see :func:`set_skew`)."""
        if self.component is None:
            return base
        return SkewedClock(base, self.run_dir, self.component)

    def seam(self, name: str, operation_id: str) -> None:
        """SIGSTOP or SIGKILL this process if a hook is armed for ``name`` and the operation.

        See :func:`seam`.
        """
        seam(self.run_dir, name, operation_id, self.process)
