"""producers.review: a review system's grant is bound to the operation it approves.

Issue 28: an approval made the documented way (subject, cap, currency, action,
sink; no account, no operation ID) admitted a service's own operation naming
``acct-attacker``. A grant made for an intent admits that intent and refuses
the same request redirected to another account or made under another ID.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.authority import evaluate
from ledger.credentials import person_key, person_key_path
from ledger.errors import LedgerError, LocalFileError
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, verify
from producers.review import ScopeNotBoundError, grant, grant_for
from tests import helpers

KEY = ReviewerKey.generate("alice")
TRUSTED = {KEY.key_id: KEY.private.public_key()}


def _admits(approval: object, request: object) -> tuple[bool, str]:
    result = evaluate(
        approval,  # type: ignore[arg-type]
        request,  # type: ignore[arg-type]
        now_ms=1000,
        policy_version=1,
        decided_by="k",
        trusted=TRUSTED,
        amount_field="amount_minor",
    )
    return result.decision.admitted, result.decision.reason


def _grant_for(intent: object) -> object:
    return grant_for(
        KEY,
        intent,  # type: ignore[arg-type]
        approval_id="ap-1",
        expires_at_ms=10_000,
        granted_at_ms=0,
        policy_version=1,
        ledger_id="ledger",
    )


def test_a_grant_for_an_intent_admits_it_and_nothing_redirected() -> None:
    intent = helpers.intent("refund:c1:v1", 5000, "ap-1", "customer-1")
    approval = _grant_for(intent)
    assert verify(approval, TRUSTED, "ledger") is None  # type: ignore[arg-type]
    assert _admits(approval, helpers.admission_request())[0]
    redirected = helpers.admission_request(account="acct-attacker")
    assert _admits(approval, redirected) == (
        False,
        "out of scope: account acct-attacker, approved acct-1",
    )
    other_id = helpers.admission_request(op="refund:c1:v9")
    assert _admits(approval, other_id) == (False, "approval is bound to another operation")


def test_a_grant_by_hand_is_refused_until_every_field_is_bound_or_opened() -> None:
    base = dict(
        approval_id="ap-2",
        subject="customer-1",
        max_amount_minor=5000,
        expires_at_ms=10_000,
        granted_at_ms=0,
        policy_version=1,
        ledger_id="ledger",
        currency="GBP",
        action="refund",
        sink="payments",
    )
    with pytest.raises(ScopeNotBoundError, match="any operation-id, account"):
        grant(KEY, **base)  # type: ignore[arg-type]
    with pytest.raises(ScopeNotBoundError, match="both bound and opened"):
        grant(KEY, **base, account="acct-1", opened=["account"])  # type: ignore[arg-type]
    with pytest.raises(ScopeNotBoundError, match="cannot open colour"):
        grant(KEY, **base, opened=["colour"])  # type: ignore[arg-type]
    standing = grant(KEY, **base, opened=["operation-id", "account"])  # type: ignore[arg-type]
    assert standing.scope_account is None and standing.reviewer == "alice"


def test_a_reviewer_key_missing_from_this_folder_says_where_the_folder_comes_from(
    tmp_path: Path,
) -> None:
    """Tried as a new user would: a review system run from the agent's own folder looked for
    the key there and was told to make a new key, though it existed in the ledger's folder."""
    settings = LedgerSettings(run_dir=tmp_path / "agent")
    with pytest.raises(LocalFileError) as loaded:
        ReviewerKey.from_file(person_key_path(settings, "reviewer", "alice"))
    assert "LEDGER_HOME / LEDGER_RUN_DIR" in loaded.value.message
    assert "remove it" not in loaded.value.message  # nothing there to remove
    with pytest.raises(LedgerError) as asked:
        person_key(settings, "reviewer", "alice")
    assert "LEDGER_HOME / LEDGER_RUN_DIR" in asked.value.message
    assert "`ledger reviewer add alice`" in asked.value.message
