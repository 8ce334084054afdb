"""What a contract allows: the pure decisions of :mod:`ledger.contracts`, table-tested."""

from __future__ import annotations

import pytest

from ledger.contracts import (
    PAYMENT_GATEWAY,
    UNSAFE_SINK,
    EffectContract,
    Recovery,
    RecoveryAction,
    after_ambiguous_send,
    fencing_token_for,
    key_retained,
    marks_attempt_alone,
    readback_unsupported,
    sends_idempotency_key,
)

RETENTION_S = 60
FIRST_MS = 1_000_000
#: ``now_ms`` inside the key retention, and at or past its end.
INSIDE_MS = FIRST_MS + RETENTION_S * 1000 - 1
OUTSIDE_MS = FIRST_MS + RETENTION_S * 1000

HOLD_NEITHER = "the sink has neither readback nor idempotency"
HOLD_EXPIRED = (
    f"the sink's key retention ({RETENTION_S} s) has passed since the first attempt at "
    f"{FIRST_MS} ms"
)


def contract(*, idempotent: bool, readback: bool) -> EffectContract:
    return EffectContract(idempotent=idempotent, readback=readback, key_retention_s=RETENTION_S)


# (idempotent, readback, now_ms) -> (action, HOLD_UNKNOWN reason or None)
AFTER_AMBIGUOUS = [
    (False, False, INSIDE_MS, Recovery.HOLD_UNKNOWN, HOLD_NEITHER),
    (False, False, OUTSIDE_MS, Recovery.HOLD_UNKNOWN, HOLD_NEITHER),
    (True, False, INSIDE_MS, Recovery.RESUBMIT_SAME_KEY, None),
    (True, False, OUTSIDE_MS, Recovery.HOLD_UNKNOWN, HOLD_EXPIRED),
    (False, True, INSIDE_MS, Recovery.READ_BACK, None),
    (False, True, OUTSIDE_MS, Recovery.READ_BACK, None),
    (True, True, INSIDE_MS, Recovery.READ_BACK, None),
    (True, True, OUTSIDE_MS, Recovery.READ_BACK, None),
]


@pytest.mark.parametrize(("idempotent", "readback", "now_ms", "action", "reason"), AFTER_AMBIGUOUS)
def test_after_ambiguous_send(
    idempotent: bool, readback: bool, now_ms: int, action: Recovery, reason: str | None
) -> None:
    decision = after_ambiguous_send(
        contract(idempotent=idempotent, readback=readback), first_seen_ms=FIRST_MS, now_ms=now_ms
    )
    assert isinstance(decision, RecoveryAction)
    assert decision.action is action
    assert decision.reason  # every decision says why
    if reason is not None:
        assert decision.reason == reason


def test_readback_wins_over_a_retained_key_and_no_retention_means_no_key() -> None:
    assert (
        after_ambiguous_send(PAYMENT_GATEWAY, first_seen_ms=0, now_ms=0).action
        is Recovery.READ_BACK
    )
    assert after_ambiguous_send(UNSAFE_SINK, first_seen_ms=0, now_ms=0) == RecoveryAction(
        Recovery.HOLD_UNKNOWN, HOLD_NEITHER
    )
    no_retention = EffectContract(idempotent=True, key_retention_s=0)
    assert after_ambiguous_send(no_retention, first_seen_ms=5, now_ms=5) == RecoveryAction(
        Recovery.HOLD_UNKNOWN,
        "the sink's key retention (0 s) has passed since the first attempt at 5 ms",
    )


@pytest.mark.parametrize(
    ("idempotent", "now_ms", "retained"),
    [
        (True, FIRST_MS, True),
        (True, INSIDE_MS, True),
        (True, OUTSIDE_MS, False),
        (False, FIRST_MS, False),
        (False, INSIDE_MS, False),
    ],
)
def test_key_retained(idempotent: bool, now_ms: int, retained: bool) -> None:
    c = contract(idempotent=idempotent, readback=False)
    assert key_retained(c, first_seen_ms=FIRST_MS, now_ms=now_ms) is retained


@pytest.mark.parametrize(
    ("idempotent", "readback", "alone", "unsupported"),
    [
        (False, False, True, "the sink offers no readback"),
        (True, False, True, "the sink offers no readback"),
        (False, True, False, None),
        (True, True, False, None),
    ],
)
def test_readback_decides_marking_and_readback_requests(
    idempotent: bool, readback: bool, alone: bool, unsupported: str | None
) -> None:
    c = contract(idempotent=idempotent, readback=readback)
    assert marks_attempt_alone(c) is alone
    assert readback_unsupported(c) == unsupported


@pytest.mark.parametrize(
    ("idempotent", "fresh", "sends"),
    [(True, False, True), (True, True, False), (False, False, False), (False, True, False)],
)
def test_sends_idempotency_key(idempotent: bool, fresh: bool, sends: bool) -> None:
    c = EffectContract(idempotent=idempotent)
    assert sends_idempotency_key(c, fresh_attempt_identity=fresh) is sends


def test_fencing_token_only_for_a_fencing_sink() -> None:
    assert fencing_token_for(PAYMENT_GATEWAY, 7) == 7
    assert fencing_token_for(PAYMENT_GATEWAY.model_copy(update={"fencing": False}), 7) is None
    assert fencing_token_for(UNSAFE_SINK, 7) is None
