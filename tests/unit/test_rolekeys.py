"""Per-role stage keys (issue 29): each writer role signs with its own key, and rotates."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.authn import (
    STAGE_KEY_ROLES,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    MacKey,
    seal_headers,
)
from ledger.cli import main
from ledger.credentials import Credentials, keys_dir, load_keyring, provision_keys, stage_sealer
from ledger.errors import LedgerError
from ledger.rolekeys import TRUST_FILE, read_trust, role_key, rotate
from ledger.settings import LedgerSettings
from ledger.topology import TOPICS

#: Where each writer role of the topology signs (the key roles a reader accepts).
WRITER_KEYS = {
    "services": (),
    "review systems": ("reviewer", "operator"),
    "authority kernel": ("authority",),
    "processor": ("processor",),
    "relay": ("relay",),
    "reconcilers": ("reconciler",),
    "resumers": ("resumer",),
    "operators": ("operator",),
    "policy administrators": ("operator",),
    "every component": ("processor", "relay", "authority"),
}


def _settings(tmp_path: Path) -> LedgerSettings:
    settings = LedgerSettings(run_dir=tmp_path / "run", trusted_keys_file=None)
    provision_keys(settings)
    return settings


def _at(ms: int) -> tuple[int, int]:
    return (TIMESTAMP_LOG_APPEND_TIME, ms)


def test_every_topic_accepts_exactly_its_writer_roles_keys() -> None:
    for spec in TOPICS:
        wanted = {key for role in spec.roles for key in WRITER_KEYS[role]}
        if spec.name == "outcomes":
            wanted = {"outcome"}  # the processor's outcome key, which services verify
        assert set(spec.auth) == wanted, spec.name
        assert spec.auth != ("stage",), f"{spec.name} is sealed by no role in service"


def test_a_processor_record_sealed_with_the_relays_key_is_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    ring = load_keyring(settings)
    value = b"an in-flight state"
    relay, processor = role_key(settings, "relay"), role_key(settings, "processor")
    for topic in ("state", "journal", "dispatches"):
        forged = seal_headers(relay, topic, b"op-1", value)
        problem = ring.check(topic, b"op-1", value, forged, timestamp=_at(1))
        assert problem is not None and "trusted as relay; this topic is written by processor" in (
            problem
        ), problem
        genuine = seal_headers(processor, topic, b"op-1", value)
        assert ring.check(topic, b"op-1", value, genuine, timestamp=_at(1)) is None
    # The relay's key is good where the relay writes, and the processor's is not.
    receipt = seal_headers(relay, "receipts", b"op-1", value)
    assert ring.check("receipts", b"op-1", value, receipt, timestamp=_at(1)) is None
    by_processor = seal_headers(processor, "receipts", b"op-1", value)
    assert "trusted as processor" in (ring.check("receipts", b"op-1", value, by_processor) or "")


def test_a_stage_seals_only_its_own_topics_with_its_own_key(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    relay = stage_sealer(settings, "relay")
    assert relay("receipts").key_id == role_key(settings, "relay").key_id
    assert relay("operating-events").key_id == role_key(settings, "relay").key_id
    with pytest.raises(LedgerError, match="relay cannot write state: only the processor"):
        relay("state")
    kernel = stage_sealer(settings, "authority")
    assert kernel("operating-events").key_id.startswith("authority-kernel-")
    # A command signs as the role it plays: the reconciler's readbacks with its own key.
    readbacks = Credentials(settings, role="reconciler").sealer_for("readbacks", None)
    assert readbacks is not None and readbacks.key_id == role_key(settings, "reconciler").key_id
    claims = Credentials(settings).sealer_for("claims", None)
    assert claims is not None and claims.key_id.startswith("resumer-")


def test_a_host_holds_its_own_key_and_the_public_keys_only(tmp_path: Path) -> None:
    """A relay host with relay.key and the trust file seals and verifies; it makes no key."""
    maker = _settings(tmp_path)
    host = LedgerSettings(run_dir=tmp_path / "relay-host", trusted_keys_file=None)
    folder = keys_dir(host)
    folder.mkdir(parents=True)
    for name in ("relay.key", TRUST_FILE, "ledgers.json", "authority.pub", "outcome.pub"):
        (folder / name).write_text((keys_dir(maker) / name).read_text())
    assert provision_keys(host).created == ()  # no role key made over the trusted ones
    assert stage_sealer(host, "relay")("receipts").key_id == role_key(maker, "relay").key_id
    ring = load_keyring(host)
    value = b"v"
    state = seal_headers(role_key(maker, "processor"), "state", b"op", value)
    assert ring.check("state", b"op", value, state, timestamp=_at(1)) is None
    with pytest.raises(LedgerError, match="no processor.key .* the processor needs it"):
        stage_sealer(host, "processor")


def test_rotation_overlap_then_the_old_key_verifies_only_what_came_before(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    old = role_key(settings, "relay")
    done = rotate(settings, "relay", overlap_s=60)
    new = role_key(settings, "relay")
    assert done.old_key_id == old.key_id and done.new_key_id == new.key_id != old.key_id
    trust = read_trust(keys_dir(settings))
    assert trust is not None and trust["keys"][old.key_id]["not_after_ms"] == done.not_after_ms
    rotated_at = done.not_after_ms - 60_000
    ring = load_keyring(settings)
    value = b"receipt"
    by_old = seal_headers(old, "receipts", b"op", value)
    by_new = seal_headers(new, "receipts", b"op", value)

    def check(headers: object, timestamp: tuple[int, int] | None) -> str | None:
        return ring.check("receipts", b"op", value, headers, timestamp=timestamp)  # type: ignore[arg-type]

    assert check(by_old, _at(rotated_at - 5_000)) is None  # written before the rotation
    assert check(by_old, _at(rotated_at + 30_000)) is None  # inside the overlap window
    assert check(by_new, _at(rotated_at + 30_000)) is None
    late = check(by_old, _at(done.not_after_ms + 1))  # after the window: a stolen key forges
    assert late is not None and late.startswith("sealed by a retired key"), late
    assert check(by_new, _at(done.not_after_ms + 1)) is None
    # A record the broker did not stamp: before the topic kept broker time, or unknown.
    assert check(by_old, (TIMESTAMP_CREATE_TIME, done.not_after_ms + 1)) is None
    assert "no timestamp" in (check(by_old, None) or "")


def test_the_legacy_shared_key_verifies_records_from_before_the_cut_over(tmp_path: Path) -> None:
    settings = LedgerSettings(run_dir=tmp_path / "run", trusted_keys_file=None)
    folder = keys_dir(settings)
    folder.mkdir(parents=True)
    legacy = MacKey(b"L" * 32, ledger_id=settings.ledger_identity)
    secret = base64.b64encode(legacy.secret).decode()
    (folder / "deployment.key").write_text(json.dumps({"secret": secret}))
    (folder / "ledgers.json").write_text(json.dumps({"ledgers": [settings.ledger_identity]}))
    provision_keys(settings)  # the upgrade: role keys, and the legacy key's not-after
    trust = read_trust(folder)
    assert trust is not None and set(trust["legacy"]) == {legacy.key_id}
    cut_over = trust["legacy"][legacy.key_id]["not_after_ms"]
    ring = load_keyring(settings)
    value = b"an old journal entry"
    sealed = seal_headers(legacy, "journal", b"op", value)
    assert ring.check("journal", b"op", value, sealed, timestamp=_at(cut_over - 1)) is None
    assert ring.check("journal", b"op", value, sealed, timestamp=(TIMESTAMP_CREATE_TIME, 0)) is None
    after = ring.check("journal", b"op", value, sealed, timestamp=_at(cut_over + 1)) or ""
    assert after.startswith("sealed by a retired key"), after
    # It never was the kernel's key, before or after.
    assert "stage key" in (
        ring.check("admissions", b"op", value, seal_headers(legacy, "admissions", b"op", value))
        or ""
    )


def test_keys_rotate_command_says_what_to_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path / "run"))
    settings = _settings(tmp_path)
    before = role_key(settings, "processor").key_id
    result = CliRunner().invoke(main, ["keys", "rotate", "processor", "--overlap-s", "600"])
    assert result.exit_code == 0, result.output
    after = role_key(settings, "processor").key_id
    assert after != before and after in result.output and before in result.output
    assert "processor.key" in result.output and TRUST_FILE in result.output
    shown = CliRunner().invoke(main, ["keys", "show", "--json"])
    rows = {row["key_id"]: row for row in json.loads(shown.output)}
    assert rows[before]["not_after_ms"] is not None and rows[after]["not_after_ms"] is None
    refused = CliRunner().invoke(main, ["keys", "rotate", "authority"])
    assert refused.exit_code != 0 and "processor" in refused.output
    assert set(STAGE_KEY_ROLES) <= {row["role"] for row in rows.values()}


def test_sealed_topics_keep_broker_time_and_a_topic_that_does_not_is_refused() -> None:
    """A retired key's not-after is told by the broker's append time, which no writer sets."""
    from confluent_kafka.admin import ConfigEntry

    from ledger import topics
    from ledger.topology import TOPIC_BY_NAME

    for spec in TOPICS:
        stamped = topics.topic_config(spec).get("message.timestamp.type") == "LogAppendTime"
        assert stamped == any(role in STAGE_KEY_ROLES for role in spec.auth), spec.name
    state = TOPIC_BY_NAME["state"]
    entries = {k: ConfigEntry(k, v) for k, v in topics.topic_config(state).items()}
    assert topics.check._config_problems("x.state", state, entries) == []
    entries["message.timestamp.type"] = ConfigEntry("message.timestamp.type", "CreateTime")
    (problem,) = topics.check._config_problems("x.state", state, entries)
    assert problem.config == "message.timestamp.type" and problem.expected == "LogAppendTime"
    assert "set message.timestamp.type=LogAppendTime" in problem.message
