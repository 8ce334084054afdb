"""Who may write what: the keys that seal records, and the people the ledger trusts.

* ``ledger keys init`` / ``ledger keys show`` / ``ledger keys rotate ROLE``
  -- each stage role's signing key, the authority kernel's and the outcome
  key pairs (:mod:`ledger.rolekeys`).
* ``ledger reviewer add NAME`` -- a reviewer signs approvals and revocations.
* ``ledger operator add NAME`` -- an operator signs policy changes,
  dispositions and revocations.

See :mod:`ledger.authn` for what a seal covers and docs/trust-model.md.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import click

from ledger import topics
from ledger.cli.common import EXIT_ERROR, current_settings, fail
from ledger.credentials import add_person, keys_dir, load_keyring, provision_keys
from ledger.errors import BrokerUnavailableError
from ledger.rolekeys import TRUST_FILE, rotate
from ledger.topology import TOPICS

#: Reviewer and operator names: they become file names under LEDGER_RUN_DIR/.
PERSON_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _when(ms: int) -> str:
    """A not-after time as people read it: UTC, then the ledger's milliseconds."""
    return f"{datetime.fromtimestamp(ms / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC ({ms} ms)"


def person_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Click callback: a reviewer or operator name is file-safe (no path traversal)."""
    if not PERSON_NAME.fullmatch(value):
        raise click.BadParameter(
            "use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def _add(role: str, name: str) -> None:

    settings = current_settings()
    _, path = add_person(settings, role, name)
    click.echo(
        f"{role} key for {name} written to {path} (mode 0600); trusted as {role} in "
        f"{settings.trusted_keys_path()}"
    )


@click.group("reviewer")
def reviewer_group() -> None:
    """Reviewer signing keys (Ed25519) the authority kernel trusts."""


@reviewer_group.command("add")
@click.argument("name", callback=person_name)
def reviewer_add(name: str) -> None:
    """Create a signing key for reviewer NAME and trust it.

    The private key goes to LEDGER_RUN_DIR/reviewers/NAME.key (mode 0600); its
    public half is added to the trusted keys file every stage reads
    (LEDGER_TRUSTED_KEYS_FILE, default LEDGER_RUN_DIR/trusted_keys.json).
    `ledger approve --reviewer NAME` and `ledger revoke --by NAME` sign with it.
    """
    _add("reviewer", name)


@click.group("operator")
def operator_group() -> None:
    """Operator signing keys (Ed25519): policy changes, dispositions, revocations."""


@operator_group.command("add")
@click.argument("name", callback=person_name)
def operator_add(name: str) -> None:
    """Create a signing key for operator NAME and trust it.

    The private key goes to LEDGER_RUN_DIR/operators/NAME.key (mode 0600); its
    public half is trusted (role operator) in the trusted keys file. The
    ledger believes a policy change, a disposition or a revocation only when
    the operator it names (`--by NAME`) signed it:

        ledger operator add alex
        ledger policy set 2 --by alex
        ledger reconcile dispose OP --decision absent --by alex --evidence "..."
    """
    _add("operator", name)


@click.group("keys")
def keys_group() -> None:
    """Each stage role's signing key, the authority kernel's key and the outcome key."""


@keys_group.command("init")
@click.option(
    "--share",
    is_flag=True,
    help="Add this ledger to a keys folder that already serves another ledger "
    "(seals still name their ledger, so nothing moves between them).",
)
@click.option(
    "--offline",
    is_flag=True,
    help="Do not ask Kafka whether the ledger already holds records (a host that "
    "cannot reach it; you vouch that the ledger is new).",
)
def keys_init(share: bool, offline: bool) -> None:
    """Provision this ledger's stage role, authority and outcome keys; never over evidence.

    Keys are made only here (and by the testbed): a stage, command or service
    that lacks a key stops and says so, since a fresh key would read the
    evidence sealed with the lost one as absent. Keys already in the folder
    are kept (run it again to bind a folder made by an earlier release). When
    a key is missing and the ledger's topics already hold sealed records, it
    refuses: restore the keys folder instead.

    Then copy the files to the other hosts: each ROLE.key (processor, relay,
    reconciler, resumer) to that role's hosts only, authority.key to the
    authority kernel's host only, outcome.key to the processors' hosts,
    stage-keys.json, authority.pub, ledgers.json and trusted_keys.json
    everywhere. On a folder of an earlier release (a shared deployment.key),
    it makes the role keys and records the cut-over: the deployment key
    verifies records appended until now plus an hour, then only older ones.

    \b
      ledger keys init                      # a new ledger (LEDGER_TOPIC_PREFIX)
      LEDGER_TOPIC_PREFIX=b ledger keys init --share   # ledger b uses the same keys
    """
    settings = current_settings()
    folder = keys_dir(settings)
    missing = [n for n in ("authority.pub",) if not (folder / n).exists()]
    if not (folder / TRUST_FILE).exists() and not (folder / "deployment.key").exists():
        missing.append(TRUST_FILE)  # an earlier release's deployment.key still verifies
    if missing and not offline:
        sealed = [spec.name for spec in TOPICS if spec.auth]
        try:
            held = topics.non_empty_topics(settings, sealed)
        except BrokerUnavailableError as exc:
            raise BrokerUnavailableError(
                f"{exc.message}; `ledger keys init` asks Kafka whether ledger "
                f"{settings.ledger_identity!r} already holds records before it makes keys "
                "(--offline skips that, for a ledger you know is new)",
                expected=exc.expected,
                observed=exc.observed,
            ) from exc
        if held:
            fail(
                f"ledger {settings.ledger_identity!r} already holds sealed records "
                f"({', '.join(held)}) and {folder} has no {' or '.join(missing)}: keys made now "
                "could not verify that evidence. Restore the keys folder from a backup or "
                "another stage host (LEDGER_KEYS_DIR), or start a new ledger under another "
                "LEDGER_TOPIC_PREFIX",
                EXIT_ERROR,
            )
    done = provision_keys(settings, share=share)
    verb = (
        f"created {', '.join(done.created)}"
        if done.created
        else "every key this host holds was there already"
    )
    click.echo(f"keys of ledger {settings.ledger_identity!r} in {done.folder}: {verb}")
    for role, key_id in done.role_key_ids.items():
        mine = " (+ private key)" if (done.folder / f"{role}.key").exists() else ""
        click.echo(f"{role} key {key_id}: {done.folder / TRUST_FILE}{mine}")
    if done.authority_key_id:
        click.echo(
            f"authority key {done.authority_key_id}: {done.folder / 'authority.pub'}"
            + (" (+ authority.key)" if (done.folder / "authority.key").exists() else "")
        )
    if (done.folder / "outcome.pub").exists():
        click.echo(
            f"outcome key: {done.folder / 'outcome.pub'}"
            + (" (+ outcome.key)" if (done.folder / "outcome.key").exists() else "")
            + "; give services its public half: `ledger keys export --outcome-public > F`"
        )
    click.echo(f"serves ledger(s): {', '.join(done.ledgers)}")


@keys_group.command("export")
@click.option(
    "--outcome-public",
    "outcome_public",
    is_flag=True,
    required=True,
    help="Print the public half of the processor's outcome key (no secret).",
)
def keys_export(outcome_public: bool) -> None:
    """Print a public key for another host; creates nothing.

    A service reads what became of its operations from the outcomes topic
    and checks each record with the outcome key's public half, so it holds no
    secret. On a stage host:

    \b
      ledger keys export --outcome-public > outcome.pub
      # on the service host: LEDGER_OUTCOME_PUBLIC_KEY_FILE=/path/outcome.pub
    """
    settings = current_settings()
    path = keys_dir(settings) / "outcome.pub"
    if not path.exists():
        fail(
            f"no outcome.pub in {keys_dir(settings)} (LEDGER_KEYS_DIR): run this on a stage "
            "host of the ledger; `ledger keys init` there makes the outcome key",
            EXIT_ERROR,
        )
    click.echo(path.read_text().strip())


@keys_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def keys_show(as_json: bool) -> None:
    """List the keys this host holds and trusts (IDs and roles; never a secret)."""
    settings = current_settings()
    ring = load_keyring(settings, missing_ok=True)
    rows = [
        {
            "key_id": k,
            "role": "stage (legacy)",
            "kind": "hmac-sha256",
            "not_after_ms": ring.mac_not_after.get(k),
        }
        for k in sorted(ring.macs)
    ] + [
        {"key_id": k, "role": t.role, "kind": "ed25519", "not_after_ms": t.not_after_ms}
        for k, t in sorted(ring.trusted.items())
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        ms = row["not_after_ms"]
        until = f"  not after {_when(ms)}" if isinstance(ms, int) else ""
        click.echo(f"{row['role']:<14} {row['kind']:<12} {row['key_id']}{until}")


@keys_group.command("rotate")
@click.argument("role", type=click.Choice(["processor", "relay", "reconciler", "resumer"]))
@click.option(
    "--overlap-s",
    type=click.IntRange(min=0),
    default=3600,
    show_default=True,
    help="Seconds the old key still verifies new records (copy the new key and restart "
    "the role's stages within them).",
)
def keys_rotate(role: str, overlap_s: int) -> None:
    """Give stage ROLE a new signing key; the old one retires after an overlap.

    The new key replaces ROLE.key here and is listed in stage-keys.json; the
    old key's not-after time is now plus --overlap-s. Until then both verify
    new records; after it, the old key verifies only records the broker
    appended by then (the topics keep broker time, LogAppendTime), so a
    stolen old key forges nothing new. Then copy ROLE.key to the role's hosts
    and stage-keys.json to every host, and restart the role's stages.

    \b
      ledger keys rotate relay                  # an hour of overlap
      ledger keys rotate processor --overlap-s 600
    """
    settings = current_settings()
    done = rotate(settings, role, overlap_s=overlap_s)
    key_file, trust_file = done.files
    click.echo(
        f"{role}: new key {done.new_key_id} in {key_file}; {done.old_key_id} verifies records "
        f"appended until {_when(done.not_after_ms)}, in {overlap_s} s"
    )
    click.echo(
        f"copy {key_file} to the {role}'s hosts and {trust_file} to every host, then restart "
        f"the {role}'s stages within {overlap_s} s"
    )


#: This module's commands, in the order ``ledger --help`` lists them.
COMMANDS: tuple[click.Command, ...] = (reviewer_group, operator_group, keys_group)
