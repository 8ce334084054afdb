"""The conformance check's probe: fresh operations, submits and effect counts.

:class:`Probe` is what every claim of :mod:`sinks.conformance` drives: it
holds the opened adapter (through the fault proxy), the contract, and the
run's counter of operation IDs (``sink-check:<run>-<n>:v1``), and offers the
few moves the claims are made of: a plain submit, a submit with a fault
armed on the wire, and counting what the system holds of an operation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ledger.contracts import EffectContract
from ledger.identity import parameter_digest
from sinks.client import SubmitResult
from sinks.port import SinkPort
from sinks.wire import COMMIT_POINTS, FaultProxy, WireMode

Verdict = Literal["holds", "fails", "untested"]


@dataclass(frozen=True)
class ClaimResult:
    """One claim's verdict.

    Attributes:
        claim: the claim's name (see the module docstring).
        verdict: ``holds``, ``fails`` or ``untested``.
        detail: what was observed, or why it was not tested.
    """

    claim: str
    verdict: Verdict
    detail: str


class Probe:
    """One check run's probing of one sink, through its fault proxy.

    Args:
        name: the sink's registered name (a digest input).
        contract: the contract the sink declares.
        port: the sink's adapter, opened through ``proxy``.
        proxy: the fault proxy between the adapter and the system.
        scheme: the scheme of the system's URL (where faults can fire).
        run: this run's unique part of every operation ID.
        timeout_s: the adapter's deadline per call, seconds (faults hold
            answers for twice that).
        account: the account the probes credit.
        amount_minor: the amount of each probe, minor units.
        retention_wait_s: the longest key retention the check waits out (seconds).
    """

    def __init__(
        self,
        name: str,
        contract: EffectContract,
        port: SinkPort,
        proxy: FaultProxy,
        *,
        scheme: str,
        run: str,
        timeout_s: float,
        account: str,
        amount_minor: int,
        retention_wait_s: float,
    ) -> None:
        self.name = name
        self.contract = contract
        self.port = port
        self.proxy = proxy
        self.scheme = scheme
        self.run = run
        self.timeout_s = timeout_s
        self.account = account
        self.amount_minor = amount_minor
        self.retention_wait_s = retention_wait_s
        self._n = 0

    def op(self) -> tuple[str, bytes]:
        """A fresh operation ID and its marker on the wire (its unique part)."""
        self._n += 1
        unique = f"{self.run}-{self._n}"
        return f"sink-check:{unique}:v1", unique.encode()

    def params(self, amount_minor: int | None = None) -> dict[str, Any]:
        """A probe's parameters: ``amount_minor`` (default the check's) to the test account."""
        amount = self.amount_minor if amount_minor is None else amount_minor
        return {"account": self.account, "amount_minor": amount, "currency": "GBP"}

    def submit(
        self, op: str, params: dict[str, Any], token: int | None = 1, *, same_key: bool = True
    ) -> SubmitResult:
        """Submit ``op`` with ``params`` under ``token`` (its own key unless not ``same_key``)."""
        digest = parameter_digest(
            action="refund",
            params=params,
            subject=self.account,
            purpose="sink-check",
            decision_version=1,
            sink=self.name,
        )
        return self.port.submit(
            op,
            digest,
            params,
            token if self.contract.fencing else None,
            f"{op}#1",
            self.contract.idempotent and same_key,
            action="refund",
            subject=self.account,
            purpose="sink-check",
            decision_version=1,
        )

    def faulted(self, mode: WireMode) -> tuple[str, SubmitResult, bool]:
        """Submit a fresh operation with ``mode`` armed; whether the fault fired."""
        op, marker = self.op()
        fault = self.proxy.arm(
            marker,
            mode,
            commit_point=COMMIT_POINTS.get(self.scheme),
            hold_s=2 * self.timeout_s + 1,
        )
        result = self.submit(op, self.params())
        fired = fault is not None and fault.fired.is_set()
        self.proxy.clear()
        return op, result, fired

    def effects(self, op: str) -> int | None:
        """How many effects the system holds for ``op`` (``None``: it cannot say)."""
        if not self.contract.readback:
            return None
        rb = self.port.readback(op, None)
        return rb.effects if rb.status == "committed" else 0 if rb.status == "absent" else None

    def count_effects(
        self, op: str, effect_id: str | None
    ) -> tuple[list[str], list[str], list[str]]:
        """What the system shows of ``op``'s effects.

        A tuple (one effect seen by, more than one seen by, could not count because),
        from its readback and its postcondition query.
        """
        ones: list[str] = []
        doubts: list[str] = []
        unknown: list[str] = []
        if self.contract.readback:
            rb = self.port.readback(op, None)
            if rb.status != "committed":
                unknown.append(f"readback answered {rb.status!r}, not the committed effect")
            elif rb.effects > 1:
                doubts.append(f"readback counts {rb.effects} effects")
            elif rb.effect_id and effect_id and rb.effect_id != effect_id:
                doubts.append(
                    f"readback names effect {rb.effect_id}, the resubmit {effect_id}: two effects"
                )
            else:
                ones.append("one effect read back")
        query = self.contract.postcondition_query()
        if query is not None:
            seen = self.port.postcondition(query, self.account)
            mine = [c for c in seen.credits if c.operation_id == op]
            if seen.status != "observed":
                unknown.append(f"the postcondition query answered {seen.status!r}")
            elif len(mine) > 1:
                doubts.append(f"{self.account} shows {len(mine)} credits of {op}")
            elif len(mine) == 1:
                ones.append("one credit on the account")
            else:
                unknown.append(f"the postcondition query shows no credit of {op}")
        return ones, doubts, unknown
