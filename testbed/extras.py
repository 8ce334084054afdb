"""Whether the testbed's dependencies are installed, said with the remedy when they are not.

The testbed distribution (``kafka-recovery-ledger-testbed``) requires them;
they are missing only where it was installed without its dependencies
(``pip install --no-deps``) or its code is run from a checkout without it.
"""

from __future__ import annotations

from importlib.util import find_spec

from ledger.errors import MissingExtraError

#: Modules the testbed's sinks, reports and scenario files need (its dependencies).
EXTRA_MODULES = ("starlette", "uvicorn", "matplotlib", "yaml")


def require_testbed_extra(command: str) -> None:
    """Fail with the remedy when the testbed's dependencies are missing.

    Args:
        command: the command that needs them, for the message (e.g. ``ledger demo``).

    Raises:
        MissingExtraError: naming the missing modules and the install command.
    """
    missing = [name for name in EXTRA_MODULES if find_spec(name) is None]
    if missing:
        raise MissingExtraError(
            f"{command} needs the testbed's dependencies (missing: {', '.join(missing)}); "
            "install them with: pip install kafka-recovery-ledger-testbed "
            "(from a checkout: pip install -e ./testbed)"
        )
