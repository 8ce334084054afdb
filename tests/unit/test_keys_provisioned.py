"""Keys are provisioned, never invented; seals name their ledger; doubt is not absence.

Issue: lost keys failed open (stages made new keys, a consumed approval paid
again), a stage started without keys invented them, and records carried no
ledger identity, so one ledger's evidence was accepted by another.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ledger.logs
from consumers.metrics import StageMetrics
from ledger.authn import (
    ROLE_AUTHORITY,
    MacKey,
    SigningKey,
    authority_key_id,
    keyring_of,
    seal_headers,
    sealed_message,
    unverifiable,
)
from ledger.authority import REASON_UNVERIFIABLE, evaluate
from ledger.cli import main
from ledger.credentials import (
    KeysOfAnotherLedgerError,
    MissingKeyError,
    authority_key,
    bound_ledgers,
    deployment_key,
    keys_dir,
    load_keyring,
    provision_keys,
)
from ledger.rolekeys import role_key
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey
from tests import helpers

MAC = MacKey(b"k" * 32, ledger_id="ledger-a")


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []


# ------------------------------------------------------------ ledger identity


def test_a_seal_names_its_ledger_and_another_ledger_refuses_it() -> None:
    raw = b"value"
    headers = seal_headers(MAC, "receipts", b"op", raw)
    mine = keyring_of([MAC], ledger_id="ledger-a")
    other = keyring_of([MacKey(b"k" * 32, ledger_id="ledger-b")], ledger_id="ledger-b")
    assert mine.check("receipts", b"op", raw, headers) is None
    problem = other.check("receipts", b"op", raw, headers)
    assert problem is not None and "does not match" in problem
    assert not unverifiable(problem)  # same key, other ledger: not authentic there
    assert sealed_message("receipts", b"op", raw, "a") != sealed_message(
        "receipts", b"op", raw, "b"
    )


def test_a_grant_signed_for_one_ledger_does_not_verify_in_another() -> None:
    key = ReviewerKey.generate("rev")
    grant = key.sign(helpers.approval(), ledger_id="ledger-a")
    trusted = {"rev": key.private.public_key()}
    req = helpers.admission_request()
    here = evaluate(grant, req, now_ms=1, policy_version=1, decided_by="k", trusted=trusted,
                    ledger_id="ledger-a")  # fmt: skip
    there = evaluate(grant, req, now_ms=1, policy_version=1, decided_by="k", trusted=trusted,
                     ledger_id="ledger-b")  # fmt: skip
    assert here.decision.admitted and not there.decision.admitted
    assert "another ledger" in there.decision.reason


def test_a_seal_by_a_key_not_held_is_unverifiable_not_forged() -> None:
    ring = keyring_of([MAC], ledger_id="ledger-a")
    stranger = MacKey(b"s" * 32, ledger_id="ledger-a")
    raw = b"value"
    unknown = ring.check("receipts", b"op", raw, seal_headers(stranger, "receipts", b"op", raw))
    forged = ring.check("receipts", b"op", b"other", seal_headers(MAC, "receipts", b"op", raw))
    assert unverifiable(unknown), unknown
    assert forged is not None and not unverifiable(forged)
    assert not unverifiable(None)


def test_unverifiable_evidence_holds_the_approval_whatever_else_holds() -> None:
    key = ReviewerKey.generate("rev")
    grant = key.sign(helpers.approval(), ledger_id="ledger")
    trusted = {"rev": key.private.public_key()}
    doubt = "approval-uses:0:7 sealed by unknown key authority-kernel-0123456789ab"
    result = evaluate(grant, helpers.admission_request(), now_ms=1, policy_version=1,
                      decided_by="k", trusted=trusted, unverifiable=doubt)  # fmt: skip
    assert not result.decision.admitted and result.use is None
    assert (
        result.decision.reason.startswith(REASON_UNVERIFIABLE) and doubt in result.decision.reason
    )


# ------------------------------------------------------------ provisioning


def test_no_loader_creates_a_key_and_the_error_names_key_folder_and_command(
    tmp_path: Path,
) -> None:
    settings = LedgerSettings(run_dir=tmp_path / "run")
    for load in (deployment_key, authority_key, load_keyring, partial(role_key, role="relay")):
        with pytest.raises(MissingKeyError) as caught:
            load(settings)  # type: ignore[operator]
        message = str(caught.value)
        assert str(keys_dir(settings)) in message and "ledger keys init" in message
    assert _files(tmp_path) == []


def test_provisioned_keys_are_bound_to_their_ledger_and_kept(tmp_path: Path) -> None:
    a = LedgerSettings(run_dir=tmp_path / "run", topic_prefix="a")
    made = provision_keys(a)
    roles = {f"{role}.key" for role in ("processor", "relay", "reconciler", "resumer")}
    assert set(made.created) == {
        "ledgers.json",
        "stage-keys.json",
        "authority.key",
        "outcome.key",
        *roles,
    }
    assert provision_keys(a).created == ()  # kept
    assert bound_ledgers(a) == ["a"]
    kernel = authority_key(a)
    public = kernel.private.public_key().public_bytes_raw()
    assert kernel.key_id == authority_key_id(public) == made.authority_key_id
    assert kernel.key_id.startswith("authority-kernel-")
    # Another ledger in the same folder is refused unless shared on purpose.
    b = a.model_copy(update={"topic_prefix": "b"})
    for load in (partial(role_key, role="processor"), load_keyring):
        with pytest.raises(KeysOfAnotherLedgerError, match="ledger keys init --share"):
            load(b)  # type: ignore[operator]
    with pytest.raises(KeysOfAnotherLedgerError):
        provision_keys(b)
    provision_keys(b, share=True)
    assert bound_ledgers(b) == ["a", "b"] and role_key(b, "processor").ledger_id == "b"
    # LEDGER_ID keeps a ledger's identity under another prefix.
    moved = a.model_copy(update={"topic_prefix": "a2", "id": "a"})
    assert role_key(moved, "processor").ledger_id == "a"


def test_a_host_holding_only_the_kernels_public_key_makes_no_kernel_key(tmp_path: Path) -> None:
    kernel_host = LedgerSettings(run_dir=tmp_path / "kernel")
    provision_keys(kernel_host)
    stage_host = LedgerSettings(run_dir=tmp_path / "stage")
    folder = keys_dir(stage_host)
    folder.mkdir(parents=True)
    for name in ("authority.pub", "ledgers.json"):
        (folder / name).write_text((keys_dir(kernel_host) / name).read_text())
    made = provision_keys(stage_host)
    assert "authority.key" not in made.created and not (folder / "authority.key").exists()
    assert made.authority_key_id == authority_key(kernel_host).key_id


def test_keys_that_vanish_while_a_stage_runs_are_not_replaced(tmp_path: Path) -> None:
    settings = LedgerSettings(run_dir=tmp_path / "run")
    provision_keys(settings)
    ring = load_keyring(settings)
    before = dict(ring.trusted)
    for path in keys_dir(settings).iterdir():
        path.unlink()
    stranger = MacKey(b"s" * 32, ledger_id="ledger")
    problem = ring.check("receipts", b"op", b"v", seal_headers(stranger, "receipts", b"op", b"v"))
    assert unverifiable(problem)
    assert ring.trusted == before and before  # the keys already loaded stay
    assert list(keys_dir(settings).iterdir()) == []  # and nothing was made


def test_keys_of_an_earlier_release_are_bound_by_keys_init_not_by_a_stage(tmp_path: Path) -> None:
    settings = LedgerSettings(run_dir=tmp_path / "run")
    provision_keys(settings)
    (keys_dir(settings) / "ledgers.json").unlink()
    with pytest.raises(KeysOfAnotherLedgerError, match="ledger keys init"):
        role_key(settings, "relay")
    assert provision_keys(settings).created == ("ledgers.json",)
    role_key(settings, "relay")


# ------------------------------------------------------------ commands


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """``ledger`` with a run folder of its own and the broker's record counts replaced."""
    import ledger.topics

    seen: dict[str, Any] = {"non_empty": []}
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", "lost")
    monkeypatch.setattr(
        ledger.topics, "non_empty_topics", lambda settings, names=None: list(seen["non_empty"])
    )
    return seen


