"""Attributable review decisions: Ed25519 signatures over approvals.

A reviewer signs the canonical encoding of an approval's grant (ID, reviewer,
policy version, expiry, scope, grant time) with an Ed25519 key (RFC 8032, via
the ``cryptography`` package). The authority kernel admits only approvals
signed by a key it is configured to trust (``trusted_keys.json``: key ID ->
base64 raw public key).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from ledger.errors import LocalFileError
from ledger.events import Approval
from ledger.identity import canonical_json

#: Scope fields added by Approval schema version 2. Each is in the signed
#: body only when set, so a signature made before they existed (over the nine
#: fields of version 1) still verifies, and setting one changes what is signed.
OPTIONAL_SIGNED_FIELDS = (
    "scope_action",
    "scope_sink",
    "scope_currency",
    "scope_account",
    "scope_purpose",
    "scope_parameter_digest",
)


#: How :func:`verify` starts the reason for a grant signed by a key the
#: reader does not hold (:func:`ledger.authn.unverifiable` knows it).
GRANT_UNKNOWN_KEY = "approval signed by unknown key"


def signed_body(approval: Approval, ledger_id: str) -> bytes:
    """The bytes a reviewer signs: the grant's fields, canonical JSON (UTF-8).

    The body holds the ledger the grant is made for (``ledger``: a grant
    copied to another ledger does not verify there), the nine fields of the
    first release (ID, reviewer, policy version, expiry, grant time, key ID,
    subject, amount cap, bound operation) and, of
    :data:`OPTIONAL_SIGNED_FIELDS`, those that are set: the reviewer's
    signature covers every constraint the approval carries.

    Args:
        approval: the grant.
        ledger_id: the ledger's identity (``LEDGER_ID``, by default its topic
            prefix).
    """
    body: dict[str, object] = {
        "ledger": ledger_id,
        "approval_id": approval.approval_id,
        "expires_at_ms": approval.expires_at_ms,
        "granted_at_ms": approval.granted_at_ms,
        "key_id": approval.key_id,
        "policy_version": approval.policy_version,
        "reviewer": approval.reviewer,
        "scope_max_amount_minor": approval.scope_max_amount_minor,
        "scope_operation_id": approval.scope_operation_id,
        "scope_subject": approval.scope_subject,
    }
    for field in OPTIONAL_SIGNED_FIELDS:
        value = getattr(approval, field)
        if value is not None:
            body[field] = value
    return canonical_json(body).encode("utf-8")


@dataclass(frozen=True)
class ReviewerKey:
    """A reviewer's signing key.

    Attributes:
        key_id: the name the ledger trusts it under.
        private: the Ed25519 private key.
    """

    key_id: str
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls, key_id: str) -> ReviewerKey:
        """A fresh random key."""
        return cls(key_id, Ed25519PrivateKey.generate())

    @classmethod
    def from_file(cls, path: Path) -> ReviewerKey:
        """Load ``{"key_id": ..., "private_key": base64 raw}``.

        Raises:
            LocalFileError: the file is unreadable or not such an object.
        """
        try:
            raw = json.loads(path.read_text())
            key = Ed25519PrivateKey.from_private_bytes(
                base64.b64decode(raw["private_key"], validate=True)
            )
            key_id = raw["key_id"]
            if not isinstance(key_id, str) or not key_id.strip():
                raise ValueError("key_id is not a name")
        except FileNotFoundError as exc:
            raise LocalFileError(
                f"no reviewer key at {path}: the folder comes from LEDGER_HOME / LEDGER_RUN_DIR; "
                "if the key was made for a ledger elsewhere, point them at that ledger's "
                "folder, else create one with `ledger reviewer add NAME`",
                observed=str(exc),
            ) from exc
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise LocalFileError(
                f"the reviewer key {path} is unreadable ({type(exc).__name__}: {exc}); restore "
                "it from a backup, or remove it and create a new key with `ledger reviewer add` "
                "(approvals signed with the old key then stop verifying)",
                observed=str(exc),
            ) from exc
        return cls(key_id, key)

    def save(self, path: Path) -> None:
        """Write the private key (mode 0600)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        raw = self.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        path.write_text(
            json.dumps({"key_id": self.key_id, "private_key": base64.b64encode(raw).decode()})
        )
        path.chmod(0o600)

    def public_b64(self) -> str:
        """The raw public key, base64."""
        raw = self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(raw).decode()

    def sign(self, approval: Approval, *, ledger_id: str) -> Approval:
        """Return ``approval`` with ``key_id`` and ``signature`` set.

        Args:
            approval: the grant to sign.
            ledger_id: the ledger it is granted in (``settings.ledger_identity``):
                the signature verifies in that ledger only.
        """
        unsigned = approval.model_copy(update={"key_id": self.key_id, "signature": None})
        signature = self.private.sign(signed_body(unsigned, ledger_id))
        return unsigned.model_copy(update={"signature": signature})


