"""The sink registry: where each sink answers and what it declares.

The registry is a JSON file (``LEDGER_SINKS_FILE``, default
``LEDGER_RUN_DIR/sinks.json``) mapping a sink's name to its URL, its
:class:`~ledger.contracts.EffectContract` and its bearer token::

    {"payments": {"url": "http://127.0.0.1:8123",
                  "contract": {"idempotent": true, ...},
                  "token": "k3J..."}}

``token`` is the secret the sink requires as ``Authorization: Bearer
<token>`` on every request; the sink client sends it. It is optional (``null``
or absent: no header is sent, for sinks that take none). The file holds the
secret itself, so keep it readable by the ledger's user only (it is written
with mode 0600). ``ledger sink serve`` and the test harness generate a random
token for each reference sink they start and write it here; the relay, the
reconciler, the auditor and the CLI read it.
The file I/O lives here so that :mod:`ledger.contracts` stays pure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ledger.contracts import EffectContract
from ledger.errors import LocalFileError
from ledger.upgrades import ReleaseManifest


class SinkEndpoint(BaseModel):
    """Where a sink answers and what it declares.

    Attributes:
        url: base URL, e.g. ``http://127.0.0.1:8123``.
        contract: the sink's effect contract.
        token: the sink's bearer token, or ``None`` when it takes none.
        contract_version: the version of ``contract`` (1 unless stated): a
            sink release that changes its contract raises it, and the release
            manifest says which in-flight operations may resume under it
            (:mod:`ledger.upgrades`).
        adapter: the adapter kind that reaches the sink's system
            (:mod:`sinks.port`): ``http`` (the ledger's HTTP sink protocol, the
            default; ``reference`` is the same), ``http-idempotency-key``,
            ``postgres``, ``smtp``, or an installed entry point's name.
        config: the adapter's own settings, as its documentation names them
            (empty for ``http``). ``url`` is the system's address in the
            adapter's scheme (``http://``, ``postgresql://``, ``smtp://``).
        timeout_s: the overall deadline of every call to this sink, in
            seconds, or ``None`` for the stage's ``LEDGER_SINK_TIMEOUT_S``. A
            system that needs several round trips per effect (SMTP: about
            eight) may need more than an HTTP API; an answer past the deadline
            is ambiguous, and on a sink without readback that is held.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    contract: EffectContract
    token: str | None = Field(default=None, min_length=1, repr=False)
    contract_version: int = Field(default=1, ge=1)
    adapter: str = Field(default="http", min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=None, gt=0, le=300)

    def deadline_s(self, default_s: float) -> float:
        """The overall deadline of a call to this sink, in seconds.

        Args:
            default_s: the stage's ``LEDGER_SINK_TIMEOUT_S``.
        """
        return self.timeout_s if self.timeout_s is not None else default_s


def load_sinks(path: Path) -> dict[str, SinkEndpoint]:
    """Read the sink registry.

    Args:
        path: the registry file (a JSON object: name -> ``{url, contract, token}``).

    Returns:
        ``{name: endpoint}``; an empty dict when the file does not exist.

    Raises:
        LocalFileError: when the file is not such an object or an entry is malformed.
    """
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {str(name): SinkEndpoint.model_validate(entry) for name, entry in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:  # ValidationError too
        raise LocalFileError(
            f"the sink registry {path} is unreadable ({type(exc).__name__}: {str(exc)[:300]}); "
            "fix the entry, or remove the file and register the sinks again",
            observed=str(exc)[:300],
        ) from exc


def _unset(endpoint: SinkEndpoint) -> set[str] | None:
    """Fields left out of the file: those at their defaults (as before they existed)."""
    left = {"token"} if endpoint.token is None else set()
    if endpoint.contract_version == 1:
        left.add("contract_version")
    if endpoint.adapter == "http":
        left.add("adapter")
    if not endpoint.config:
        left.add("config")
    if endpoint.timeout_s is None:
        left.add("timeout_s")
    return left or None


def save_sinks(path: Path, sinks: dict[str, SinkEndpoint]) -> None:
    """Write the sink registry atomically (a temporary file, then a rename).

    The file is created with mode 0600: it holds the sinks' bearer tokens.

    Args:
        path: the registry file; its folder is created when missing.
        sinks: ``{name: endpoint}``, the whole registry (it replaces the file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    entries = {k: v.model_dump(exclude=_unset(v)) for k, v in sinks.items()}
    text = json.dumps(entries, indent=2)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


class RegistryFile:
    """The sink registry as a long-running stage reads it: again whenever it changes.

    Stages read the registry often (the processor for every intent, the
    relay for every dispatch); this re-reads the file only when its size,
    modification time or inode changed, so a sink registered (or moved to
    another URL) while the stage runs is seen at its next use.

    Args:
        path: the registry file (see :func:`load_sinks`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._sinks: dict[str, SinkEndpoint] = {}

    def exists(self) -> bool:
        """Whether the registry file exists (a stage without one cannot check names)."""
        return self.path.exists()

    def current(self) -> dict[str, SinkEndpoint]:
        """The registry as the file says now.

        Returns:
            ``{name: endpoint}``; empty when the file does not exist.

        Raises:
            LocalFileError: when the file is unreadable or malformed (as
                :func:`load_sinks`); the next call reads it again.
        """
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._sinks = None, {}
            return self._sinks
        except OSError as exc:
            raise LocalFileError(
                f"the sink registry {self.path} cannot be read ({exc}); fix its permissions",
                observed=str(exc),
            ) from exc
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            self._sinks = load_sinks(self.path)
            self._stamp = stamp
        return self._sinks

    def problem(self, name: str) -> str | None:
        """Why sink ``name`` cannot be used, or ``None`` when it is registered.

        Args:
            name: the sink's name, as an intent or a dispatch gives it.

        Returns:
            ``None`` when the registry names the sink; otherwise the problem
            in words that name the file and the sinks it does register (or
            the registry's own problem when it is unreadable).
        """
        try:
            sinks = self.current()
        except LocalFileError as exc:
            return exc.message
        if name in sinks:
            return None
        known = ", ".join(sorted(sinks)) or "none"
        return f"sink {name!r} is not registered in {self.path} (registered: {known})"


def load_manifest(path: Path) -> ReleaseManifest:
    """Read a release manifest (JSON, see :mod:`ledger.upgrades`).

    Args:
        path: the manifest file.

    Returns:
        The validated manifest.

    Raises:
        LocalFileError: when the file is missing, unreadable or not a valid manifest.
    """
    try:
        return ReleaseManifest.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as exc:  # ValidationError too
        raise LocalFileError(
            f"the release manifest {path} is unreadable ({type(exc).__name__}: "
            f"{str(exc)[:300]}); fix it or point LEDGER_RELEASE_MANIFEST_FILE at a valid one",
            observed=str(exc)[:300],
        ) from exc
