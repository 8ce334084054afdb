"""Optional dependencies, named with the install command when one is missing.

A service that only publishes intents installs ``kafka-recovery-ledger`` with
no extras. The operator console (``[console]``), HTML plots (``[plots]``), spans over OTLP
(``[otlp]``) and a sink served with the toolkit (``[sink-toolkit]``) need
more; the command that needs one says which, instead of failing on an
``ImportError``.
"""

from __future__ import annotations

from importlib.util import find_spec

from ledger.errors import MissingExtraError

#: The modules of each extra this package checks for, by extra name.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "console": ("starlette", "uvicorn"),
    "otlp": ("opentelemetry.exporter.otlp.proto.http",),
    "sink-toolkit": ("starlette", "uvicorn"),
    # HTML reports with plots (`ledger audit --html`): matplotlib.
    "plots": ("matplotlib",),
}


def _present(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` (a key of :data:`EXTRA_MODULES`) not installed here."""
    return [name for name in EXTRA_MODULES[extra] if not _present(name)]


def require_extra(extra: str, what: str) -> None:
    """Fail with the remedy when ``extra``'s modules are not installed.

    Args:
        extra: a key of :data:`EXTRA_MODULES`.
        what: what needs it, for the message (e.g. ``ledger console``).

    Raises:
        MissingExtraError: naming the missing modules and the install command.
    """
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(
            f"{what} needs the {extra} extra (missing: {', '.join(missing)}); install it "
            f"with: pip install 'kafka-recovery-ledger[{extra}]'"
        )
