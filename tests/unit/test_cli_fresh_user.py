"""Findings of a fresh user's trial of the ``ledger`` CLI, each pinned by a test."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ledger.cli import main
from ledger.settings import LedgerSettings
from testbed.runs import RunLedger, inspect_lines

# ---------------------------------------------------------------- 1. inspecting a finished run


def _run(tmp_path: Path, prefix: str, ops: list[str]) -> RunLedger:
    settings = LedgerSettings(
        topic_prefix=prefix, run_dir=tmp_path / "run folder" / prefix, clock="manual"
    )
    return RunLedger(f"case {prefix}", settings, list(ops))


def test_inspect_lines_name_the_prefix_run_folder_and_commands_to_paste(tmp_path: Path) -> None:
    run = _run(tmp_path, "demo-race-abc123", ["refund:case-race:v1"])
    lines = inspect_lines(run)
    text = "\n".join(lines)
    assert "topic prefix demo-race-abc123" in lines[0]
    assert str(run.settings.run_dir) in lines[0]
    export = next(line for line in lines if "export " in line).split("export ", 1)[1]
    # The line is valid shell: the run folder with a space comes back as one word.
    words = dict(w.split("=", 1) for w in shlex.split(export))
    assert words == {
        "LEDGER_TOPIC_PREFIX": "demo-race-abc123",
        "LEDGER_RUN_DIR": str(run.settings.run_dir),
        "LEDGER_CLOCK": "manual",
    }
    assert "ledger state" in text
    assert "ledger history refund:case-race:v1" in text
    assert "ledger audit" in text


@contextlib.contextmanager
def _no_broker(settings: LedgerSettings, say: Any, keep: bool = False) -> Iterator[LedgerSettings]:
    yield settings


def test_demo_says_each_cases_ledger_and_ends_with_ok(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import testbed.cli
    import testbed.demo

    def fake_run_demo(
        settings: LedgerSettings, say: Any, verbose: bool = False, ledgers: Any = None
    ) -> dict[str, dict[str, Any]]:
        for name in ("one-aaaaaa", "two-bbbbbb"):
            ledgers.append(_run(tmp_path, name, [f"refund:{name}"]))
        return {case: dict(fields) for case, fields in testbed.demo.EXPECTED.items()}

    monkeypatch.setattr(testbed.cli, "running_broker", _no_broker)
    monkeypatch.setattr(testbed.demo, "run_demo", fake_run_demo)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 0, result.output
    for name in ("one-aaaaaa", "two-bbbbbb"):
        assert f"topic prefix {name}" in result.stderr
        assert f"export LEDGER_TOPIC_PREFIX={name} " in result.stderr
        assert f"ledger history refund:{name}" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("OK: all ")
    assert "ledger broker start" in result.stderr  # the records outlive a stopped broker


def test_demo_with_a_mismatch_ends_with_failed_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import testbed.cli
    import testbed.demo

    def fake_run_demo(
        settings: LedgerSettings, say: Any, verbose: bool = False, ledgers: Any = None
    ) -> dict[str, dict[str, Any]]:
        ledgers.append(_run(tmp_path, "one-aaaaaa", []))
        report = {case: dict(fields) for case, fields in testbed.demo.EXPECTED.items()}
        report["consume_once_claim"]["accepted_resumers"] = 2
        return report

    monkeypatch.setattr(testbed.cli, "running_broker", _no_broker)
    monkeypatch.setattr(testbed.demo, "run_demo", fake_run_demo)
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code == 1
    assert "MISMATCH consume_once_claim.accepted_resumers" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("FAILED: 1 of ")
    assert "topic prefix one-aaaaaa" in result.stderr
    assert "OK:" not in result.stderr


def test_gameday_run_says_each_scenarios_ledger(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import testbed.cli
    import testbed.gameday

    good = sorted((Path(__file__).parents[1] / "testbed" / "scenarios").iterdir())[0]

    def fake_run_files(
        paths: list[Path], base: LedgerSettings, say: Any, ledgers: Any = None
    ) -> list[dict[str, Any]]:
        ledgers.append(_run(tmp_path, "gameday-g01-cccccc", ["refund:g01"]))
        return [{"name": "g01", "passed": True, "failures": []}]

    monkeypatch.setattr(testbed.cli, "running_broker", _no_broker)
    monkeypatch.setattr(testbed.gameday, "run_files", fake_run_files)
    result = CliRunner().invoke(main, ["gameday", "run", str(good)])
    assert result.exit_code == 0, result.output
    assert "topic prefix gameday-g01-cccccc" in result.stderr
    assert "export LEDGER_TOPIC_PREFIX=gameday-g01-cccccc " in result.stderr
    assert "ledger history refund:g01" in result.stderr
    assert result.stdout.strip() == "PASS  g01"


# ---------------------------------------------------------------- 4. an intent for an unknown sink

_SINK_PROBLEM = "sink 'bogus' is not registered in /run/sinks.json (registered: payments)"


def _refused_before_the_operation_existed() -> Any:
    from ledger.events import JournalEntry

    return JournalEntry(
        operation_id="op1",
        seq=0,
        kind="Intent",
        outcome="REFUSED",
        reason=f"intent for op1 refused before admission: {_SINK_PROBLEM}; approval a1 was "
        "not used",
        input_topic="intents",
        input_partition=2,
        input_offset=0,
        input_event=b"",
        sink_problem=_SINK_PROBLEM,
    )


@pytest.mark.parametrize(
    ("from_state", "to_state", "words"),
    [
        (None, None, "(no state)"),
        (None, "PROPOSED", "(new) -> PROPOSED"),
        ("ADMITTED", "ADMITTED", "ADMITTED"),
        ("ADMITTED", "EFFECT_PENDING", "ADMITTED -> EFFECT_PENDING"),
    ],
)
def test_a_journal_move_is_said_in_words_never_none(
    from_state: str | None, to_state: str | None, words: str
) -> None:
    from ledger.history import journal_move

    entry = _refused_before_the_operation_existed().model_copy(
        update={"from_state": from_state, "to_state": to_state}
    )
    assert journal_move(entry) == words


def test_history_line_of_an_unknown_sink_refusal_names_the_sinks_not_none() -> None:
    from ledger.history import describe

    line = describe(_refused_before_the_operation_existed())
    assert "None" not in line
    assert "REFUSED Intent (no state)" in line
    assert "'bogus'" in line and "registered: payments" in line


def test_intent_publish_says_the_refusal_of_an_unknown_sink_without_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import click

    import consumers.reader
    from ledger.cli.ops import _report_decision

    monkeypatch.setattr(
        consumers.reader,
        "wait_for_decision",
        lambda *args, **kwargs: _refused_before_the_operation_existed(),
    )

    @click.command()
    def report() -> None:
        _report_decision(LedgerSettings(), ("intents", 2, 0), 5.0)

    result = CliRunner().invoke(report, [])
    assert result.exit_code == 1
    assert result.stdout.startswith("REFUSED: op1 (no state) (intent for op1 refused")
    assert "None" not in result.stdout
    assert "'bogus'" in result.stdout and "registered: payments" in result.stdout


# ---------------------------------------------------------------- 2. reading the wrong ledger


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []


def test_a_reader_keyring_creates_no_key_and_trusts_no_seal(tmp_path: Path) -> None:
    from consumers.reader import _keyring
    from ledger.credentials import MissingKeyError, load_keyring

    settings = LedgerSettings(run_dir=tmp_path / "run")
    ring = load_keyring(settings, missing_ok=True)
    assert ring.macs == {} and ring.trusted == {}
    reader_ring = _keyring(settings, True)
    assert reader_ring is not None and reader_ring.macs == {}
    assert _files(tmp_path) == []
    # A stage's keyring stops without the keys it needs, naming the remedy, and makes none.
    with pytest.raises(MissingKeyError, match="ledger keys init"):
        load_keyring(settings)
    assert _files(tmp_path) == []


@pytest.fixture
def read_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """``ledger`` as a reader sees it, with the broker's answers replaced."""
    import consumers.reader
    import ledger.topics

    seen: dict[str, Any] = {"non_empty": [], "states": {}}
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", "demo-race-abc123")
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path / "wrong"))
    monkeypatch.setattr(ledger.topics, "check_topics", lambda settings, names=None: [])
    monkeypatch.setattr(
        ledger.topics,
        "non_empty_topics",
        lambda settings, names=None: [
            n for n in seen["non_empty"] if names is None or n in list(names)
        ],
    )
    monkeypatch.setattr(consumers.reader, "current_states", lambda settings: seen["states"])
    return seen


