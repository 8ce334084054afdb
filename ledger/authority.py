"""The authority kernel's decision, as a pure function.

An approval admits one exact operation once: at decision time it must exist,
be neither revoked nor expired, have been granted under the current policy
version, cover the operation's scope (see :func:`scope_problem`: subject,
amount, and every optional scope field the reviewer set), and not have been
consumed by another operation. The decision records its evaluation time, so
replay needs no clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ledger.authn import DEFAULT_LEDGER_ID
from ledger.events import AdmissionDecision, AdmissionRequest, Approval, ApprovalUse, PolicyChange
from ledger.signing import verify

REASON_ADMITTED = "admitted"
REASON_NOT_FOUND = "approval not found"
#: The start of the reason a request is held for: evidence about its approval
#: (a use, a revocation, a policy change) that the kernel cannot verify.
REASON_UNVERIFIABLE = "held: evidence about this approval cannot be verified"
REASON_REVOKED = "approval was revoked"
REASON_CONSUMED = "approval was consumed by another operation"
REASON_EXPIRED = "approval has expired"
REASON_POLICY = "policy version changed"
REASON_SUBJECT = "approval does not cover this subject"
REASON_AMOUNT = "amount exceeds approval scope"
REASON_OPERATION = "approval is bound to another operation"
#: Prefix of every refusal by an optional scope field:
#: ``out of scope: currency EUR, approved GBP``.
REASON_OUT_OF_SCOPE = "out of scope"
REASON_LEGACY_REQUEST = (
    "the admission request does not carry the operation (an earlier release wrote it), so its "
    "scope cannot be checked; reauthorise the operation with a new approval"
)

#: The parameter holding the amount when a sink's contract names no other
#: (:attr:`ledger.contracts.EffectContract.amount_field`).
DEFAULT_AMOUNT_FIELD = "amount_minor"

#: Optional scope fields of an approval and how each reads the operation's
#: value: ``(approval field, name in reasons, where the request holds it)``;
#: ``params.X`` is key X of the operation's parameters.
SCOPE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("scope_action", "action", "action"),
    ("scope_sink", "sink", "sink"),
    ("scope_currency", "currency", "params.currency"),
    ("scope_account", "account", "params.account"),
    ("scope_purpose", "purpose", "purpose"),
    ("scope_parameter_digest", "parameter_digest", "parameter_digest"),
)

#: Longest value a refusal reason quotes (characters); longer ones are cut.
SHOWN_CHARS = 80
_ABSENT = object()


def _show(value: object) -> str:
    """A value as a refusal reason quotes it: plain words bare, anything else as JSON."""
    if value is _ABSENT:
        return "(absent)"
    if isinstance(value, str) and value and value.isprintable() and " " not in value:
        text = value
    else:
        text = json.dumps(value, ensure_ascii=True, default=str)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def scope_problem(
    approval: Approval,
    request: AdmissionRequest,
    amount_field: str | None,
    *,
    sink_registered: bool = True,
) -> str | None:
    """Why ``request`` is outside what ``approval`` covers, or ``None`` when it is inside.

    Checked in order: the request carries the operation (schema v2), the
    subject, the amount, the bound operation ID, then each optional scope
    field the reviewer set (:data:`SCOPE_FIELDS`); a field left ``None`` puts
    no constraint.

    The amount is read from the operation's parameters, from the field the
    sink's contract names (``amount_field``), never from the request's
    ``amount_minor``: an operation whose parameters lack that field, or hold
    anything but a non-negative integer there, is refused (a cap of 1 cannot
    admit ``"amount": 999999999`` under another name).

    Args:
        approval: the approval's current record.
        request: the admission request, carrying the operation as recorded.
        amount_field: the parameter holding the amount, as the sink's
            contract names it; ``None`` when the contract declares that the
            sink's effects carry no amount (no cap applies).
        sink_registered: ``False`` when the request's sink is not in the
            sink registry: nothing then says where the amount is, and the
            request is refused (the approval stays unused).

    Returns:
        ``None``, or the refusal reason: for an optional field
        ``out of scope: FIELD VALUE, approved APPROVED`` (``(absent)`` for a
        parameter the operation lacks, ``(not a string)`` after a parameter
        of another JSON type; values over :data:`SHOWN_CHARS` characters are
        cut).
    """
    if (
        request.params_json is None
        or request.sink is None
        or request.action is None
        or request.purpose is None
    ):
        return REASON_LEGACY_REQUEST
    try:
        params: Any = json.loads(request.params_json)
    except ValueError:
        params = None
    if not isinstance(params, dict):
        return "the operation's parameters are not a JSON object"
    if approval.scope_subject != request.subject:
        return REASON_SUBJECT
    if not sink_registered:
        return (
            f"sink {_show(request.sink)} is not registered, so no contract names the parameter "
            "holding the amount; register the sink, then reauthorise the operation"
        )
    if amount_field is not None:
        amount = params.get(amount_field, _ABSENT)
        if amount is _ABSENT:
            return (
                f"the parameters lack {amount_field}, the amount field of sink "
                f"{_show(request.sink)}'s contract: the approval caps the amount there"
            )
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            return (
                f"parameter {amount_field} is {_show(amount)}, not an amount in minor units "
                "(a non-negative integer)"
            )
        if amount > approval.scope_max_amount_minor:
            return (
                f"{REASON_AMOUNT}: {amount_field} {amount}, approved up to "
                f"{approval.scope_max_amount_minor}"
            )
    if approval.scope_operation_id is not None and approval.scope_operation_id != (
        request.operation_id
    ):
        return REASON_OPERATION
    for field, name, source in SCOPE_FIELDS:
        approved = getattr(approval, field)
        if approved is None:
            continue
        if source.startswith("params."):
            actual = params.get(source.removeprefix("params."), _ABSENT)
        else:
            actual = getattr(request, source)
        if actual != approved:
            kind = "" if actual is _ABSENT or isinstance(actual, str) else " (not a string)"
            return (
                f"{REASON_OUT_OF_SCOPE}: {name} {_show(actual)}{kind}, approved {_show(approved)}"
            )
    return None


@dataclass(frozen=True)
class Admission:
    """Result of :func:`evaluate`.

    Attributes:
        decision: the admission decision to publish (key: operation ID).
        use: the approval's consumption by this operation, to publish on
            ``approval-uses`` (key: approval ID), or ``None`` when nothing
            was consumed now.
    """

    decision: AdmissionDecision
    use: ApprovalUse | None


def evaluate(
    approval: Approval | None,
    request: AdmissionRequest,
    *,
    use: ApprovalUse | None = None,
    now_ms: int,
    policy_version: int,
    decided_by: str,
    trusted: Mapping[str, Ed25519PublicKey] | None = None,
    amount_field: str | None = DEFAULT_AMOUNT_FIELD,
    sink_registered: bool = True,
    consequence: str | None = None,
    ledger_id: str = DEFAULT_LEDGER_ID,
    unverifiable: str | None = None,
) -> Admission:
    """Decide whether ``request`` may be admitted under ``approval`` at ``now_ms``.

    Args:
        approval: the approval's current record (grant or revocation), or
            ``None`` if unknown.
        request: the admission request (one exact operation and digest).
        use: the approval's consumption as the kernel recorded it on
            ``approval-uses``, or ``None`` when it was never consumed. Only
            this record says who consumed an approval; a ``CONSUMED`` status
            on the approval record itself (written by earlier releases, or by
            anyone who can write that topic) can refuse but never admit.
        now_ms: ledger time of the decision (milliseconds).
        policy_version: policy version in force at ``now_ms``.
        decided_by: kernel instance name, recorded in the decision.
        trusted: reviewer keys trusted to sign approvals; ``None`` disables
            the signature check (unit tests of the other checks only).
        amount_field: the parameter holding the amount, as the contract of
            the request's sink names it (``None``: its effects carry no
            amount; see :func:`scope_problem`).
        sink_registered: whether the request's sink is in the sink registry
            (an unregistered one is refused, see :func:`scope_problem`).
        consequence: the consequence class of the request's sink contract
            (``None``: unknown); decides what a compensation needs (see
            :func:`compensation_problem`).
        ledger_id: the kernel's ledger: a grant signed for another ledger
            does not verify (:func:`ledger.signing.verify`).
        unverifiable: what the kernel could not verify about this approval
            or the policy (a use, revocation or policy record sealed by a key
            it does not hold), or ``None``. Such evidence is never read as
            absent: the request is refused with :data:`REASON_UNVERIFIABLE`
            and the description, whatever else holds (fail closed).

    Returns:
        The decision and, when admitted for the first time, the use to record.
        An operation that already consumed this approval (the same
        operation and digest: a redelivered request, or the operation asking
        again after a reservation was cancelled) is not refused as consumed,
        but every check that time or a person changes (revocation, expiry,
        policy version) applies again: the use record does not say which
        request consumed the approval, so a request after the approval
        lapsed is refused whatever its history. A true redelivery finds the
        operation past admission and its decision is ignored. The decision
        (and the use) name the request they answer (``request_state_version``
        = the request's ``state_version``): the processor applies a decision
        only to the request pending, so a copy of it appended later changes
        nothing.
    """

    def result(admitted: bool, reason: str, new: ApprovalUse | None = None) -> Admission:
        return Admission(
            AdmissionDecision(
                operation_id=request.operation_id,
                approval_id=request.approval_id,
                parameter_digest=request.parameter_digest,
                admitted=admitted,
                reason=reason,
                evaluated_at_ms=now_ms,
                policy_version=policy_version,
                approval_policy_version=approval.policy_version if approval else None,
                approval_expires_at_ms=approval.expires_at_ms if approval else None,
                reviewer=approval.reviewer if approval else None,
                decided_by=decided_by,
                request_state_version=request.state_version,
            ),
            new,
        )

    if unverifiable is not None:
        return result(False, f"{REASON_UNVERIFIABLE} ({unverifiable})")
    if approval is None:
        return result(False, REASON_NOT_FOUND)
    if trusted is not None:
        problem = verify(approval, dict(trusted), ledger_id)
        if problem is not None:
            return result(False, problem)
    # Scope never depends on time: it is checked for every request, a
    # redelivery included, so no use record (forged or not) can carry an
    # operation outside what the reviewer approved.
    problem = scope_problem(approval, request, amount_field, sink_registered=sink_registered)
    if problem is None:
        problem = compensation_problem(approval, request, consequence)
    if problem is not None:
        return result(False, problem)
    # The consuming operation asking again is not refused as consumed; the
    # checks that time or a person can change apply to it as to any request.
    # (Skipping them let anyone who can publish intents steer an operation
    # whose reservation was cancelled back to its own revoked or expired
    # approval and have it admitted again.)
    again = (
        use is not None
        and use.operation_id == request.operation_id
        and use.parameter_digest == request.parameter_digest
    )
    if approval.status == "REVOKED":
        return result(False, REASON_REVOKED)
    if not again and (
        use is not None or approval.status == "CONSUMED" or approval.consumed_by is not None
    ):
        return result(False, REASON_CONSUMED)
    if now_ms >= approval.expires_at_ms:
        return result(False, REASON_EXPIRED)
    if approval.policy_version != policy_version:
        return result(False, REASON_POLICY)
    if again:
        return result(True, REASON_ADMITTED)
    consumed = ApprovalUse(
        approval_id=request.approval_id,
        operation_id=request.operation_id,
        parameter_digest=request.parameter_digest,
        consumed_at_ms=now_ms,
        decided_by=decided_by,
        request_state_version=request.state_version,
    )
    return result(True, REASON_ADMITTED, consumed)


#: The reviewer name of the standing policy engine: its approvals are policy
#: approvals, not a person's review.
POLICY_ENGINE = "policy-engine"


def compensation_problem(
    approval: Approval, request: AdmissionRequest, consequence: str | None
) -> str | None:
    """Why ``approval`` cannot admit a compensation, by consequence class.

    A compensation (``request.compensates`` set) of a reversible-internal
    effect may be admitted under a standing policy approval (reviewer
    :data:`POLICY_ENGINE`, no human review); a reversible-external one only
    under a reviewer's own approval (a fresh review: a consumed approval,
    the original's included, never admits another operation); an
    irreversible one, or one whose sink's class is unknown, never. Other
    requests are not concerned.

    Args:
        approval: the approval the request names.
        request: the admission request.
        consequence: the consequence class of the request's sink (``None``: unknown).

    Returns:
        ``None`` when the approval may admit the request, else the reason.
    """
    if request.compensates is None:
        return None
    if consequence not in ("reversible-internal", "reversible-external"):
        return (
            f"compensation of {request.compensates} refused: the sink's consequence class is "
            f"{consequence or 'unknown'}, which no approval can compensate"
        )
    if consequence == "reversible-external" and approval.reviewer == POLICY_ENGINE:
        return (
            f"compensation of {request.compensates} refused: a reversible-external effect is "
            f"compensated only under a fresh review by a person, not a {POLICY_ENGINE} approval"
        )
    return None


@dataclass(frozen=True)
class Merge:
    """Result of :func:`merge_approval`.

    Attributes:
        approval: the approval's record after the incoming one.
        note: ``None``, or why the incoming record was not taken as is
            (an operating-event reason).
    """

    approval: Approval
    note: str | None = None


def _grant(a: Approval) -> tuple[object, ...]:
    return (
        a.reviewer,
        a.policy_version,
        a.expires_at_ms,
        a.scope_subject,
        a.scope_max_amount_minor,
        a.scope_operation_id,
        a.granted_at_ms,
        a.key_id,
        a.signature,
        *(getattr(a, field) for field, _, _ in SCOPE_FIELDS),
    )


def merge_approval(existing: Approval | None, incoming: Approval) -> Merge:
    """Fold one record of ``ledger.approvals`` (grants and revocations) into the kernel's table.

    A review decision submitted twice stays one approval, and a grant never
    un-revokes an approval. Consumption is not here: it lives on
    ``approval-uses``, which only the kernel writes, so a grant re-published
    after its use cannot erase the use (DESIGN.md "Kafka layout": one writer
    per compacted key). A ``CONSUMED`` record on this topic (earlier
    releases wrote them) is kept, and can only refuse.
    """
    if existing is None:
        return Merge(incoming)
    if incoming.status == "GRANTED":
        if _grant(incoming) != _grant(existing):
            return Merge(
                existing,
                f"approval ID {incoming.approval_id} reused for a different review decision; "
                "the first decision stands",
            )
        return Merge(existing)
    if incoming.status == "REVOKED":
        return Merge(
            existing.model_copy(update={"status": "REVOKED", "revoked_by": incoming.revoked_by})
        )
    # CONSUMED, as earlier releases wrote it: refuses from now on, never admits.
    if existing.status == "REVOKED":
        return Merge(existing.model_copy(update={"consumed_by": incoming.consumed_by}))
    return Merge(incoming)


def admission_withdrawn(
    approval_id: str | None, approval: Approval | None, policy_version: int
) -> str | None:
    """Why an admitted operation may no longer cross its effect boundary, or ``None``.

    A reservation (try-confirm-cancel) is confirmed only while the admission
    still stands: the kernel admitted the operation under this approval
    while it was current, so what can have changed since is only what time
    or a person changes -- a revocation, or a new policy version (the
    approval was granted under the policy version in force at admission).
    This function never admits anything: it can only withdraw.

    Args:
        approval_id: the approval the operation was admitted under.
        approval: that approval as the approvals table holds it now
            (revocations merged by :func:`merge_approval`), or ``None``.
        policy_version: the policy version in force now.

    Returns:
        ``None`` while the admission stands, else the reason (it names the
        approval and says ``revoked`` or ``policy version changed``).
    """
    if approval_id is None:
        return "the dispatch names no approval: its admission cannot be checked"
    if approval is None:
        return (
            f"approval {approval_id} is not in the approvals table: its admission cannot be checked"
        )
    if approval.status == "REVOKED":
        by = f" by {approval.revoked_by}" if approval.revoked_by else ""
        return f"approval {approval_id} was revoked{by} after admission ({REASON_REVOKED})"
    if approval.policy_version != policy_version:
        return (
            f"{REASON_POLICY} since admission under approval {approval_id} "
            f"(admitted under policy {approval.policy_version}, now {policy_version})"
        )
    return None


#: The key of the policy topic's one row in releases before per-change keys;
#: such a record is still read (and ordered by its effective time like any).
LEGACY_POLICY_KEY = "current"


def policy_key(change: PolicyChange) -> str:
    """The record key of a policy change: ``v{version}@{effective_at_ms}``.

    Each change has its own key, so compaction keeps every change (they are
    few) and a replayed copy of an old change lands on that change's own key:
    it cannot displace, under compaction, the change that superseded it.
    """
    return f"v{change.version}@{change.effective_at_ms}"


def supersedes(incoming: PolicyChange, in_force: PolicyChange | None) -> bool:
    """Whether a policy change takes over from the one in force.

    Changes are ordered by their effective time (ledger milliseconds, signed
    with the change), then by version, never by where they were found: an
    authentic change appended again later (a replay by anyone who can write
    the topic) is older than what superseded it and changes nothing. Setting
    an earlier version again is a new change with a new effective time.

    Args:
        incoming: a policy change (authenticated by the caller).
        in_force: the change in force, or ``None`` (the configured version).

    Returns:
        ``True`` when ``incoming`` is later than ``in_force``.
    """
    if in_force is None:
        return True
    return (incoming.effective_at_ms, incoming.version) > (
        in_force.effective_at_ms,
        in_force.version,
    )


def version_in_force(in_force: PolicyChange | None, configured: int) -> int:
    """The policy version in force: the change in force's, else the configured one.

    Args:
        in_force: the policy change in force (see :func:`takes_over`), or ``None``.
        configured: the version the settings name (``LEDGER_POLICY_VERSION``).
    """
    return in_force.version if in_force is not None else configured


def takes_over(key: str, change: PolicyChange, in_force: PolicyChange | None) -> bool:
    """Whether an authentic policy record found under ``key`` becomes the policy in force.

    It must be keyed by itself (:func:`policy_key`, or the legacy
    ``current``), name a version of 1 or more and be later than the change
    in force (:func:`supersedes`). The authority kernel reports a record
    that fails; other readers skip it.

    Args:
        key: the record's key.
        change: the authenticated change.
        in_force: the change in force so far, or ``None``.
    """
    return (
        change.version >= 1
        and key in (LEGACY_POLICY_KEY, policy_key(change))
        and supersedes(change, in_force)
    )
