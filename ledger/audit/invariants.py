"""The auditor's invariants: one function each, in a registry.

An invariant is a function ``(facts, findings) -> None`` that reads the
immutable :class:`~ledger.audit.facts.AuditInput`, counts the facts it checks
with ``findings.check()`` and records each broken one with
``findings.violation(operation_id, evidence)``. Decorating it with
:func:`invariant` adds it to :data:`INVARIANTS`; :func:`ledger.audit.audit`
runs every registered invariant in registration order. Adding an invariant
is adding a function here (and a line to the :mod:`ledger.audit` docstring).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from ledger.audit.facts import AuditInput, Provenance
from ledger.audit.report import Findings
from ledger.authn import ROLE_OPERATOR, ROLE_REVIEWER
from ledger.events import (
    AdmissionDecision,
    Dispatch,
    Disposition,
    EffectReceipt,
    OperationState,
    Readback,
)
from ledger.fold import account_of, amount_of, hop_names
from ledger.states import IN_FLIGHT
from ledger.states import RecoveryState as S
from ledger.topology import MISPLACED, TOPIC_BY_NAME

#: The parameter holding a sink's amount when the audit is given no contract for it.
DEFAULT_AMOUNT = "amount_minor"

#: An invariant check: reads the facts, records what it finds.
Invariant = Callable[[AuditInput, Findings], None]

#: Invariant name -> check, in the order :func:`ledger.audit.audit` runs them.
INVARIANTS: dict[str, Invariant] = {}


def invariant(
    name: str, registry: dict[str, Invariant] | None = None
) -> Callable[[Invariant], Invariant]:
    """Register the decorated function as the check of invariant ``name``.

    Args:
        name: the name violations are reported under, e.g. ``single-effect``.
        registry: where to register (default :data:`INVARIANTS`); tests pass
            a throwaway dict.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        ValueError: if ``name`` is already registered (a programming error,
            found at import time).
    """
    target = INVARIANTS if registry is None else registry

    def register(check: Invariant) -> Invariant:
        if name in target:
            raise ValueError(
                f"invariant {name!r} is already registered (by {target[name].__qualname__}); "
                "give the new check another name"
            )
        target[name] = check
        return check

    return register


def _ref(topic: str, partition: int, offset: int) -> str:
    return f"{topic}:{partition}:{offset}"


@invariant("readable")
def readable(facts: AuditInput, found: Findings) -> None:
    """Every record the auditor read decodes, and every journal entry's input does.

    A record that does not decode is reported with its position; the rest
    of the ledger is still audited (the entry is left out of the replay).

    Args:
        facts: the gathered facts (``unreadable`` and ``provenance.undecodable``).
        found: where violations are recorded.
    """
    found.check(len(facts.journal))
    for entry, reason in facts.unreadable:
        found.violation(
            entry.operation_id,
            f"journal entry {entry.seq} records an input at {entry.input_topic}:"
            f"{entry.input_partition}:{entry.input_offset} that does not decode ({reason})",
        )
    if facts.provenance is None:
        return
    for (topic, partition, offset), reason in sorted(facts.provenance.undecodable.items()):
        found.violation(None, f"record at {topic}:{partition}:{offset} does not decode ({reason})")


@invariant("authenticity")
def authenticity(facts: AuditInput, found: Findings) -> None:
    """Authenticity: every decision rests on records trusted writers produced.

    No decision rests on a record no trusted writer produced, and no genuine record
    of the ledger's components was copied off its partition.

    Unauthenticated records that nothing acted on are reported
    (``unauthenticated_records``) but are not violations: readers refused
    them. Violations are: a journal entry that applied an unauthenticated
    input, and an admission without both a grant signed by a trusted
    reviewer and the authority kernel's signed use of that approval for that
    operation (DESIGN.md "Trust boundary").

    One refused record is a violation too: an authentic record of a topic
    only the ledger's components write (the journal, the state, the outbox
    ...) found on a partition its key does not name. A seal covers the
    topic, key and value but not the partition
    (:func:`ledger.topology.misplaced`), so a genuine record copied
    elsewhere still verifies; nobody without a writer's key could have
    produced it and no component writes one off its key's partition, so
    someone holding a writer's rights misbehaved, or a broker administrator
    copied it. The violation names where it lies and where it belongs. A
    copy of an input (an intent, a grant, a disposition) is what its writer
    could equally have published again: it stays a refused record.

    Args:
        facts: the gathered facts (``steps`` and ``provenance``).
        found: where violations are recorded.
    """
    prov = facts.provenance
    if prov is None:
        return
    found.check(prov.records)
    _misplaced_copies(prov, found)
    for entry, event, _before, decision in facts.steps:
        where = (entry.input_topic, entry.input_partition, entry.input_offset)
        reason = prov.unauthenticated.get(where)
        if reason is not None and decision.outcome == "APPLIED":
            found.violation(
                entry.operation_id,
                f"journal entry {entry.seq} applied an unauthenticated {entry.kind} at "
                f"{where[0]}:{where[1]}:{where[2]} ({reason})",
            )
        if (
            isinstance(event, AdmissionDecision)
            and event.admitted
            and decision.outcome == "APPLIED"
        ):
            found.check()
            approval = event.approval_id
            use = prov.uses.get(approval)
            if use is None or use.operation_id != entry.operation_id:
                found.violation(
                    entry.operation_id,
                    f"admitted with approval {approval} at {where[0]}:{where[1]}:{where[2]}, "
                    "but no use of it for this operation signed by the authority kernel "
                    + ("exists" if use is None else f"(its use names {use.operation_id})"),
                )
            grant = prov.grants.get(approval, "no grant of it is in ledger.approvals")
            if grant is not None:
                found.violation(
                    entry.operation_id,
                    f"admitted with approval {approval}, whose grant is not authentic: {grant}",
                )


#: Key roles of people and services: an input they seal may be published again.
_INPUT_ROLES = frozenset({ROLE_OPERATOR, ROLE_REVIEWER})


def _stage_written(topic: str) -> bool:
    """Whether only the ledger's own components write ``topic`` (no service or person)."""
    spec = TOPIC_BY_NAME.get(topic)
    return spec is not None and bool(spec.auth) and not _INPUT_ROLES & set(spec.auth)