@pytest.mark.parametrize("component", ["processor", "authority", "relay"])
def test_a_stage_without_keys_refuses_to_start_and_creates_none(
    env: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, component: str
) -> None:
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", "127.0.0.1:1")  # nothing listens there
    # The stage command names its stage in every log line of the process: keep that here.
    monkeypatch.setattr(ledger.logs, "_process", dict(ledger.logs._process))
    result = CliRunner().invoke(main, [component, "--instance", "0"])
    assert result.exit_code == 1, result.output
    assert "stage-keys.json" in result.output and "ledger keys init" in result.output
    assert not (tmp_path / "run" / "keys").exists()


def test_keys_init_refuses_over_existing_evidence(env: dict[str, Any], tmp_path: Path) -> None:
    env["non_empty"] = ["state", "journal"]
    result = CliRunner().invoke(main, ["keys", "init"])
    assert result.exit_code == 1, result.output
    assert "already holds sealed records (state, journal)" in result.output
    assert "Restore the keys folder" in result.output
    assert not (tmp_path / "run" / "keys").exists()


def test_keys_init_provisions_a_new_ledger_once(env: dict[str, Any], tmp_path: Path) -> None:
    first = CliRunner().invoke(main, ["keys", "init"])
    assert first.exit_code == 0, first.output
    assert "created ledgers.json, processor.key, relay.key" in first.output
    env["non_empty"] = ["state"]  # the ledger has records now: keys that exist are kept
    again = CliRunner().invoke(main, ["keys", "init"])
    assert again.exit_code == 0 and "was there already" in again.output
    folder = tmp_path / "run" / "keys"
    assert json.loads((folder / "ledgers.json").read_text()) == {"ledgers": ["lost"]}
    assert (folder / "relay.key").stat().st_mode & 0o777 == 0o600


