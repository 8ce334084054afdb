"""Ledger-clock instants for people: ISO 8601 UTC, not epoch milliseconds.

Records carry instants as milliseconds since the Unix epoch on the ledger
clock (``published_at_ms``, ``expires_at_ms`` ...); machine output (``--json``)
keeps them so. What a person reads (``ledger history``, the console) shows
them as ISO 8601 UTC with milliseconds (ISO 8601-1:2019, the profile of RFC
3339), e.g. ``2026-12-07T12:26:18.123Z``. A manual ledger clock (game days,
demos) counts from 0, so its small instants are shown as seconds on it.
Pure: no clock is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

#: Ledger-clock instants at or after this (2001-09-09 in Unix milliseconds) are
#: wall-clock times; a manual clock (game days, demos) counts from 0.
EPOCH_LIKE_MS = 1_000_000_000_000


def clock_time(ms: int | None) -> str | None:
    """One ledger-clock instant as text.

    Args:
        ms: milliseconds since the epoch on the ledger clock, or ``None``.

    Returns:
        ``2026-12-07T12:26:18.123Z`` for a wall-clock instant, ``3600.5 s on
        the manual clock`` below :data:`EPOCH_LIKE_MS`, ``None`` kept.
    """
    if ms is None:
        return None
    if ms >= EPOCH_LIKE_MS:
        at = datetime.fromtimestamp(ms / 1000, UTC)
        return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
    seconds = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{seconds} s on the manual clock"


def readable_fields(fields: Mapping[str, object]) -> list[tuple[str, object]]:
    """A record's fields for a page, instants (``*_at_ms``) as :func:`clock_time` text.

    Args:
        fields: a record or state as JSON-ready values (``model_dump(mode="json")``).

    Returns:
        ``(name, value)`` sorted by name; an instant's name loses its ``_ms``
        (``admitted_at_ms`` -> ``admitted_at``), other values are kept.
    """
    rows: list[tuple[str, object]] = []
    for name, value in fields.items():
        if name.endswith("_at_ms") and isinstance(value, int) and not isinstance(value, bool):
            rows.append((name[: -len("_ms")], clock_time(value)))
        else:
            rows.append((name, value))
    return sorted(rows)