def _misplaced_copies(prov: Provenance, found: Findings) -> None:
    """Name every authentic component record that lies off its key's partition.

    Name every authentic record of a topic the ledger's components write that lies on
    a partition its key does not name (see :func:`authenticity`).
    """
    for (topic, partition, offset), (key, reason) in sorted(prov.misplaced.items()):
        if not _stage_written(topic):
            continue
        spec = TOPIC_BY_NAME[topic]
        belongs = reason.removeprefix(MISPLACED).strip()
        found.violation(
            key if spec.key == "operation ID" else None,
            f"{_ref(topic, partition, offset)} holds an authentic {topic} record of key "
            f"{key!r} on the wrong partition ({belongs}): only a holder of its writer's "
            "key misbehaving, or a broker administrator, puts a copy there; readers refuse it",
        )


@invariant("state")
def state(facts: AuditInput, found: Findings) -> None:
    """Replaying the journal reproduces ``ledger.state``, and the journal agrees.

    Proves the fold is deterministic and ``ledger.state`` was written by it:
    for every operation the state in ``ledger.state`` equals the state the
    replay of ``ledger.journal`` reaches (one fact per operation), and every
    journal entry records the outcome, target state and hops through the
    transition table that the replay decides for its input (a disagreement
    is a violation; entries are not counted; entries written before
    JournalEntry v2 carry no hops and are checked without them).

    Args:
        facts: the audit's facts (``states``, ``replayed``, ``steps``).
        found: where the facts checked and violations are recorded.
    """
    displaced = facts.provenance.displaced_states if facts.provenance is not None else {}
    for op in facts.operation_ids:
        found.check()
        got, want = facts.states.get(op), facts.replayed.get(op)
        if got != want:
            evidence = state_disagreement(got, want)
            if op in displaced:
                (topic, partition, offset), why = displaced[op]
                evidence += (
                    f"; the latest {topic} record of the operation, at "
                    f"{_ref(topic, partition, offset)}, displaced its authentic state ({why})"
                )
            found.violation(op, evidence)
    for entry, _event, _before, decision in facts.steps:
        if (entry.outcome, entry.to_state) != (decision.outcome, decision.to_state):
            found.violation(
                entry.operation_id,
                f"journal {_ref(entry.input_topic, entry.input_partition, entry.input_offset)} "
                f"records {entry.outcome} -> {entry.to_state}; replay gives "
                f"{decision.outcome} -> {decision.to_state}",
            )
        elif entry.hops is not None and tuple(entry.hops) != hop_names(decision):
            found.violation(
                entry.operation_id,
                f"journal {_ref(entry.input_topic, entry.input_partition, entry.input_offset)} "
                f"records hops {list(entry.hops)}; replay gives {list(hop_names(decision))}",
            )


