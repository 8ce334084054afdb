"""Key files: where a process finds the keys that seal and check records.

Files (all under ``LEDGER_KEYS_DIR``, default ``LEDGER_RUN_DIR/keys``, unless
noted), each written with mode 0600 when it holds a secret:

* ``deployment.key`` -- the stages' shared HMAC key (``{"secret": base64}``).
  Every stage, reconciler and resumer (``ledger claim``) holds it.
* ``authority.key`` / ``authority.pub`` -- the authority kernel's Ed25519
  key pair. Only the kernel needs the private half; every reader needs the
  public one.
* ``LEDGER_RUN_DIR/reviewers/NAME.key`` and ``LEDGER_RUN_DIR/operators/NAME.key``
  -- people's Ed25519 keys (``ledger reviewer add``, ``ledger operator add``),
  whose public halves are trusted by role in ``trusted_keys.json``.

On one host, the first process that needs the deployment or authority key
creates it (atomically: concurrent starters end up with the same key). On
several hosts, run ``ledger keys init`` once and copy the files: the
deployment key to every stage host, the authority key to the kernel's host
only, ``authority.pub`` and ``trusted_keys.json`` everywhere.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PublicKey,
)

from ledger.authn import (
    ROLE_AUTHORITY,
    ROLE_OPERATOR,
    ROLE_REVIEWER,
    ROLE_STAGE,
    Keyring,
    MacKey,
    Sealer,
    SigningKey,
    claimed_writer,
)
from ledger.errors import LedgerError, LocalFileError
from ledger.events import Approval, Event
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, load_trusted_roles, trust
from ledger.topology import TOPIC_BY_NAME

log = logging.getLogger(__name__)

#: Seconds between re-reads of the key files when a seal names an unknown key.
RELOAD_EVERY_S = 1.0

#: Key ID of the authority kernel's signing key.
AUTHORITY_KEY_ID = "authority-kernel"


def keys_dir(settings: LedgerSettings) -> Path:
    """The folder of the deployment and authority keys."""
    return settings.keys_dir or settings.run_dir / "keys"


def _create_once(path: Path, content: str) -> bool:
    """Write ``path`` only if it does not exist yet, atomically (mode 0600).

    Returns:
        True if this call created it; False if another process had.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_text(content)
    tmp.chmod(0o600)
    try:
        os.link(tmp, path)  # fails if the file exists: the first creator wins
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _read_json(path: Path, what: str, remedy: str) -> dict[str, str]:
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        return raw
    except (OSError, ValueError) as exc:
        raise LocalFileError(
            f"the {what} file {path} is unreadable ({type(exc).__name__}: {exc}); {remedy}",
            observed=str(exc),
        ) from exc


def deployment_key(settings: LedgerSettings, *, create: bool = True) -> MacKey:
    """The stages' deployment key, created on first use when ``create``.

    Raises:
        LocalFileError: the file is unreadable, or absent and ``create`` is
            false.
    """
    path = keys_dir(settings) / "deployment.key"
    if not path.exists():
        if not create:
            raise LocalFileError(
                f"no deployment key at {path}; copy it from the host where the ledger's "
                "keys were made, or run `ledger keys init` for a new ledger"
            )
        secret = base64.b64encode(secrets.token_bytes(32)).decode()
        if _create_once(path, json.dumps({"secret": secret})):
            log.warning("created a new deployment key at %s (every stage must share it)", path)
    raw = _read_json(path, "deployment key", "restore it from another stage host")
    try:
        secret_bytes = base64.b64decode(raw["secret"], validate=True)
        if len(secret_bytes) < 16:
            raise ValueError("the secret is shorter than 16 bytes")
    except (KeyError, ValueError, TypeError) as exc:
        raise LocalFileError(
            f"the deployment key file {path} is unreadable ({exc}); "
            "restore it from another stage host",
            observed=str(exc),
        ) from exc
    return MacKey(secret_bytes)


