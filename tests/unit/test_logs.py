"""Structured logs: every JSON line names its operation, stage, instance and trace."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import ledger.logs as logs_module
from consumers.processor import Processor
from consumers.stage import Record
from ledger.logs import (
    CONTEXT_FIELDS,
    bind,
    bound_each,
    bound_fields,
    configure_logging,
    make_handler,
)
from ledger.settings import LedgerSettings
from tests.helpers import intent, keyed, receipt


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger of its own writing JSON lines into a buffer, in a process with no stage.

    An earlier test in this process may have run a stage command in-process
    (``ledger processor`` through click's runner), which names the process's
    stage for good; under ``make test``'s workers such a test can come first.
    """
    monkeypatch.setattr(logs_module, "_process", {})
    buffer = io.StringIO()
    logger = logging.getLogger("tests.logs.captured")
    handler = make_handler("json", buffer)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, buffer
    logger.removeHandler(handler)


def _lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def test_a_json_line_carries_every_field(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, buffer = captured
    with bind(stage="relay", instance="2", operation_id="refund:c1:v1"):
        logger.warning("sent %s", "d-1")
    (line,) = _lines(buffer)
    assert line["message"] == "sent d-1"
    assert line["level"] == "WARNING"
    assert line["logger"] == "tests.logs.captured"
    assert line["timestamp"]
    assert line["operation_id"] == "refund:c1:v1"
    assert line["stage"] == "relay"
    assert line["instance"] == "2"
    assert set(CONTEXT_FIELDS) <= set(line)
    assert line["trace_id"] is None and line["span_id"] is None  # no span is current


def test_unbound_fields_are_null_and_binds_nest_and_unwind(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, buffer = captured
    logger.info("outside")
    with bind(stage="processor"):
        with bind(operation_id="op-1"):
            logger.info("inner")
        logger.info("outer")
    first, inner, outer = _lines(buffer)
    assert first["operation_id"] is None and first["stage"] is None
    assert (inner["stage"], inner["operation_id"]) == ("processor", "op-1")
    assert (outer["stage"], outer["operation_id"]) == ("processor", None)
    assert bound_fields() == {}


def test_the_trace_id_is_the_current_spans(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, buffer = captured
    tracer = TracerProvider().get_tracer("tests")
    with tracer.start_as_current_span("operation") as span:
        logger.info("inside a span")
        context = span.get_span_context()
    logger.info("after it")
    inside, after = _lines(buffer)
    assert inside["trace_id"] == format(context.trace_id, "032x")
    assert inside["span_id"] == format(context.span_id, "016x")
    assert after["trace_id"] is None


def test_bound_each_names_each_items_operation_and_restores_on_an_error(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, buffer = captured
    with bind(operation_id="outer"):
        for op in bound_each(["a", "b"], lambda x: f"op-{x}"):
            logger.info("working on %s", op)
        logger.info("after the loop")
        with pytest.raises(RuntimeError):
            for _ in bound_each(["c"], lambda x: f"op-{x}"):
                raise RuntimeError("boom")
        logger.info("after the error")
    ops = [line["operation_id"] for line in _lines(buffer)]
    assert ops == ["op-a", "op-b", "outer", "outer"]


@pytest.fixture
def root_restored() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_configure_logging_names_the_stage_on_every_line_of_every_logger(
    root_restored: logging.Logger,
) -> None:
    buffer = io.StringIO()
    settings = keyed(LedgerSettings(log_format="json"))
    assert configure_logging(settings, "authority", "1", stream=buffer, force=True) is not None
    logging.getLogger("consumers.somewhere").info("hello")
    (line,) = _lines(buffer)
    assert (line["stage"], line["instance"], line["message"]) == ("authority", "1", "hello")
    # A second call replaces its own handler instead of adding one.
    again = io.StringIO()
    configure_logging("text", "authority", "1", stream=again)
    logging.getLogger("x").warning("plain")
    assert buffer.getvalue().count("\n") == 1
    assert again.getvalue().endswith("WARNING x: plain\n")


def test_configure_logging_leaves_a_root_logger_configured_elsewhere(
    root_restored: logging.Logger,
) -> None:
    foreign = logging.StreamHandler(io.StringIO())
    for handler in list(root_restored.handlers):
        root_restored.removeHandler(handler)
    root_restored.addHandler(foreign)
    assert configure_logging("json", "relay", "0", stream=io.StringIO()) is None
    assert root_restored.handlers == [foreign]


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="neither text nor json"):
        make_handler("xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log_format"):
        keyed(LedgerSettings(log_format="xml"))  # type: ignore[arg-type]


class _Producer:
    """Accepts produce() calls (records are not kept: the test reads the logs)."""

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def poll(self, timeout: float) -> int:
        return 0


def test_the_processors_lines_within_a_record_carry_its_operation_id(
    tmp_path: Path, captured: tuple[logging.Logger, io.StringIO]
) -> None:
    logger, buffer = captured
    processor_log = logging.getLogger("consumers.processor")
    handler = make_handler("json", buffer)
    processor_log.addHandler(handler)
    try:
        stage = Processor(keyed(LedgerSettings(run_dir=tmp_path)))  # no sink registry: says so once
        stage.producer = _Producer()  # type: ignore[assignment]
        records = [
            Record("intents", 0, 7, "op-new", b"", intent("op-new")),
            Record("receipts", 1, 3, "op-unknown", b"", receipt("op-unknown", "d-1")),
        ]
        with bind(stage="processor", instance="0"):
            stage.handle(records, stage.writer())
            logger.info("after the batch")
    finally:
        processor_log.removeHandler(handler)
    lines = _lines(buffer)
    registry_line = next(x for x in lines if "no sink registry" in x["message"])
    refused_line = next(x for x in lines if "refused" in x["message"])
    assert registry_line["operation_id"] == "op-new"
    assert refused_line["operation_id"] == "op-unknown"
    assert refused_line["stage"] == "processor" and refused_line["instance"] == "0"
    assert lines[-1]["operation_id"] is None