@invariant("admission")
def admission(facts: AuditInput, found: Findings) -> None:
    """Every dispatch rests on a current admission of that exact operation.

    Proves no effect crossed the boundary without admission, from two
    sources: each ``EXECUTE`` dispatch the replay generates must come from a
    state with an admitted approval, carry the admitted parameter digest and
    have been admitted before the approval expired (one fact per dispatch);
    and each dispatch in ``ledger.dispatches`` must be one the replay
    generated under its ID (one fact per operation in the outbox).

    Args:
        facts: the audit's facts (``steps``, ``dispatches``,
            ``generated_dispatches``).
        found: where the facts checked and violations are recorded.
    """
    for _entry, _event, _before, decision in facts.steps:
        for out in decision.outputs:
            if isinstance(out.event, Dispatch) and out.event.kind == "EXECUTE":
                _check_admitted(found, out.event, decision.state)
    for op, dispatch in sorted(facts.dispatches.items()):
        found.check()
        if facts.generated_dispatches.get(dispatch.dispatch_id) != unstamped(dispatch):
            found.violation(
                op,
                f"dispatch {dispatch.dispatch_id} ({dispatch.kind}, token "
                f"{dispatch.fencing_token}) is in the outbox but no journaled admission "
                "and decision produced it",
            )


def unstamped(dispatch: Dispatch) -> Dispatch:
    """A dispatch without what the processor stamps on it after the decision.

    The contract version and schema versions (:mod:`ledger.upgrades`) come
    from the sink registry when the dispatch is written, not from the fold,
    so the replay cannot generate them; everything else must match.

    Args:
        dispatch: a dispatch as read from the outbox.

    Returns:
        The same dispatch with ``contract_version`` and ``schema_versions_json`` unset.
    """
    return dispatch.model_copy(update={"contract_version": None, "schema_versions_json": None})


def _check_admitted(found: Findings, dispatch: Dispatch, state: OperationState | None) -> None:
    found.check()
    if state is None or state.admitted_approval_id is None:
        found.violation(
            dispatch.operation_id, f"EXECUTE {dispatch.dispatch_id} generated without an admission"
        )
        return
    if dispatch.parameter_digest != state.parameter_digest:
        found.violation(
            dispatch.operation_id,
            f"EXECUTE {dispatch.dispatch_id} carries digest {dispatch.parameter_digest[:12]} "
            f"but the admitted operation is {state.parameter_digest[:12]}",
        )
    if (
        state.admitted_at_ms is not None
        and state.approval_expires_at_ms is not None
        and state.admitted_at_ms >= state.approval_expires_at_ms
    ):
        found.violation(
            dispatch.operation_id,
            f"admitted at {state.admitted_at_ms} ms, after the approval expired at "
            f"{state.approval_expires_at_ms} ms",
        )


