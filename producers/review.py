"""Grants from Python: a review system makes the approval a reviewer decided.

The same rule as ``ledger approve`` (:mod:`ledger.scope`): a grant is bound
to one exact operation unless the reviewer deliberately leaves a field open,
and a grant that would admit any account or any operation by omission is
refused before it is signed. Two ways to make one:

* :func:`grant_for` -- the reviewer approves an intent as recorded (the
  usual case once a service has published it): the grant names its
  operation ID, parameter digest, subject, action, sink and amount.
* :func:`grant` -- every field given by hand (approving before the intent
  exists), each bound or named in ``opened``.

Publish the result with :meth:`producers.publisher.LedgerPublisher.publish_approval`.

Example:
    >>> approval = grant_for(alice_key, intent, approval_id="review-1842",
    ...                      expires_at_ms=now + 3_600_000, policy_version=1,
    ...                      granted_at_ms=now, ledger_id=settings.ledger_identity)
    >>> publisher.publish_approval(approval)
"""

from __future__ import annotations

import json
from collections.abc import Collection

from ledger.errors import ScopeNotBoundError
from ledger.events import Approval, Intent
from ledger.scope import BINDABLE, problem, scope_values
from ledger.signing import ReviewerKey

__all__ = ["ScopeNotBoundError", "grant", "grant_for"]


def grant(
    key: ReviewerKey,
    *,
    approval_id: str,
    subject: str,
    max_amount_minor: int,
    expires_at_ms: int,
    granted_at_ms: int,
    policy_version: int,
    ledger_id: str,
    operation_id: str | None = None,
    account: str | None = None,
    action: str | None = None,
    sink: str | None = None,
    currency: str | None = None,
    purpose: str | None = None,
    parameter_digest: str | None = None,
    opened: Collection[str] = (),
    reviewer: str | None = None,
) -> Approval:
    """A grant signed by ``key``, bound to one operation unless fields are ``opened``.

    Args:
        key: the reviewer's signing key (its name is the grant's reviewer).
        approval_id: the grant's ID (intents name it).
        subject: the subject it covers.
        max_amount_minor: the largest amount it covers, in minor units.
        expires_at_ms: when it expires, ledger time (ms).
        granted_at_ms: when it is granted, ledger time (ms).
        policy_version: the policy it is granted under (1 or more).
        ledger_id: the ledger it is for (``settings.ledger_identity``).
        operation_id: the operation it binds (``None``: not bound).
        account: the account it binds (``None``: not bound).
        action: the action it binds (``None``: not bound).
        sink: the sink it binds (``None``: not bound).
        currency: the currency it binds (``None``: not bound).
        purpose: the purpose it binds (``None``: not bound).
        parameter_digest: the parameter digest it binds (``None``: not bound).
        opened: fields of :data:`ledger.scope.BINDABLE` left open on purpose.
        reviewer: the reviewer's name (default the key's ``key_id``).

    Returns:
        The signed grant.

    Raises:
        ScopeNotBoundError: a bindable field is neither given nor opened, a
            field is both given and opened, or ``opened`` names an unknown field.
    """
    given = scope_values(
        operation_id=operation_id,
        account=account,
        action=action,
        sink=sink,
        currency=currency,
        parameter_digest=parameter_digest,
    )
    found = problem(given, opened)
    if found is not None:
        kind, fields = found
        if kind == "unknown":
            raise ScopeNotBoundError(
                f"cannot open {', '.join(fields)}: the fields a grant may leave open are "
                + ", ".join(BINDABLE),
                observed=fields,
            )
        if kind == "both":
            raise ScopeNotBoundError(
                f"{fields[0]} is both bound and opened: bind the field or leave it open, not both",
                observed=fields,
            )
        raise ScopeNotBoundError(
            f"the grant would admit any {', '.join(fields)}: bind {', '.join(fields)} (an "
            f"approval is for one exact operation), or leave them open on purpose with "
            f"opened={fields!r}",
            observed=fields,
        )
    return key.sign(
        Approval(
            approval_id=approval_id,
            reviewer=reviewer if reviewer is not None else key.key_id,
            policy_version=policy_version,
            expires_at_ms=expires_at_ms,
            scope_subject=subject,
            scope_max_amount_minor=max_amount_minor,
            scope_operation_id=operation_id,
            granted_at_ms=granted_at_ms,
            scope_action=action,
            scope_sink=sink,
            scope_currency=currency,
            scope_account=account,
            scope_purpose=purpose,
            scope_parameter_digest=parameter_digest,
        ),
        ledger_id=ledger_id,
    )


def grant_for(
    key: ReviewerKey,
    intent: Intent,
    *,
    approval_id: str,
    expires_at_ms: int,
    granted_at_ms: int,
    policy_version: int,
    ledger_id: str,
    max_amount_minor: int | None = None,
) -> Approval:
    """A grant of exactly the operation ``intent`` describes, signed by ``key``.

    It binds the intent's operation ID, parameter digest (hence its
    parameters), subject, action, sink, purpose and, where its parameters
    name them, account and currency.

    Args:
        key: the reviewer's signing key.
        intent: the intent as recorded (e.g. read from the ledger, or as the
            service built it with :func:`producers.publisher.build_intent`).
        approval_id: the grant's ID (the intent's ``approval_id``, when it names one).
        expires_at_ms: when it expires, ledger time (ms).
        granted_at_ms: when it is granted, ledger time (ms).
        policy_version: the policy it is granted under.
        ledger_id: the ledger it is for.
        max_amount_minor: the cap; default the intent's ``amount_minor``.

    Returns:
        The signed grant.
    """
    params = json.loads(intent.params_json)
    account = params.get("account") if isinstance(params, dict) else None
    currency = params.get("currency") if isinstance(params, dict) else None
    return grant(
        key,
        approval_id=approval_id,
        subject=intent.subject,
        max_amount_minor=intent.amount_minor if max_amount_minor is None else max_amount_minor,
        expires_at_ms=expires_at_ms,
        granted_at_ms=granted_at_ms,
        policy_version=policy_version,
        ledger_id=ledger_id,
        operation_id=intent.operation_id,
        account=account if isinstance(account, str) else None,
        action=intent.action,
        sink=intent.sink,
        currency=currency if isinstance(currency, str) else None,
        purpose=intent.purpose,
        parameter_digest=intent.parameter_digest,
    )
