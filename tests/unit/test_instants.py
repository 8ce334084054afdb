"""People read ledger-clock instants as ISO 8601 UTC, not epoch milliseconds (issue 29)."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.history import HistoryRecord, build_history, describe
from ledger.instants import EPOCH_LIKE_MS, clock_time, readable_fields
from tests.helpers import approval, intent

#: 2026-12-07T12:26:18.123Z as the ledger clock records it.
AT = datetime(2026, 12, 7, 12, 26, 18, 123000, tzinfo=UTC)
AT_MS = int(AT.timestamp() * 1000)


def test_a_wall_clock_instant_reads_as_iso_utc_with_milliseconds() -> None:
    text = clock_time(AT_MS)
    assert text == AT.strftime("%Y-%m-%dT%H:%M:%S.123Z")
    assert text is not None and datetime.fromisoformat(text) == AT  # it parses back
    assert str(AT_MS) not in text


def test_a_manual_clock_instant_reads_as_seconds_on_it() -> None:
    assert clock_time(3_600_500) == "3600.5 s on the manual clock"
    assert clock_time(0) == "0 s on the manual clock"
    assert clock_time(None) is None
    assert clock_time(EPOCH_LIKE_MS - 1) is not None and "manual" in str(
        clock_time(EPOCH_LIKE_MS - 1)
    )


def test_instant_fields_are_renamed_and_shown_as_text_others_kept() -> None:
    rows = dict(
        readable_fields({"admitted_at_ms": AT_MS, "amount_minor": 5000, "observed_at_ms": None})
    )
    assert rows == {"admitted_at": clock_time(AT_MS), "amount_minor": 5000, "observed_at_ms": None}


def test_history_summaries_name_instants_not_milliseconds() -> None:
    grant = approval(expires_at_ms=AT_MS)
    summary = describe(grant)
    assert f"expires at {clock_time(AT_MS)}" in summary and str(AT_MS) not in summary
    published = intent().model_copy(update={"published_at_ms": AT_MS})
    history = build_history(
        published.operation_id,
        [HistoryRecord("intents", 0, 0, AT_MS, published.operation_id, published, None)],
    )
    initiated = history.answer("initiated").answer
    assert clock_time(AT_MS) in initiated and str(AT_MS) not in initiated