@invariant("unknown-release")
def unknown_release(facts: AuditInput, found: Findings) -> None:
    """No operation left UNKNOWN_OUTCOME except on an observation or a disposition.

    Proves no retry timer released an unknown outcome: every replayed step
    that moves an operation out of ``UNKNOWN_OUTCOME`` (one fact each) must
    be a receipt or readback that observed ``COMMITTED`` or ``ABSENT``, or a
    disposition that names who decided and on what evidence.

    Args:
        facts: the audit's facts (``steps``).
        found: where the facts checked and violations are recorded.
    """
    for entry, event, before, decision in facts.steps:
        if (
            before is None
            or before.state != S.UNKNOWN_OUTCOME
            or decision.state is None
            or decision.state.state == S.UNKNOWN_OUTCOME
        ):
            continue
        found.check()
        attributable = isinstance(event, Disposition) and event.by and event.evidence
        observed = isinstance(event, Readback | EffectReceipt) and event.status in (
            "COMMITTED",
            "ABSENT",
        )
        if not (attributable or observed):
            found.violation(
                entry.operation_id,
                f"left UNKNOWN_OUTCOME on {event.KIND} at "
                f"{_ref(entry.input_topic, entry.input_partition, entry.input_offset)}, which is "
                "neither a new observation nor an attributable disposition",
            )


#: One sink contact: (outbox position of its dispatch, journal index,
#: fencing token, effect accepted, token shown to the sink, journal reference).
_Contact = tuple[int, int, int, bool, bool, str]


@invariant("fencing")
def fencing(facts: AuditInput, found: Findings) -> None:
    """No effect was accepted with a fencing token older than one the sink had seen.

    Proves stale workers were fenced, from the receipts and readbacks in the
    journal: per operation, the sink contacts are put in the order the relay
    made them (the outbox order of their dispatches, not the journal order,
    which interleaves receipts and readbacks as the processor read them);
    every committed receipt (one fact each) must carry a token at least as
    high as every token shown to the sink before it (a ``STALE_TOKEN``
    answer shows none).

    Args:
        facts: the audit's facts (``steps``).
        found: where the facts checked and violations are recorded.
    """
    for op, seen in sorted(_sink_contacts(facts).items()):
        highest = 0
        for _order, _index, token, accepted, shown, ref in sorted(seen):
            if accepted:
                found.check()
                if token < highest:
                    found.violation(
                        op,
                        f"effect accepted with fencing token {token} after the sink had been "
                        f"shown token {highest} ({ref})",
                    )
            if shown:
                highest = max(highest, token)


def _sink_contacts(facts: AuditInput) -> dict[str, list[_Contact]]:
    """Every receipt and readback per operation, keyed for the relay's order.

    One relay owns a partition at a time and contacts the sink in outbox
    order (a zombie's late request is what fencing refuses), so a contact
    sorts by its dispatch's outbox position; a dispatch the replay never
    generated sorts after every dispatch generated so far.
    """
    dispatch_order: dict[str, int] = {}
    contacts: dict[str, list[_Contact]] = defaultdict(list)
    for index, (entry, event, _before, decision) in enumerate(facts.steps):
        for out in decision.outputs:
            if isinstance(out.event, Dispatch):
                dispatch_order.setdefault(out.event.dispatch_id, len(dispatch_order))
        if isinstance(event, EffectReceipt | Readback):
            contacts[entry.operation_id].append(
                (
                    dispatch_order.get(event.dispatch_id, len(dispatch_order) + index),
                    index,
                    event.fencing_token,
                    isinstance(event, EffectReceipt) and event.status == "COMMITTED",
                    event.status != "STALE_TOKEN",
                    _ref(entry.input_topic, entry.input_partition, entry.input_offset),
                )
            )
    return contacts


@invariant("single-effect")
def single_effect(facts: AuditInput, found: Findings) -> None:
    """At most one effect per operation, in the ledger and at the sink.

    Proves idempotent execution from two sources: the committed receipts and
    effect readbacks in the journal name at most one distinct effect ID per
    operation (one fact per operation with an effect ID), and every
    readback-capable sink holds at most one effect per operation (one fact
    per operation the sinks were asked about; skipped when they were not).

    Args:
        facts: the audit's facts (``effect_ids``, ``sink_effects``).
        found: where the facts checked and violations are recorded.
    """
    for op, ids in sorted(facts.effect_ids.items()):
        found.check()
        if len(ids) > 1:
            found.violation(op, f"{len(ids)} distinct effects recorded: {sorted(ids)}")
    for op, count in sorted((facts.sink_effects or {}).items()):
        found.check()
        if count > 1:
            found.violation(op, f"the sink holds {count} effects for the operation")


