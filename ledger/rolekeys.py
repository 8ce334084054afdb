"""Per-role stage keys: each stage role signs with its own Ed25519 key (issue 29).

Before this module every stage sealed with one shared HMAC key
(``deployment.key``), so a compromised relay host could forge the
processor's state and journal records. Now each writer role of
:mod:`ledger.topology` signs with a key of its own and a reader accepts a
record of topic T only under the key of a role that writes T
(:attr:`ledger.topology.TopicSpec.auth`, checked by
:meth:`ledger.authn.Keyring.check`); the relay's key on a ``state`` record is
refused like any forgery.

Files (in the keys folder, ``LEDGER_KEYS_DIR``; private ones mode 0600), and
which host holds which:

* ``processor.key`` -- the processors' hosts only (with ``outcome.key``);
* ``relay.key`` -- the relays' hosts only;
* ``reconciler.key`` -- the hosts that run ``ledger reconcile run``;
* ``resumer.key`` -- the operators' hosts that run ``ledger claim``;
* ``authority.key`` -- the authority kernel's host only (it signs its
  operating events with it too);
* ``stage-keys.json`` -- every host: the public half of every role's keys,
  each ``{"role", "public", "created_ms", "not_after_ms"}`` by key ID, and
  the legacy deployment key's not-after time (``legacy``). It holds no
  secret;
* ``deployment.key`` -- the legacy shared key of earlier releases, kept on
  hosts that read old records (readers, auditors, the processor for its
  journal replay) as a verifier only; a fresh ledger has none.

Key IDs are ``{role}-`` and 12 hex digits of the public key's SHA-256
(:func:`ledger.authn.role_key_id`).

Cut-over from the shared key. ``ledger keys init`` on a folder that holds an
earlier release's ``deployment.key`` makes the role keys and records the
deployment key's not-after time (now plus the overlap, default
:data:`DEFAULT_OVERLAP_S`): stages of the earlier release may seal with it
until then; after it, a record it seals is believed only if the broker
appended it by that time. Alter every sealed topic to
``message.timestamp.type=LogAppendTime`` (``ledger topics check`` prints
the commands) and restart every stage on this release within the overlap.

Rotation (``ledger keys rotate ROLE``). A new key becomes the role's key
(``{role}.key`` is replaced, the old private half deleted) and the old
key's ``not_after_ms`` is set to now plus the overlap (``--overlap-s``).
Until then both keys verify anything; after it, the old key verifies only
records appended by that time. How "before" is told: a seal names its key
(the key ID), and the trust file names when each key retires in ledger
time (Unix ms); the record's time is its Kafka timestamp, which the broker
sets at append on every sealed topic (``LogAppendTime``), so whoever holds
the old key cannot backdate a forgery past it. A time in the seal itself
would not do: the holder of a stolen key signs whatever time it likes. Why
not-after rather than per-partition offsets: offsets would name "before" as
exactly, but must be read from Kafka at the end of the window by someone,
while a time is fixed when the rotation is made. Copy the new ``{role}.key``
to the role's hosts and ``stage-keys.json`` to every host, and restart the
role's stages within the overlap: a record a stage seals with the old key
after the window is refused, as a forgery would be. Readers pick up
``stage-keys.json`` when a seal names a key they do not know (the new one).
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger.authn import (
    ROLE_AUTHORITY,
    STAGE_KEY_ROLES,
    Keyring,
    SigningKey,
    role_key_id,
)
from ledger.errors import InvalidInputError, LocalFileError
from ledger.keyfolder import (
    TRUST_FILE,
    MissingKeyError,
    check_binding,
    deployment_key,
    keys_dir,
    missing_key,
)
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey

log = logging.getLogger(__name__)

#: Seconds both keys verify new records after a rotation or the cut-over
#: (long enough to copy a key and restart a role's stages; short enough that
#: a stolen old key is soon worthless).
DEFAULT_OVERLAP_S = 3600

#: What each role signs, for the missing-key message.
ROLE_WRITES: dict[str, str] = {
    "processor": "dispatches, states, journal entries and the processor's other records",
    "relay": "receipts and readbacks",
    "reconciler": "the readbacks of `ledger reconcile run`",
    "resumer": "claims (`ledger claim`)",
}

#: The key role a stage component signs as (``Stage.component`` or a command).
COMPONENT_ROLE: dict[str, str] = {
    "processor": "processor",
    "relay": "relay",
    "reconciler": "reconciler",
    "resumer": "resumer",
    "authority": ROLE_AUTHORITY,
}


class RoleKeyError(LocalFileError):
    """A role key is missing, unreadable, or not in the trust file; the message says what to do."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _folder(settings: LedgerSettings) -> Path:
    return keys_dir(settings)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold the keys folder's lock (concurrent provisioners and rotations agree on one key)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".keys.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_trust(folder: Path) -> dict[str, Any] | None:
    """The trust file of ``folder`` (``None`` when there is none).

    Returns:
        ``{"keys": {key ID: {"role", "public", "created_ms", "not_after_ms"}},
        "legacy": {key ID: {"not_after_ms"}}}``.

    Raises:
        RoleKeyError: the file is unreadable or malformed.
    """
    path = folder / TRUST_FILE
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict) or not isinstance(raw.get("keys"), dict):
            raise ValueError("no 'keys' object")
        for key_id, entry in raw["keys"].items():
            if entry.get("role") not in STAGE_KEY_ROLES or not isinstance(entry["public"], str):
                raise ValueError(f"key {key_id!r} names no stage role or public key")
        raw.setdefault("legacy", {})
        return raw
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RoleKeyError(
            f"the stage keys trust file {path} is unreadable ({type(exc).__name__}: {exc}); "
            "copy it again from the host where the ledger's keys were made",
            observed=str(exc),
        ) from exc


