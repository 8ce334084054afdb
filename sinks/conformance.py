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

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ledger.errors import LedgerError
from sinks.claims import (
    ambiguity,
    answers,
    commits,
    fencing,
    idempotent,
    key_reuse,
    postcondition,
    readback,
    retention,
)
from sinks.port import SinkPort, open_sink
from sinks.probe import ClaimResult as ClaimResult  # re-exported: its old home
from sinks.probe import Probe
from sinks.probe import Verdict as Verdict  # re-exported: its old home
from sinks.seams import RESUME_STEPS as RESUME_STEPS  # re-exported: its old home
from sinks.seams import SEAMS as SEAMS  # re-exported: its old home
from sinks.seams import seams
from sinks.wire import FaultProxy, proxied_url

#: A claim function's name (dashed) -> its claim's name, where they differ.
CLAIM_NAMES = {
    "ambiguity": "ambiguity-is-reported",
    "key-reuse": "key-reuse-refused",
    "retention": "key-retention",
    "seams": "relay-seams",
}

#: The claims in the order they are played (:mod:`sinks.claims`, :mod:`sinks.seams`).
CLAIMS: tuple[Callable[[Probe], ClaimResult], ...] = (
    answers,
    commits,
    ambiguity,
    idempotent,
    key_reuse,
    readback,
    fencing,
    postcondition,
    retention,
    seams,
)


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
        self.scheme = urlsplit(endpoint.url).scheme
        self.proxy: FaultProxy | None = None
        self.port: SinkPort | None = None

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
            probe = Probe(
                self.name,
                self.contract,
                self.port,
                self.proxy,
                scheme=self.scheme,
                run=self.run,
                timeout_s=self.timeout_s,
                account=self.account,
                amount_minor=self.amount_minor,
                retention_wait_s=self.retention_wait_s,
            )
            for claim in CLAIMS:
                try:
                    result = claim(probe)
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