@invariant("consume-once")
def consume_once(facts: AuditInput, found: Findings) -> None:
    """No approval admitted two different operations.

    Proves the authority kernel consumed each approval once, from the
    admission decisions the replay applied: per approval (one fact each),
    the operations it admitted number at most one.

    Args:
        facts: the audit's facts (``steps``).
        found: where the facts checked and violations are recorded.
    """
    admitted_by: dict[str, set[str]] = defaultdict(set)
    for entry, event, _before, decision in facts.steps:
        if (
            isinstance(event, AdmissionDecision)
            and event.admitted
            and decision.outcome == "APPLIED"
        ):
            admitted_by[event.approval_id].add(entry.operation_id)
    for approval_id, ops in sorted(admitted_by.items()):
        found.check()
        if len(ops) > 1:
            found.violation(
                None, f"approval {approval_id} admitted {len(ops)} operations: {sorted(ops)}"
            )


@invariant("verified-evidence")
def verified_evidence(facts: AuditInput, found: Findings) -> None:
    """Every OUTCOME_VERIFIED operation has the evidence verification needs.

    Proves no operation was marked verified on say-so: each operation that
    ``ledger.state`` holds as ``OUTCOME_VERIFIED`` (one fact each) has, in
    the journal, an effect receipt, effect readback or ``COMMITTED``
    disposition, and a ``MATCH`` postcondition readback (its own record, or
    carried by the committed receipt of a relay that read the postcondition
    right after the effect).

    Args:
        facts: the audit's facts (``states``, ``effect_evidence``,
            ``postconditions``).
        found: where the facts checked and violations are recorded.
    """
    for op, current in sorted(facts.states.items()):
        if current.state != S.OUTCOME_VERIFIED:
            continue
        found.check()
        missing = [
            what
            for what, ok in (
                ("an effect receipt or readback", op in facts.effect_evidence),
                ("a postcondition readback", op in facts.postconditions),
            )
            if not ok
        ]
        if missing:
            found.violation(op, f"OUTCOME_VERIFIED without {' and '.join(missing)}")


@invariant("recovery-receipt")
def recovery_receipt(facts: AuditInput, found: Findings) -> None:
    """Every resume produced a recovery receipt, and the latest one was written.

    Proves each resume says why acting was safe: per operation in
    ``ledger.state`` (one fact each), the resumes its state counts equal the
    recovery receipts the replay generates, and the last generated receipt
    is the one ``ledger.recovery-receipts`` holds.

    Args:
        facts: the audit's facts (``states``, ``recovery_receipts``,
            ``generated_recovery_receipts``).
        found: where the facts checked and violations are recorded.
    """
    for op, current in sorted(facts.states.items()):
        found.check()
        generated = facts.generated_recovery_receipts.get(op, ())
        if current.recovery_receipts != len(generated):
            found.violation(
                op,
                f"state counts {current.recovery_receipts} resumes; the journal shows "
                f"{len(generated)}",
            )
        if generated and facts.recovery_receipts.get(op) != generated[-1]:
            found.violation(
                op,
                f"the resume at {generated[-1].receipt_id} has no recovery receipt in "
                "ledger.recovery-receipts",
            )


#: States of a compensation that was admitted and may have taken effect, or has.
ADMITTED_EFFECT: frozenset[S] = IN_FLIGHT | {S.OUTCOME_VERIFIED}