def _write_trust(folder: Path, trust: dict[str, Any]) -> None:
    tmp = folder / f".{TRUST_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    tmp.write_text(json.dumps(trust, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / TRUST_FILE)


def current_key_id(trust: dict[str, Any], role: str) -> str | None:
    """The key ID ``role`` signs with now: its newest key with no not-after time."""
    live = [
        (entry.get("created_ms", 0), key_id)
        for key_id, entry in trust["keys"].items()
        if entry["role"] == role and entry.get("not_after_ms") is None
    ]
    return max(live)[1] if live else None


def _public_b64(key: ReviewerKey) -> str:
    raw = key.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def _key_id_of(key: ReviewerKey, role: str) -> str:
    raw = key.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return role_key_id(role, raw)


def _write_private(path: Path, key: ReviewerKey, role: str) -> None:
    content = {
        "key_id": role,
        "private_key": base64.b64encode(key.private.private_bytes_raw()).decode(),
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps(content))
    tmp.chmod(0o600)
    os.replace(tmp, path)


def provision_role_keys(
    settings: LedgerSettings, created: list[str], *, overlap_s: int = DEFAULT_OVERLAP_S
) -> dict[str, str]:
    """Make each stage role's key unless the trust file names one already; record the cut-over.

    Only :func:`ledger.credentials.provision_keys` calls this. A host whose
    trust file already lists a role's key makes none for it (it is not that
    role's host: a key made here would replace the one every reader trusts).
    A legacy ``deployment.key`` in the folder gets its not-after time (now
    plus ``overlap_s``) the first time, which is the cut-over.

    Args:
        settings: the keys folder.
        created: file names this call creates are appended here.
        overlap_s: seconds the legacy key still verifies new records.

    Returns:
        The role -> current key ID map.

    Raises:
        RoleKeyError: the trust file or a key file is unreadable.
    """
    folder = _folder(settings)
    with _locked(folder):
        trust = read_trust(folder) or {"keys": {}, "legacy": {}}
        changed = False
        now = _now_ms()
        for role in STAGE_KEY_ROLES:
            if current_key_id(trust, role) is not None:
                continue
            path = folder / f"{role}.key"
            if path.exists():
                key = _load_private(path, role)
            else:
                key = ReviewerKey.generate(role)
                _write_private(path, key, role)
                created.append(path.name)
                log.warning("created a new %s key in %s", role, folder)
            trust["keys"][_key_id_of(key, role)] = {
                "role": role,
                "public": _public_b64(key),
                "created_ms": now,
                "not_after_ms": None,
            }
            changed = True
        legacy = folder / "deployment.key"
        if legacy.exists():
            legacy_id = deployment_key(settings).key_id
            if legacy_id not in trust["legacy"]:
                trust["legacy"][legacy_id] = {"not_after_ms": now + overlap_s * 1000}
                changed = True
                log.warning(
                    "the legacy deployment key %s verifies records appended until %d ms "
                    "(the cut-over to per-role keys)",
                    legacy_id,
                    now + overlap_s * 1000,
                )
        if changed or not (folder / TRUST_FILE).exists():
            _write_trust(folder, trust)
            if TRUST_FILE not in created:
                created.append(TRUST_FILE)
        return {role: current_key_id(trust, role) or "" for role in STAGE_KEY_ROLES}


