"""The relay says each request to a sink and its outcome at INFO (issue 13, item 2)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.unit.test_relay_unreachable import Sink, _dispatch, _relay


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "consumers.relay" and r.levelno == logging.INFO
    ]


def test_a_timeout_that_becomes_an_unknown_outcome_is_said_line_by_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="consumers.relay")
    relay = _relay(tmp_path, Sink(submit="timeout", readback="refuse"), attempts=1)
    outputs = relay.parking.attempt(_dispatch(), 0, 3, fresh=True)
    assert outputs  # the budget of one is spent: the operation is held
    lines = _lines(caplog)
    tail = "(dispatch refund:1:v1#1.1, attempt 1, fencing token 1)"
    assert lines[0] == f"relay: sending EXECUTE refund:1:v1 at payments {tail}: fresh"
    assert lines[1].startswith(
        f"relay: not sent EXECUTE refund:1:v1 at payments {tail}: SINK_UNREACHABLE:"
    )
    assert "Connection refused" in lines[1]
    assert lines[2].startswith(
        f"relay: outcome EXECUTE refund:1:v1 at payments {tail}: EFFECT readback UNKNOWN "
        "(held as UNKNOWN_OUTCOME)"
    )


def test_a_refused_connection_is_one_line_with_the_operation_and_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="consumers.relay")
    relay = _relay(tmp_path, Sink())
    assert relay.parking.attempt(_dispatch(), 0, 5, fresh=True) == []
    refused = [line for line in _lines(caplog) if line.startswith("relay: not sent")]
    assert len(refused) == 1
    assert "refund:1:v1 at payments" in refused[0] and "fencing token 1" in refused[0]
    assert "Connection refused" in refused[0]
