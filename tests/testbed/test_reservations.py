"""Reservations (try-confirm-cancel): the reference gateway's holds and the relay's decisions.

The gateway runs in this process (starlette's ``TestClient``, no socket) and
is reached through the real :class:`~sinks.client.SinkClient`, so the client's
protocol is exercised too. The relay's decisions are driven against that
gateway with the admission check replaced by a fixed answer (the check itself,
a pure function, is tested here as well): what matters is which calls the
relay makes and which receipts it records for each hold it meets.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

from consumers.relay import Relay
from ledger.authority import admission_withdrawn
from ledger.clock import ManualClock
from ledger.contracts import EffectContract
from ledger.events import Dispatch, EffectReceipt
from ledger.identity import parameter_digest
from ledger.settings import LedgerSettings
from sinks.client import SinkClient
from testbed.sinks.gateway import create_app
from tests import helpers
from tests.helpers import keyed

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

TOKEN = "reservation-test-token-0123456789"
OP = "book:case-1:v1"
PARAMS: dict[str, Any] = {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}
INPUTS: dict[str, Any] = {
    "action": "book_appointment",
    "subject": "customer-1",
    "purpose": "fee-remediation",
    "decision_version": 1,
}
BOOKINGS = EffectContract(
    idempotent=True,
    readback=True,
    fencing=True,
    key_retention_s=604800,
    reservation=True,
    reservation_hold_s=300,
    consequence="reversible-external",
)
DIGEST = parameter_digest(params=PARAMS, sink="bookings", version=2, **INPUTS)


class Sink:
    """A bookings gateway in this process, its ledger clock, and a client of it."""

    def __init__(self, tmp_path: Path, contract: EffectContract = BOOKINGS) -> None:
        self.clock = ManualClock(tmp_path / "clock")
        app = create_app(
            "bookings", contract, tmp_path / "bookings.sqlite", self.clock, token=TOKEN
        )
        self.test = TestClient(app, raise_server_exceptions=False)
        self.test.__enter__()

        def forward(request: httpx.Request) -> httpx.Response:
            answer = self.test.request(
                request.method,
                request.url.raw_path.decode(),
                content=request.content,
                headers=dict(request.headers),
            )
            return httpx.Response(answer.status_code, content=answer.content)

        self.client = SinkClient(
            "http://bookings", token=TOKEN, transport=httpx.MockTransport(forward)
        )

    def advance_s(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def reserve(self, token: int = 1) -> Any:
        return self.client.reserve(OP, DIGEST, PARAMS, token, "d1", **INPUTS)

    def effects(self) -> dict[str, int]:
        counts: dict[str, int] = self.test.get(
            "/admin/effects", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()["effects"]
        return counts

    def stats(self) -> dict[str, int]:
        stats: dict[str, int] = self.test.get(
            "/admin/stats", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        return stats

    def close(self) -> None:
        self.client.close()
        self.test.__exit__(None, None, None)


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Sink]:
    s = Sink(tmp_path)
    yield s
    s.close()


# --- the gateway --------------------------------------------------------------------------------


def test_a_hold_makes_no_effect_until_confirmed_and_confirming_twice_makes_one(sink: Sink) -> None:
    held = sink.reserve()
    assert held.status == "held" and held.expires_at_ms == 300_000
    assert sink.effects() == {}
    assert sink.client.read_hold(OP).status == "held"

    first = sink.client.confirm(OP, 1)
    again = sink.client.confirm(OP, 1)

    assert first.status == "confirmed" and first.effect_id is not None
    assert again.status == "confirmed" and again.effect_id == first.effect_id
    assert sink.effects() == {OP: 1}
    # The effect is readable back as any other (reconciliation relies on it).
    assert sink.client.readback(OP, 1).status == "committed"
    # Reserving a confirmed operation again answers the hold as it stands.
    assert sink.reserve().status == "confirmed"
    assert sink.effects() == {OP: 1}


def test_a_cancelled_hold_cannot_be_confirmed(sink: Sink) -> None:
    sink.reserve()
    cancelled = sink.client.cancel(OP, 1)
    assert cancelled.status == "released" and cancelled.released_why == "cancelled"

    late = sink.client.confirm(OP, 1)

    assert late.status == "released"
    assert sink.effects() == {}
    assert sink.stats()["reservations_released"] == 1


def test_a_confirmed_hold_cannot_be_cancelled(sink: Sink) -> None:
    sink.reserve()
    sink.client.confirm(OP, 1)
    assert sink.client.cancel(OP, 1).status == "confirmed"
    assert sink.effects() == {OP: 1}


def test_the_sink_releases_an_unconfirmed_hold_after_its_hold_time_on_the_ledger_clock(
    sink: Sink,
) -> None:
    sink.reserve()
    sink.advance_s(299)
    assert sink.client.read_hold(OP).status == "held"
    sink.advance_s(1)

    hold = sink.client.read_hold(OP)

    assert hold.status == "released" and hold.released_why == "expired"
    assert sink.client.confirm(OP, 1).status == "released"
    assert sink.effects() == {}
    # Reserved again under the same key: a new hold, counted.
    again = sink.reserve()
    assert again.status == "held" and again.reserves == 2
    assert sink.client.confirm(OP, 1).status == "confirmed"
    assert sink.effects() == {OP: 1}
    assert sink.stats()["reservations_released"] == 1


def test_a_hold_for_other_parameters_is_refused(sink: Sink) -> None:
    sink.reserve()
    other = {**PARAMS, "amount_minor": 9000}
    digest = parameter_digest(params=other, sink="bookings", version=2, **INPUTS)
    assert sink.client.reserve(OP, digest, other, 1, "d2", **INPUTS).status == "key_reused"


def test_a_stale_fencing_token_is_refused_on_confirm(sink: Sink) -> None:
    sink.reserve(token=2)
    assert sink.client.confirm(OP, 1).status == "stale_token"
    assert sink.effects() == {}


def test_a_sink_without_reservations_says_so(tmp_path: Path) -> None:
    s = Sink(tmp_path, EffectContract(idempotent=True, readback=True, consequence="irreversible"))
    try:
        assert s.client.read_hold(OP).status == "unsupported"
        assert s.reserve().status == "unsupported"
    finally:
        s.close()


def test_an_unknown_hold_is_absent(sink: Sink) -> None:
    assert sink.client.read_hold(OP).status == "absent"
    assert sink.client.confirm(OP, 1).status == "absent"


# --- the admission check ------------------------------------------------------------------------


def test_the_admission_stands_only_while_the_approval_is_not_revoked_and_the_policy_unchanged() -> (
    None
):
    granted = helpers.approval("ap-1", policy=1)
    revoked = granted.model_copy(update={"status": "REVOKED", "revoked_by": "reviewer-1"})

    assert admission_withdrawn("ap-1", granted, 1) is None
    assert "revoked by reviewer-1" in (admission_withdrawn("ap-1", revoked, 1) or "")
    assert "policy version changed" in (admission_withdrawn("ap-1", granted, 2) or "")
    assert "not in the approvals table" in (admission_withdrawn("ap-1", None, 1) or "")
    assert admission_withdrawn(None, None, 1) is not None


# --- the relay's decisions ----------------------------------------------------------------------


def dispatch() -> Dispatch:
    return Dispatch(
        dispatch_id=f"{OP}:1:exec:1",
        operation_id=OP,
        kind="EXECUTE",
        sink="bookings",
        action=INPUTS["action"],
        params_json='{"account": "acct-1", "amount_minor": 5000, "currency": "GBP"}',
        parameter_digest=DIGEST,
        fencing_token=1,
        state_version=2,
        approval_id="ap-1",
        subject=INPUTS["subject"],
        purpose=INPUTS["purpose"],
        decision_version=INPUTS["decision_version"],
    )


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    r = Relay(keyed(LedgerSettings(run_dir=tmp_path / "run")))
    yield r
    r.close()


def decide(
    relay: Relay, sink: Sink, *, fresh: bool, withdrawn: str | None = None
) -> list[EffectReceipt]:
    judged = Relay(relay.settings, withdrawn=lambda d: withdrawn)
    try:
        outputs = judged.dispatcher.deliver(
            dispatch(), sink.client, BOOKINGS, fresh=fresh, readback_on_resume=None, first=0, now=0
        )
    finally:
        judged.close()
    receipts = [event for topic, _, event in outputs if isinstance(event, EffectReceipt)]
    assert len(receipts) == len(outputs)
    return receipts


def test_a_fresh_dispatch_reserves_and_confirms_while_the_admission_stands(
    relay: Relay, sink: Sink
) -> None:
    (receipt,) = decide(relay, sink, fresh=True)
    assert receipt.status == "COMMITTED" and receipt.reservation == "CONFIRMED"
    assert receipt.effect_id is not None and not receipt.on_resume
    assert sink.effects() == {OP: 1}


def test_a_fresh_dispatch_whose_admission_was_withdrawn_cancels_its_hold(
    relay: Relay, sink: Sink
) -> None:
    (receipt,) = decide(relay, sink, fresh=True, withdrawn="approval ap-1 was revoked")
    assert receipt.status == "CANCELLED" and receipt.reservation == "CANCELLED"
    assert "revoked" in receipt.detail
    assert sink.client.read_hold(OP).status == "released"
    assert sink.effects() == {}


def test_a_resume_records_a_hold_already_confirmed_without_a_new_call(
    relay: Relay, sink: Sink
) -> None:
    sink.reserve()
    sink.client.confirm(OP, 1)

    (receipt,) = decide(relay, sink, fresh=False, withdrawn="approval ap-1 was revoked")

    # Confirmed is a fact: a later revocation does not undo it.
    assert receipt.status == "COMMITTED" and receipt.on_resume
    assert sink.effects() == {OP: 1}


def test_a_resume_meeting_a_held_hold_checks_the_admission_again(relay: Relay, sink: Sink) -> None:
    sink.reserve()
    (receipt,) = decide(relay, sink, fresh=False, withdrawn="policy version changed")
    assert receipt.status == "CANCELLED" and receipt.on_resume
    assert sink.effects() == {}


def test_a_resume_meeting_an_expired_hold_reserves_again_and_journals_the_expiry(
    relay: Relay, sink: Sink
) -> None:
    sink.reserve()
    sink.advance_s(301)

    expired, confirmed = decide(relay, sink, fresh=False)

    assert expired.status == "EXPIRED" and expired.reservation == "EXPIRED"
    assert confirmed.status == "COMMITTED" and confirmed.reservation == "CONFIRMED"
    assert sink.effects() == {OP: 1}
    assert sink.stats()["reservations"] == 2


def test_a_resume_meeting_an_expired_hold_does_not_reserve_without_authority(
    relay: Relay, sink: Sink
) -> None:
    sink.reserve()
    sink.advance_s(301)

    (receipt,) = decide(relay, sink, fresh=False, withdrawn="approval ap-1 was revoked")

    assert receipt.status == "CANCELLED" and "expired" in receipt.detail
    assert sink.stats()["reservations"] == 1
    assert sink.effects() == {}


def test_a_resume_whose_reserve_never_reached_the_sink_reserves_now(
    relay: Relay, sink: Sink
) -> None:
    (receipt,) = decide(relay, sink, fresh=False)
    assert receipt.status == "COMMITTED" and receipt.on_resume
    assert sink.effects() == {OP: 1}
