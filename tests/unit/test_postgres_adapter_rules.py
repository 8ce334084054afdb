"""The postgres adapter's rules that need no server: what a failure means, its config, its kind."""

from __future__ import annotations

import psycopg
import pytest

from ledger.contracts import EffectContract
from ledger.errors import SinkConfigError
from sinks.adapters.postgres import PostgresAdapter
from sinks.adapters.postgres_call import Deadline, classify, session_options
from sinks.adapters.postgres_schema import Settings
from sinks.port import SinkPort, capabilities_of, open_sink
from sinks.registry import SinkEndpoint


def _server_error(sqlstate: str) -> psycopg.Error:
    """An error as psycopg raises it for a server's answer with this SQLSTATE."""
    return psycopg.errors.lookup(sqlstate)(f"server said {sqlstate}")


def test_before_commit_nothing_can_have_committed() -> None:
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    for phase in ("book", "effect", "record"):
        failure = classify(phase, lost, fired=False, timeout_s=2.0)
        assert failure.verdict == "unavailable" and "no effect" in failure.detail
    timed_out = classify("effect", lost, fired=True, timeout_s=1.5)
    assert timed_out.verdict == "unavailable" and "no answer within 1.5 s" in timed_out.detail


def test_after_commit_only_the_servers_word_rules_the_effect_out() -> None:
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    assert classify("commit", lost, fired=False, timeout_s=2.0).verdict == "ambiguous"
    # A deadline that passed is no answer, even if an error with a SQLSTATE follows.
    late = _server_error("23505")
    assert classify("commit", late, fired=True, timeout_s=2.0).verdict == "ambiguous"
    assert classify("commit", late, fired=False, timeout_s=2.0).verdict == "rejected"
    assert classify("commit", _server_error("40001"), fired=False, timeout_s=2.0).verdict == (
        "unavailable"
    )
    # The server shutting the session down during COMMIT says nothing of the commit.
    assert classify("commit", _server_error("57P01"), fired=False, timeout_s=2.0).verdict == (
        "ambiguous"
    )


def test_the_database_refusing_the_effect_is_a_rejection_but_a_timeout_is_not() -> None:
    for refusal in ("23514", "23505", "22003", "P0001", "42P01"):
        failure = classify("effect", _server_error(refusal), fired=False, timeout_s=2.0)
        assert failure.verdict == "rejected" and failure.sqlstate == refusal
    for transient in ("57014", "40P01", "55P03", "53300", "08006"):
        failure = classify("effect", _server_error(transient), fired=False, timeout_s=2.0)
        assert failure.verdict == "unavailable"
    missing = psycopg.ProgrammingError("query parameter missing: currency")
    assert classify("effect", missing, fired=False, timeout_s=2.0).verdict == "rejected"


def test_the_adapters_own_statements_failing_on_the_schema_is_configuration() -> None:
    assert classify("book", _server_error("42P01"), fired=False, timeout_s=2.0).verdict == "config"
    assert classify("book", _server_error("42501"), fired=False, timeout_s=2.0).verdict == "config"
    assert classify("record", _server_error("23505"), fired=False, timeout_s=2.0).verdict == (
        "key_reused"
    )
    assert classify("book", _server_error("22003"), fired=False, timeout_s=2.0).verdict == (
        "rejected"
    )


def test_the_budget_reaches_the_server_and_the_connect() -> None:
    options = session_options(1.5, "-c search_path=app")
    assert options.startswith("-c search_path=app ")
    assert "statement_timeout=1500" in options and "lock_timeout=1500" in options
    assert "idle_in_transaction_session_timeout=3000" in options
    assert Deadline(0.5).connect_timeout_s() == 2  # libpq's floor
    assert Deadline(4.2).connect_timeout_s() == 5


def test_config_keys_are_checked_naming_the_known_ones() -> None:
    assert Settings.from_config({}).operations_table == "ledger_operations"
    with pytest.raises(SinkConfigError, match="unknown keys \\['effect'\\]"):
        Settings.from_config({"effect": "INSERT ..."})
    with pytest.raises(SinkConfigError, match="create_schema"):
        Settings.from_config({"create_schema": "yes"})
    with pytest.raises(SinkConfigError, match="schema.table"):
        Settings.from_config({"operations_table": "a.b.c"})
    qualified = Settings.from_config({"operations_table": "app.ops"})
    assert qualified.fences().as_string(None) == '"app"."ops_fences"'


def test_the_postgres_kind_opens_without_connecting_and_declares_no_reservations() -> None:
    endpoint = SinkEndpoint(
        url="postgresql://ledger:s3cret@127.0.0.1:1/ledger",
        contract=EffectContract(),
        adapter="postgres",
    )
    adapter = open_sink(endpoint, timeout_s=0.5)
    try:
        assert isinstance(adapter, PostgresAdapter) and isinstance(adapter, SinkPort)
        assert "s3cret" not in adapter.name
        assert adapter.read_hold("op-1").status == "unsupported"
        refused = adapter.readback("op-1", None)
        assert refused.status == "ambiguous" and not refused.sent
        assert "s3cret" not in refused.detail
    finally:
        adapter.close()
    caps = capabilities_of("postgres")
    assert caps.idempotent and caps.readback and caps.postcondition and caps.fencing
    assert not caps.reservation


def test_a_url_that_is_no_dsn_is_a_configuration_error() -> None:
    with pytest.raises(SinkConfigError, match="not a PostgreSQL DSN"):
        PostgresAdapter("http://127.0.0.1:8123", {}, timeout_s=1.0)


def test_the_test_server_names_the_remedy_when_postgresql_is_missing() -> None:
    from testbed.errors import SinkStartError
    from testbed.realsys.postgres import PostgresServer, find_bin

    with pytest.raises(SinkStartError, match="apt-get install postgresql"):
        find_bin("pg_no_such_program")
    with pytest.raises(SinkStartError, match="lower-case"):
        PostgresServer('ledger"; DROP')
