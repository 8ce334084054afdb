"""`ledger sink register | list | show | adapters`: the registry from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger.cli import main
from sinks.registry import load_sinks


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"LEDGER_RUN_DIR": str(tmp_path), "LEDGER_SINKS_FILE": str(tmp_path / "sinks.json")}


def _run(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.output


def test_register_list_and_show_keep_secrets_masked(env: dict[str, str]) -> None:
    code, out = _run(
        env,
        *("sink", "register", "payments", "--url", "http://gw.test:8123"),
        *("--contract", "payments", "--token", "s3cret-value"),
    )
    assert code == 0, out
    code, out = _run(
        env,
        *("sink", "register", "ledgerdb", "--adapter", "http", "--contract", "unsafe"),
        *("--url", "http://relay:hunter2@db.test:1/"),
    )
    assert code == 0, out
    saved = load_sinks(Path(env["LEDGER_SINKS_FILE"]))
    assert saved["payments"].token == "s3cret-value" and saved["payments"].adapter == "http"
    code, out = _run(env, "sink", "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["payments"]["token"] == "***" and "s3cret" not in out
    assert rows["ledgerdb"]["url"] == "http://relay:***@db.test:1/" and "hunter2" not in out
    code, out = _run(env, "sink", "show", "payments")
    assert code == 0 and "s3cret" not in out and "idempotent" in out
    code, out = _run(env, "sink", "show", "nosuch")
    assert code == 1 and "registered: ledgerdb, payments" in out


def test_register_refuses_twice_without_replace(env: dict[str, str]) -> None:
    args = ("sink", "register", "p", "--url", "http://x.test", "--contract", "payments")
    assert _run(env, *args)[0] == 0
    code, out = _run(env, *args)
    assert code == 1 and "--replace" in out
    assert _run(env, *args, "--replace")[0] == 0


def test_register_refuses_an_unknown_adapter_naming_the_known_ones(env: dict[str, str]) -> None:
    code, out = _run(
        env,
        *("sink", "register", "p", "--adapter", "telegraph", "--url", "x://y"),
        *("--contract", "unsafe"),
    )
    assert code == 1 and "telegraph" in out and "http" in out
    assert not Path(env["LEDGER_SINKS_FILE"]).exists()


def test_a_secret_named_by_variable_is_kept_as_a_reference(env: dict[str, str]) -> None:
    code, out = _run(
        env,
        *("sink", "register", "p", "--url", "http://x.test", "--contract", "payments"),
        *("--token", "${PAYMENTS_TOKEN}"),
    )
    assert code == 0, out
    assert load_sinks(Path(env["LEDGER_SINKS_FILE"]))["p"].token == "${PAYMENTS_TOKEN}"
    code, out = _run(env, "sink", "show", "p", "--probe")
    assert code == 1 and "PAYMENTS_TOKEN" in out and "is not set" in out


def test_a_sink_may_have_its_own_deadline(env: dict[str, str]) -> None:
    base = ("sink", "register", "mail", "--adapter", "smtp", "--url", "smtp://mx.test:25")
    code, out = _run(env, *base, "--contract", "unsafe", "--timeout", "0")
    assert code == 2 and "--timeout" in out
    code, out = _run(env, *base, "--contract", "unsafe", "--timeout", "4.5")
    assert code == 0, out
    saved = load_sinks(Path(env["LEDGER_SINKS_FILE"]))["mail"]
    assert saved.timeout_s == 4.5 and saved.deadline_s(2.0) == 4.5
    code, out = _run(env, "sink", "show", "mail", "--json")
    assert json.loads(out)["timeout_s"] == 4.5
    code, out = _run(
        env, "sink", "register", "p", "--url", "http://x.test", "--contract", "payments"
    )
    assert code == 0 and load_sinks(Path(env["LEDGER_SINKS_FILE"]))["p"].deadline_s(2.0) == 2.0