def test_state_of_an_empty_ledger_says_no_operations_with_the_prefix_and_creates_nothing(
    read_env: dict[str, Any], tmp_path: Path
) -> None:
    result = CliRunner().invoke(main, ["state"])
    assert result.exit_code == 0, result.output
    assert "no operations in the ledger (topic prefix 'demo-race-abc123'" in result.stdout
    assert "LEDGER_TOPIC_PREFIX" in result.stdout and "LEDGER_RUN_DIR" in result.stdout
    assert _files(tmp_path) == []


@pytest.mark.parametrize("command", [["state"], ["state", "--json"], ["audit"], ["history", "x"]])
def test_a_reader_without_the_ledgers_key_says_so_instead_of_an_empty_ledger(
    read_env: dict[str, Any], tmp_path: Path, command: list[str]
) -> None:
    from ledger.cli.common import EXIT_ERROR

    read_env["non_empty"] = ["intents", "state", "journal"]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == EXIT_ERROR, result.output
    assert f"no stage keys at {tmp_path / 'wrong' / 'keys' / 'stage-keys.json'}" in (result.stderr)
    assert "'demo-race-abc123'" in result.stderr and "LEDGER_RUN_DIR" in result.stderr
    assert "no operations" not in result.output
    assert _files(tmp_path) == []


