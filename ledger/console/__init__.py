"""The operator console: a small web application over the ledger (``ledger console``).

* :mod:`ledger.console.data` -- what the pages read and write
  (:class:`ConsoleData`, and :class:`LedgerData` for a real ledger); loads
  in a core install;
* :mod:`ledger.console.app` -- the pages and forms (Starlette, the
  ``[console]`` extra), reached through :func:`create_app` and
  :func:`serve`, which name the install command when the extra is missing;
* :mod:`ledger.console.triage` -- problems first, counts in the navigation;
* :mod:`ledger.console.hosts` -- the ``Host`` headers it answers.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ledger.console.data import (
    DECISIONS,
    AuditRun,
    ConsoleData,
    LedgerData,
    StageHealth,
    operation_age_s,
)
from ledger.console.hosts import LOOPBACK_HOSTS, allowed_hosts, is_loopback
from ledger.extras import require_extra

if TYPE_CHECKING:  # Starlette is loaded when the console runs, not by every command
    from starlette.applications import Starlette

__all__ = [
    "DECISIONS",
    "AuditRun",
    "ConsoleData",
    "LedgerData",
    "StageHealth",
    "allowed_hosts",
    "create_app",
    "is_loopback",
    "operation_age_s",
    "serve",
]


def create_app(
    data: ConsoleData,
    *,
    title: str = "ledger",
    token: str | None = None,
    hosts: Sequence[str] = LOOPBACK_HOSTS,
) -> Starlette:
    """The console as an ASGI application (:func:`ledger.console.app.create_app`).

    Raises:
        MissingExtraError: Starlette is not installed (install the ``[console]`` extra).
    """
    require_extra("console", "the operator console")
    app = importlib.import_module("ledger.console.app")
    made: Starlette = app.create_app(data, title=title, token=token, hosts=hosts)
    return made


def serve(data: ConsoleData, *, host: str, port: int, title: str) -> None:
    """Serve the console on ``host:port`` until interrupted (uvicorn, the ``[console]`` extra).

    Args:
        data: where the pages read from and dispositions go.
        host: address to listen on; its ``Host`` headers are :func:`allowed_hosts`.
        port: TCP port (0: any free one).
        title: the ledger's name in page titles (its topic prefix).

    Raises:
        MissingExtraError: Starlette or uvicorn is not installed.
    """
    require_extra("console", "ledger console")
    uvicorn = importlib.import_module("uvicorn")
    app = create_app(data, title=title, hosts=allowed_hosts(host))
    uvicorn.run(app, host=host, port=port, log_level="warning")
