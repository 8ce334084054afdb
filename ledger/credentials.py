"""Key files: where a process finds the keys that seal and check records.

Files (all under ``LEDGER_KEYS_DIR``, default ``LEDGER_RUN_DIR/keys``, unless
noted), each written with mode 0600 when it holds a secret:

* ``processor.key``, ``relay.key``, ``reconciler.key``, ``resumer.key`` and
  ``stage-keys.json`` -- each stage role's own Ed25519 key, and the public
  halves every reader trusts (:mod:`ledger.rolekeys`, which says which file
  goes to which host, and how keys rotate).
* ``deployment.key`` -- the stages' shared HMAC key of earlier releases
  (``{"secret": base64}``), kept where old records are read, as a verifier of
  records appended before the cut-over only (:mod:`ledger.rolekeys`).
* ``authority.key`` / ``authority.pub`` -- the authority kernel's Ed25519
  key pair. Only the kernel needs the private half; every reader needs the
  public one. Its key ID is its fingerprint
  (:func:`ledger.authn.authority_key_id`).
* ``outcome.key`` / ``outcome.pub`` -- the processor's Ed25519 outcome key
  pair: the processor signs the ``outcomes`` it publishes for services with
  the private half; a service needs only ``outcome.pub``
  (``LEDGER_OUTCOME_PUBLIC_KEY_FILE``), which ``ledger keys export
  --outcome-public`` prints, and holds no secret.
* ``ledgers.json`` -- the ledgers these keys serve (``{"ledgers": [ID ...]}``,
  by ``LEDGER_ID``, default the topic prefix): a process of another ledger
  refuses to use them, so separate ledgers never share keys unless an
  operator says so (``ledger keys init --share``).
* ``LEDGER_RUN_DIR/reviewers/NAME.key`` and ``LEDGER_RUN_DIR/operators/NAME.key``
  -- people's Ed25519 keys (``ledger reviewer add``, ``ledger operator add``),
  whose public halves are trusted by role in ``trusted_keys.json``.

Keys are provisioned, never invented: only ``ledger keys init`` (which
refuses while the ledger's topics already hold evidence) and the testbed
call :func:`provision_keys`. A stage, command or service that lacks a key it
needs stops with a :class:`MissingKeyError` naming the key, the folder and
the command that provisions it -- a process that made a fresh key instead
would read the evidence sealed with the lost one as absent (a consumed
approval paid twice) or refuse every genuine record. On several hosts, run
``ledger keys init`` once and copy the files: each ``{role}.key`` to that
role's hosts only, the authority key to the kernel's host only,
``stage-keys.json``, ``authority.pub``, ``ledgers.json`` and
``trusted_keys.json`` everywhere, ``outcome.key`` to the processors' hosts
only, ``outcome.pub`` to every service host, and an earlier release's
``deployment.key`` to the hosts that read old records.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger.authn import (
    AUTHORITY_KEY_PREFIX,
    OUTCOME_KEY_PREFIX,
    ROLE_AUTHORITY,
    ROLE_OPERATOR,
    ROLE_OUTCOME,
    ROLE_REVIEWER,
    STAGE_KEY_ROLES,
    Keyring,
    Sealer,
    SigningKey,
    authority_key_id,
    claimed_writer,
    outcome_key_id,
)
from ledger.errors import CredentialError, InvalidInputError, LocalFileError
from ledger.events import Approval, Event
from ledger.keyfolder import (
    LEDGERS_FILE,
    TRUST_FILE,
    KeysOfAnotherLedgerError,
    MissingKeyError,
    bound_ledgers,
    check_binding,
    create_once,
    deployment_key,
    keys_dir,
    missing_key,
)
from ledger.rolekeys import (
    COMPONENT_ROLE,
    add_role_keys,
    provision_role_keys,
    role_key,
    sealer_for_roles,
)
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, load_trusted_roles, trust
from ledger.topology import TOPIC_BY_NAME

log = logging.getLogger(__name__)

#: Seconds between re-reads of the key files when a seal names an unknown key.
RELOAD_EVERY_S = 1.0

#: Name prefix of the authority kernel's key IDs (the rest is its fingerprint).
AUTHORITY_KEY_ID = AUTHORITY_KEY_PREFIX


def _stage_signing_key(
    settings: LedgerSettings, name: str, who: str, remedy: str
) -> tuple[ReviewerKey, bytes]:
    """Load ``{name}.key`` of the keys folder, a stage's Ed25519 signing key; never create it.

    Args:
        settings: the ledger's settings (the keys folder, the ledger it serves).
        name: ``authority`` or ``outcome``.
        who: the stage that holds it (for the missing-key message).
        remedy: what to do when the file is unreadable.

    Returns:
        The key and its raw public half (32 bytes).

    Raises:
        MissingKeyError: there is no such file.
        KeysOfAnotherLedgerError: the folder serves another ledger.
        LocalFileError: the file is unreadable.
    """
    path = keys_dir(settings) / f"{name}.key"
    if not path.exists():
        raise missing_key(settings, f"{name}.key", who)
    check_binding(settings)
    try:
        key = ReviewerKey.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalFileError(
            f"the {name} key file {path} is unreadable ({exc}); {remedy}",
            observed=str(exc),
        ) from exc
    return key, key.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def authority_key(settings: LedgerSettings) -> SigningKey:
    """The authority kernel's signing key, bound to this ledger; never created here.

    Raises:
        MissingKeyError: there is no ``authority.key``.
        KeysOfAnotherLedgerError: the folder serves another ledger.
        LocalFileError: the file is unreadable.
    """
    key, raw_public = _stage_signing_key(
        settings,
        "authority",
        "the authority kernel",
        "restore it from a backup (records the kernel signed can only be verified with its key)",
    )
    public = keys_dir(settings) / "authority.pub"
    if not public.exists() or public.read_text().strip() != key.public_b64():
        tmp = public.with_name(f".authority.pub.{os.getpid()}")
        tmp.write_text(key.public_b64() + "\n")
        os.replace(tmp, public)
    return SigningKey(
        authority_key_id(raw_public), key.private, ROLE_AUTHORITY, settings.ledger_identity
    )


def authority_public(settings: LedgerSettings) -> tuple[str, Ed25519PublicKey] | None:
    """The authority kernel's key ID and public key from ``authority.pub`` (``None`` if absent).

    Raises:
        LocalFileError: the file is unreadable.
    """
    path = keys_dir(settings) / "authority.pub"
    if not path.exists():
        return None
    try:
        raw = base64.b64decode(path.read_text().strip(), validate=True)
        return authority_key_id(raw), Ed25519PublicKey.from_public_bytes(raw)
    except (OSError, ValueError) as exc:
        raise LocalFileError(
            f"the authority public key {path} is unreadable ({exc}); copy it from the "
            "authority kernel's host",
            observed=str(exc),
        ) from exc


#: The command that prints the outcome key's public half on a stage host.
EXPORT_OUTCOME_PUBLIC = "ledger keys export --outcome-public"


def outcome_key(settings: LedgerSettings) -> SigningKey:
    """The processor's outcome signing key, bound to this ledger; never created here.

    Raises:
        MissingKeyError: there is no ``outcome.key`` (the message names the
            folder and ``ledger keys init``).
        KeysOfAnotherLedgerError: the folder serves another ledger.
        LocalFileError: the file is unreadable.
    """
    key, raw_public = _stage_signing_key(
        settings,
        "outcome",
        "the processor (it signs the services' outcomes)",
        "restore it from another processor host",
    )
    return SigningKey(
        outcome_key_id(raw_public), key.private, ROLE_OUTCOME, settings.ledger_identity
    )


def outcome_public(settings: LedgerSettings) -> tuple[str, Ed25519PublicKey]:
    """The outcome key's ID and public half, as a service host holds it; never created here.

    The file is ``LEDGER_OUTCOME_PUBLIC_KEY_FILE`` (default
    ``LEDGER_KEYS_DIR/outcome.pub``): one line, the raw public key in base64.

    Raises:
        MissingKeyError: the file is absent (the message names the command
            that prints it on a stage host).
        LocalFileError: the file is unreadable or holds no Ed25519 public key.
    """
    path = settings.outcome_public_path()
    if not path.exists():
        raise MissingKeyError(
            f"no outcome public key at {path} (LEDGER_OUTCOME_PUBLIC_KEY_FILE): a service "
            f"verifies outcomes with it. On a stage host of ledger "
            f"{settings.ledger_identity!r} run `{EXPORT_OUTCOME_PUBLIC} > outcome.pub` and "
            "copy the file here (it holds no secret). Nothing was created: a key made on "
            "this host would verify nothing the processor signs",
            expected=str(path),
            observed="absent",
        )
    try:
        raw = base64.b64decode(path.read_text().strip(), validate=True)
        return outcome_key_id(raw), Ed25519PublicKey.from_public_bytes(raw)
    except (OSError, ValueError) as exc:
        raise LocalFileError(
            f"the outcome public key {path} is unreadable ({exc}); print it again on a stage "
            f"host with `{EXPORT_OUTCOME_PUBLIC}`",
            observed=str(exc),
        ) from exc


def outcome_keyring(settings: LedgerSettings) -> Keyring:
    """The keyring a service checks outcome records with: the outcome public key only.

    Raises:
        MissingKeyError: no outcome public key (see :func:`outcome_public`).
        LocalFileError: it is unreadable.
    """
    key_id, public = outcome_public(settings)
    ring = Keyring(partitions=settings.partitions, ledger_id=settings.ledger_identity)
    ring.add_public(key_id, ROLE_OUTCOME, public)
    return ring


def _provision_outcome_key(folder: Path, created: list[str]) -> None:
    """Make the outcome key pair unless this host holds its public half already."""
    # A host that holds outcome.pub without outcome.key is a service's: a key
    # made here would replace the public key the services trust.
    if (folder / "outcome.pub").exists() and not (folder / "outcome.key").exists():
        return
    if not (folder / "outcome.key").exists():
        fresh = ReviewerKey.generate(OUTCOME_KEY_PREFIX)
        content = {
            "key_id": OUTCOME_KEY_PREFIX,
            "private_key": base64.b64encode(fresh.private.private_bytes_raw()).decode(),
        }
        if create_once(folder / "outcome.key", json.dumps(content)):
            created.append("outcome.key")
            log.warning("created a new outcome key in %s", folder)
    key = ReviewerKey.from_file(folder / "outcome.key")
    public = folder / "outcome.pub"
    if not public.exists() or public.read_text().strip() != key.public_b64():
        tmp = public.with_name(f".outcome.pub.{os.getpid()}")
        tmp.write_text(key.public_b64() + "\n")
        os.replace(tmp, public)


@dataclass(frozen=True)
class Provisioned:
    """What :func:`provision_keys` found or made.

    Attributes:
        folder: the keys folder.
        role_key_ids: each stage role's key ID in service (:mod:`ledger.rolekeys`).
        authority_key_id: the authority kernel's key ID.
        created: the files this call created (names), empty when all were there.
        ledgers: the ledgers the folder serves now.
    """

    folder: Path
    role_key_ids: dict[str, str]
    authority_key_id: str
    created: tuple[str, ...]
    ledgers: tuple[str, ...]


def provision_keys(settings: LedgerSettings, *, share: bool = False) -> Provisioned:
    """Create the ledger's missing stage role, authority and outcome keys and bind the folder.

    Only ``ledger keys init`` (after it has checked that the ledger's topics
    hold no evidence) and the testbed call this. Keys that exist are kept;
    concurrent callers end up with the same keys.

    Args:
        settings: the ledger (``ledger_identity``) and its keys folder.
        share: add this ledger to a folder that already serves another one
            (the operator says the ledgers share keys; seals still name their
            ledger, so nothing moves between them).

    Returns:
        What is there now, and what was created.

    Raises:
        KeysOfAnotherLedgerError: the folder serves other ledgers and
            ``share`` is false.
        LocalFileError: a key file is unreadable.
    """
    folder = keys_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    me = settings.ledger_identity
    ledgers = bound_ledgers(settings)
    created: list[str] = []
    if ledgers is not None and me not in ledgers and not share:
        check_binding(settings)  # raises, naming the ledgers it serves
    if ledgers is None or me not in ledgers:
        updated = sorted({*(ledgers or []), me})
        tmp = folder / f".{LEDGERS_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        tmp.write_text(json.dumps({"ledgers": updated}) + "\n")
        os.replace(tmp, folder / LEDGERS_FILE)
        created.append(LEDGERS_FILE)
    role_ids = provision_role_keys(settings, created)
    # A host that holds authority.pub without authority.key is not the kernel's:
    # a key made here would replace the public key every reader trusts.
    if not (folder / "authority.pub").exists():
        fresh = ReviewerKey.generate(AUTHORITY_KEY_ID)
        content = {
            "key_id": AUTHORITY_KEY_ID,
            "private_key": base64.b64encode(fresh.private.private_bytes_raw()).decode(),
        }
        if create_once(folder / "authority.key", json.dumps(content)):
            created.append("authority.key")
            log.warning("created a new authority key in %s", folder)
    _provision_outcome_key(folder, created)
    if (folder / "authority.key").exists():
        kernel_id = authority_key(settings).key_id
    else:
        public = authority_public(settings)
        kernel_id = public[0] if public is not None else ""
    return Provisioned(
        folder, role_ids, kernel_id, tuple(created), tuple(bound_ledgers(settings) or ())
    )


def load_keyring(settings: LedgerSettings, *, missing_ok: bool = False) -> Keyring:
    """Every key a reader checks seals against, re-read on demand; creates nothing.

    A stage (the default) needs the stage roles' public keys
    (``stage-keys.json``) and the authority kernel's public key: without
    either it stops here, before it joins its group, since it could not
    authenticate its inputs. Each key is trusted under its role only, so a
    record is believed only under a key of a role that writes its topic
    (:mod:`ledger.rolekeys`); an earlier release's ``deployment.key``, where
    present, verifies records appended before the cut-over. A reader that
    only looks (``ledger state``, ``history``, ``audit`` ...) passes
    ``missing_ok=True``: without the trust file its ring has no stage key,
    and every sealed record reads as unverifiable (the auditor says so). When a
    seal names a key it does not know, the keyring re-reads the files: at
    once if one of them changed since it last read them (a reviewer added a
    moment ago), else at most once a second; keys that vanish meanwhile are
    not replaced (the ring keeps what it had).

    Args:
        settings: where the keys are (``keys_dir``, ``trusted_keys_file``)
            and the ledger they must serve.
        missing_ok: a missing trust file or authority public key leaves the
            ring without it instead of raising.

    Raises:
        MissingKeyError: (``missing_ok`` false) ``stage-keys.json`` or
            ``authority.pub`` is missing; the message names the folder and
            the command that provisions them.
        KeysOfAnotherLedgerError: the keys folder serves other ledgers.
        LocalFileError: a key file is unreadable.
    """

    def read() -> Keyring:
        ring = Keyring(
            unsigned_grants_ok=not settings.require_signed_approvals,
            partitions=settings.partitions,
            ledger_id=settings.ledger_identity,
        )
        add_role_keys(ring, settings, missing_ok=missing_ok)
        if not missing_ok:
            check_binding(settings)
        public = authority_public(settings)
        if public is None and not missing_ok:
            raise missing_key(
                settings, "authority.pub", "every stage (to check the kernel's records)"
            )
        if public is not None:
            ring.add_public(public[0], ROLE_AUTHORITY, public[1])
        if settings.outcome_public_path().exists():  # readers of outcomes (history, console)
            key_id, outcome = outcome_public(settings)
            ring.add_public(key_id, ROLE_OUTCOME, outcome)
        for key_id, (role, key) in load_trusted_roles(settings.trusted_keys_path()).items():
            # A person never takes the name of a stage or kernel key.
            if not key_id.startswith(AUTHORITY_KEY_ID) and key_id not in ring.trusted:
                ring.add_public(key_id, role, key)
        return ring

    files = (
        settings.trusted_keys_path(),
        keys_dir(settings) / "authority.pub",
        keys_dir(settings) / "deployment.key",
        keys_dir(settings) / TRUST_FILE,
        settings.outcome_public_path(),
    )

    def stamp() -> tuple[tuple[int, int], ...]:
        found = []
        for path in files:
            try:
                st = path.stat()
                found.append((st.st_mtime_ns, st.st_size))
            except OSError:
                found.append((0, -1))
        return tuple(found)

    last_read, last_stamp = time.monotonic(), stamp()

    def reload() -> Keyring | None:
        # A key file that changed (a reviewer added just now) is read at once;
        # otherwise at most once a second, for a seal that names a key no file has.
        nonlocal last_read, last_stamp
        now_stamp = stamp()
        if now_stamp == last_stamp and time.monotonic() - last_read < RELOAD_EVERY_S:
            return None
        last_read, last_stamp = time.monotonic(), now_stamp
        try:
            return read()
        except LocalFileError as exc:
            log.error("keeping the keys already loaded: %s", exc)
            return None

    ring = read()
    ring.reload = reload
    return ring


def person_key_path(settings: LedgerSettings, role: str, name: str) -> Path:
    """Where a reviewer's or operator's private key lives."""
    folder = "reviewers" if role == ROLE_REVIEWER else "operators"
    return settings.run_dir / folder / f"{name}.key"


def add_person(settings: LedgerSettings, role: str, name: str) -> tuple[ReviewerKey, Path]:
    """Create a signing key for a reviewer or operator and trust it under ``role``.

    Returns:
        The key and the file its private half was written to (mode 0600).

    Raises:
        LedgerError: the name already has a key or is trusted under another
            role.
        LocalFileError: the trusted-keys file is unreadable.
    """
    path = person_key_path(settings, role, name)
    if path.exists():
        raise CredentialError(f"{role} {name!r} already has a key at {path}")
    known = load_trusted_roles(settings.trusted_keys_path())
    if name in known or name.startswith(AUTHORITY_KEY_ID):
        other = known[name][0] if name in known else ROLE_AUTHORITY
        raise CredentialError(
            f"{name!r} is already trusted as {other}; one name holds one role, so choose "
            "another name"
        )
    key = ReviewerKey.generate(name)
    key.save(path)
    trust(settings.trusted_keys_path(), key, role=role)
    return key, path


def person_key(settings: LedgerSettings, role: str, name: str) -> SigningKey:
    """Load a reviewer's or operator's signing key.

    Raises:
        LedgerError: there is no such key (the message says how to make one).
        LocalFileError: the key file is unreadable.
    """
    path = person_key_path(settings, role, name)
    if not path.exists():
        raise CredentialError(
            f"{role} {name!r} has no signing key at {path} (the folder comes from "
            "LEDGER_HOME / LEDGER_RUN_DIR: if the key was made for a ledger elsewhere, point "
            f"them at that ledger's folder); else create one with `ledger {role} add {name}`"
        )
    try:
        key = ReviewerKey.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalFileError(
            f"the {role} key file {path} is unreadable ({exc}); restore it, or make a new "
            f"key under a new name with `ledger {role} add`",
            observed=str(exc),
        ) from exc
    return SigningKey(key.key_id, key.private, role, settings.ledger_identity)


class Credentials:
    """The keys a publisher seals its records with, chosen per record.

    * records on stage-written topics (claims, readbacks, operating events)
      are signed with the key of a role that writes the topic: ``role``'s
      when given and it does, else the first such role whose key this host
      holds (a resumer's host holds ``resumer.key``, a reconciler's
      ``reconciler.key``: :mod:`ledger.rolekeys`);
    * records that name their writer (approvals, revocations, policy
      changes, dispositions) are signed with that person's key: a key added
      with :meth:`add`, else the file of that name (reviewers first, then
      operators);
    * intents are not sealed; topics only the authority kernel writes are
      refused.

    Args:
        settings: where the key files are, and the ledger the seals name.
        role: the stage role this process plays (``reconciler``), if any.
    """

    def __init__(self, settings: LedgerSettings, role: str | None = None) -> None:
        self.settings = settings
        self.role = role
        self._people: dict[str, SigningKey] = {}
        self._stage: dict[str, SigningKey] = {}

    def add(self, key: ReviewerKey | SigningKey, role: str = ROLE_REVIEWER) -> None:
        """Sign records that name ``key.key_id`` with ``key`` (held in memory)."""
        signer = SigningKey(
            key.key_id,
            key.private,
            key.role if isinstance(key, SigningKey) else role,
            self.settings.ledger_identity,
        )
        self._people[signer.key_id] = signer

    def sealer_for(self, topic: str, event: Event | None) -> Sealer | None:
        """The key that seals a record of ``event`` on ``topic`` (``None``: unsealed).

        Raises:
            LedgerError: the named writer has no key here, or the topic is
                written by the authority kernel alone.
            LocalFileError: a key file is unreadable.
        """
        spec = TOPIC_BY_NAME.get(topic)
        if spec is None:
            raise InvalidInputError(
                f"{topic!r} is no ledger topic; topics: {', '.join(TOPIC_BY_NAME)}"
            )
        roles = spec.auth
        if not roles:
            return None
        if any(role in STAGE_KEY_ROLES for role in roles):
            if topic not in self._stage:
                self._stage[topic] = sealer_for_roles(self.settings, roles, self.role)
            return self._stage[topic]
        if roles == (ROLE_AUTHORITY,):
            raise CredentialError(f"only the authority kernel writes {topic}")
        if isinstance(event, Approval) and event.status == "GRANTED":
            return None  # a grant carries its reviewer's signature (ledger.signing)
        named = claimed_writer(event)
        if named is None:
            raise CredentialError(f"records on {topic} must name who signs them")
        name, allowed = named
        held = self._people.get(name)
        if held is not None:
            return held
        errors: list[str] = []
        for role in allowed:
            if person_key_path(self.settings, role, name).exists():
                signer = person_key(self.settings, role, name)
                self._people[name] = signer
                return signer
            errors.append(f"`ledger {role} add {name}`")
        other = [
            role
            for role in (ROLE_REVIEWER, ROLE_OPERATOR)
            if role not in allowed and person_key_path(self.settings, role, name).exists()
        ]
        if other:
            raise CredentialError(
                f"{name!r} is a {other[0]} here, and a {topic} record is signed by "
                f"{' or '.join(f'an {r}' if r[0] in 'aeiou' else f'a {r}' for r in allowed)}: "
                f"name one (`ledger {allowed[0]} add NAME` makes one; one name holds one role)"
            )
        raise CredentialError(
            f"{name!r} has no signing key here, so the {topic} record cannot be signed; "
            f"create one with {' or '.join(errors)}"
        )


def stage_sealer(settings: LedgerSettings, component: str) -> Callable[[str], Sealer]:
    """The sealer of each topic a stage writes: its own role's key, and only on its topics.

    Args:
        settings: the keys folder and the ledger.
        component: ``processor``, ``relay``, ``authority``, ``reconciler``
            or ``resumer`` (:data:`ledger.rolekeys.COMPONENT_ROLE`).

    Returns:
        ``topic -> sealer``: the component's role key where its role writes
        the topic (:attr:`ledger.topology.TopicSpec.auth`; the authority
        kernel's key for its own topics and its operating events), the
        outcome key for ``outcomes`` (the processor only); any other topic
        raises :class:`ledger.errors.LedgerError` naming its writers.

    Raises:
        LedgerError: an unknown component.
        MissingKeyError: a key it needs is missing (nothing is created).
        LocalFileError: a key file is unreadable.
    """
    role = COMPONENT_ROLE.get(component)
    if role is None:
        raise InvalidInputError(
            f"{component!r} is no stage role; stages are {', '.join(COMPONENT_ROLE)}"
        )
    own: Sealer = authority_key(settings) if role == ROLE_AUTHORITY else role_key(settings, role)
    outcomes = outcome_key(settings) if component == "processor" else None

    def choose(topic: str) -> Sealer:
        spec = TOPIC_BY_NAME.get(topic)
        auth = spec.auth if spec is not None else ()
        if role in auth:
            return own
        if outcomes is not None and auth == (ROLE_OUTCOME,):
            return outcomes
        only: dict[tuple[str, ...], str] = {
            (ROLE_AUTHORITY,): "the authority kernel",
            (ROLE_OUTCOME,): "the processor",
        }
        raise CredentialError(
            f"{component} cannot write {topic}: only "
            + only.get(auth, f"the {' or the '.join(auth) or 'no stage'}")
        )

    return choose


__all__ = [
    "AUTHORITY_KEY_ID",
    "Credentials",
    "KeysOfAnotherLedgerError",
    "MissingKeyError",
    "Provisioned",
    "bound_ledgers",
    "check_binding",
    "provision_keys",
    "add_person",
    "authority_key",
    "authority_public",
    "deployment_key",
    "outcome_key",
    "outcome_keyring",
    "outcome_public",
    "keys_dir",
    "load_keyring",
    "person_key",
    "stage_sealer",
    "ROLE_OPERATOR",
]