def load_trusted_roles(path: Path) -> dict[str, tuple[str, Ed25519PublicKey]]:
    """Read every trusted key with its role; empty if the file is absent.

    The file maps key IDs to either a base64 raw public key (a reviewer, the
    format of earlier releases) or ``{"role": ..., "public_key": ...}`` with
    role ``reviewer`` or ``operator``.

    Raises:
        LocalFileError: the file is not such a JSON object.
    """
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        found: dict[str, tuple[str, Ed25519PublicKey]] = {}
        for key_id, value in raw.items():
            role, b64 = (
                ("reviewer", value)
                if isinstance(value, str)
                else (
                    str(value["role"]),
                    value["public_key"],
                )
            )
            if role not in ("reviewer", "operator"):
                raise ValueError(f"key {key_id!r} has unknown role {role!r}")
            found[str(key_id)] = (
                role,
                Ed25519PublicKey.from_public_bytes(base64.b64decode(b64, validate=True)),
            )
        return found
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise LocalFileError(
            f"the trusted-keys file {path} is unreadable ({type(exc).__name__}: {exc}); "
            "restore it, or remove it and add the reviewers and operators again with "
            "`ledger reviewer add` and `ledger operator add`",
            observed=str(exc),
        ) from exc


def load_trusted(path: Path, role: str = "reviewer") -> dict[str, Ed25519PublicKey]:
    """Read the trusted keys of one role (``{key_id: public key}``); empty if absent.

    Raises:
        LocalFileError: the file is not a trusted-keys file (see
            :func:`load_trusted_roles`).
    """
    return {k: public for k, (r, public) in load_trusted_roles(path).items() if r == role}


def trust(path: Path, key: ReviewerKey, role: str = "reviewer") -> None:
    """Add a key to a trusted-keys file under ``role`` (``reviewer`` or ``operator``).

    The file is replaced atomically under an exclusive lock, so concurrent
    additions do not lose each other.

    Raises:
        LocalFileError: the existing file is unreadable.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        load_trusted_roles(path)  # refuse to overwrite a corrupted file
        raw = json.loads(path.read_text()) if path.exists() else {}
        raw[key.key_id] = (
            key.public_b64()
            if role == "reviewer"
            else {"role": role, "public_key": key.public_b64()}
        )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(raw, indent=2))
        os.replace(tmp, path)


def verify(approval: Approval, trusted: dict[str, Ed25519PublicKey], ledger_id: str) -> str | None:
    """Check an approval's signature.

    Args:
        approval: the grant.
        trusted: reviewer key ID -> public key.
        ledger_id: the reader's ledger: a grant signed for another ledger
            does not verify.

    Returns:
        ``None`` when it is signed by a trusted key, else the reason it is
        refused: ``approval is not signed``, ``approval signed by unknown key
        K`` or ``approval signature is invalid (forged, altered, or made for
        another ledger)``.
    """
    if approval.signature is None or approval.key_id is None:
        return "approval is not signed"
    public = trusted.get(approval.key_id)
    if public is None:
        return f"{GRANT_UNKNOWN_KEY} {approval.key_id}"
    try:
        public.verify(approval.signature, signed_body(approval, ledger_id))
    except InvalidSignature:
        return "approval signature is invalid (forged, altered, or made for another ledger)"
    return None
