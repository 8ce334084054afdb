"""Production defaults: the system clock, a refused manual clock, instance identity.

A stage started as an operator starts it runs on the system clock unless told
otherwise, refuses the manual ledger clock outside a testbed (it starts at 0,
so approvals would never expire), and takes its instance name from
``--instance``, ``LEDGER_INSTANCE`` or the host name's StatefulSet ordinal.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from consumers.hooks import NO_FAULTS, FaultHooks
from consumers.processor import Processor
from ledger.cli import main
from ledger.cli import stages as cli_stages
from ledger.clock import check_stage_clock
from ledger.errors import SettingsError
from ledger.settings import LedgerSettings
from tests.helpers import keyed

_ISOLATED = ("LEDGER_CLOCK", "LEDGER_TESTBED", "LEDGER_INSTANCE")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No clock, testbed or instance setting in force; a run folder; no broker."""
    for name in _ISOLATED:
        monkeypatch.delenv(name, raising=False)
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("LEDGER_RUN_DIR", str(run))
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    return run


# ---------------------------------------------------------------------- the clock


def test_the_system_clock_is_the_default(env: Path) -> None:
    settings = keyed(LedgerSettings())
    assert (settings.clock, settings.testbed, settings.instance) == ("system", False, None)


def test_the_testbed_flag_and_instance_come_from_the_environment(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_TESTBED", "true")
    monkeypatch.setenv("LEDGER_INSTANCE", "relay-b")
    settings = keyed(LedgerSettings())
    assert (settings.testbed, settings.instance) == (True, "relay-b")


@pytest.mark.parametrize(
    ("kind", "testbed"), [("system", False), ("system", True), ("manual", True)]
)
def test_a_stage_accepts_the_system_clock_and_the_manual_one_in_a_testbed(
    kind: str, testbed: bool
) -> None:
    check_stage_clock(kind, testbed=testbed)


def test_a_stage_refuses_the_manual_clock_outside_a_testbed_naming_the_remedy() -> None:
    with pytest.raises(SettingsError) as caught:
        check_stage_clock("manual", testbed=False)
    message = caught.value.message
    assert "LEDGER_CLOCK=manual" in message and "LEDGER_TESTBED=true" in message
    assert "never expire" in message
    assert caught.value.observed == "LEDGER_CLOCK=manual"


def test_an_unknown_clock_is_refused() -> None:
    with pytest.raises(SettingsError, match="unknown clock 'sundial'"):
        check_stage_clock("sundial", testbed=True)


def test_a_stage_on_the_manual_clock_stops_before_it_touches_kafka(tmp_path: Path) -> None:
    """Nothing listens on port 1: the refusal must come before the topic check."""
    stage = Processor(
        keyed(LedgerSettings(run_dir=tmp_path, clock="manual", bootstrap_servers="127.0.0.1:1"))
    )
    with pytest.raises(SettingsError, match="LEDGER_TESTBED"):
        stage.run()
    assert stage.producer is None and stage.consumer is None


@pytest.mark.parametrize("component", ["processor", "authority", "relay"])
def test_ledger_stage_commands_refuse_the_manual_clock_with_an_error_not_a_traceback(
    env: Path, monkeypatch: pytest.MonkeyPatch, component: str
) -> None:
    monkeypatch.setenv("LEDGER_CLOCK", "manual")
    result = CliRunner().invoke(main, [component, "--instance", "0"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Error: a stage refuses the manual ledger clock" in result.output
    assert "LEDGER_TESTBED=true" in result.output
    assert not (env / "keys").exists()  # refused before the stage made its key files


def test_clock_show_says_it_is_the_system_clock(env: Path) -> None:
    result = CliRunner().invoke(main, ["clock", "show"])
    assert result.exit_code == 0, result.output
    seconds, _, note = result.output.partition(" ")
    assert float(seconds) > 1.7e9  # the Unix epoch's seconds, not a manual clock's 0
    assert "system clock" in note and "LEDGER_CLOCK=system" in note
    assert not (env / "clock").exists()


def test_clock_advance_on_the_system_clock_says_it_cannot_be_moved(env: Path) -> None:
    result = CliRunner().invoke(main, ["clock", "advance", "60"])
    assert result.exit_code != 0
    assert "the clock is the system clock" in result.output
    assert "LEDGER_CLOCK=manual" in result.output
    assert not (env / "clock").exists()


def test_the_manual_clock_still_shows_and_advances(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_CLOCK", "manual")
    (env / "clock").write_text("5000")
    assert CliRunner().invoke(main, ["clock", "advance", "10"]).output.strip() == "15"
    assert CliRunner().invoke(main, ["clock", "show"]).output.strip() == "15"


# ---------------------------------------------------------------------- instance identity


@pytest.mark.parametrize(
    ("given", "from_settings", "hostname", "expected", "source"),
    [
        ("3", "5", "relay-2", "3", "--instance"),
        (None, "5", "relay-2", "5", "LEDGER_INSTANCE"),
        (None, None, "relay-2", "2", "host name 'relay-2'"),
        (None, "", "relay-12.relay.ledger.svc.cluster.local", "12", "host name"),
        (None, None, "processor-0", "0", "host name 'processor-0'"),
        (None, None, "3f4e2a1b9c0d", "0", "by default"),  # a container ID
        (None, None, "relay-7d9f8b6c4-x2k9p", "0", "by default"),  # a Deployment's pod
        (None, None, "relay-2a", "0", "by default"),
        (None, None, "relay2", "0", "by default"),
    ],
)
def test_instance_identity_comes_from_the_option_the_setting_or_the_host_ordinal(
    given: str | None, from_settings: str | None, hostname: str, expected: str, source: str
) -> None:
    instance, said = cli_stages.resolve_instance(given, from_settings, hostname)
    assert instance == expected
    assert source in said


def test_the_default_identity_warns_of_fencing() -> None:
    _, said = cli_stages.resolve_instance(None, None, "laptop")
    assert "would fence this one" in said


@pytest.mark.parametrize("bad", ["", "a b", "relay/1", "x" * 101, "é"])
def test_an_instance_name_kafka_cannot_carry_is_refused(bad: str) -> None:
    with pytest.raises(SettingsError, match="--instance or LEDGER_INSTANCE"):
        cli_stages.resolve_instance(bad, None, "relay-2")
    with pytest.raises(SettingsError, match="from LEDGER_INSTANCE"):
        cli_stages.resolve_instance(None, bad or " ", "relay-2")


class _Recorder:
    """Stands in for a stage class: records how it was built; ``run`` does nothing."""

    built: list[tuple[LedgerSettings, str]] = []

    def __init__(self, settings: LedgerSettings, instance: str, hooks: FaultHooks) -> None:
        _Recorder.built.append((settings, instance))
        assert hooks is NO_FAULTS

    def run(self) -> None:
        pass


def test_a_stage_takes_its_identity_from_the_host_name_and_logs_where_it_came_from(
    env: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _Recorder.built = []
    monkeypatch.setitem(cli_stages.STAGES, "relay", _Recorder)  # type: ignore[arg-type]
    monkeypatch.setattr(cli_stages.socket, "gethostname", lambda: "relay-2")
    with caplog.at_level(logging.INFO, logger=cli_stages.__name__):
        result = CliRunner().invoke(main, ["relay"])
    assert result.exit_code == 0, result.output
    assert [instance for _, instance in _Recorder.built] == ["2"]
    assert "relay instance 2 (from the ordinal of the host name 'relay-2')" in caplog.text

    monkeypatch.setenv("LEDGER_INSTANCE", "7")
    with caplog.at_level(logging.INFO, logger=cli_stages.__name__):
        CliRunner().invoke(main, ["relay"])
    assert _Recorder.built[-1][1] == "7"
    assert "relay instance 7 (from LEDGER_INSTANCE)" in caplog.text


def test_testbed_stage_runs_its_stage_in_a_testbed(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m testbed.stage`` sets LEDGER_TESTBED, so the manual clock is accepted."""
    from testbed import stage as testbed_stage

    _Recorder.built = []
    monkeypatch.setenv("LEDGER_CLOCK", "manual")
    monkeypatch.setenv("LEDGER_TESTBED", "false")  # restored by monkeypatch afterwards
    monkeypatch.setitem(cli_stages.STAGES, "processor", _Recorder)  # type: ignore[arg-type]
    monkeypatch.setattr(testbed_stage, "run_stage", _run_stage_without_hooks)
    result = CliRunner().invoke(testbed_stage.main, ["processor", "--instance", "1"])
    assert result.exit_code == 0, result.output
    settings, instance = _Recorder.built[-1]
    assert (settings.clock, settings.testbed, instance) == ("manual", True, "1")
    check_stage_clock(settings.clock, testbed=settings.testbed)


def _run_stage_without_hooks(component: str, instance: str | None, hooks_for: object) -> None:
    cli_stages.run_stage(component, instance)
