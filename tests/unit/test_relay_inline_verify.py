"""The relay reads the postcondition right after a committed effect (consumers.relay).

Where the contract offers a postcondition query and ``relay_inline_verify``
is on, a ``COMMITTED`` receipt takes the query's verdict; anything else (no
query, setting off, no verdict, a failed query, another receipt status)
leaves the receipt as it was, so the processor verifies by a ``VERIFY``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from consumers.relay import Output, Relay
from ledger.contracts import PAYMENT_GATEWAY, EffectContract, PostconditionQuery
from ledger.errors import SinkProtocolError
from ledger.events import Dispatch, EffectReceipt
from ledger.settings import LedgerSettings
from sinks.client import AccountCredits, Credit
from tests.helpers import keyed

OP = "refund:1:v1"
D = Dispatch(
    dispatch_id=f"{OP}#1.1",
    operation_id=OP,
    kind="EXECUTE",
    sink="payments",
    action="refund",
    params_json='{"account":"acct-1","amount_minor":500}',
    parameter_digest="0" * 64,
    fencing_token=1,
    state_version=2,
)


def _receipt(status: str = "COMMITTED") -> Output:
    return (
        "receipts",
        OP,
        EffectReceipt(
            operation_id=OP,
            dispatch_id=D.dispatch_id,
            status=status,  # type: ignore[arg-type]
            sink="payments",
            attempt_id=D.dispatch_id,
            fencing_token=1,
            effect_id="e-1",
            observed_at_ms=10,
            first_attempt_at_ms=10,
            detail="committed",
            observer="relay-0",
        ),
    )


class Sink:
    """A sink client whose postcondition query answers ``answer`` (or raises it)."""

    def __init__(self, answer: AccountCredits | Exception) -> None:
        self.answer = answer
        self.asked: list[tuple[Any, str]] = []

    def postcondition(self, query: PostconditionQuery, subject: str) -> AccountCredits:
        self.asked.append((query, subject))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _credits(*amounts: int) -> AccountCredits:
    return AccountCredits(
        status="observed",
        account="acct-1",
        credited_minor=sum(amounts),
        credits=tuple(Credit(OP, a, f"e-{n}") for n, a in enumerate(amounts)),
    )


def _relay(tmp_path: Path, **settings: Any) -> Relay:
    return Relay(keyed(LedgerSettings(run_dir=tmp_path, **settings)))


@pytest.mark.parametrize("amounts, verdict", [((500,), "MATCH"), ((500, 500), "MISMATCH")])
def test_a_committed_receipt_takes_the_verdict(
    tmp_path: Path, amounts: tuple[int, ...], verdict: str
) -> None:
    sink = Sink(_credits(*amounts))
    topic, key, event = _relay(tmp_path).dispatcher.postconditions.read_at_once(
        D,
        sink,  # type: ignore[arg-type]
        PAYMENT_GATEWAY,
        _receipt(),
    )
    assert (topic, key) == ("receipts", OP) and isinstance(event, EffectReceipt)
    assert event.status == "COMMITTED" and event.postcondition_status == verdict
    assert event.postcondition_source == "payments GET /accounts/acct-1"
    assert event.postcondition_detail and event.postcondition_observed_at_ms is not None
    assert sink.asked and sink.asked[0][1] == "acct-1"


@pytest.mark.parametrize(
    "why, settings, contract, answer, status",
    [
        (
            "setting off",
            {"relay_inline_verify": False},
            PAYMENT_GATEWAY,
            _credits(500),
            "COMMITTED",
        ),
        ("no query offered", {}, EffectContract(), _credits(500), "COMMITTED"),
        ("not committed", {}, PAYMENT_GATEWAY, _credits(500), "AMBIGUOUS"),
        (
            "no verdict",
            {},
            PAYMENT_GATEWAY,
            AccountCredits(status="ambiguous", account="acct-1", detail="timed out"),
            "COMMITTED",
        ),
        (
            "not reached",
            {},
            PAYMENT_GATEWAY,
            AccountCredits(status="ambiguous", account="acct-1", sent=False),
            "COMMITTED",
        ),
        (
            "protocol error",
            {},
            PAYMENT_GATEWAY,
            SinkProtocolError("GET", "/accounts/acct-1", 500, "boom"),
            "COMMITTED",
        ),
    ],
)
def test_otherwise_the_receipt_is_left_for_a_verify(
    tmp_path: Path,
    why: str,
    settings: dict[str, Any],
    contract: EffectContract,
    answer: AccountCredits | Exception,
    status: str,
) -> None:
    outcome = _receipt(status)
    got = _relay(tmp_path, **settings).dispatcher.postconditions.read_at_once(
        D,
        Sink(answer),  # type: ignore[arg-type]
        contract,
        outcome,
    )
    assert got == outcome, why