def test_state_with_records_none_authentic_says_the_run_folder_is_another(
    read_env: dict[str, Any], tmp_path: Path
) -> None:
    from ledger.cli.common import EXIT_ERROR
    from ledger.credentials import provision_keys

    # keys made anew for this prefix: none of the ledger's records is sealed by them
    provision_keys(LedgerSettings(run_dir=tmp_path / "wrong", topic_prefix="demo-race-abc123"))
    before = _files(tmp_path)
    read_env["non_empty"] = ["state"]
    result = CliRunner().invoke(main, ["state"])
    assert result.exit_code == EXIT_ERROR, result.output
    assert "demo-race-abc123.state holds records but none is sealed by a key in" in result.stderr
    assert "no operations" not in result.output
    assert _files(tmp_path) == before


def test_topics_missing_under_the_prefix_exit_7(
    monkeypatch: pytest.MonkeyPatch, read_env: dict[str, Any], tmp_path: Path
) -> None:
    import ledger.topics
    from ledger.cli.common import EXIT_TOPICS_MISSING
    from ledger.errors import TopicConfigError

    def missing(settings: LedgerSettings, names: Any = None) -> list[str]:
        raise TopicConfigError(
            "topics not created: run `ledger topics create` (no ledger topic with prefix "
            f"{settings.topic_prefix!r})",
            topic=settings.topic("intents"),
            config="existence",
            expected="exists",
            observed="missing",
        )

    monkeypatch.setattr(ledger.topics, "check_topics", missing)
    for command in (["state"], ["history", "x"], ["audit"], ["reconcile", "list"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == EXIT_TOPICS_MISSING, (command, result.output)
        assert "topics not created" in result.stderr
        assert "'demo-race-abc123'" in result.stderr
    assert _files(tmp_path) == []


# ---------------------------------------------------------------- 3. an honest audit badge


def _audit(sink_readback: bool, sink_facts: int) -> Any:
    from ledger.audit import AuditReport

    report = AuditReport(operations=1, journal_entries=3)
    report.checked["state"] += 4
    if sink_facts:
        report.checked["single-effect"] += sink_facts
    report.sink_readback = sink_readback
    report.sink_facts = sink_facts
    return report


@pytest.mark.parametrize(
    ("sink_readback", "sink_facts", "verdict", "facts_line"),
    [
        (True, 0, "CLEAN (ledger only; no sink readback)", "none against sink readback (no "),
        (True, 2, "CLEAN (ledger and sink readback)", "2 against sink readback"),
        (False, 0, "CLEAN (ledger only, sink readback off)", "none against sink readback (--no"),
    ],
)
def test_the_audit_verdict_claims_sink_readback_only_when_a_sink_fact_was_checked(
    sink_readback: bool, sink_facts: int, verdict: str, facts_line: str
) -> None:
    from ledger.cli.audit import audit_lines

    report = _audit(sink_readback, sink_facts)
    assert report.verdict == verdict
    assert report.to_dict()["verdict"] == verdict
    lines = audit_lines(report)
    assert lines[0].startswith(f"{verdict}: 0 violation(s)")
    assert any(line.startswith("facts checked: 4 in the ledger's records, ") for line in lines)
    assert any(facts_line in line for line in lines if line.startswith("facts checked"))


def test_the_audit_page_badge_claims_sink_readback_only_when_a_sink_fact_was_checked() -> None:
    from ledger.reports.audit import audit_page

    none = audit_page({**_audit(True, 0).to_dict(), "ledger": "demo-race-abc123"})
    some = audit_page({**_audit(True, 3).to_dict(), "ledger": "demo-race-abc123"})
    assert "LEDGER AND SINK READBACK" not in none and "(ledger and sink readback)" not in none
    assert '<span class="badge warn">LEDGER ONLY; NO SINK READBACK</span>' in none
    assert "no registered sink with readback answered" in none
    assert '<span class="badge pass">LEDGER AND SINK READBACK</span>' in some
    assert "<td>… against sink readback</td><td>3</td>" in some


# ---------------------------------------------------------------- 5. ledger broker start


@pytest.mark.parametrize(
    ("port", "warned"),
    [(19092, None), (40000, 40000), (32767, 32768), (60999, 60999), (61000, None)],
)
def test_a_broker_port_in_the_ephemeral_range_is_warned_about(
    port: int, warned: int | None
) -> None:
    from testbed.broker import ephemeral_port_warning

    warning = ephemeral_port_warning(port, (32768, 60999))
    if warned is None:
        assert warning is None
        return
    assert warning is not None
    assert f"LEDGER_KAFKA_PORT={port}" in warning and f"port {warned} " in warning
    assert "32768-60999" in warning and "/proc/sys/net/ipv4/ip_local_port_range" in warning
    assert ephemeral_port_warning(port, None) is None


def test_the_ephemeral_range_is_read_from_proc(tmp_path: Path) -> None:
    from testbed.broker import ephemeral_range

    good = tmp_path / "range"
    good.write_text("32768\t60999\n")
    assert ephemeral_range(good) == (32768, 60999)
    bad = tmp_path / "bad"
    bad.write_text("nonsense\n")
    assert ephemeral_range(bad) is None
    assert ephemeral_range(tmp_path / "absent") is None


def _listening(port: int = 0) -> Any:
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


def test_broker_start_on_a_port_another_process_listens_on_names_it(tmp_path: Path) -> None:
    from ledger.errors import BrokerError
    from testbed import broker

    with _listening() as sock:
        port = sock.getsockname()[1]
        settings = LedgerSettings(kafka_port=port, kafka_home=tmp_path / "kafka")
        with pytest.raises(BrokerError) as caught:
            broker.start(settings, wait_s=1)
    message = caught.value.message
    assert f"port 127.0.0.1:{port} (LEDGER_KAFKA_PORT) is in use by another process" in message
    assert "does not answer as Kafka" in message and "export LEDGER_KAFKA_PORT=" in message
    assert not (tmp_path / "kafka" / "libs").exists()  # nothing fetched or launched


def test_broker_start_with_the_controller_port_taken_names_it(tmp_path: Path) -> None:
    from ledger.errors import BrokerError
    from testbed import broker

    for _ in range(20):  # a port whose predecessor is free
        with _listening() as sock:
            ctl = sock.getsockname()[1]
            if broker._port_taken(ctl - 1):
                continue
            settings = LedgerSettings(kafka_port=ctl - 1, kafka_home=tmp_path / "kafka")
            with pytest.raises(BrokerError) as caught:
                broker.start(settings, wait_s=1)
            break
    else:
        pytest.fail("no free port below a listening one")
    assert f"controller port 127.0.0.1:{ctl} (LEDGER_KAFKA_PORT + 1) is in use" in (
        caught.value.message
    )


def test_a_free_port_is_not_taken_whatever_a_connect_would_say() -> None:
    from testbed import broker

    with _listening() as sock:
        port = sock.getsockname()[1]
        assert broker._port_taken(port)
    assert not broker._port_taken(port)


@pytest.mark.parametrize("present", [True, False])
def test_broker_start_says_it_fetches_jars_only_when_they_are_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, present: bool
) -> None:
    from testbed import broker

    class Fetching(Exception):
        pass

    def fetch(paths: Any) -> Path:
        raise Fetching  # stop here: nothing is downloaded or launched

    with _listening() as sock:
        port = sock.getsockname()[1]  # free once closed; its successor is checked too
    settings = LedgerSettings(kafka_port=port, kafka_home=tmp_path / "kafka")
    monkeypatch.setattr(broker, "_port_taken", lambda port, host="127.0.0.1": False)
    monkeypatch.setattr(broker, "_jars_fetched", lambda paths: present)
    monkeypatch.setattr(broker, "_fetch_jars", fetch)
    lines: list[str] = []
    with pytest.raises(Fetching):
        broker.start(settings, wait_s=1, say=lines.append)
    assert lines == ([] if present else [broker.FETCHING_JARS])


def test_broker_start_on_a_taken_port_says_nothing_of_fetching(tmp_path: Path) -> None:
    with _listening() as sock:
        port = sock.getsockname()[1]
        result = CliRunner().invoke(
            main,
            ["broker", "start", "--wait", "1"],
            env={"LEDGER_KAFKA_PORT": str(port), "LEDGER_KAFKA_HOME": str(tmp_path / "kafka")},
        )
    assert result.exit_code == 1
    assert "Maven" not in result.output
    assert f"127.0.0.1:{port} (LEDGER_KAFKA_PORT) is in use by another process" in result.stderr


def test_broker_start_warns_about_a_port_in_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from testbed import broker

    monkeypatch.setenv("LEDGER_KAFKA_HOME", str(tmp_path / "kafka"))
    monkeypatch.setenv("LEDGER_KAFKA_PORT", "40000")
    monkeypatch.setattr(broker, "ephemeral_range", lambda: (32768, 60999))
    monkeypatch.setattr(broker, "status_pid", lambda settings: None)
    monkeypatch.setattr(
        broker,
        "start",
        lambda settings, wait_s=90, say=None: broker._status(
            settings, broker._Paths.of(settings), 4242, True, True, "started"
        ),
    )
    result = CliRunner().invoke(main, ["broker", "start"])
    assert result.exit_code == 0, result.output
    assert "warning: LEDGER_KAFKA_PORT=40000" in result.stderr
    assert "ephemeral port range 32768-60999" in result.stderr


def test_the_demo_passes_its_progress_to_broker_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from testbed import broker

    settings = LedgerSettings(kafka_port=19092, kafka_home=tmp_path / "kafka")
    down = broker._status(settings, broker._Paths.of(settings), None, False, False, "down")
    up = broker._status(settings, broker._Paths.of(settings), 4242, True, True, "started")

    def start(s: LedgerSettings, wait_s: float = 90, say: Any = None) -> Any:
        say(broker.FETCHING_JARS)  # as start does when the jars are missing
        return up

    monkeypatch.setattr(broker, "status", lambda s: down)
    monkeypatch.setattr(broker, "start", start)
    monkeypatch.setattr(broker, "stop", lambda s, timeout_s=30: "stopped")
    lines: list[str] = []
    with broker.running_broker(settings, lines.append):
        pass
    assert lines == ["starting the local Kafka broker ...", broker.FETCHING_JARS]


def test_upgrade_check_without_the_ledgers_key_says_so_instead_of_nothing_stranded(
    read_env: dict[str, Any], tmp_path: Path
) -> None:
    import json

    from ledger.cli.common import EXIT_ERROR

    proposal = tmp_path / "payments-v2.json"
    proposal.write_text(
        json.dumps(
            {
                "sink": "payments",
                "contract_version": 2,
                "contract": {
                    "idempotent": True,
                    "readback": False,
                    "fencing": True,
                    "key_retention_s": 60,
                    "consequence": "irreversible",
                },
            }
        )
    )
    read_env["non_empty"] = ["state", "dispatches"]
    result = CliRunner().invoke(main, ["upgrade", "check", "--contract", str(proposal)])
    assert result.exit_code == EXIT_ERROR, result.output
    assert "no stage keys at" in result.stderr
    assert "stranded" not in result.stdout
    assert not (tmp_path / "wrong").exists()


def _proposal_file(tmp_path: Path, sink: str, contract: dict[str, Any]) -> Path:
    import json

    path = tmp_path / "proposal.json"
    path.write_text(json.dumps({"sink": sink, "contract_version": 2, "contract": contract}))
    return path


def test_upgrade_check_of_a_sink_nobody_knows_is_a_usage_error_naming_the_known_ones(
    read_env: dict[str, Any], tmp_path: Path
) -> None:
    """A typo ('payment') printed "0 of 0 ... stranded" and exit 0: a release check
    that checks nothing must not look like a pass (found by a fresh-user trial)."""
    from ledger.cli.common import EXIT_USAGE

    manifest = Path(__file__).resolve().parents[2] / "deploy" / "release-manifest.json"
    proposal = _proposal_file(tmp_path, "payment", {"idempotent": True})
    result = CliRunner().invoke(
        main, ["upgrade", "check", "--contract", str(proposal), "--manifest", str(manifest)]
    )
    assert result.exit_code == EXIT_USAGE, result.output
    assert "sink 'payment' is neither in the sink registry" in result.stderr
    assert "payments" in result.stderr  # the manifest's sinks are named
    assert "stranded" not in result.stdout


def test_upgrade_check_names_the_contract_key_it_refuses(
    read_env: dict[str, Any], tmp_path: Path
) -> None:
    from ledger.cli.common import EXIT_USAGE

    proposal = _proposal_file(tmp_path, "payments", {"idempotent": True, "readbak": False})
    result = CliRunner().invoke(main, ["upgrade", "check", "--contract", str(proposal)])
    assert result.exit_code == EXIT_USAGE, result.output
    assert "at 'readbak'" in result.stderr, result.stderr
