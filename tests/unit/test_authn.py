"""Record seals: who may write what, and what a forger cannot do (no broker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.authn import (
    AUTH_HEADER,
    ROLE_AUTHORITY,
    ROLE_OPERATOR,
    ROLE_REVIEWER,
    Keyring,
    MacKey,
    Seal,
    SigningKey,
    keyring_of,
    sealed_message,
)
from ledger.credentials import (
    Credentials,
    MissingKeyError,
    add_person,
    authority_key,
    deployment_key,
    load_keyring,
    provision_keys,
    stage_sealer,
)
from ledger.errors import LedgerError, LocalFileError
from ledger.events import Approval, Disposition, PolicyChange
from ledger.rolekeys import role_key
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey

MAC = MacKey(b"k" * 32)
OTHER_MAC = MacKey(b"x" * 32)
KERNEL = SigningKey("authority-kernel", ReviewerKey.generate("a").private, ROLE_AUTHORITY)
ALEX = SigningKey("alex", ReviewerKey.generate("alex").private, ROLE_OPERATOR)
SAM = SigningKey("sam", ReviewerKey.generate("sam").private, ROLE_OPERATOR)
REVIEWER = ReviewerKey.generate("rev-1")
RING = keyring_of([MAC], [KERNEL, ALEX, SAM])
RING.add_public("rev-1", ROLE_REVIEWER, REVIEWER.private.public_key())


def headers(sealer: MacKey | SigningKey, topic: str, key: bytes, value: bytes | None) -> list:
    return [(AUTH_HEADER, sealer.seal(topic, key, value))]


def test_a_stage_seal_holds_only_for_its_topic_key_and_value() -> None:
    h = headers(MAC, "dispatches", b"op-1", b"value")
    assert RING.check("dispatches", b"op-1", b"value", h) is None
    assert "does not match" in (RING.check("dispatches", b"op-1", b"valuE", h) or "")
    assert "does not match" in (RING.check("dispatches", b"op-2", b"value", h) or "")
    assert "does not match" in (RING.check("receipts", b"op-1", b"value", h) or "")
    # A tombstone's seal is not a seal of an empty value, nor the reverse.
    assert sealed_message("state", b"k", None) != sealed_message("state", b"k", b"")
    assert "does not match" in (
        RING.check("state", b"k", None, headers(MAC, "state", b"k", b"")) or ""
    )


def test_records_without_or_with_a_foreign_seal_are_refused() -> None:
    assert RING.check("readbacks", b"op", b"v", None) == f"no {AUTH_HEADER} header"
    assert "malformed" in (RING.check("readbacks", b"op", b"v", [(AUTH_HEADER, b"junk")]) or "")
    forged = headers(OTHER_MAC, "readbacks", b"op", b"v")
    assert "unknown key" in (RING.check("readbacks", b"op", b"v", forged) or "")
    # A forger who reuses the real key ID with another secret is caught by the MAC.
    spoof = Seal.parse(forged[0][1])
    same_id = [(AUTH_HEADER, Seal("hmac-sha256", MAC.key_id, spoof.tag).encode())]
    assert "does not match" in (RING.check("readbacks", b"op", b"v", same_id) or "")


def test_intents_are_not_sealed_and_the_kernels_topics_take_only_its_key() -> None:
    assert RING.check("intents", b"op", b"v", None) is None
    by_stage = headers(MAC, "admissions", b"op", b"v")
    assert "stage key" in (RING.check("admissions", b"op", b"v", by_stage) or "")
    by_operator = headers(ALEX, "approval-uses", b"ap", b"v")
    assert "trusted as operator" in (RING.check("approval-uses", b"ap", b"v", by_operator) or "")
    assert RING.check("admissions", b"op", b"v", headers(KERNEL, "admissions", b"op", b"v")) is None


def test_an_operator_signs_only_in_their_own_name() -> None:
    change = PolicyChange(version=2, set_by="alex", effective_at_ms=0)
    value = change.to_bytes()
    assert (
        RING.check("policy", b"current", value, headers(ALEX, "policy", b"current", value), change)
        is None
    )
    as_sam = headers(SAM, "policy", b"current", value)
    reason = RING.check("policy", b"current", value, as_sam, change) or ""
    assert "names 'alex'" in reason and "'sam'" in reason
    disposition = Disposition(
        disposition_id="d",
        operation_id="op",
        decision="ABSENT",
        by="alex",
        evidence="e",
        disposed_at_ms=0,
    )
    raw = disposition.to_bytes()
    by_stage = headers(MAC, "dispositions", b"op", raw)
    assert "stage key" in (RING.check("dispositions", b"op", raw, by_stage, disposition) or "")


def _grant(**kw: object) -> Approval:
    return Approval(
        approval_id="ap-1",
        reviewer="rev-1",
        policy_version=1,
        expires_at_ms=10,
        scope_subject="c",
        scope_max_amount_minor=5,
        granted_at_ms=0,
        **kw,  # type: ignore[arg-type]
    )


def test_a_grant_is_authenticated_by_its_signature_and_a_revocation_by_a_seal() -> None:
    grant = REVIEWER.sign(_grant(), ledger_id="ledger")
    assert RING.check("approvals", b"ap-1", grant.to_bytes(), None, grant) is None
    assert RING.check("approvals", b"ap-1", b"", None, _grant()) == "approval is not signed"
    tampered = grant.model_copy(update={"scope_max_amount_minor": 999_999})
    assert "invalid" in (RING.check("approvals", b"ap-1", b"", None, tampered) or "")
    revoked = grant.model_copy(update={"status": "REVOKED", "revoked_by": "alex"})
    raw = revoked.to_bytes()
    assert "no ledger-auth" in (RING.check("approvals", b"ap-1", raw, None, revoked) or "")
    sealed = headers(ALEX, "approvals", b"ap-1", raw)
    assert RING.check("approvals", b"ap-1", raw, sealed, revoked) is None


def test_a_key_added_while_running_is_found_by_reloading() -> None:
    late = SigningKey("late", ReviewerKey.generate("late").private, ROLE_OPERATOR)
    fresh = keyring_of([MAC], [late])
    ring = Keyring(dict(RING.macs), dict(RING.trusted), reload=lambda: fresh)
    change = PolicyChange(version=3, set_by="late", effective_at_ms=0)
    raw = change.to_bytes()
    assert (
        ring.check("policy", b"current", raw, headers(late, "policy", b"current", raw), change)
        is None
    )


def _settings(tmp_path: Path, **fields: object) -> LedgerSettings:
    """Settings of a ledger whose keys are provisioned (as `ledger keys init` does)."""
    settings = LedgerSettings(run_dir=tmp_path / "run", trusted_keys_file=None, **fields)
    provision_keys(settings)
    return settings


def test_key_files_are_made_once_and_read_back(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    again = provision_keys(settings)
    assert again.created == ()  # keys that exist are kept
    first, second = role_key(settings, "relay"), role_key(settings, "relay")
    assert first.key_id == second.key_id == again.role_key_ids["relay"]
    assert (settings.run_dir / "keys" / "relay.key").stat().st_mode & 0o777 == 0o600
    assert not (settings.run_dir / "keys" / "deployment.key").exists()  # only a legacy verifier
    kernel = authority_key(settings)
    ring = load_keyring(settings)
    raw = b"decision"
    sealed = headers(kernel, "admissions", b"op", raw)
    assert ring.check("admissions", b"op", raw, sealed) is None
    stage = stage_sealer(settings, "relay")
    assert stage("receipts").key_id == first.key_id
    with pytest.raises(LedgerError, match="only the authority kernel"):
        stage("admissions")


def test_corrupted_or_missing_key_files_name_the_file_and_the_remedy(tmp_path: Path) -> None:
    bare = LedgerSettings(run_dir=tmp_path / "bare")
    with pytest.raises(MissingKeyError, match="ledger keys init"):
        deployment_key(bare)
    settings = _settings(tmp_path)
    path = settings.run_dir / "keys" / "deployment.key"  # an earlier release's, kept to verify
    path.write_text("{not json")
    with pytest.raises(LocalFileError, match=str(path)):
        deployment_key(settings)
    path.write_text(json.dumps({"secret": "c2hvcnQ="}))
    with pytest.raises(LocalFileError, match="shorter than 16 bytes"):
        deployment_key(settings)


def test_a_publisher_signs_as_the_person_a_record_names(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    add_person(settings, ROLE_OPERATOR, "alex")
    creds = Credentials(settings)
    change = PolicyChange(version=2, set_by="alex", effective_at_ms=0)
    sealer = creds.sealer_for("policy", change)
    assert isinstance(sealer, SigningKey) and sealer.key_id == "alex"
    ring = load_keyring(settings)
    raw = change.to_bytes()
    assert (
        ring.check("policy", b"current", raw, headers(sealer, "policy", b"current", raw), change)
        is None
    )
    with pytest.raises(LedgerError, match="ledger operator add kim"):
        creds.sealer_for("policy", PolicyChange(version=2, set_by="kim", effective_at_ms=0))
    with pytest.raises(LedgerError, match="only the authority kernel"):
        creds.sealer_for("admissions", None)
    assert creds.sealer_for("intents", None) is None
    claims = creds.sealer_for("claims", None)
    assert claims is not None and claims.key_id == role_key(settings, "resumer").key_id
    with pytest.raises(LedgerError, match="already trusted as operator"):
        add_person(settings, ROLE_REVIEWER, "alex")


def test_a_reviewer_trusted_just_after_the_keys_were_loaded_is_found_at_once(
    tmp_path: Path,
) -> None:
    """A stage loads its keys at start; a reviewer added a moment later signs a grant that
    arrives within the second: the changed trusted-keys file is read again at once (a
    game day refused such grants as unknown, and the approvals were never admitted)."""
    from ledger.signing import trust

    settings = _settings(tmp_path)
    ring = load_keyring(settings)
    late = ReviewerKey.generate("late-reviewer")
    trust(settings.trusted_keys_path(), late)
    grant = late.sign(_grant(), ledger_id=settings.ledger_identity)
    assert ring.check("approvals", b"ap-1", grant.to_bytes(), None, grant) is None
    # A key no file has is still refused, and asking again at once reads nothing new.
    stranger = ReviewerKey.generate("stranger").sign(_grant(), ledger_id=settings.ledger_identity)
    assert "unknown key" in (ring.check("approvals", b"ap-1", b"", None, stranger) or "")


def test_a_sealed_record_on_a_partition_its_key_does_not_name_is_refused() -> None:
    """The seal does not cover the partition; the key names it (murmur2_random)."""
    from dataclasses import replace

    from ledger.topology import partition_for

    ring = replace(RING, partitions=3)
    home = partition_for(b"op-1", 3)
    elsewhere = (home + 1) % 3
    sealed = headers(MAC, "dispatches", b"op-1", b"value")
    assert ring.check("dispatches", b"op-1", b"value", sealed, None, home) is None
    problem = ring.check("dispatches", b"op-1", b"value", sealed, None, elsewhere) or ""
    assert problem.startswith(f"misplaced: its key belongs on partition {home} of 3"), problem
    # Intents carry no seal, but their placement is checked all the same.
    assert ring.check("intents", b"op-1", b"v", None, None, home) is None
    assert "misplaced" in (ring.check("intents", b"op-1", b"v", None, None, elsewhere) or "")
    # The control topic has one partition; a ring without a count checks nothing.
    policy = headers(ALEX, "policy", b"current", b"v")
    assert "misplaced" not in (ring.check("policy", b"current", b"v", policy, None, 0) or "")
    assert RING.check("dispatches", b"op-1", b"value", sealed, None, elsewhere) is None


def test_a_loaded_keyring_checks_placement_over_the_ledgers_partitions(tmp_path: Path) -> None:
    settings = _settings(tmp_path, partitions=4)
    assert load_keyring(settings).partitions == 4
