"""Whether the ``[testbed]`` extra is installed, said with the remedy when it is not."""

from __future__ import annotations

from importlib.util import find_spec

from ledger.errors import LedgerError

#: Modules the testbed's sinks, reports and scenario files need (the ``[testbed]`` extra).
EXTRA_MODULES = ("starlette", "uvicorn", "matplotlib", "yaml")


def require_testbed_extra(command: str) -> None:
    """Fail with the remedy when the ``[testbed]`` extra's modules are missing.

    Args:
        command: the command that needs them, for the message (e.g. ``ledger demo``).

    Raises:
        LedgerError: naming the missing modules and the install command.
    """
    missing = [name for name in EXTRA_MODULES if find_spec(name) is None]
    if missing:
        raise LedgerError(
            f"{command} needs the testbed extra (missing: {', '.join(missing)}); "
            "install it with: pip install 'kafka-recovery-ledger[testbed]'"
        )
