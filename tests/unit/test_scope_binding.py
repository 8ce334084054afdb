"""ledger.scope: an approval binds one exact operation unless a field is opened on purpose."""

from __future__ import annotations

from ledger.events import Approval
from ledger.scope import BINDABLE, open_fields, unbound


def _grant(**scope: str | None) -> Approval:
    return Approval(
        approval_id="a",
        reviewer="alice",
        policy_version=1,
        expires_at_ms=10,
        scope_subject="customer-1",
        scope_max_amount_minor=5,
        granted_at_ms=0,
        **{f"scope_{k}": v for k, v in scope.items()},  # type: ignore[arg-type]
    )


def test_every_field_must_be_bound_or_opened() -> None:
    assert unbound({}, ()) == list(BINDABLE)
    assert unbound({"operation-id": "op", "account": "a"}, ("action", "sink")) == ["currency"]


def test_a_parameter_digest_binds_the_parameters_action_and_sink_but_not_the_operation() -> None:
    assert unbound({"parameter-digest": "v2:" + "a" * 64}, ()) == ["operation-id"]
    assert unbound({"parameter-digest": "v2:" + "a" * 64, "operation-id": "op"}, ()) == []


def test_open_fields_of_a_record_are_those_it_does_not_bind() -> None:
    assert open_fields(_grant()) == list(BINDABLE)
    exact = _grant(operation_id="op", parameter_digest="v2:" + "b" * 64)
    assert open_fields(exact) == []
    assert open_fields(_grant(operation_id="op", action="refund", sink="p", currency="GBP")) == [
        "account"
    ]
