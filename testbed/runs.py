"""What a testbed run (demo case, game day) leaves behind, and how to look at it.

Each demo case and game day runs on its own ledger: a random topic prefix and
its own run folder (keys, sink registry, manual ledger clock). Once the run
ends, :func:`inspect_lines` says which, and the commands that read it.
Standard library only, so the ``ledger`` plug-in imports it without the
testbed's extra.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from ledger.settings import LedgerSettings


@dataclass
class RunLedger:
    """One testbed run's ledger, as a person inspects it afterwards.

    Attributes:
        label: what ran on it (``case consume_once_claim``, ``scenario s01``).
        settings: its settings (topic prefix, run folder, clock).
        operation_ids: the operations it published, in order (for ``ledger history``).
    """

    label: str
    settings: LedgerSettings
    operation_ids: list[str] = field(default_factory=list)


def inspect_lines(run: RunLedger) -> list[str]:
    """How to look at a finished run's ledger: its prefix, run folder and the commands.

    The commands need the variables printed (the topic prefix and run folder
    are the run's own; its clock is the manual ledger clock in the run
    folder) and a broker on the same bootstrap servers: the records survive
    ``ledger broker stop``, so ``ledger broker start`` brings them back.

    Args:
        run: the run's ledger.

    Returns:
        Lines without newlines: ``ledger of LABEL: topic prefix P, run folder
        D``, the ``export LEDGER_TOPIC_PREFIX=... LEDGER_RUN_DIR=...
        LEDGER_CLOCK=...`` line and the ``ledger state`` / ``ledger history OP``
        / ``ledger audit --no-sinks`` commands (the run's sinks are stopped).
    """
    s = run.settings
    env = (
        f"export LEDGER_TOPIC_PREFIX={shlex.quote(s.topic_prefix)} "
        f"LEDGER_RUN_DIR={shlex.quote(str(s.run_dir))} LEDGER_CLOCK={shlex.quote(s.clock)}"
    )
    op = shlex.quote(run.operation_ids[0]) if run.operation_ids else "OP"
    lines = [
        f"ledger of {run.label}: topic prefix {s.topic_prefix}, run folder {s.run_dir}",
        f"  inspect it:  {env}",
        f"               ledger state; ledger history {op}; ledger audit --no-sinks",
    ]
    return lines