def authority_key(settings: LedgerSettings, *, create: bool = True) -> SigningKey:
    """The authority kernel's signing key (and its ``authority.pub``), created on first use.

    Raises:
        LocalFileError: the file is unreadable, or absent and ``create`` is
            false.
    """
    path = keys_dir(settings) / "authority.key"
    if not path.exists():
        if not create:
            raise LocalFileError(f"no authority key at {path}; run `ledger keys init`")
        fresh = ReviewerKey.generate(AUTHORITY_KEY_ID)
        raw_private = fresh.private.private_bytes_raw()
        content = {
            "key_id": AUTHORITY_KEY_ID,
            "private_key": base64.b64encode(raw_private).decode(),
        }
        if _create_once(path, json.dumps(content)):
            log.warning("created a new authority key at %s", path)
    try:
        key = ReviewerKey.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalFileError(
            f"the authority key file {path} is unreadable ({exc}); restore it, or run "
            "`ledger keys init --force` for a new ledger (records signed by the old key "
            "are then refused)",
            observed=str(exc),
        ) from exc
    public = keys_dir(settings) / "authority.pub"
    if not public.exists() or public.read_text().strip() != key.public_b64():
        tmp = public.with_name(f".authority.pub.{os.getpid()}")
        tmp.write_text(key.public_b64() + "\n")
        os.replace(tmp, public)
    return SigningKey(key.key_id, key.private, ROLE_AUTHORITY)


def authority_public(settings: LedgerSettings) -> Ed25519PublicKey | None:
    """The authority kernel's public key from ``authority.pub`` (``None`` if absent).

    Raises:
        LocalFileError: the file is unreadable.
    """
    path = keys_dir(settings) / "authority.pub"
    if not path.exists():
        return None
    try:
        return Ed25519PublicKey.from_public_bytes(
            base64.b64decode(path.read_text().strip(), validate=True)
        )
    except (OSError, ValueError) as exc:
        raise LocalFileError(
            f"the authority public key {path} is unreadable ({exc}); copy it from the "
            "authority kernel's host",
            observed=str(exc),
        ) from exc


