"""How far an approval reaches: bound to one exact operation unless deliberately opened.

The article's admission is for "one exact, typed operation". An approval
names its subject and amount always; the fields below bind it further. An
approval made by the ledger's own tools (``ledger approve``) must bind each of
them, or name it as deliberately left open, so that a grant broad enough to
be used by another operation (a service naming its own account under a
customer's approval) is never made by omission. A parameter digest binds the
operation's parameters, action and sink at once (it is computed over them,
:func:`ledger.identity.parameter_digest`), so with one only the operation ID
is left to bind.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ledger.events import Approval

#: The fields an approval may bind, as the CLI names them (``--open`` takes these).
BINDABLE: tuple[str, ...] = ("operation-id", "account", "action", "sink", "currency")

#: What a parameter digest binds besides itself.
BOUND_BY_DIGEST: frozenset[str] = frozenset({"account", "action", "sink", "currency"})


def scope_values(
    *,
    operation_id: str | None,
    account: str | None,
    action: str | None,
    sink: str | None,
    currency: str | None,
    parameter_digest: str | None,
) -> dict[str, str | None]:
    """The binding fields of a grant as :func:`problem` and :func:`unbound` take them."""
    return {
        "operation-id": operation_id,
        "account": account,
        "action": action,
        "sink": sink,
        "currency": currency,
        "parameter-digest": parameter_digest,
    }


def problem(
    given: Mapping[str, str | None], opened: Collection[str]
) -> tuple[str, list[str]] | None:
    """What keeps a grant from being made, or ``None`` when its scope is complete.

    Args:
        given: :func:`scope_values`.
        opened: the fields left open on purpose.

    Returns:
        ``("unknown", fields)`` -- ``opened`` names fields not in
        :data:`BINDABLE`; ``("both", fields)`` -- fields both given and
        opened; ``("unbound", fields)`` -- fields neither (see :func:`unbound`).
        Each caller words the remedy in its own terms (options, arguments).
    """
    unknown = [f for f in opened if f not in BINDABLE]
    if unknown:
        return "unknown", unknown
    both = [f for f in opened if given.get(f) is not None]
    if both:
        return "both", both
    missing = unbound(given, opened)
    return ("unbound", missing) if missing else None


def unbound(given: Mapping[str, str | None], opened: Collection[str]) -> list[str]:
    """The fields neither bound nor deliberately left open, in :data:`BINDABLE` order.

    Args:
        given: field -> value given (``None``: not given); the keys are
            :data:`BINDABLE` and ``parameter-digest``.
        opened: the fields the reviewer leaves open on purpose.

    Returns:
        The fields still to bind or open (empty: the scope is complete).
    """
    by_digest = BOUND_BY_DIGEST if given.get("parameter-digest") else frozenset()
    return [f for f in BINDABLE if given.get(f) is None and f not in opened and f not in by_digest]


def open_fields(approval: Approval) -> list[str]:
    """The fields an approval leaves open (any operation's value is admitted there).

    Args:
        approval: a grant.

    Returns:
        Names from :data:`BINDABLE`; empty for an approval bound to one exact operation.
    """
    values = scope_values(
        operation_id=approval.scope_operation_id,
        account=approval.scope_account,
        action=approval.scope_action,
        sink=approval.scope_sink,
        currency=approval.scope_currency,
        parameter_digest=approval.scope_parameter_digest,
    )
    return unbound(values, ())
