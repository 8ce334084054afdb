"""The keys folder: where it is, which ledger it serves, and the legacy deployment key.

The lowest layer of key handling (:mod:`ledger.credentials` and
:mod:`ledger.rolekeys` build on it): the folder (``LEDGER_KEYS_DIR``,
default ``LEDGER_RUN_DIR/keys``), its ``ledgers.json`` binding, the
missing-key error every loader raises (it names the key, the folder and the
remedy), and the shared deployment key of earlier releases, which verifies
records appended before the cut-over to per-role keys only.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from pathlib import Path

from ledger.authn import MacKey
from ledger.errors import LocalFileError
from ledger.settings import LedgerSettings

#: The public trust file of the stage roles' keys (:mod:`ledger.rolekeys`; every host holds it).
TRUST_FILE = "stage-keys.json"

#: The file that says which ledgers a keys folder serves.
LEDGERS_FILE = "ledgers.json"


class MissingKeyError(LocalFileError):
    """A key the process needs is not there.

    The message names the key, the folder and the command that provisions it. Nothing is created
    instead.
    """


class KeysOfAnotherLedgerError(LocalFileError):
    """The keys folder serves other ledgers (its ``ledgers.json``).

    Separate ledgers never share keys unless told to (``ledger keys init --share``).
    """


def keys_dir(settings: LedgerSettings) -> Path:
    """The folder of the ledger's keys (``LEDGER_KEYS_DIR``, default ``LEDGER_RUN_DIR/keys``)."""
    return settings.keys_dir or settings.run_dir / "keys"


def create_once(path: Path, content: str) -> bool:
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


def read_json(path: Path, what: str, remedy: str) -> dict[str, str]:
    """A key folder's JSON object file.

    Args:
        path: the file.
        what: what the file is, for the message.
        remedy: what to do when it is unreadable.

    Raises:
        LocalFileError: unreadable or not a JSON object.
    """
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


def missing_key(settings: LedgerSettings, name: str, who: str) -> MissingKeyError:
    """The error for a key file ``name`` that ``who`` needs and the keys folder lacks.

    Returns:
        The error (to raise), naming the folder and how to restore the key.
    """
    folder = keys_dir(settings)
    return MissingKeyError(
        f"no {name} in {folder} (LEDGER_KEYS_DIR), and {who} needs it: copy the keys folder "
        f"from the host where the keys of ledger {settings.ledger_identity!r} were made (or "
        f"restore it from a backup); for a new ledger with no records yet, run `ledger keys init`. "
        "Nothing was created: a fresh key would read the evidence sealed with the lost one "
        "as absent",
        expected=str(folder / name),
        observed="absent",
    )


def bound_ledgers(settings: LedgerSettings) -> list[str] | None:
    """The ledgers the keys folder serves (``ledgers.json``); ``None`` if it has no such file.

    Raises:
        LocalFileError: the file is unreadable.
    """
    path = keys_dir(settings) / LEDGERS_FILE
    if not path.exists():
        return None
    raw = read_json(path, "ledgers", "restore it from another stage host")
    ledgers = raw.get("ledgers")
    if not isinstance(ledgers, list) or not all(isinstance(x, str) for x in ledgers):
        raise LocalFileError(
            f"the ledgers file {path} has no list of ledger IDs under 'ledgers'; restore it "
            "from another stage host",
            observed=str(raw)[:200],
        )
    return list(ledgers)


def check_binding(settings: LedgerSettings) -> None:
    """Refuse a keys folder that serves other ledgers, or none.

    Raises:
        KeysOfAnotherLedgerError: ``ledgers.json`` does not list this ledger,
            or the folder holds keys but no ``ledgers.json`` (an earlier
            release's folder: ``ledger keys init`` binds it).
        LocalFileError: ``ledgers.json`` is unreadable.
    """
    folder = keys_dir(settings)
    me = settings.ledger_identity
    ledgers = bound_ledgers(settings)
    if ledgers is None:
        if any((folder / n).exists() for n in ("deployment.key", "authority.pub", TRUST_FILE)):
            raise KeysOfAnotherLedgerError(
                f"the keys in {folder} name no ledger (no {LEDGERS_FILE}, an earlier release's "
                f"folder); if they are ledger {me!r}'s, bind them with `ledger keys init`",
                expected=me,
                observed="no ledgers.json",
            )
        return
    if me not in ledgers:
        raise KeysOfAnotherLedgerError(
            f"the keys in {folder} serve ledger(s) {', '.join(map(repr, ledgers))}, not {me!r} "
            f"(LEDGER_ID, default the topic prefix): give this ledger its own folder "
            "(LEDGER_KEYS_DIR) and run `ledger keys init` there, or share these keys on "
            "purpose with `ledger keys init --share`",
            expected=me,
            observed=",".join(ledgers),
        )


def deployment_key(settings: LedgerSettings) -> MacKey:
    """The legacy shared deployment key of earlier releases, bound to this ledger (a verifier).

    Raises:
        MissingKeyError: there is no ``deployment.key`` (the message names
            the folder and ``ledger keys init``).
        KeysOfAnotherLedgerError: the folder serves another ledger.
        LocalFileError: the file is unreadable.
    """
    path = keys_dir(settings) / "deployment.key"
    if not path.exists():
        raise missing_key(settings, "deployment.key", "a reader of an earlier release's records")
    check_binding(settings)
    raw = read_json(path, "deployment key", "restore it from another stage host")
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
    return MacKey(secret_bytes, ledger_id=settings.ledger_identity)
