"""The conformance check's claims about one call: answers, ambiguity, keys, readback.

Each function plays one claim of :mod:`sinks.conformance` with a
:class:`~sinks.probe.Probe` and returns its :class:`~sinks.probe.ClaimResult`:
the ambiguity and idempotency claims (a lost answer, a resubmit, a key
reused with other parameters), then what the system shows afterwards
(readback, fencing, the postcondition query, key retention). The relay's
seams are in :mod:`sinks.seams`.
"""

from __future__ import annotations

import time

from sinks.probe import ClaimResult, Probe
from sinks.wire import WireMode


def answers(probe: Probe) -> ClaimResult:
    """The ``answers`` claim: the system answers its health probe."""
    ok = probe.port.health()
    return ClaimResult(
        "answers",
        "holds" if ok else "fails",
        "the health probe answered" if ok else "the health probe got no answer",
    )


def commits(probe: Probe) -> ClaimResult:
    """The ``commits`` claim: a plain submit commits."""
    op, _ = probe.op()
    result = probe.submit(op, probe.params())
    if result.status == "committed":
        return ClaimResult("commits", "holds", f"{op} committed as {result.effect_id}")
    return ClaimResult("commits", "fails", f"{op}: {result.status} ({result.detail[:600]})")


def ambiguity(probe: Probe) -> ClaimResult:
    """The ``ambiguity-is-reported`` claim: a lost or late answer is ``ambiguous``."""
    seen = []
    modes: tuple[WireMode, ...] = ("commit_then_drop_response", "timeout_after_commit", "reset")
    for mode in modes:
        op, result, fired = probe.faulted(mode)
        if not fired:
            return ClaimResult(
                "ambiguity-is-reported",
                "untested",
                f"the operation was not seen on the wire ({probe.scheme}): no fault injected",
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


def idempotent(probe: Probe) -> ClaimResult:
    """The ``idempotent`` claim: a resubmit after a lost response makes no second effect."""
    if not probe.contract.idempotent:
        return ClaimResult("idempotent", "untested", "not claimed")
    op, first, fired = probe.faulted("commit_then_drop_response")
    if not fired:
        return ClaimResult("idempotent", "untested", "no fault could be injected")
    again = probe.submit(op, probe.params())
    if again.status != "committed":
        return ClaimResult("idempotent", "fails", f"the resubmit of {op} answered {again.status!r}")
    ones, doubts, unknown = probe.count_effects(op, again.effect_id)
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


def key_reuse(probe: Probe) -> ClaimResult:
    """The ``key-reuse-refused`` claim: the same key with other parameters is refused."""
    if not probe.contract.idempotent:
        return ClaimResult("key-reuse-refused", "untested", "not claimed (no idempotency)")
    op, _ = probe.op()
    first = probe.submit(op, probe.params())
    other = probe.submit(op, probe.params(probe.amount_minor + 1))
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


def readback(probe: Probe) -> ClaimResult:
    """The ``readback`` claim: committed, unknown and never-committed operations read back."""
    if not probe.contract.readback:
        return ClaimResult("readback", "untested", "not claimed")
    op, _ = probe.op()
    committed = probe.submit(op, probe.params())
    rb = probe.port.readback(op, None)
    if committed.status != "committed":
        return ClaimResult("readback", "untested", f"submit {committed.status}")
    if rb.status != "committed" or rb.effects != 1:
        return ClaimResult(
            "readback", "fails", f"committed {op} reads back {rb.status} ({rb.effects})"
        )
    unknown, _ = probe.op()
    if (absent := probe.port.readback(unknown, None)).status != "absent":
        return ClaimResult("readback", "fails", f"an unknown operation reads back {absent.status}")
    held, result, fired = probe.faulted("timeout_before_commit")
    if fired:
        rb_held = probe.port.readback(held, None)
        if rb_held.status == "committed":
            return ClaimResult(
                "readback",
                "fails",
                f"{held} never reached its commit but reads back committed",
            )
    return ClaimResult("readback", "holds", "committed, absent and never-committed read back")


def fencing(probe: Probe) -> ClaimResult:
    """The ``fencing`` claim: a lower token than the highest seen is refused."""
    if not probe.contract.fencing:
        return ClaimResult("fencing", "untested", "not claimed")
    op, _ = probe.op()
    high = probe.submit(op, probe.params(), token=7)
    if high.status != "committed":
        return ClaimResult("fencing", "untested", f"submit with token 7: {high.status}")
    low = probe.submit(op, probe.params(), token=6)
    if low.status != "stale_token":
        return ClaimResult(
            "fencing", "fails", f"a submit with token 6 after 7 answered {low.status!r}"
        )
    if probe.contract.readback:
        rb = probe.port.readback(op, 6)
        if rb.status != "stale_token":
            return ClaimResult(
                "fencing", "fails", f"a readback with token 6 after 7 answered {rb.status!r}"
            )
    return ClaimResult("fencing", "holds", "token 6 refused after 7")


def postcondition(probe: Probe) -> ClaimResult:
    """The ``postcondition`` claim: the contract's business query sees the effect."""
    query = probe.contract.postcondition_query()
    if query is None:
        return ClaimResult("postcondition", "untested", "not claimed")
    op, _ = probe.op()
    committed = probe.submit(op, probe.params())
    if committed.status != "committed":
        return ClaimResult("postcondition", "untested", f"submit {committed.status}")
    seen = probe.port.postcondition(query, probe.account)
    mine = [c for c in seen.credits if c.operation_id == op]
    if seen.status == "observed" and mine and mine[0].amount_minor == probe.amount_minor:
        return ClaimResult("postcondition", "holds", f"{probe.account} shows {op}'s credit")
    return ClaimResult(
        "postcondition",
        "fails",
        f"{probe.account}: {seen.status}, {len(mine)} credit(s) of {op}",
    )


def retention(probe: Probe) -> ClaimResult:
    """The ``key-retention`` claim: the key still answers just inside its retention."""
    retention = probe.contract.key_retention_s
    if not probe.contract.idempotent:
        return ClaimResult("key-retention", "untested", "not claimed (no idempotency)")
    if retention < 2:
        return ClaimResult(
            "key-retention",
            "untested",
            f"the contract declares key_retention_s {retention}: declare how long (seconds) "
            "the system keeps an idempotency key, or the relay never resubmits under it",
        )
    if retention > probe.retention_wait_s:
        return ClaimResult(
            "key-retention",
            "untested",
            f"the key retention ({retention} s) is longer than the check waits "
            f"({probe.retention_wait_s:.0f} s); the relay reads back before any resubmit "
            "past it",
        )
    op, _ = probe.op()
    first = probe.submit(op, probe.params())
    if first.status != "committed":
        return ClaimResult("key-retention", "untested", f"submit {first.status}")
    time.sleep(max(0.0, retention - 1.0))  # just inside the retention the sink declares
    again = probe.submit(op, probe.params())
    effects = probe.effects(op)
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
