"""The conformance check: does a registered sink keep the contract it declares?

``ledger sink check NAME`` opens the sink's adapter through a fault proxy
(:mod:`sinks.wire`) placed between the adapter and the real system, and
drives it through the failures the relay meets: a response lost after the
commit, timeouts on each side of the commit, a reset, a stale fencing token,
the same key with other parameters. It then reports, claim by claim, which
parts of the declared contract hold. Every probe is a real request with an
operation ID of its own (``sink-check:<run>-<n>:v1``) and makes at most a
real effect of ``amount_minor`` (default 1) to ``account``: run it against a
test account, or a staging system.

Claims (each ``holds``, ``fails`` or ``untested`` with the reason):

* ``answers`` -- the system answers its health probe.
* ``commits`` -- a plain submit commits.
* ``ambiguity-is-reported`` -- a submit whose answer is lost or late is
  ``ambiguous`` (or ``unavailable`` with ``sent=False`` when nothing left),
  never ``committed`` nor ``rejected``: the relay then reads back or holds.
* ``idempotent`` -- after a lost response, a resubmit under the same key
  answers the first effect, and the system holds one effect (read back).
* ``key-reuse-refused`` -- the same key with other parameters is refused as
  ``key_reused``, never a second effect.
* ``readback`` -- a committed operation reads back ``committed`` with its
  digest and one effect; an unknown one ``absent``; one whose request never
  reached the commit ``absent``.
* ``fencing`` -- a lower fencing token than the highest seen is refused
  (submit and readback).
* ``postcondition`` -- the contract's business query sees the effect.
* ``key-retention`` -- a resubmit a second inside the declared retention still
  answers the first effect (untested when the retention is longer than the
  check's patience, ``retention_wait_s``).

* ``relay-seams`` -- a relay killed at each of its seams and resumed ends
  with what the system holds: killed after its ``ATTEMPTED`` marker and
  before the send, and killed after the system committed but before the
  receipt (from the system's side, a kill after the receipt and before its
  transaction commits is the same), the resumed relay's own decisions
  (:func:`ledger.delivery.next_step`, run against the adapter) never make a
  second effect, never record ``COMMITTED`` for an effect the system lacks
  nor ``ABSENT`` for one it holds, and hold the outcome as unknown when
  nothing can tell.

Faults reach the wire only where the proxy can see the operation: a system
reached over TLS (``https://``) cannot be faulted, and those claims are
``untested``. The seams are played here with the relay's decisions and the
real system, without Kafka; the relay's Kafka side of them (markers,
transactions, fencing of a zombie) is proven by the crash harness of the
test suite (``tests/testbed/test_mission.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from ledger.delivery import (
    BEFORE_RECEIPT,
    BEFORE_SEND,
    Observation,
    Observed,
    Receipt,
    Situation,
    next_step,
)
from ledger.errors import LedgerError
from ledger.identity import parameter_digest
from sinks.client import SubmitResult
from sinks.port import SinkPort, open_sink
from sinks.wire import COMMIT_POINTS, FaultProxy, WireMode, proxied_url

Verdict = Literal["holds", "fails", "untested"]


#: A probe's method name -> its claim's name, where they differ.
CLAIM_NAMES = {
    "ambiguity": "ambiguity-is-reported",
    "key-reuse": "key-reuse-refused",
    "retention": "key-retention",
    "seams": "relay-seams",
}

#: The seams the check plays: (seam, whether the system committed before the kill).
SEAMS: tuple[tuple[str, bool], ...] = ((BEFORE_SEND, False), (BEFORE_RECEIPT, True))

#: How many steps a resumed relay may take before the check calls it a loop.
RESUME_STEPS = 8


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


@dataclass
class CheckReport:
    """The whole check: the sink, its claims and the verdicts."""

    sink: str
    adapter: str
    results: list[ClaimResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """``True`` when no claim fails."""
        return all(r.verdict != "fails" for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "sink": self.sink,
            "adapter": self.adapter,
            "passed": self.passed,
            "claims": [asdict(r) for r in self.results],
        }


class SinkCheck:
    """One run of the check against one registered sink.

    Args:
        name: the sink's registered name (a digest input).
        endpoint: its :class:`~sinks.registry.SinkEndpoint`.
        timeout_s: the adapter's deadline per call, seconds (faults hold
            answers for twice that).
        account: the account the probes credit.
        amount_minor: the amount of each probe, minor units.
        say: progress lines.
        retention_wait_s: the longest key retention the check waits out.
    """

    def __init__(
        self,
        name: str,
        endpoint: Any,
        *,
        timeout_s: float = 2.0,
        account: str = "ledger-sink-check",
        amount_minor: int = 1,
        say: Callable[[str], None] = lambda line: None,
        retention_wait_s: float = 30.0,
    ) -> None:
        self.name = name
        self.endpoint = endpoint
        self.contract = endpoint.contract
        self.timeout_s = timeout_s
        self.account = account
        self.amount_minor = amount_minor
        self.say = say
        self.retention_wait_s = retention_wait_s
        self.run = uuid.uuid4().hex[:10]
        self._n = 0
        self.scheme = urlsplit(endpoint.url).scheme
        self.proxy: FaultProxy | None = None
        self.port: SinkPort | None = None

    # ------------------------------------------------------------------ probes

    def _op(self) -> tuple[str, bytes]:
        """A fresh operation ID and its marker on the wire (its unique part)."""
        self._n += 1
        unique = f"{self.run}-{self._n}"
        return f"sink-check:{unique}:v1", unique.encode()

    def _params(self, amount_minor: int | None = None) -> dict[str, Any]:
        amount = self.amount_minor if amount_minor is None else amount_minor
        return {"account": self.account, "amount_minor": amount, "currency": "GBP"}

    def _submit(
        self, op: str, params: dict[str, Any], token: int | None = 1, *, same_key: bool = True
    ) -> SubmitResult:
        assert self.port is not None
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

    def _faulted(self, mode: WireMode) -> tuple[str, SubmitResult, bool]:
        """Submit a fresh operation with ``mode`` armed; whether the fault fired."""
        assert self.proxy is not None
        op, marker = self._op()
        fault = self.proxy.arm(
            marker,
            mode,
            commit_point=COMMIT_POINTS.get(self.scheme),
            hold_s=2 * self.timeout_s + 1,
        )
        result = self._submit(op, self._params())
        fired = fault is not None and fault.fired.is_set()
        self.proxy.clear()
        return op, result, fired

    def _effects(self, op: str) -> int | None:
        """How many effects the system holds for ``op`` (``None``: it cannot say)."""
        assert self.port is not None
        if not self.contract.readback:
            return None
        rb = self.port.readback(op, None)
        return rb.effects if rb.status == "committed" else 0 if rb.status == "absent" else None

    # ------------------------------------------------------------------ claims

    def run_all(self) -> CheckReport:
        """Run every probe and return the report (the proxy and adapter are closed after)."""
        report = CheckReport(self.name, self.endpoint.adapter)
        _, target = proxied_url(self.endpoint.url, 0)
        self.proxy = FaultProxy(*target).start()
        proxied = self.endpoint.model_copy(
            update={"url": proxied_url(self.endpoint.url, self.proxy.port)[0]}
        )
        try:
            self.port = open_sink(proxied, timeout_s=self.timeout_s, name=self.name)
            for claim in (
                self._answers,
                self._commits,
                self._ambiguity,
                self._idempotent,
                self._key_reuse,
                self._readback,
                self._fencing,
                self._postcondition,
                self._retention,
                self._seams,
            ):
                try:
                    result = claim()
                except LedgerError as exc:  # the adapter refused: that claim fails, say why
                    name = claim.__name__.strip("_").replace("_", "-")
                    result = ClaimResult(CLAIM_NAMES.get(name, name), "fails", exc.message)
                self.say(f"{result.verdict.upper():<9} {result.claim}: {result.detail}")
                report.results.append(result)
                if result.claim in ("answers", "commits") and result.verdict == "fails":
                    break  # nothing else can be learned from a sink that does not work
        finally:
            if self.port is not None:
                self.port.close()
            self.proxy.close()
        return report

    def _answers(self) -> ClaimResult:
        assert self.port is not None
        ok = self.port.health()
        return ClaimResult(
            "answers",
            "holds" if ok else "fails",
            "the health probe answered" if ok else "the health probe got no answer",
        )

    def _commits(self) -> ClaimResult:
        op, _ = self._op()
        result = self._submit(op, self._params())
        if result.status == "committed":
            return ClaimResult("commits", "holds", f"{op} committed as {result.effect_id}")
        return ClaimResult("commits", "fails", f"{op}: {result.status} ({result.detail[:600]})")

    def _ambiguity(self) -> ClaimResult:
        seen = []
        modes: tuple[WireMode, ...] = ("commit_then_drop_response", "timeout_after_commit", "reset")
        for mode in modes:
            op, result, fired = self._faulted(mode)
            if not fired:
                return ClaimResult(
                    "ambiguity-is-reported",
                    "untested",
                    f"the operation was not seen on the wire ({self.scheme}): no fault injected",
                )
            if result.status != "ambiguous":
                return ClaimResult(
                    "ambiguity-is-reported",
                    "fails",
                    f"{mode}: the system committed {op} but the adapter answered "
                    f"{result.status!r} ({result.detail[:600]}); only 'ambiguous' is safe",
                )
            seen.append(mode)
        return ClaimResult("ambiguity-is-reported", "holds", f"ambiguous under {', '.join(seen)}")

    def _idempotent(self) -> ClaimResult:
        if not self.contract.idempotent:
            return ClaimResult("idempotent", "untested", "not claimed")
        op, first, fired = self._faulted("commit_then_drop_response")
        if not fired:
            return ClaimResult("idempotent", "untested", "no fault could be injected")
        again = self._submit(op, self._params())
        if again.status != "committed":
            return ClaimResult(
                "idempotent", "fails", f"the resubmit of {op} answered {again.status!r}"
            )
        ones, doubts, unknown = self._count_effects(op, again.effect_id)
        if doubts:
            return ClaimResult(
                "idempotent",
                "fails",
                f"after a lost response and a resubmit under the same key: {'; '.join(doubts)}",
            )
        if ones:
            return ClaimResult("idempotent", "holds", f"resubmit replayed ({', '.join(ones)})")
        return ClaimResult(
            "idempotent",
            "untested",
            "the effects could not be counted ("
            + ("; ".join(unknown) or "no readback or postcondition query")
            + "): the resubmit committed, but one effect is unproven",
        )

    def _count_effects(
        self, op: str, effect_id: str | None
    ) -> tuple[list[str], list[str], list[str]]:
        """What the system shows of ``op``'s effects.

        What the system shows of ``op``'s effects: (one effect seen by, more than one seen
        by, could not count because), from its readback and its postcondition query.
        """
        assert self.port is not None
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

    def _key_reuse(self) -> ClaimResult:
        if not self.contract.idempotent:
            return ClaimResult("key-reuse-refused", "untested", "not claimed (no idempotency)")
        op, _ = self._op()
        first = self._submit(op, self._params())
        other = self._submit(op, self._params(self.amount_minor + 1))
        if first.status != "committed":
            return ClaimResult("key-reuse-refused", "untested", f"first submit {first.status}")
        if other.status == "key_reused":
            return ClaimResult("key-reuse-refused", "holds", "other parameters: key_reused")
        return ClaimResult(
            "key-reuse-refused",
            "fails",
            f"the same key with other parameters answered {other.status!r}"
            + (" (a second effect)" if other.status == "committed" and not other.replayed else ""),
        )

    def _readback(self) -> ClaimResult:
        assert self.port is not None
        if not self.contract.readback:
            return ClaimResult("readback", "untested", "not claimed")
        op, _ = self._op()
        committed = self._submit(op, self._params())
        rb = self.port.readback(op, None)
        if committed.status != "committed":
            return ClaimResult("readback", "untested", f"submit {committed.status}")
        if rb.status != "committed" or rb.effects != 1:
            return ClaimResult(
                "readback", "fails", f"committed {op} reads back {rb.status} ({rb.effects})"
            )
        unknown, _ = self._op()
        if (absent := self.port.readback(unknown, None)).status != "absent":
            return ClaimResult(
                "readback", "fails", f"an unknown operation reads back {absent.status}"
            )
        held, result, fired = self._faulted("timeout_before_commit")
        if fired:
            rb_held = self.port.readback(held, None)
            if rb_held.status == "committed":
                return ClaimResult(
                    "readback",
                    "fails",
                    f"{held} never reached its commit but reads back committed",
                )
        return ClaimResult("readback", "holds", "committed, absent and never-committed read back")

    def _fencing(self) -> ClaimResult:
        assert self.port is not None
        if not self.contract.fencing:
            return ClaimResult("fencing", "untested", "not claimed")
        op, _ = self._op()
        high = self._submit(op, self._params(), token=7)
        if high.status != "committed":
            return ClaimResult("fencing", "untested", f"submit with token 7: {high.status}")
        low = self._submit(op, self._params(), token=6)
        if low.status != "stale_token":
            return ClaimResult(
                "fencing", "fails", f"a submit with token 6 after 7 answered {low.status!r}"
            )
        if self.contract.readback:
            rb = self.port.readback(op, 6)
            if rb.status != "stale_token":
                return ClaimResult(
                    "fencing", "fails", f"a readback with token 6 after 7 answered {rb.status!r}"
                )
        return ClaimResult("fencing", "holds", "token 6 refused after 7")

    def _postcondition(self) -> ClaimResult:
        assert self.port is not None
        query = self.contract.postcondition_query()
        if query is None:
            return ClaimResult("postcondition", "untested", "not claimed")
        op, _ = self._op()
        committed = self._submit(op, self._params())
        if committed.status != "committed":
            return ClaimResult("postcondition", "untested", f"submit {committed.status}")
        seen = self.port.postcondition(query, self.account)
        mine = [c for c in seen.credits if c.operation_id == op]
        if seen.status == "observed" and mine and mine[0].amount_minor == self.amount_minor:
            return ClaimResult("postcondition", "holds", f"{self.account} shows {op}'s credit")
        return ClaimResult(
            "postcondition",
            "fails",
            f"{self.account}: {seen.status}, {len(mine)} credit(s) of {op}",
        )

    def _retention(self) -> ClaimResult:
        retention = self.contract.key_retention_s
        if not self.contract.idempotent:
            return ClaimResult("key-retention", "untested", "not claimed (no idempotency)")
        if retention < 2:
            return ClaimResult(
                "key-retention",
                "untested",
                f"the contract declares key_retention_s {retention}: declare how long (seconds) "
                "the system keeps an idempotency key, or the relay never resubmits under it",
            )
        if retention > self.retention_wait_s:
            return ClaimResult(
                "key-retention",
                "untested",
                f"the key retention ({retention} s) is longer than the check waits "
                f"({self.retention_wait_s:.0f} s); the relay reads back before any resubmit "
                "past it",
            )
        op, _ = self._op()
        first = self._submit(op, self._params())
        if first.status != "committed":
            return ClaimResult("key-retention", "untested", f"submit {first.status}")
        time.sleep(max(0.0, retention - 1.0))  # just inside the retention the sink declares
        again = self._submit(op, self._params())
        effects = self._effects(op)
        if (
            again.status == "committed"
            and again.effect_id == first.effect_id
            and effects
            in (
                None,
                1,
            )
        ):
            return ClaimResult(
                "key-retention", "holds", f"the key still answered {retention - 1} s later"
            )
        return ClaimResult(
            "key-retention",
            "fails",
            f"{retention - 1} s after the first submit (retention {retention} s) the resubmit "
            f"answered {again.status!r} (effect {again.effect_id} vs {first.effect_id})",
        )

    def _seams(self) -> ClaimResult:
        if self.contract.reservation:
            return ClaimResult(
                "relay-seams",
                "untested",
                "a reservation sink's seams (hold, confirm, cancel) are proven by the crash "
                "harness, not here",
            )
        seen = []
        for seam, committed_first in SEAMS:
            op, _ = self._op()
            if committed_first:
                first = self._submit(op, self._params())  # its answer dies with the relay
                if first.status != "committed":
                    return ClaimResult(
                        "relay-seams", "untested", f"{seam}: the first submit {first.status}"
                    )
            ended, sends = self._resume(op)
            problem = self._seam_problem(op, committed_first, ended, sends)
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

    def _resume(self, op: str) -> tuple[Receipt | Observation | None, list[str]]:
        """Run a resumed relay's decisions for ``op`` against the adapter.

        Returns:
            ``(the last record it would write, or None; the requests it sent)``;
            a request that could not be sent ends the run (the relay parks it).
        """
        assert self.port is not None
        situation = Situation(
            kind="EXECUTE", mode="ledger", fresh=False, first_attempt_ms=0, now_ms=1_000
        )
        history: list[Observed] = []
        sends: list[str] = []
        last: Receipt | Observation | None = None
        for _ in range(RESUME_STEPS):
            decision = next_step(self.contract, situation, history)
            if decision.records:
                last = decision.records[-1]
            if decision.send is None:
                break
            request = decision.send.request
            sends.append(request + (" again" if decision.send.resubmit else ""))
            answer: Any
            if request == "submit":
                answer = self._submit(op, self._params())
            elif request == "readback":
                answer = self.port.readback(op, 1 if self.contract.fencing else None)
            else:
                break  # a reservation's requests: not played here
            history.append(Observed.of(request, answer, resubmit=decision.send.resubmit))
        return last, sends

    def _seam_problem(
        self,
        op: str,
        committed_first: bool,
        ended: Receipt | Observation | None,
        sends: list[str],
    ) -> str | None:
        """Why the resumed relay's record disagrees with the system, or ``None``."""
        status = ended.status if ended is not None else None
        effects = self._effects(op)
        if effects is not None and effects > 1:
            return f"the system holds {effects} effects of {op} after {', '.join(sends)}"
        submits = sum(1 for r in sends if r.startswith("submit")) + committed_first
        if not self.contract.idempotent and submits > 1:
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
