"""Review decisions from the command line: ``ledger approve`` and ``ledger revoke``.

An approval made here is bound to one exact operation unless the reviewer
deliberately opens a field (:mod:`ledger.scope`): ``--operation-id`` and the
operation's ``--account``, ``--action``, ``--sink`` and ``--currency`` (or its
``--parameter-digest``, which binds the last four at once), each given or
named with ``--open``.
"""

from __future__ import annotations

from typing import Any

import click

from consumers import reader
from ledger.cli.common import current_settings, instant_text
from ledger.cli.inputs import POLICY_VERSION
from ledger.cli.inputs import digest as _digest
from ledger.cli.inputs import non_blank as _non_blank
from ledger.cli.inputs import publisher as _publisher
from ledger.cli.inputs import ready as _ready
from ledger.cli.keys import person_name
from ledger.clock import clock_for
from ledger.errors import LocalFileError
from ledger.events import Approval
from ledger.scope import BINDABLE, problem, scope_values
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey
from ledger.topology import Topic
from producers.review import grant
from sinks.registry import load_sinks


def _reviewer_name(ctx: click.Context, param: click.Parameter, value: str) -> str:

    return person_name(ctx, param, value)


def _reviewer_key(settings: LedgerSettings, name: str) -> Any:

    path = settings.run_dir / "reviewers" / f"{name}.key"
    if not path.exists():
        raise click.ClickException(
            f"reviewer {name!r} has no signing key; create one with 'ledger reviewer add {name}'"
        )
    try:
        return ReviewerKey.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalFileError(
            f"the reviewer key file {path} is unreadable ({exc}); restore it, or make a new "
            f"key under a new name with `ledger reviewer add`",
            observed=str(exc),
        ) from exc


@click.command("approve")
@click.option(
    "--approval-id",
    required=True,
    callback=_non_blank,
    help="Approval ID (the review decision's ID); intents name it with --approval-id.",
)
@click.option(
    "--reviewer", required=True, callback=_reviewer_name, help="Reviewer; signs with their key."
)
@click.option("--subject", required=True, callback=_non_blank, help="Subject the approval covers.")
@click.option(
    "--max-amount-minor",
    type=click.IntRange(min=0),
    required=True,
    help="Largest amount covered, in minor units (pence, cents), read from the parameter the "
    "sink's contract names (amount_minor unless it says otherwise); an intent whose parameters "
    "lack it is refused.",
)
@click.option(
    "--expires-in-s",
    type=click.FloatRange(min=0, min_open=True),
    default=3600.0,
    show_default=True,
    help="Expiry, seconds after now on the ledger clock.",
)
@click.option(
    "--operation-id",
    default=None,
    callback=_non_blank,
    help="Bind the approval to one operation ID (e.g. refund:1842:v3).",
)
@click.option(
    "--policy-version",
    type=POLICY_VERSION,
    default=None,
    help="Policy version granted under, 1 or more (default: the version in force on the ledger, "
    "`ledger policy show`). An approval granted under another version than the one in force "
    "admits nothing.",
)
@click.option(
    "--action",
    default=None,
    callback=_non_blank,
    help="Admit only this action (e.g. refund): a payout under a refund's approval is refused.",
)
@click.option(
    "--sink",
    default=None,
    callback=_non_blank,
    help="Admit only operations at this sink (its name in the sink registry, e.g. payments; "
    "a name the registry does not hold is refused: ledger sink list shows them).",
)
@click.option(
    "--currency",
    default=None,
    callback=_non_blank,
    help="Admit only operations whose params.currency is this (e.g. GBP): without it, "
    "'5000' covers 5000 of any currency.",
)
@click.option(
    "--account",
    default=None,
    callback=_non_blank,
    help="Admit only operations whose params.account is this (e.g. acct-1842).",
)
@click.option(
    "--purpose",
    default=None,
    callback=_non_blank,
    help="Admit only operations declaring this purpose (e.g. fee-remediation).",
)
@click.option(
    "--parameter-digest",
    default=None,
    callback=_digest,
    help="Admit only the operation with exactly these parameters: its parameter digest "
    "('v2:' and 64 hex digits), as 'ledger intent publish' prints it.",
)
@click.option(
    "--open",
    "opened",
    multiple=True,
    type=click.Choice(BINDABLE),
    help="Leave this field open on purpose (repeat for each): the approval then admits any "
    "operation's value there. Every field of operation-id, account, action, sink and currency "
    "must be bound or opened.",
)
def approve_cmd(
    approval_id: str,
    reviewer: str,
    subject: str,
    max_amount_minor: int,
    expires_in_s: float,
    operation_id: str | None,
    policy_version: int | None,
    action: str | None,
    sink: str | None,
    currency: str | None,
    account: str | None,
    purpose: str | None,
    parameter_digest: str | None,
    opened: tuple[str, ...],
) -> None:
    """Publish a signed review decision (an approval), bound to one exact operation.

    The authority kernel admits one exact operation with it, once, while it is
    current: not expired or revoked, granted under the policy in force, and
    covering the operation's scope: its subject, its amount (up to
    --max-amount-minor), and each of --operation-id, --action, --sink,
    --currency, --account, --purpose and --parameter-digest that is given.
    An operation outside the scope is refused with the field and both values
    ('out of scope: currency EUR, approved GBP') and the approval stays
    unused. The reviewer's signature covers every field given.

    The approval is bound to one operation: give --operation-id, and either
    its --parameter-digest or each of --account, --action, --sink and
    --currency. A field left out must be named with --open (a standing
    policy approval, say), and is shown as open wherever the approval is:
    an approval that leaves the account open lets whoever may publish an
    intent choose where the money goes.

    Example (5000 pence of one GBP refund to acct-1842 at the payments sink):

    \b
      ledger approve --approval-id review-1842 --reviewer alice \\
        --subject customer-1842 --max-amount-minor 5000 \\
        --operation-id refund:1842:v3 --account acct-1842 \\
        --currency GBP --action refund --sink payments
    """
    found = problem(
        scope_values(
            operation_id=operation_id,
            account=account,
            action=action,
            sink=sink,
            currency=currency,
            parameter_digest=parameter_digest,
        ),
        opened,
    )
    if found is not None:  # (--open takes only BINDABLE: "unknown" cannot happen here)
        kind, fields = found
        if kind == "both":
            raise click.UsageError(
                f"--open {fields[0]} and --{fields[0]} contradict each other: bind the field "
                "or open it"
            )
        raise click.UsageError(
            f"the approval would admit any {', '.join(fields)}: bind "
            + " ".join(f"--{f} ..." for f in fields)
            + " (an approval is for one exact operation), or leave them open on purpose with "
            + " ".join(f"--open {f}" for f in fields)
        )
    settings = current_settings()
    if sink is not None:
        _registered_sink(settings, sink)
    _ready(settings)
    key = _reviewer_key(settings, reviewer)
    now = clock_for(settings.clock, settings.run_dir).now_ms()
    in_force = reader.policy_in_force(settings)
    current = in_force.version if in_force is not None else settings.policy_version
    if policy_version is not None and policy_version != current:
        click.echo(
            f"warning: policy {current} is in force; an approval under policy {policy_version} "
            "admits nothing until that version is set (`ledger policy set`)",
            err=True,
        )
    approval = grant(
        key,
        approval_id=approval_id,
        reviewer=reviewer,
        subject=subject,
        max_amount_minor=max_amount_minor,
        expires_at_ms=now + int(expires_in_s * 1000),
        granted_at_ms=now,
        policy_version=policy_version if policy_version is not None else current,
        ledger_id=settings.ledger_identity,
        operation_id=operation_id,
        account=account,
        action=action,
        sink=sink,
        currency=currency,
        purpose=purpose,
        parameter_digest=parameter_digest,
        opened=opened,
    )
    pub = _publisher(settings)
    try:
        pub.publish_approval(approval)
    finally:
        pub.close()
    bound = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("operation", operation_id),
            ("action", action),
            ("sink", sink),
            ("currency", currency),
            ("account", account),
            ("purpose", purpose),
            ("parameter digest", parameter_digest),
        )
        if value is not None
    )
    click.echo(
        f"approval {approval_id} by {reviewer}: {subject}, up to {max_amount_minor} minor units"
        + (f" ({bound})" if bound else "")
        + f", policy {approval.policy_version}, expires at "
        + instant_text(approval.expires_at_ms, now)
        + " on the ledger clock"
        + (f"; left open on purpose: {', '.join(opened)}" if opened else "")
    )


