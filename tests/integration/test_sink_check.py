"""`ledger sink check`: the reference gateway keeps its claims; broken adapters fail, one by one.

The gateway runs as the real process the testbed starts (no Kafka needed);
the check puts its fault proxy between the adapter and the gateway's port.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli import main
from ledger.contracts import PAYMENT_GATEWAY
from sinks import port as sink_port
from sinks.client import ReadbackResult, SinkClient, SubmitResult
from sinks.registry import SinkEndpoint, save_sinks
from testbed.sinks.process import SinkProcess

pytestmark = pytest.mark.integration


class _CallsTimeoutsRejections(SinkClient):
    """A classic adapter bug: no answer is read as "rejected" (the relay would abandon it)."""

    def submit(self, *args: Any, **kwargs: Any) -> SubmitResult:
        result = super().submit(*args, **kwargs)
        if result.status == "ambiguous":
            return SubmitResult("rejected", result.operation_id, detail="timed out")
        return result


class _FreshKeyEachTime(SinkClient):
    """Another: a new idempotency key for every attempt (what checkpoint-only runtimes do)."""

    def submit(self, *args: Any, **kwargs: Any) -> SubmitResult:
        kwargs["idempotency_key"] = uuid.uuid4().hex
        return super().submit(*args, **kwargs)


class _HidesTheCount(_FreshKeyEachTime):
    """The same bug, behind a readback that shows one effect record (no count): the check
    must still see two effects, from the effect IDs and the account's credits."""

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        return dataclasses.replace(super().readback(operation_id, fencing_token), effects=1)


class _ReadsBackElsewhere(SinkClient):
    """A readback that looks under another key (a wrong path, a wrong column): every
    operation reads back absent, so a relay resumed after the commit would send again."""

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        return super().readback(operation_id + "-elsewhere", fencing_token)


def elsewhere_adapter(endpoint: Any, *, timeout_s: float) -> SinkClient:
    return _ReadsBackElsewhere(endpoint.url, timeout_s=timeout_s, token=endpoint.token)


def hiding_adapter(endpoint: Any, *, timeout_s: float) -> SinkClient:
    return _HidesTheCount(endpoint.url, timeout_s=timeout_s, token=endpoint.token)


def lying_adapter(endpoint: Any, *, timeout_s: float) -> SinkClient:
    return _CallsTimeoutsRejections(endpoint.url, timeout_s=timeout_s, token=endpoint.token)


def fresh_key_adapter(endpoint: Any, *, timeout_s: float) -> SinkClient:
    return _FreshKeyEachTime(endpoint.url, timeout_s=timeout_s, token=endpoint.token)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SinkProcess, Path]]:
    root = tmp_path_factory.mktemp("sink-check")
    sink = SinkProcess("payments", PAYMENT_GATEWAY, root, clock="system")
    sink.start()
    yield sink, root
    sink.stop()


def _check(
    gateway: tuple[SinkProcess, Path], adapter: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, dict[str, Any]]:
    sink, root = gateway
    registry = root / f"sinks-{adapter}.json"
    endpoint = SinkEndpoint(
        url=sink.url, contract=PAYMENT_GATEWAY, token=sink.token, adapter=adapter
    )
    save_sinks(registry, {"payments": endpoint})
    monkeypatch.setitem(sink_port.BUILTIN, "lying-http", f"{__name__}:lying_adapter")
    monkeypatch.setitem(sink_port.BUILTIN, "fresh-key-http", f"{__name__}:fresh_key_adapter")
    monkeypatch.setitem(sink_port.BUILTIN, "hiding-http", f"{__name__}:hiding_adapter")
    monkeypatch.setitem(sink_port.BUILTIN, "elsewhere-http", f"{__name__}:elsewhere_adapter")
    result = CliRunner().invoke(
        main,
        ["sink", "check", "payments", "--json"],
        env={
            "LEDGER_RUN_DIR": str(root),
            "LEDGER_SINKS_FILE": str(registry),
            "LEDGER_SINK_TIMEOUT_S": "0.5",
        },
    )
    return result.exit_code, json.loads(result.output)


def _verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {c["claim"]: c["verdict"] for c in report["claims"]}


