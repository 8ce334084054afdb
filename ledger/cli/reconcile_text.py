"""What ``ledger reconcile run`` prints on standard output, as text (pure).

Each readback or verification the run recorded is a line; the last line
says what is left open, so a run whose only open work is stranded (nothing
read back) does not print an empty result. The reason and remedy of each
operation left open are on standard error, said as the run finds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def run_lines(results: Sequence[dict[str, Any]], left: Sequence[str]) -> list[str]:
    """The text of one ``ledger reconcile run``.

    Args:
        results: the rows :func:`consumers.reverify.run_pass` returns
            (``{"operation_id", "sink", "observed", "detail"}``, a
            verification with ``"kind": "POSTCONDITION"``).
        left: the operations left open, sorted.

    Returns:
        Lines without newlines: one per row (``OP  SINK  readback|verification
        OBSERVED  detail``), then a summary naming what is left open.
    """
    lines = []
    for row in results:
        what = "verification" if row.get("kind") == "POSTCONDITION" else "readback"
        detail = row.get("detail", "")
        lines.append(f"{row['operation_id']}\t{row['sink']}\t{what} {row['observed']}\t{detail}")
    verified = sum(1 for r in results if r.get("kind") == "POSTCONDITION")
    done = f"{len(results) - verified} readback(s) and {verified} verification(s) recorded"
    if not left:
        lines.append(f"{done}; nothing left open (no unknown outcome, nothing stranded)")
        return lines
    shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
    lines.append(
        f"{done}; {len(left)} operation(s) LEFT OPEN: {shown} (each one's reason and remedy "
        "is on standard error; `ledger audit` lists them as open items)"
    )
    return lines
