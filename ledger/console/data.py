"""What the operator console reads and writes.

The :class:`ConsoleData` port, and :class:`LedgerData`, the ledger's.

No web framework here: the pages (:mod:`ledger.console.app`) read through
the port, so they can be tested without a broker, and this module loads in
a core install.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from consumers.auditor import run_audit
from consumers.groups import stage_status
from consumers.history import UnknownOperationError, read_history
from consumers.liveness import SILENT_S
from consumers.reader import current_states, wait_for_decision
from consumers.reconciler import open_items
from consumers.reverify import read_back_now
from consumers.stranding import ledger_stranded
from consumers.twins import local_presences
from ledger.clock import age_s, clock_for
from ledger.credentials import person_key
from ledger.errors import LedgerError
from ledger.events import OperationState
from ledger.history import journal_move
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.stranded import Stranded
from producers.publisher import LedgerPublisher, build_disposition

#: Disposition decisions, as the form offers them (``ledger reconcile dispose --decision``).
DECISIONS: dict[str, str] = {
    "committed": "committed: the effect happened",
    "absent": "absent: it did not (execute the same operation again)",
    "abandon": "abandon: give the operation up",
}

#: States an operator has to act on (the audit's open items).
OPEN_STATES: tuple[S, ...] = (S.UNKNOWN_OUTCOME, S.NEEDS_REAUTHORISATION, S.ABANDONED)

#: Longest evidence text a disposition form accepts (characters).
MAX_EVIDENCE = 2000

#: Most operations one page lists.
MAX_ROWS = 500


@dataclass(frozen=True)
class StageHealth:
    """What the console knows of one stage instance or group.

    Attributes:
        name: ``component-instance`` or a consumer group / endpoint name.
        source: where it was read: ``status file``, ``consumer group`` or ``metrics``.
        ok: healthy (``None``: unknown).
        ready: ready (assigned and restored; ``None``: unknown).
        detail: one line for the operator.
    """

    name: str
    source: str
    ok: bool | None
    ready: bool | None
    detail: str


@dataclass
class AuditRun:
    """The latest audit run by this console (``report`` is ``AuditReport.to_dict()``)."""

    ran_at_ms: int
    read_sinks: bool
    report: dict[str, Any] = field(default_factory=dict)


class ConsoleData(Protocol):
    """What the console reads and writes (a port; :class:`LedgerData` is the ledger's)."""

    def now_ms(self) -> int:
        """The ledger clock, milliseconds."""

    def operations(self) -> list[OperationState]:
        """Every operation's current state."""

    def queue(self) -> list[OperationState]:
        """Operations held in UNKNOWN_OUTCOME and queued for reconciliation, oldest first."""

    def history(self, operation_id: str) -> dict[str, Any] | None:
        """One operation's history as plain data, or ``None`` when none can be read."""

    def operators(self) -> list[str]:
        """Operators whose signing key is on this host (sorted)."""

    def dispose(self, operation_id: str, decision: str, by: str, evidence: str) -> str:
        """Publish a disposition signed by ``by``; return one line saying the outcome.

        Raises:
            LedgerError: it could not be signed or published.
        """

    def audit(self, read_sinks: bool) -> dict[str, Any]:
        """Run the auditor; its report as ``AuditReport.to_dict()``."""

    def stages(self) -> list[StageHealth]:
        """Health of the ledger's stages."""

    def stranded(self) -> list[Stranded]:
        """Operations stranded short of where they should rest, oldest first."""

    def read_back(self, operation_id: str) -> str:
        """Read back one operation now (a verification or an effect readback.

        Never the effect's request) and record it; return one line saying what was observed.

        Raises:
            LedgerError: it could not be read back or recorded.
        """


def operation_age_s(state: OperationState, now_ms: int) -> float | None:
    """Seconds on the ledger clock since the operation's latest observation.

    Without an observation, since its admission (``None``: neither happened); never
    negative.
    """
    since = state.observed_at_ms if state.observed_at_ms is not None else state.admitted_at_ms
    return age_s(now_ms, since)


# ---------------------------------------------------------------------- the ledger's data


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LedgerData:
    """The console's data from a real ledger (Kafka, the run folder, the stages).

    Args:
        settings: the ledger's settings.
        metrics: stage name -> base URL of its metrics server (``/healthz``,
            ``/readyz``), in addition to any a stage's status file names.
        wait_s: how long a disposition waits for the processor's decision (seconds).
    """

    def __init__(
        self, settings: LedgerSettings, metrics: Mapping[str, str] | None = None, wait_s: float = 15
    ) -> None:
        self.settings = settings
        self.metrics = dict(metrics or {})
        self.wait_s = wait_s

    def now_ms(self) -> int:
        """The ledger clock (system, or the testbed's manual one), milliseconds."""
        return clock_for(self.settings.clock, self.settings.run_dir).now_ms()

    def operations(self) -> list[OperationState]:
        """Every operation in ``ledger.state`` (as ``ledger state`` reads them)."""
        return sorted(current_states(self.settings).values(), key=lambda st: st.operation_id)

    def queue(self) -> list[OperationState]:
        """The reconciliation queue (as ``ledger reconcile list`` reads it)."""
        return open_items(self.settings)

    def history(self, operation_id: str) -> dict[str, Any] | None:
        """The operation's history, ``None`` when no record is about it.

        The operation's history (``History.to_dict()``, as ``ledger history --json``),
        ``None`` when no record is about it.
        """
        try:
            return read_history(self.settings, operation_id).to_dict()
        except UnknownOperationError:
            return None

    def operators(self) -> list[str]:
        """Names of ``LEDGER_RUN_DIR/operators/*.key`` (``ledger operator add``)."""
        folder = self.settings.run_dir / "operators"
        return sorted(p.stem for p in folder.glob("*.key")) if folder.is_dir() else []

    def dispose(self, operation_id: str, decision: str, by: str, evidence: str) -> str:
        """Publish a disposition signed with ``by``'s operator key and wait for the decision."""
        state = current_states(self.settings).get(operation_id)
        if state is None:
            return f"not disposed: no operation {operation_id!r} in the ledger"
        pub = LedgerPublisher(self.settings, client_id="ledger-console")
        try:
            pub.credentials.add(person_key(self.settings, "operator", by))
            pub.publish_disposition(
                build_disposition(
                    operation_id,
                    decision,
                    by,
                    evidence,
                    self.now_ms(),
                    episode=state.entered_version,  # the episode it answers
                )
            )
            position = pub.last_position
        finally:
            pub.close()
        if position is None:
            return f"disposition of {operation_id} published"
        topic, partition, offset = position
        entry = wait_for_decision(self.settings, topic, partition, offset, self.wait_s)
        if entry is None:
            return (
                f"disposition of {operation_id} published; no decision within {self.wait_s:g} s "
                "(is the processor running?)"
            )
        return f"{entry.outcome}: {operation_id} {journal_move(entry)} ({entry.reason})"

    def audit(self, read_sinks: bool) -> dict[str, Any]:
        """Run the auditor (``ledger audit``) and return its report."""
        return run_audit(self.settings, read_sinks=read_sinks).to_dict()

    def stranded(self) -> list[Stranded]:
        """The ledger's stranded operations (:func:`consumers.stranding.ledger_stranded`)."""
        return ledger_stranded(self.settings)

    def read_back(self, operation_id: str) -> str:
        """:func:`consumers.reverify.read_back_now`."""
        return read_back_now(self.settings, operation_id)

    def stages(self) -> list[StageHealth]:
        """Status files, consumer-group members and metrics endpoints, in that order."""
        rows = self._status_files()
        rows += self._groups()
        rows += self._endpoints()
        return rows

    def _status_files(self) -> list[StageHealth]:
        rows: list[StageHealth] = []
        folder = self.settings.run_dir / "status"
        # When each process of this host last went round its loop (its file's time).
        beats = {p.pid: p.beat_ms for p in local_presences(self.settings.run_dir)}
        now_ms = int(time.time() * 1000)
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                status = json.loads(path.read_text())
                pid = int(status["pid"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                rows.append(StageHealth(path.stem, "status file", None, None, f"unreadable: {exc}"))
                continue
            alive = _pid_alive(pid)
            waiting = status.get("waiting")
            detail = f"pid {pid} {'running' if alive else 'not running on this host'}"
            if waiting:
                detail += f"; waiting: {waiting}"
            ready = bool(status.get("ready")) and alive
            silent_ms = now_ms - beats[pid] if alive and pid in beats else 0
            if silent_ms > SILENT_S * 1000:  # as `ledger status` says it (consumers.liveness)
                detail += (
                    f"; NOT RESPONDING (silent for {silent_ms / 1000:.0f} s): do not start "
                    "another; inspect or kill it first"
                )
                alive = ready = False
            held = int(status.get("unverifiable_held_count") or 0)
            if held and alive:
                # docs/trust-model.md: a stage that holds work is not healthy.
                detail += (
                    f"; HOLDING {held} key(s) on evidence its keys cannot verify (restore the "
                    "keys folder, then restart it)"
                )
                ready = False
            rows.append(StageHealth(path.stem, "status file", alive and not held, ready, detail))
        return rows

    def _groups(self) -> list[StageHealth]:
        """Each stage's consumer group as ``ledger status`` sees it (members, assignment, lag)."""
        try:
            stages = stage_status(self.settings)
        except LedgerError as exc:
            return [StageHealth("consumer groups", "consumer group", None, None, exc.message)]
        rows: list[StageHealth] = []
        for stage in stages:
            parts = sum(len(m.partitions) for m in stage.members)
            names = (
                ", ".join(sorted(f"{m.instance}@{m.host}" for m in stage.members)) or "no members"
            )
            twins = "".join(
                f"; TWO LIVE PROCESSES named {name} ({', '.join(who)}): give each its own "
                "--instance"
                for name, who in sorted(stage.twins.items())
            )
            rows.append(
                StageHealth(
                    stage.group,
                    "consumer group",
                    stage.live and not stage.twins,
                    stage.live and parts > 0 and not stage.twins,
                    f"{stage.group_state}: {len(stage.members)} member(s), {parts} partition(s) "
                    f"assigned, lag {stage.lag}; {names}{twins}",
                )
            )
        return rows

    def _endpoints(self) -> list[StageHealth]:
        endpoints = dict(self.metrics)
        folder = self.settings.run_dir / "status"
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                status = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            url = status.get("metrics_url") if isinstance(status, dict) else None
            port = status.get("metrics_port") if isinstance(status, dict) else None
            if isinstance(url, str):
                endpoints.setdefault(path.stem, url)
            elif isinstance(port, int):
                endpoints.setdefault(path.stem, f"http://127.0.0.1:{port}")
        rows: list[StageHealth] = []
        for name, base in sorted(endpoints.items()):
            answers: dict[str, bool | None] = {}
            said: list[str] = []
            for probe in ("healthz", "readyz"):
                try:
                    reply = httpx.get(f"{base.rstrip('/')}/{probe}", timeout=2.0)
                    answers[probe] = reply.status_code == 200
                    said.append(f"/{probe} {reply.status_code}")
                except httpx.HTTPError as exc:
                    answers[probe] = None
                    said.append(f"/{probe} unreachable ({type(exc).__name__})")
            rows.append(
                StageHealth(
                    name,
                    "metrics",
                    answers["healthz"],
                    answers["readyz"],
                    f"{base}: " + ", ".join(said),
                )
            )
        return rows