@invariant("compensation-bounds")
def compensation_bounds(facts: AuditInput, found: Findings) -> None:
    """Every admitted compensation is of its original's effect, and compensates it at most once.

    Proves what the fold decides before a compensation may ask for admission
    (:func:`ledger.fold.compensation.tally_refusal`) held for every
    compensation the ledger holds past admission (``ADMITTED`` onwards,
    however it got there: an earlier release, a writer with a stage's key):
    per such compensation (one fact each) its original is in the ledger and
    has the same subject and account, and its amount is at most the
    original's; per original (one fact each) the admitted compensations
    total at most its amount, counted in admission order (an original whose
    amount cannot be read is compensated once). Amounts are read from the
    parameter each sink's contract names (``facts.amount_fields``).

    Args:
        facts: the audit's facts (``states`` over ``replayed``, ``amount_fields``).
        found: where the facts checked and violations are recorded.
    """
    held = {**facts.replayed, **facts.states}

    def amount(st: OperationState) -> int | None:
        return amount_of(st.params_json, facts.amount_fields.get(st.sink, DEFAULT_AMOUNT))[0]

    by_original: dict[str, list[OperationState]] = defaultdict(list)
    for op, st in sorted(held.items()):
        if st.compensates is None or S(st.state) not in ADMITTED_EFFECT:
            continue
        found.check()
        original = held.get(st.compensates)
        if original is None:
            found.violation(
                op,
                f"compensation of {st.compensates} admitted ({st.state}), but the ledger holds "
                f"no operation {st.compensates}",
            )
            continue
        by_original[st.compensates].append(st)
        problem = _not_of_original(st, original, amount(st), amount(original))
        if problem is not None:
            found.violation(op, problem)
    for name, admitted in sorted(by_original.items()):
        found.check()
        total = amount(held[name])
        order = sorted(
            admitted,
            key=lambda c: (c.admitted_at_ms is None, c.admitted_at_ms or 0, c.operation_id),
        )
        first = order[0].operation_id
        if total is None:
            for extra in order[1:]:
                found.violation(
                    extra.operation_id,
                    f"second compensation of {name} admitted ({extra.state}): {name} carries "
                    f"no amount that can be read, so it is compensated once, and {first} "
                    "compensates it first",
                )
            continue
        running = 0
        for c in order:
            own = amount(c)
            running += total if own is None else own
            if running > total:
                found.violation(
                    c.operation_id,
                    f"compensation of {name} admitted ({c.state}) beyond its effect: with "
                    f"{first} (the first) and the others admitted before it, {running} minor "
                    f"units are compensated of {name}'s {total}",
                )


def _not_of_original(
    comp: OperationState, original: OperationState, own: int | None, total: int | None
) -> str | None:
    """Why an admitted compensation is not of its original's effect, or ``None``."""
    name = original.operation_id
    if comp.subject != original.subject:
        return (
            f"compensation of {name} admitted ({comp.state}) for subject {comp.subject}, but "
            f"{name} was for subject {original.subject}"
        )
    mine, theirs = account_of(comp.params_json), account_of(original.params_json)
    if mine != theirs:
        return (
            f"compensation of {name} admitted ({comp.state}) on account {mine or '(none)'}, but "
            f"{name} was on account {theirs or '(none)'}"
        )
    if own is not None and total is not None and own > total:
        return (
            f"compensation of {name} admitted ({comp.state}) for {own} minor units, more than "
            f"the {total} of {name}'s effect"
        )
    return None


def _brief(state: OperationState | None) -> str:
    if state is None:
        return "nothing"
    return f"{state.state} v{state.version} epoch {state.epoch}"


#: Longest rendering of one field's value in :func:`state_disagreement`.
MAX_SHOWN = 80


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else f"{text[: MAX_SHOWN - 3]}..."


def state_disagreement(held: OperationState | None, replayed: OperationState | None) -> str:
    """Say how ``ledger.state``'s state of an operation differs from the journal's replay.

    The two are compared as whole states, so the words name every field
    that differs (not only the state, version and epoch the summary shows);
    values over :data:`MAX_SHOWN` characters are cut.

    Args:
        held: the state ``ledger.state`` holds (``None``: none).
        replayed: the state replaying the journal reaches (``None``: none).

    Returns:
        ``ledger.state holds A but replaying the journal gives B`` when one
        side is missing; otherwise the summary and, field by field in
        declaration order, ``field: X in ledger.state, Y replayed``.
    """
    summary = f"ledger.state holds {_brief(held)} but replaying the journal gives "
    summary += _brief(replayed)
    if held is None or replayed is None or held == replayed:
        return summary
    if _brief(held) == _brief(replayed):
        summary = f"ledger.state and replaying the journal both give {_brief(held)}"
    a, b = held.model_dump(), replayed.model_dump()
    fields = [name for name in a if a[name] != b.get(name)]
    differs = "; ".join(
        f"{name}: {_shown(a[name])} in ledger.state, {_shown(b.get(name))} replayed"
        for name in fields
    )
    return f"{summary}, and they differ in {differs}"
