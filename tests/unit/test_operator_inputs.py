"""Operator inputs are validated before anything is published (issue 11, item 8).

Policy versions count from 1 (0 never silently becomes 1), names and IDs are
never blank, and a corrupted local file is an error message with the remedy,
never a traceback. No broker is needed: the commands are refused first, or the
broker check and the publisher are replaced by fakes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from consumers import reader
from ledger.cli import approvals, main, ops, reconcile
from ledger.contracts import PAYMENT_GATEWAY
from ledger.errors import LedgerError
from ledger.events import Approval, Disposition, PolicyChange
from ledger.history import describe as summary
from ledger.settings import LedgerSettings
from ledger.signing import ReviewerKey, load_trusted, trust, verify
from ledger.states import RecoveryState
from producers.publisher import LedgerPublisher, build_intent
from sinks.registry import SinkEndpoint, save_sinks
from tests import helpers
from tests.helpers import keyed


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run folder in force for the CLI (manual clock); nothing listens on the broker port."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("LEDGER_RUN_DIR", str(run))
    monkeypatch.setenv("LEDGER_CLOCK", "manual")
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.delenv("LEDGER_POLICY_VERSION", raising=False)
    monkeypatch.delenv("LEDGER_SINKS_FILE", raising=False)
    monkeypatch.delenv("LEDGER_TRUSTED_KEYS_FILE", raising=False)
    return run


class FakePublisher:
    """Records what a command would publish."""

    def __init__(self) -> None:
        self.approvals: list[Approval] = []
        self.dispositions: list[Disposition] = []
        #: where the last record went (none: nothing is waited for)
        self.last_position: Any = None
        #: the policy change the ledger holds in force (``None``: none published).
        self.policy: PolicyChange | None = None

    def publish_approval(self, approval: Approval) -> None:
        self.approvals.append(approval)

    def publish_disposition(self, disposition: Disposition) -> None:
        self.dispositions.append(disposition)

    def close(self) -> None:
        pass


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePublisher]:
    """No broker check; publishing goes to a fake."""
    fake = FakePublisher()
    for module in (ops, reconcile, approvals):
        monkeypatch.setattr(module, "_ready", lambda settings: None)
        monkeypatch.setattr(module, "_publisher", lambda settings: fake)
    monkeypatch.setattr(reader, "policy_in_force", lambda settings: fake.policy)
    yield fake


def ledger(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def refused(result: Result, *words: str) -> None:
    """The command failed with a message (no traceback) that says ``words``."""
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output, result.output


APPROVE = [
    "approve",
    "--approval-id",
    "review-1",
    "--reviewer",
    "alice",
    "--subject",
    "customer-1",
    "--max-amount-minor",
    "5000",
    "--operation-id",
    "refund:1:v1",
    "--parameter-digest",
    "cd" * 32,
]


# --------------------------------------------------------------------- policy versions


@pytest.mark.parametrize("version", ["0", "-1"])
def test_a_policy_version_below_one_is_refused_by_every_command(
    run_dir: Path, published: FakePublisher, version: str
) -> None:
    ledger("reviewer", "add", "alice")
    refused(ledger(*APPROVE, "--policy-version", version), "--policy-version", "x>=1")
    refused(ledger("policy", "set", "--by", "ops", "--", version), "VERSION", "x>=1")
    assert published.approvals == []


def test_an_explicit_policy_version_is_kept_and_the_default_is_the_setting(
    run_dir: Path, published: FakePublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger("reviewer", "add", "alice")
    monkeypatch.setenv("LEDGER_POLICY_VERSION", "4")
    assert ledger(*APPROVE).exit_code == 0
    assert ledger(*APPROVE, "--policy-version", "2").exit_code == 0
    assert [a.policy_version for a in published.approvals] == [4, 2]


def test_approve_defaults_to_the_policy_in_force_on_the_ledger_and_warns_of_another(
    run_dir: Path, published: FakePublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After `ledger policy set 3`, a new approval is granted under 3, not the setting."""
    ledger("reviewer", "add", "alice")
    monkeypatch.setenv("LEDGER_POLICY_VERSION", "1")
    published.policy = PolicyChange(version=3, set_by="ops", effective_at_ms=5)
    assert ledger(*APPROVE).exit_code == 0
    other = ledger(*APPROVE, "--policy-version", "1")
    assert other.exit_code == 0
    assert "policy 3 is in force" in other.output
    assert [a.policy_version for a in published.approvals] == [3, 1]