def test_the_reference_gateway_keeps_every_claim_it_makes(
    gateway: tuple[SinkProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = _check(gateway, "http", monkeypatch)
    verdicts = _verdicts(report)
    assert code == 0 and report["passed"], report
    for claim in (
        "answers",
        "commits",
        "ambiguity-is-reported",
        "idempotent",
        "key-reuse-refused",
        "readback",
        "fencing",
        "postcondition",
        "relay-seams",
    ):
        assert verdicts[claim] == "holds", (claim, report)
    assert verdicts["key-retention"] == "untested"  # a week is longer than the check waits


def test_a_readback_that_loses_a_committed_effect_fails_the_relay_seams(
    gateway: tuple[SinkProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = _check(gateway, "elsewhere-http", monkeypatch)
    verdicts = _verdicts(report)
    assert code == 1 and verdicts["relay-seams"] == "fails", report
    detail = next(c["detail"] for c in report["claims"] if c["claim"] == "relay-seams")
    assert "after_sink_commit_before_receipt" in detail and "absent" in detail, detail
    assert verdicts["commits"] == "holds"


def test_an_adapter_that_reads_no_answer_as_a_rejection_fails_that_claim(
    gateway: tuple[SinkProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = _check(gateway, "lying-http", monkeypatch)
    verdicts = _verdicts(report)
    assert code == 1 and not report["passed"]
    assert verdicts["ambiguity-is-reported"] == "fails"
    assert verdicts["commits"] == "holds" and verdicts["fencing"] == "holds"


def test_an_adapter_that_claims_idempotency_but_changes_its_key_fails_it(
    gateway: tuple[SinkProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = _check(gateway, "fresh-key-http", monkeypatch)
    verdicts = _verdicts(report)
    assert code == 1
    assert verdicts["idempotent"] == "fails"
    detail = next(c["detail"] for c in report["claims"] if c["claim"] == "idempotent")
    assert "2 effects" in detail
    assert verdicts["ambiguity-is-reported"] == "holds"


def test_a_double_effect_behind_a_readback_without_a_count_still_fails_idempotent(
    gateway: tuple[SinkProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, report = _check(gateway, "hiding-http", monkeypatch)
    assert code == 1 and _verdicts(report)["idempotent"] == "fails", report
    detail = next(c["detail"] for c in report["claims"] if c["claim"] == "idempotent")
    assert "two effects" in detail and "2 credits" in detail, detail


# ---------------------------------------------------------------- the other adapters


def _check_endpoint(
    root: Path, endpoint: SinkEndpoint, name: str = "payments"
) -> tuple[int, dict[str, Any]]:
    registry = root / f"sinks-{endpoint.adapter}.json"
    save_sinks(registry, {name: endpoint})
    result = CliRunner().invoke(
        main,
        ["sink", "check", name, "--json"],
        env={
            "LEDGER_RUN_DIR": str(root),
            "LEDGER_SINKS_FILE": str(registry),
            "LEDGER_SINK_TIMEOUT_S": "1.0",
        },
    )
    assert result.output.strip(), result
    return result.exit_code, json.loads(result.output)


def test_the_postgres_adapter_keeps_its_claims_on_a_real_database(
    tmp_path: Path,
) -> None:
    from testbed.realsys.postgres import PostgresServer

    contract = PAYMENT_GATEWAY.model_copy(update={"key_retention_s": 604_800})
    with PostgresServer(database="sink_check") as db:
        endpoint = SinkEndpoint(url=db.dsn, contract=contract, adapter="postgres")
        code, report = _check_endpoint(tmp_path, endpoint)
    verdicts = _verdicts(report)
    assert code == 0, report
    for claim in ("commits", "ambiguity-is-reported", "idempotent", "key-reuse-refused"):
        assert verdicts[claim] == "holds", (claim, report)
    for claim in ("readback", "fencing", "postcondition", "relay-seams"):
        assert verdicts[claim] == "holds", (claim, report)


def test_the_smtp_adapter_claims_nothing_and_reports_every_lost_answer(tmp_path: Path) -> None:
    from ledger.contracts import EffectContract
    from testbed.realsys.smtp import SmtpServer

    server = SmtpServer(tmp_path).start()
    try:
        contract = EffectContract(consequence="reversible-external", amount_field=None)
        endpoint = SinkEndpoint(url=server.url, contract=contract, adapter="smtp")
        code, report = _check_endpoint(tmp_path, endpoint, "mailer")
    finally:
        server.stop()
    verdicts = _verdicts(report)
    assert code == 0, report
    assert verdicts["commits"] == "holds" and verdicts["ambiguity-is-reported"] == "holds"
    assert {verdicts[c] for c in ("idempotent", "readback", "fencing")} == {"untested"}
    # resumed at either seam, the relay holds the send as unknown and sends nothing again
    seams = next(c["detail"] for c in report["claims"] if c["claim"] == "relay-seams")
    assert verdicts["relay-seams"] == "holds" and seams.count("AMBIGUOUS after no request") == 2
    # every probe reached the server: one message each, none sent twice by the check
    counts = [server.store.count(m["operation_id"]) for m in server.store.messages()]
    assert counts and set(counts) == {1}


def test_the_idempotency_key_adapter_keeps_its_claims_on_a_real_api(tmp_path: Path) -> None:
    from ledger.contracts import EffectContract
    from testbed.realsys.keyed_api import KeyedApiServer

    api = KeyedApiServer(tmp_path).start()
    try:
        contract = EffectContract(
            idempotent=True, readback=True, postcondition=True, key_retention_s=86_400
        )
        endpoint = SinkEndpoint(
            url=api.url,
            contract=contract,
            token=api.token,
            adapter="http-idempotency-key",
            config={
                "submit": {"method": "POST", "path": "/refunds"},
                "readback_path": "/refunds/by-operation/{operation_id}",
                "postcondition_path": "/accounts/{subject}",
            },
        )
        code, report = _check_endpoint(tmp_path, endpoint)
    finally:
        api.stop()
    verdicts = _verdicts(report)
    assert code == 0, report
    for claim in ("commits", "ambiguity-is-reported", "idempotent", "key-reuse-refused"):
        assert verdicts[claim] == "holds", (claim, report)
    assert verdicts["readback"] == "holds" and verdicts["postcondition"] == "holds"
    assert verdicts["relay-seams"] == "holds", report
    assert verdicts["fencing"] == "untested"
