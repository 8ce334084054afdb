"""The pure parts of item 2 of issue 13: exit codes, --until's states, ages, resting states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli import main
from ledger.cli.common import (
    EXIT_BROKER_UNREACHABLE,
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_TOPICS_MISSING,
    EXIT_USAGE,
    bootstrap_in_force,
    exit_code_for,
)
from ledger.clock import age_s
from ledger.errors import (
    BrokerUnavailableError,
    InputBoundsError,
    LedgerError,
    OperationEndedElsewhereError,
    ParameterDriftError,
    TopicConfigError,
)
from ledger.events import OperationState
from ledger.states import RESTING, TERMINAL, TRANSITIONS, RecoveryState
from producers.waiting import parse_states, verdict
from tests import helpers

S = RecoveryState


def _state(state: RecoveryState) -> OperationState:
    return helpers.state(state=state, reason="because")


def test_exit_codes_are_distinct_and_each_error_kind_has_its_own() -> None:
    assert len(EXIT_CODES) == len(set(EXIT_CODES)) == 9
    assert exit_code_for(BrokerUnavailableError("down")) == EXIT_BROKER_UNREACHABLE
    missing = TopicConfigError("topics not created", config="existence")
    assert exit_code_for(missing) == EXIT_TOPICS_MISSING
    assert exit_code_for(TopicConfigError("bad policy", config="cleanup.policy")) == EXIT_ERROR
    assert exit_code_for(LedgerError("other")) == EXIT_ERROR
    # A value of the wrong form (an operation ID outside the grammar) is bad input.
    assert exit_code_for(InputBoundsError("refund 5001")) == EXIT_USAGE


def test_an_operation_id_outside_the_grammar_exits_as_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("LEDGER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    args = ["intent", "publish", "--operation-id", "refund 5001", "--sink", "payments"]
    args += ["--action", "refund", "--params", '{"amount_minor": 1}', "--actor", "svc"]
    args += ["--subject", "c", "--purpose", "p", "--decision-version", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert "U+0020" in result.output, result.output


def test_help_lists_every_exit_code() -> None:
    out = CliRunner().invoke(main, ["--help"]).output
    for code, meaning in EXIT_CODES.items():
        assert f"  {code}  {meaning}\n" in out


def test_terminal_states_are_those_no_transition_leaves() -> None:
    assert TERMINAL == {S.OUTCOME_VERIFIED, S.ABANDONED}
    assert all(f not in TERMINAL for f, _ in TRANSITIONS)
    assert RESTING == TERMINAL | {S.NEEDS_REAUTHORISATION, S.UNKNOWN_OUTCOME}


def test_parse_states_reads_names_case_insensitively_and_refuses_others() -> None:
    assert parse_states("outcome_verified, EFFECT_COMMITTED") == {
        S.OUTCOME_VERIFIED,
        S.EFFECT_COMMITTED,
    }
    with pytest.raises(ValueError, match="not a recovery state: DONE"):
        parse_states("OUTCOME_VERIFIED,done")
    with pytest.raises(ValueError, match="at least one"):
        parse_states(" , ")


def test_verdict_returns_a_wanted_state_waits_through_others_and_fails_on_resting() -> None:
    wanted = frozenset({S.OUTCOME_VERIFIED})
    assert verdict(None, wanted) is None
    assert verdict(_state(S.EFFECT_PENDING), wanted) is None
    reached = _state(S.OUTCOME_VERIFIED)
    assert verdict(reached, wanted) is reached
    for resting in (S.NEEDS_REAUTHORISATION, S.ABANDONED, S.UNKNOWN_OUTCOME):
        with pytest.raises(OperationEndedElsewhereError) as caught:
            verdict(_state(resting), wanted)
        assert caught.value.observed == resting
        assert caught.value.operation_id == "refund:1:v1"
    # A resting state that is asked for is reached, not "elsewhere".
    held = _state(S.UNKNOWN_OUTCOME)
    assert verdict(held, frozenset({S.UNKNOWN_OUTCOME, S.OUTCOME_VERIFIED})) is held


def test_verdict_refuses_a_state_bound_to_another_digest_than_the_intent_waited_on() -> None:
    """A reused operation ID with other parameters is refused as drift; the earlier
    request's OUTCOME_VERIFIED is not an answer to it."""
    wanted = frozenset({S.OUTCOME_VERIFIED})
    earlier = _state(S.OUTCOME_VERIFIED).model_copy(update={"parameter_digest": "v2:" + "a" * 64})
    with pytest.raises(ParameterDriftError) as caught:
        verdict(earlier, wanted, "v2:" + "b" * 64)
    assert caught.value.observed == earlier.parameter_digest
    assert "PARAMETER_DRIFT" in caught.value.message
    assert verdict(earlier, wanted, earlier.parameter_digest) is earlier
    # A digest of another version cannot be compared here: not refused.
    assert verdict(earlier, wanted, "b" * 64) is earlier


def test_ages_are_never_negative() -> None:
    assert age_s(10_000, 4_000) == 6.0
    assert age_s(4_000, 10_000) == 0.0
    assert age_s(4_000, None) is None


def test_until_refuses_an_unknown_state_as_bad_input() -> None:
    result = CliRunner().invoke(
        main,
        [
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
            "a",
            "--subject",
            "s",
            "--purpose",
            "p",
            "--decision-version",
            "1",
            "--until",
            "FINISHED",
        ],
    )
    assert result.exit_code == 2
    assert "not a recovery state: FINISHED" in result.output


def test_config_prints_resolved_paths_and_where_each_value_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("LEDGER_SINKS_FILE", "LEDGER_KEYS_DIR", "LEDGER_TRUSTED_KEYS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LEDGER_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", "cfg")
    result = CliRunner().invoke(main, ["config"])
    assert result.exit_code == 0, result.output
    assert "=None" not in result.output
    assert f"LEDGER_SINKS_FILE={tmp_path / 'sinks.json'}  # default: LEDGER_RUN_DIR" in (
        result.output
    )
    assert f"LEDGER_KEYS_DIR={tmp_path / 'keys'}  # default" in result.output
    assert "LEDGER_TOPIC_PREFIX=cfg  # LEDGER_TOPIC_PREFIX" in result.output
    document = json.loads(CliRunner().invoke(main, ["config", "--json"]).output)
    by_name = {row["variable"]: row for row in document["settings"]}
    assert by_name["LEDGER_RUN_DIR"] == {
        "variable": "LEDGER_RUN_DIR",
        "value": str(tmp_path),
        "source": "LEDGER_RUN_DIR",
    }
    assert by_name["LEDGER_TRUSTED_KEYS_FILE"]["value"] == str(tmp_path / "trusted_keys.json")


def test_help_names_the_broker_in_force() -> None:
    assert bootstrap_in_force({"LEDGER_KAFKA_PORT": "39292"}) == (
        "127.0.0.1:39292 (LEDGER_KAFKA_PORT)"
    )
    assert bootstrap_in_force({}) == "127.0.0.1:19092 (default port)"
    assert bootstrap_in_force(
        {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "LEDGER_KAFKA_PORT": "39292"}
    ) == ("k:9092 (KAFKA_BOOTSTRAP_SERVERS)")