# ------------------------------------------------------------ health


def test_a_stage_holding_unverifiable_evidence_is_not_ready_and_says_why() -> None:
    held: dict[str, str] = {}
    metrics = StageMetrics("authority", "0", ready=lambda: True, held=lambda: held)
    assert metrics.readiness()[0]
    held["ap-1"] = "approval-uses:0:3 sealed by unknown key authority-kernel-0123456789ab"
    ok, body = metrics.readiness()
    assert not ok and body["unverifiable_held"] == 1 and "ap-1" in body["unverifiable"]
    assert "restore the keys folder" in body["state"]
    metrics.beat()
    alive, said = metrics.liveness()
    assert alive and said["unverifiable_held"] == 1
    scraped = b"".join(
        metrics.app()({"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET"}, lambda *a: None)
    )
    assert b'ledger_unverifiable_held{stage="authority"} 1.0' in scraped


def test_signing_keys_seal_for_their_ledger() -> None:
    kernel = SigningKey("k", ReviewerKey.generate("k").private, ROLE_AUTHORITY, "ledger-a")
    ring = keyring_of(signers=[kernel], ledger_id="ledger-a")
    raw = b"decision"
    assert (
        ring.check("admissions", b"op", raw, seal_headers(kernel, "admissions", b"op", raw)) is None
    )
    elsewhere = keyring_of(signers=[kernel], ledger_id="ledger-b")
    assert elsewhere.check("admissions", b"op", raw, seal_headers(kernel, "admissions", b"op", raw))


def test_an_audit_with_records_it_cannot_verify_is_never_clean() -> None:
    from ledger.audit import AuditReport

    report = AuditReport(operations=1)
    assert report.clean and report.verdict.startswith("CLEAN")
    report.unverifiable_records.append(
        {"topic": "state", "partition": 0, "offset": 3, "reason": "sealed by unknown key k"}
    )
    assert not report.clean
    assert report.verdict.startswith("NOT VERIFIED: 1 record sealed by keys not held here")
    assert report.to_dict()["unverifiable_records"] == report.unverifiable_records