def _load_private(path: Path, role: str) -> ReviewerKey:
    try:
        return ReviewerKey.from_file(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RoleKeyError(
            f"the {role} key file {path} is unreadable ({exc}); copy it again from the "
            f"host where the ledger's keys were made, or make a new one with "
            f"`ledger keys rotate {role}`",
            observed=str(exc),
        ) from exc


def role_key(settings: LedgerSettings, role: str) -> SigningKey:
    """The signing key of stage role ``role``, bound to this ledger; never created here.

    Raises:
        MissingKeyError: no ``{role}.key`` in the keys folder (the message
            names the key, the folder and the remedy).
        KeysOfAnotherLedgerError: the folder serves another ledger.
        RoleKeyError: the key is unreadable, or the trust file does not list
            it (readers would refuse what it signs).
    """
    folder = _folder(settings)
    path = folder / f"{role}.key"
    if not path.exists():
        raise MissingKeyError(
            f"no {role}.key in {folder} (LEDGER_KEYS_DIR), and the {role} needs it: it signs "
            f"{ROLE_WRITES.get(role, 'its records')}. Copy {role}.key and {TRUST_FILE} from "
            f"the host where the keys of ledger {settings.ledger_identity!r} were made; for a "
            "new ledger with no records yet, run `ledger keys init`. Nothing was created: a "
            "key made here would sign records no other host trusts",
            expected=str(path),
            observed="absent",
        )
    check_binding(settings)
    key = _load_private(path, role)
    key_id = _key_id_of(key, role)
    trust = read_trust(folder)
    entry = (trust or {"keys": {}})["keys"].get(key_id)
    if entry is None or entry["role"] != role:
        raise RoleKeyError(
            f"{path} is a {role} key ({key_id}) that {folder / TRUST_FILE} does not list, so "
            f"every reader would refuse what it signs: copy {TRUST_FILE} from the host where "
            f"the key was made (after `ledger keys rotate {role}`, both files change)",
            expected=key_id,
            observed="not in the trust file",
        )
    return SigningKey(key_id, key.private, role, settings.ledger_identity)


def add_role_keys(ring: Keyring, settings: LedgerSettings, *, missing_ok: bool) -> None:
    """Trust every stage role's public keys, and the legacy key as a bounded verifier.

    The legacy ``deployment.key`` verifies records appended by its not-after
    time in the trust file; one the trust file does not name retires when the
    first role key was made. Without any trust file (an earlier release's
    folder, read by a command that only looks) it verifies as it did then,
    unbounded: the cut-over is ``ledger keys init``.

    Args:
        ring: the keyring to add to.
        settings: the keys folder and the ledger.
        missing_ok: a missing trust file leaves the ring without role keys
            (a reader that only looks) instead of raising.

    Raises:
        MissingKeyError: (``missing_ok`` false) no trust file.
        RoleKeyError: the trust file is unreadable.
        LocalFileError: the legacy key file is unreadable.
    """
    folder = _folder(settings)
    trust = read_trust(folder)
    if trust is None and not missing_ok:
        raise missing_key(settings, TRUST_FILE, "every stage (to check the stage roles' records)")
    first_ms: int | None = None
    for key_id, entry in (trust or {"keys": {}})["keys"].items():
        try:
            public = Ed25519PublicKey.from_public_bytes(
                base64.b64decode(entry["public"], validate=True)
            )
        except ValueError as exc:
            raise RoleKeyError(
                f"{folder / TRUST_FILE}: key {key_id} has no valid public key ({exc}); copy the "
                "file again from the host where the ledger's keys were made",
                observed=str(exc),
            ) from exc
        ring.add_public(key_id, entry["role"], public, entry.get("not_after_ms"))
        created = entry.get("created_ms")
        if isinstance(created, int):
            first_ms = created if first_ms is None else min(first_ms, created)
    if (folder / "deployment.key").exists():
        mac = deployment_key(settings)
        recorded = (trust or {}).get("legacy", {}).get(mac.key_id)
        # A legacy key the trust file does not name retires when the first role key was made.
        not_after = recorded.get("not_after_ms") if recorded else first_ms
        ring.add_mac(mac, not_after)


@dataclass(frozen=True)
class Rotated:
    """What :func:`rotate` did.

    Attributes:
        role: the stage role.
        old_key_id: the key that retires.
        new_key_id: the role's key from now on.
        not_after_ms: when the old key stops verifying new records (Unix ms).
        files: the files to copy: the private key to the role's hosts, the
            trust file to every host.
    """

    role: str
    old_key_id: str
    new_key_id: str
    not_after_ms: int
    files: tuple[Path, Path]


def rotate(settings: LedgerSettings, role: str, *, overlap_s: int = DEFAULT_OVERLAP_S) -> Rotated:
    """Give ``role`` a new key; the old one verifies new records for ``overlap_s`` more seconds.

    Args:
        settings: the keys folder (it must hold the trust file).
        role: one of :data:`ledger.authn.STAGE_KEY_ROLES`.
        overlap_s: the overlap window, seconds (0 or more).

    Returns:
        The old and new key IDs, the old key's not-after time and the files to copy.

    Raises:
        LedgerError: an unknown role or a negative overlap.
        MissingKeyError: no trust file here (run ``ledger keys init`` first).
        RoleKeyError: the trust file is unreadable or lists no key for the role.
    """
    if role not in STAGE_KEY_ROLES:
        raise InvalidInputError(
            f"no stage role {role!r}: rotate one of {', '.join(STAGE_KEY_ROLES)} (the authority "
            "and outcome keys are not rotated by this command)"
        )
    if overlap_s < 0:
        raise InvalidInputError(f"the overlap is {overlap_s} s; give 0 or more seconds")
    folder = _folder(settings)
    with _locked(folder):
        trust = read_trust(folder)
        if trust is None:
            raise missing_key(settings, TRUST_FILE, f"`ledger keys rotate {role}`")
        check_binding(settings)
        old = current_key_id(trust, role)
        if old is None:
            raise RoleKeyError(
                f"{folder / TRUST_FILE} lists no {role} key in service; run `ledger keys init`",
                expected=role,
                observed="none",
            )
        now = _now_ms()
        fresh = ReviewerKey.generate(role)
        new = _key_id_of(fresh, role)
        not_after = now + overlap_s * 1000
        trust["keys"][old]["not_after_ms"] = not_after
        trust["keys"][new] = {
            "role": role,
            "public": _public_b64(fresh),
            "created_ms": now,
            "not_after_ms": None,
        }
        _write_trust(folder, trust)
        _write_private(folder / f"{role}.key", fresh, role)
        return Rotated(role, old, new, not_after, (folder / f"{role}.key", folder / TRUST_FILE))


def sealer_for_roles(
    settings: LedgerSettings, auth: tuple[str, ...], preferred: str | None
) -> SigningKey:
    """The key a command seals a stage-written topic's record with.

    Args:
        settings: the keys folder.
        auth: the topic's writer key roles.
        preferred: the role the command plays (``reconciler``), if any.

    Returns:
        ``preferred``'s key when it writes the topic, else the first of the
        topic's stage roles whose private key this host holds.

    Raises:
        MissingKeyError: this host holds no key of a role that writes the
            topic (named, with the remedy).
    """
    roles = [r for r in auth if r in STAGE_KEY_ROLES]
    if preferred in roles:
        return role_key(settings, preferred)
    folder = _folder(settings)
    for role in roles:
        if (folder / f"{role}.key").exists():
            return role_key(settings, role)
    return role_key(settings, roles[0] if roles else "processor")


__all__ = [
    "COMPONENT_ROLE",
    "DEFAULT_OVERLAP_S",
    "TRUST_FILE",
    "RoleKeyError",
    "Rotated",
    "add_role_keys",
    "current_key_id",
    "provision_role_keys",
    "read_trust",
    "role_key",
    "rotate",
    "sealer_for_roles",
]