def _registered_sink(settings: LedgerSettings, sink: str) -> None:
    """Refuse an approval scoped to a sink the registry does not hold.

    Such an approval admits nothing (no intent can name an unregistered sink
    and be delivered), so a typo would leave the operation waiting for a
    review that already happened.

    Raises:
        click.UsageError: ``sink`` is not in the sink registry; names
            ``ledger sink register`` and the sinks registered.
        LocalFileError: the registry is unreadable.
    """
    registered = load_sinks(settings.sinks_path())
    if sink in registered:
        return
    known = ", ".join(sorted(registered)) or "none"
    raise click.UsageError(
        f"--sink {sink!r} is not registered in {settings.sinks_path()} (registered: {known}); "
        f"register it first (ledger sink register {sink} --url ...) or name a registered sink"
    )


@click.command("revoke")
@click.argument("approval_id", callback=_non_blank)
@click.option(
    "--by",
    required=True,
    callback=_non_blank,
    help="Reviewer or operator who revokes it; signs with their key "
    "(ledger reviewer add / ledger operator add).",
)
def revoke_cmd(approval_id: str, by: str) -> None:
    """Withdraw an approval; nothing new may be admitted with it."""
    settings = current_settings()
    _ready(settings)
    record = reader.latest_by_key(reader.read_topic(settings, Topic.APPROVALS)).get(approval_id)
    if record is None or not isinstance(record.event, Approval):
        raise click.ClickException(f"no approval {approval_id!r} in the ledger")
    pub = _publisher(settings)
    try:
        pub.publish_approval(
            record.event.model_copy(update={"status": "REVOKED", "revoked_by": by})
        )
    finally:
        pub.close()
    click.echo(f"approval {approval_id} revoked by {by}")