def load_keyring(
    settings: LedgerSettings, *, create: bool = True, missing_ok: bool = False
) -> Keyring:
    """Every key a reader checks seals against, re-read on demand.

    With ``create`` (the default, one-host deployments: the stages),
    missing deployment and authority keys are created first, so processes
    that start together agree on them. A reader that only looks (``ledger
    state``, ``history``, ``audit`` ...) passes ``create=False,
    missing_ok=True``: it writes nothing, and without a deployment key its
    ring has none, so every sealed record is refused as unauthenticated
    until the key appears (a stage creates it). When a seal names a key it
    does not know, the keyring re-reads the files: at once if one of them
    changed since it last read them (a reviewer added a moment ago), else at
    most once a second.

    Args:
        settings: where the keys are (``keys_dir``, ``trusted_keys_file``).
        create: create missing deployment and authority keys.
        missing_ok: with ``create`` false, a missing deployment key leaves
            the ring without one instead of raising.

    Raises:
        LocalFileError: a key file is unreadable, or (``create`` and
            ``missing_ok`` false) the deployment key is missing.
    """

    def read() -> Keyring:
        ring = Keyring(
            unsigned_grants_ok=not settings.require_signed_approvals,
            partitions=settings.partitions,
        )
        if create or not missing_ok or (keys_dir(settings) / "deployment.key").exists():
            ring.add_mac(deployment_key(settings, create=create))
        if create:
            authority_key(settings)
        public = authority_public(settings)
        if public is not None:
            ring.add_public(AUTHORITY_KEY_ID, ROLE_AUTHORITY, public)
        for key_id, (role, key) in load_trusted_roles(settings.trusted_keys_path()).items():
            if key_id != AUTHORITY_KEY_ID:
                ring.add_public(key_id, role, key)
        return ring

    files = (
        settings.trusted_keys_path(),
        keys_dir(settings) / "authority.pub",
        keys_dir(settings) / "deployment.key",
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
        raise LedgerError(f"{role} {name!r} already has a key at {path}")
    known = load_trusted_roles(settings.trusted_keys_path())
    if name in known or name == AUTHORITY_KEY_ID:
        other = known[name][0] if name in known else ROLE_AUTHORITY
        raise LedgerError(
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
        raise LedgerError(
            f"{role} {name!r} has no signing key at {path}; create one with "
            f"`ledger {role} add {name}`"
        )
    try:
        key = ReviewerKey.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LocalFileError(
            f"the {role} key file {path} is unreadable ({exc}); restore it, or make a new "
            f"key under a new name with `ledger {role} add`",
            observed=str(exc),
        ) from exc
    return SigningKey(key.key_id, key.private, role)


class Credentials:
    """The keys a publisher seals its records with, chosen per record.

    * records on stage-written topics (claims, readbacks, operating events)
      are sealed with the deployment key;
    * records that name their writer (approvals, revocations, policy
      changes, dispositions) are signed with that person's key: a key added
      with :meth:`add`, else the file of that name (reviewers first, then
      operators);
    * intents are not sealed; topics only the authority kernel writes are
      refused.

    Args:
        settings: where the key files are.
        create: create a missing deployment key (one-host deployments).
    """

    def __init__(self, settings: LedgerSettings, *, create: bool = True) -> None:
        self.settings = settings
        self.create = create
        self._people: dict[str, SigningKey] = {}
        self._mac: MacKey | None = None

    def add(self, key: ReviewerKey | SigningKey, role: str = ROLE_REVIEWER) -> None:
        """Sign records that name ``key.key_id`` with ``key`` (held in memory)."""
        signer = key if isinstance(key, SigningKey) else SigningKey(key.key_id, key.private, role)
        self._people[signer.key_id] = signer

    def sealer_for(self, topic: str, event: Event | None) -> Sealer | None:
        """The key that seals a record of ``event`` on ``topic`` (``None``: unsealed).

        Raises:
            LedgerError: the named writer has no key here, or the topic is
                written by the authority kernel alone.
            LocalFileError: a key file is unreadable.
        """
        spec = TOPIC_BY_NAME.get(topic)
        roles = spec.auth if spec is not None else (ROLE_STAGE,)
        if not roles:
            return None
        if ROLE_STAGE in roles:
            if self._mac is None:
                self._mac = deployment_key(self.settings, create=self.create)
            return self._mac
        if roles == (ROLE_AUTHORITY,):
            raise LedgerError(f"only the authority kernel writes {topic}")
        if isinstance(event, Approval) and event.status == "GRANTED":
            return None  # a grant carries its reviewer's signature (ledger.signing)
        named = claimed_writer(event)
        if named is None:
            raise LedgerError(f"records on {topic} must name who signs them")
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
            raise LedgerError(
                f"{name!r} is a {other[0]} here, and a {topic} record is signed by "
                f"{' or '.join(f'an {r}' if r[0] in 'aeiou' else f'a {r}' for r in allowed)}: "
                f"name one (`ledger {allowed[0]} add NAME` makes one; one name holds one role)"
            )
        raise LedgerError(
            f"{name!r} has no signing key here, so the {topic} record cannot be signed; "
            f"create one with {' or '.join(errors)}"
        )


def stage_sealer(settings: LedgerSettings, component: str) -> Callable[[str], Sealer]:
    """The sealer of each topic a stage writes: the kernel signs its own topics.

    Returns:
        ``topic -> sealer``: the authority key for ``admissions`` and
        ``approval-uses`` (the authority kernel only), the deployment key for
        everything else.

    Raises:
        LocalFileError: a key file is unreadable.
    """
    mac = deployment_key(settings)
    signer = authority_key(settings) if component == "authority" else None

    def choose(topic: str) -> Sealer:
        spec = TOPIC_BY_NAME.get(topic)
        if spec is not None and spec.auth == (ROLE_AUTHORITY,):
            if signer is None:
                raise LedgerError(f"{component} cannot write {topic}: only the authority kernel")
            return signer
        return mac

    return choose


__all__ = [
    "AUTHORITY_KEY_ID",
    "Credentials",
    "add_person",
    "authority_key",
    "authority_public",
    "deployment_key",
    "keys_dir",
    "load_keyring",
    "person_key",
    "stage_sealer",
    "ROLE_OPERATOR",
]
