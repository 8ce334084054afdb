"""What ``ledger status`` says of one stage on its summary line (pure).

The summary must not contradict the lines under it, and its remedy must
not make things worse:

* two processes hold one instance name (:mod:`consumers.twins`): the
  summary says so (``2 live processes named relay-0, fencing each other``),
  not ``live, 1 instance(s)``;
* a process of this host announced itself (its file in the run folder) and
  runs, but is not in its group and its loop has not gone round for
  :data:`SILENT_S` seconds (stopped with SIGSTOP, or stuck): it is ``NOT
  RESPONDING``, not ``DOWN``; "start the stage" would start a second
  process with its name, so the words say to inspect or kill it first;
* one that announced itself less than :data:`SILENT_S` ago and is not yet
  in its group is ``STARTING``.

No clock and no I/O: the caller passes the processes of this host
(:func:`consumers.twins.local_presences`) and the time now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from consumers.twins import LocalProcess

#: Seconds a process of this host may go without its loop going round before it
#: is said to be not responding (the broker drops a silent member within its
#: session timeout; this is the same order).
SILENT_S = 10.0


def _count(processes: Sequence[str]) -> int:
    """Distinct processes among a twin's incarnations (this host's PIDs when listed)."""
    here = [p for p in processes if p.endswith("on this host")]
    return len(here) if here else len(processes)


def summary(
    members: Sequence[str],
    twins: Mapping[str, Sequence[str]],
    local: Sequence[LocalProcess],
    now_ms: int,
    silent_s: float = SILENT_S,
) -> tuple[str, bool]:
    """The words of a stage's summary line, and whether they are healthy.

    Args:
        members: the member names in the stage's group (``relay-0``).
        twins: member name -> the processes seen holding it (two or more).
        local: this host's live processes of this stage (any name).
        now_ms: wall clock now (milliseconds; the clock of ``beat_ms``).
        silent_s: seconds without a heartbeat after which a process that is
            not in its group is not responding.

    Returns:
        ``(words, healthy)``: e.g. ``("live, 2 instance(s)", True)``,
        ``("2 live processes named relay-0, fencing each other", False)``,
        ``("NOT RESPONDING (pid 42 alive, silent for 31 s): do not start
        another; inspect or kill it first", False)`` or ``("DOWN (no live
        instance)", False)``.
    """
    if twins:
        words = "; ".join(
            f"{_count(who)} live processes named {name}, fencing each other"
            for name, who in sorted(twins.items())
        )
        return words, False
    absent = [p for p in local if p.name not in members]
    silent = [p for p in absent if now_ms - p.beat_ms > silent_s * 1000]
    starting = [p for p in absent if p not in silent]
    quiet = "; ".join(
        f"{p.name} NOT RESPONDING (pid {p.pid} alive, silent for "
        f"{max(0, now_ms - p.beat_ms) / 1000:.0f} s): do not start another; inspect or kill "
        "it first"
        for p in silent
    )
    if members:
        words = f"live, {len(members)} instance(s)"
        return (f"{words}; {quiet}", False) if quiet else (words, True)
    if quiet:
        return quiet, False
    if starting:
        pids = ", ".join(f"{p.name} pid {p.pid}" for p in starting)
        return f"STARTING ({pids} alive, not yet in its group)", False
    return "DOWN (no live instance)", False
