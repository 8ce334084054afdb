"""The conformance check's ``relay-seams`` claim: a relay killed at a seam, resumed.

A relay killed after its ``ATTEMPTED`` marker and before the send, or after
the system committed and before the receipt, resumes with its own decisions
(:func:`ledger.delivery.next_step`) run here against the real adapter; the
claim holds when what it would record agrees with what the system holds.
"""

from __future__ import annotations

from typing import Any

from ledger.delivery import (
    BEFORE_RECEIPT,
    BEFORE_SEND,
    Observation,
    Observed,
    Receipt,
    Situation,
    next_step,
)
from sinks.probe import ClaimResult, Probe

#: The seams the check plays: (seam, whether the system committed before the kill).
SEAMS: tuple[tuple[str, bool], ...] = ((BEFORE_SEND, False), (BEFORE_RECEIPT, True))

#: How many steps a resumed relay may take before the check calls it a loop.
RESUME_STEPS = 8


def seams(probe: Probe) -> ClaimResult:
    """The ``relay-seams`` claim: a relay killed at each seam and resumed agrees with the system."""
    if probe.contract.reservation:
        return ClaimResult(
            "relay-seams",
            "untested",
            "a reservation sink's seams (hold, confirm, cancel) are proven by the crash "
            "harness, not here",
        )
    seen = []
    for seam, committed_first in SEAMS:
        op, _ = probe.op()
        if committed_first:
            first = probe.submit(op, probe.params())  # its answer dies with the relay
            if first.status != "committed":
                return ClaimResult(
                    "relay-seams", "untested", f"{seam}: the first submit {first.status}"
                )
        ended, sends = _resume(probe, op)
        problem = _seam_problem(probe, op, committed_first, ended, sends)
        if problem is not None:
            return ClaimResult("relay-seams", "fails", f"killed {seam}: {problem}")
        said = ended.status if ended is not None else "nothing recorded"
        seen.append(f"{seam} -> {said} after {', '.join(sends) or 'no request'}")
    return ClaimResult(
        "relay-seams",
        "holds",
        "; ".join(seen) + " (after_receipt_before_commit meets the system as "
        "after_sink_commit_before_receipt does)",
    )


def _resume(probe: Probe, op: str) -> tuple[Receipt | Observation | None, list[str]]:
    """Run a resumed relay's decisions for ``op`` against the adapter.

    Returns:
        ``(the last record it would write, or None; the requests it sent)``;
        a request that could not be sent ends the run (the relay parks it).
    """
    situation = Situation(
        kind="EXECUTE", mode="ledger", fresh=False, first_attempt_ms=0, now_ms=1_000
    )
    history: list[Observed] = []
    sends: list[str] = []
    last: Receipt | Observation | None = None
    for _ in range(RESUME_STEPS):
        decision = next_step(probe.contract, situation, history)
        if decision.records:
            last = decision.records[-1]
        if decision.send is None:
            break
        request = decision.send.request
        sends.append(request + (" again" if decision.send.resubmit else ""))
        answer: Any
        if request == "submit":
            answer = probe.submit(op, probe.params())
        elif request == "readback":
            answer = probe.port.readback(op, 1 if probe.contract.fencing else None)
        else:
            break  # a reservation's requests: not played here
        history.append(Observed.of(request, answer, resubmit=decision.send.resubmit))
    return last, sends


def _seam_problem(
    probe: Probe,
    op: str,
    committed_first: bool,
    ended: Receipt | Observation | None,
    sends: list[str],
) -> str | None:
    """Why the resumed relay's record disagrees with the system, or ``None``."""
    status = ended.status if ended is not None else None
    effects = probe.effects(op)
    if effects is not None and effects > 1:
        return f"the system holds {effects} effects of {op} after {', '.join(sends)}"
    submits = sum(1 for r in sends if r.startswith("submit")) + committed_first
    if not probe.contract.idempotent and submits > 1:
        return f"{op} was submitted again without an idempotency key: {', '.join(sends)}"
    if status == "COMMITTED" and effects == 0:
        return f"recorded COMMITTED, but the system holds no effect of {op}"
    if status == "ABSENT" and (committed_first or effects):
        return (
            f"the readback answered absent for {op}, which the system committed: the "
            "relay would send it again"
        )
    if status in ("REJECTED", "KEY_REUSED", "STALE_TOKEN") and committed_first:
        return f"recorded {status} for {op}, which the system committed"
    return None