def test_a_policy_version_setting_below_one_is_an_error_naming_the_variable(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_POLICY_VERSION", "0")
    refused(ledger("config"), "LEDGER_POLICY_VERSION", "greater than or equal to 1")


# --------------------------------------------------------------------- names and IDs


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_blank_ids_and_names_are_refused_by_the_cli(
    run_dir: Path, published: FakePublisher, blank: str
) -> None:
    ledger("reviewer", "add", "alice")
    for args in (
        ["approve", "--approval-id", blank, *APPROVE[3:]],
        [*APPROVE[:5], "--subject", blank, *APPROVE[7:]],
        [*APPROVE, "--currency", blank],
        ["revoke", blank, "--by", "ops"],
        ["revoke", "review-1", "--by", blank],
        ["policy", "set", "2", "--by", blank],
        ["claim", "refund:1:v1", "--worker", blank],
        ["reconcile", "dispose", "refund:1:v1", "--decision", "absent"]
        + ["--by", blank, "--evidence", "bank statement"],
        ["reconcile", "dispose", "refund:1:v1", "--decision", "absent"]
        + ["--by", "ops", "--evidence", blank],
        ["reviewer", "add", blank],
    ):
        result = ledger(*args)
        refused(result)
        assert "empty" in result.output or "letters, digits" in result.output, args
    assert published.approvals == []


def test_a_parameter_digest_scope_must_look_like_one(
    run_dir: Path, published: FakePublisher
) -> None:
    ledger("reviewer", "add", "alice")
    refused(ledger(*APPROVE, "--parameter-digest", "abc"), "64 lowercase hex digits")
    assert published.approvals == []


@pytest.mark.parametrize("seconds", ["0", "-5"])
def test_an_approval_that_would_expire_at_once_is_refused(
    run_dir: Path, published: FakePublisher, seconds: str
) -> None:
    """New-user trial: ``--expires-in-s 0`` granted an approval no operation could use."""
    ledger("reviewer", "add", "alice")
    result = ledger(*APPROVE, "--expires-in-s", seconds)
    refused(result, "--expires-in-s")
    assert result.exit_code == 2 and published.approvals == []


@pytest.mark.parametrize(
    "args",
    [
        ["state", "bad id"],
        ["claim", "bad id", "--worker", "w1"],
        ["reconcile", "dispose", "bad id", "--decision", "absent", "--by", "ops"]
        + ["--evidence", "bank statement"],
    ],
)
def test_an_operation_id_outside_the_grammar_is_bad_input(
    run_dir: Path, published: FakePublisher, args: list[str]
) -> None:
    """New-user trial: such IDs said "no operation" (exit 5) after asking Kafka."""
    result = ledger(*args)
    refused(result, "OPERATION_ID", "position")
    assert result.exit_code == 2 and published.dispositions == []


def test_waiting_zero_seconds_for_a_state_is_bad_input(run_dir: Path) -> None:
    """New-user trial: --timeout 0 said the operation was "not in the ledger yet" (exit 3)."""
    result = ledger(
        *["intent", "publish", "--operation-id", "refund:7:v1", "--sink", "payments"],
        *["--action", "refund", "--params", "{}", "--actor", "a", "--subject", "s"],
        *["--purpose", "p", "--decision-version", "1", "--until", "OUTCOME_VERIFIED"],
        *["--timeout", "0"],
    )
    refused(result, "--timeout")
    assert result.exit_code == 2


def test_a_disposition_of_an_operation_not_in_the_ledger_is_not_published(
    run_dir: Path, published: FakePublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New-user trial: it was signed and published, then refused by the processor (exit 1)."""
    ledger("operator", "add", "ops")
    monkeypatch.setattr(reader, "current_states", lambda settings: {})
    args = ["reconcile", "dispose", "refund:nosuch:v1", "--decision", "absent", "--by", "ops"]
    result = ledger(*args, "--evidence", "bank statement")
    refused(result, "no operation 'refund:nosuch:v1'", "nothing was published")
    assert result.exit_code == 5 and published.dispositions == []
    held = helpers.state("refund:nosuch:v1", RecoveryState.UNKNOWN_OUTCOME, version=4)
    held = held.model_copy(update={"entered_version": 4})
    monkeypatch.setattr(reader, "current_states", lambda settings: {"refund:nosuch:v1": held})
    assert ledger(*args, "--evidence", "bank statement").exit_code == 0
    assert [d.operation_id for d in published.dispositions] == ["refund:nosuch:v1"]
    # It names the episode the operation is in (the version it entered UNKNOWN_OUTCOME at).
    assert [d.episode for d in published.dispositions] == [4]


def test_a_reviewer_named_where_an_operator_signs_is_told_so(
    run_dir: Path, published: FakePublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New-user trial: "'alice' has no signing key here" although alice holds a reviewer key."""
    ledger("reviewer", "add", "alice")
    held = helpers.state("refund:1:v1", RecoveryState.UNKNOWN_OUTCOME)
    monkeypatch.setattr(reader, "current_states", lambda settings: {"refund:1:v1": held})
    monkeypatch.setattr(reconcile, "_publisher", LedgerPublisher)
    args = ["reconcile", "dispose", "refund:1:v1", "--decision", "absent", "--by", "alice"]
    refused(ledger(*args, "--evidence", "bank statement"), "'alice' is a reviewer", "an operator")


def _publisher() -> LedgerPublisher:
    """A publisher aimed at nothing: every record here is refused before it is sent."""
    return LedgerPublisher(keyed(LedgerSettings(bootstrap_servers="127.0.0.1:1")))


@pytest.mark.parametrize(
    "change, words",
    [
        ({"approval_id": " "}, "approval_id"),
        ({"reviewer": ""}, "reviewer"),
        ({"scope_subject": "  "}, "scope_subject"),
        ({"policy_version": 0}, "policy version 0"),
        ({"policy_version": -3}, "policy version -3"),
        ({"status": "REVOKED", "revoked_by": " "}, "revoked_by"),
        ({"status": "REVOKED"}, "revoked_by"),
        ({"scope_currency": ""}, "scope_currency"),
    ],
)
def test_the_publisher_refuses_a_blank_or_invalid_approval(
    change: dict[str, Any], words: str
) -> None:
    pub = _publisher()
    try:
        with pytest.raises(LedgerError, match=words):
            pub.publish_approval(helpers.approval().model_copy(update=change))
    finally:
        pub.close()


def test_the_publisher_refuses_blank_dispositions_policies_claims_and_approval_ids() -> None:
    good = Disposition(
        disposition_id="d-1",
        operation_id="refund:1:v1",
        decision="ABSENT",
        by="ops",
        evidence="statement",
        disposed_at_ms=0,
    )
    pub = _publisher()
    try:
        for field in ("disposition_id", "by", "evidence"):
            with pytest.raises(LedgerError, match="must not be empty"):
                pub.publish_disposition(good.model_copy(update={field: " "}))
        for version in (0, -1):
            with pytest.raises(LedgerError, match="policy versions are integers from 1"):
                pub.publish_policy(version, "ops", 0)
        with pytest.raises(LedgerError, match="set_by"):
            pub.publish_policy(2, "  ", 0)
        with pytest.raises(LedgerError, match="worker"):
            pub.publish_claim("refund:1:v1", " ", 1)
    finally:
        pub.close()
    with pytest.raises(LedgerError, match="approval_id"):
        build_intent(
            operation_id="refund:1:v1",
            sink="payments",
            action="refund",
            params={"amount_minor": 1},
            actor="svc",
            subject="customer-1",
            purpose="p",
            decision_version=1,
            approval_id="  ",
        )


# --------------------------------------------------------------------- scope options


def _register_payments(run_dir: Path) -> None:
    save_sinks(
        run_dir / "sinks.json",
        {"payments": SinkEndpoint(url="http://127.0.0.1:1", contract=PAYMENT_GATEWAY)},
    )


def test_approve_refuses_a_sink_that_is_not_registered(
    run_dir: Path, published: FakePublisher
) -> None:
    """An approval scoped to an unregistered sink admits nothing: a typo is refused."""
    ledger("reviewer", "add", "alice")
    bound = [*APPROVE, "--action", "refund", "--currency", "GBP", "--account", "acct-1"]
    result = ledger(*bound, "--sink", "paymnets")
    refused(result, "'paymnets' is not registered", "registered: none", "ledger sink register")
    _register_payments(run_dir)
    result = ledger(*bound, "--sink", "paymnets")
    refused(result, "'paymnets' is not registered", "registered: payments")
    assert published.approvals == []
    assert ledger(*bound, "--sink", "payments").exit_code == 0
    assert [a.scope_sink for a in published.approvals] == ["payments"]


def test_approve_signs_every_scope_option_given(run_dir: Path, published: FakePublisher) -> None:
    ledger("reviewer", "add", "alice")
    _register_payments(run_dir)
    digest = "ab" * 32
    result = ledger(
        *APPROVE[:11],
        "--action",
        "refund",
        "--sink",
        "payments",
        "--currency",
        "GBP",
        "--account",
        "acct-1",
        "--purpose",
        "fee-remediation",
        "--parameter-digest",
        digest,
    )
    assert result.exit_code == 0, result.output
    assert "currency GBP" in result.output and "policy 1" in result.output
    (approval,) = published.approvals
    assert (
        approval.scope_action,
        approval.scope_sink,
        approval.scope_currency,
        approval.scope_account,
        approval.scope_purpose,
        approval.scope_parameter_digest,
    ) == ("refund", "payments", "GBP", "acct-1", "fee-remediation", digest)
    trusted = load_trusted(run_dir / "trusted_keys.json")
    assert verify(approval, trusted, "ledger") is None
    assert (
        verify(approval.model_copy(update={"scope_currency": "EUR"}), trusted, "ledger") is not None
    )


def test_approve_binds_one_exact_operation_unless_a_field_is_opened_on_purpose(
    run_dir: Path, published: FakePublisher
) -> None:
    """Issue 28: an approval made as the README showed (subject, cap, currency, action,
    sink) left the account and the operation open, and a service paid itself with it."""
    ledger("reviewer", "add", "alice")
    _register_payments(run_dir)
    loose = [*APPROVE[:9], "--currency", "GBP", "--action", "refund", "--sink", "payments"]
    result = ledger(*loose)
    refused(result, "would admit any operation-id, account", "--open account")
    assert result.exit_code == 2 and published.approvals == []
    refused(ledger(*loose, "--operation-id", "refund:1:v1"), "any account")
    refused(ledger(*loose, "--account", "a", "--open", "account"), "contradict")
    bound = ledger(*loose, "--operation-id", "refund:1:v1", "--account", "acct-1")
    assert bound.exit_code == 0, bound.output
    assert "open" not in bound.output
    standing = ledger(*loose, "--open", "operation-id", "--open", "account")
    assert standing.exit_code == 0, standing.output
    assert "left open on purpose: operation-id, account" in standing.output
    first, second = published.approvals
    assert (first.scope_operation_id, first.scope_account) == ("refund:1:v1", "acct-1")
    assert (second.scope_operation_id, second.scope_account) == (None, None)
    assert summary(second).endswith("open to any operation-id, account")
    assert "open to" not in summary(first)


def test_approve_help_teaches_each_scope_option() -> None:
    text = " ".join(ledger("approve", "--help").output.split())
    for option in (
        "--action",
        "--sink",
        "--currency",
        "--account",
        "--purpose",
        "--parameter-digest",
    ):
        assert option in text
    assert "out of scope: currency EUR, approved GBP" in text
    assert "params.currency" in text


# --------------------------------------------------------------------- corrupted local files


def test_corrupted_local_files_are_errors_with_the_remedy_not_tracebacks(
    run_dir: Path, published: FakePublisher
) -> None:
    (run_dir / "clock").write_text("twelve o'clock")
    refused(ledger("clock", "show"), "ledger clock", "remove it")
    refused(ledger("clock", "advance", "5"), "ledger clock")
    (run_dir / "clock").write_text("0")

    (run_dir / "sinks.json").write_text("{not json")
    refused(ledger("reconcile", "run"), "sink registry", "register the sinks again")
    refused(
        ledger(
            "intent",
            "publish",
            "--operation-id",
            "refund:1:v1",
            "--sink",
            "payments",
            "--action",
            "refund",
            "--params",
            "{}",
            "--actor",
            "svc",
            "--subject",
            "customer-1",
            "--purpose",
            "p",
            "--decision-version",
            "1",
        ),
        "sink registry",
    )

    keys = run_dir / "trusted_keys.json"
    keys.write_text("[1, 2")
    refused(ledger("reviewer", "add", "bob"), "trusted-keys file", "ledger reviewer add")
    assert keys.read_text() == "[1, 2"  # left as it was

    keys.unlink()
    assert ledger("reviewer", "add", "alice").exit_code == 0
    (run_dir / "reviewers" / "alice.key").write_text('{"key_id": "alice"}')
    refused(ledger(*APPROVE), "reviewer key", "alice.key")
    assert published.approvals == []


def test_trusting_a_key_keeps_the_others_and_writes_atomically(tmp_path: Path) -> None:
    path = tmp_path / "trusted_keys.json"
    first, second = ReviewerKey.generate("a"), ReviewerKey.generate("b")
    trust(path, first)
    trust(path, second)
    assert set(json.loads(path.read_text())) == {"a", "b"}
    # No temporary file is left behind (the lock file serialises writers).
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trusted_keys.json",
        "trusted_keys.json.lock",
    ]


def test_the_kernel_refuses_a_policy_change_below_one_written_past_the_publisher(
    tmp_path: Path,
) -> None:
    from consumers.authority import AuthorityKernel
    from consumers.stage import Record
    from ledger.events import PolicyChange

    kernel = AuthorityKernel(
        keyed(LedgerSettings(run_dir=tmp_path, bootstrap_servers="127.0.0.1:1"))
    )
    try:

        def change(version: int, offset: int) -> Record:
            event = PolicyChange(version=version, set_by="mallory", effective_at_ms=0)
            return Record("policy", 0, offset, "current", event.to_bytes(), event)

        kernel.tables.apply_policy("current", change(3, 0))
        kernel.tables.apply_policy("current", change(0, 1))
        assert kernel.policy_version == 3
        ((topic, _, event),) = kernel.notes
        assert topic == "operating-events" and event.kind == "BAD_INPUT"  # type: ignore[attr-defined]
        assert "policy versions count from 1" in event.reason  # type: ignore[attr-defined]
    finally:
        kernel.close()


def test_a_policy_change_refused_at_start_up_is_still_reported_after_the_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attacker trial: a replay read while the kernel started was logged but never reported
    (the assignment that follows start-up dropped the pending operating event)."""
    from consumers.authority import AuthorityKernel
    from consumers.stage import Record

    kernel = AuthorityKernel(
        keyed(LedgerSettings(run_dir=tmp_path, bootstrap_servers="127.0.0.1:1"))
    )
    try:
        event = PolicyChange(version=0, set_by="mallory", effective_at_ms=0)
        kernel.tables.apply_policy(
            "current", Record("policy", 0, 7, "current", event.to_bytes(), event)
        )
        monkeypatch.setattr(kernel.tables.approval_follower, "follow", lambda partitions: 0)
        monkeypatch.setattr(kernel.tables.use_follower, "follow", lambda partitions: 0)
        kernel.on_assign({0, 1})
        assert [e.source_offset for _, _, e in kernel.notes] == [7]  # type: ignore[attr-defined]
    finally:
        kernel.close()


def test_a_replayed_policy_change_does_not_roll_the_policy_back(tmp_path: Path) -> None:
    """Changes are ordered by effective time, not offset: a copy of an old, authentic
    change appended after a newer one (a replay) changes nothing in the kernel or the
    relay, and the kernel reports it; setting the old version again is a new change."""
    from consumers.authority import AuthorityKernel
    from consumers.relay import Relay
    from consumers.stage import Record
    from ledger.authority import policy_key
    from ledger.events import PolicyChange

    settings = keyed(LedgerSettings(run_dir=tmp_path, bootstrap_servers="127.0.0.1:1"))
    kernel, relay = AuthorityKernel(settings), Relay(settings)
    try:

        def change(version: int, at_ms: int, offset: int, key: str | None = None) -> Record:
            event = PolicyChange(version=version, set_by="ops", effective_at_ms=at_ms)
            return Record("policy", 0, offset, key or policy_key(event), event.to_bytes(), event)

        records = [
            change(1, 1_000, 0, key="current"),  # written by an earlier release
            change(2, 2_000, 1),
            change(1, 1_000, 2),  # the attacker's copy of the first change
            change(1, 1_000, 3, key="current"),
        ]
        # Each follower of the policy table: how it applies a record, what it holds in force.
        followers = [
            (kernel.tables.apply_policy, lambda: kernel.policy_version),
            (relay.admission.apply_policy, lambda: relay.admission.policy_version),
        ]
        for apply, in_force in followers:
            for rec in records:
                apply(rec.key, rec)
            assert in_force() == 2, apply
        refused = [e for _, _, e in kernel.notes]
        assert [(e.kind, e.source_offset) for e in refused] == [  # type: ignore[attr-defined]
            ("BAD_INPUT", 2),
            ("BAD_INPUT", 3),
        ]
        assert "not later than version 2" in refused[0].reason  # type: ignore[attr-defined]

        again = change(1, 3_000, 4)  # an operator sets version 1 again
        for apply, in_force in followers:
            apply(again.key, again)
            assert in_force() == 1, apply
        # A change under another change's key is not a row of the table.
        kernel.notes.clear()
        moved = change(5, 4_000, 5, key="v2@2000")
        kernel.tables.apply_policy(moved.key, moved)
        relay.admission.apply_policy(moved.key, moved)
        assert kernel.policy_version == relay.admission.policy_version == 1
        assert [e.kind for _, _, e in kernel.notes] == ["BAD_INPUT"]  # type: ignore[attr-defined]
    finally:
        kernel.close()
        relay.close()


def test_gameday_run_checks_every_file_first_and_runs_nothing_when_one_is_malformed(
    tmp_path: Path,
) -> None:
    good = sorted((Path(__file__).parents[1] / "testbed" / "scenarios").iterdir())[0]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    worse = tmp_path / "worse.yaml"
    worse.write_text("name: [unclosed")
    result = CliRunner().invoke(main, ["gameday", "run", str(good), str(bad), str(worse)])
    assert result.exit_code == 2
    assert "bad.json" in result.output and "worse.yaml" in result.output
    assert "no scenario was run: 2 of 3 file(s) malformed" in result.output


@pytest.mark.parametrize(
    ("at_ms", "now_ms", "text"),
    [
        (1_796_120_000_000, 1_796_116_400_000, "2026-12-01T10:13:20Z (in 3600 s)"),
        (3_600_000, 0, "3600 s (in 3600 s)"),
        (1_500, 4_500, "1.5 s (3 s ago)"),
    ],
)
def test_an_instant_reads_as_a_time_on_the_system_clock_and_seconds_on_a_manual_one(
    at_ms: int, now_ms: int, text: str
) -> None:
    from ledger.cli.common import instant_text

    assert instant_text(at_ms, now_ms) == text
