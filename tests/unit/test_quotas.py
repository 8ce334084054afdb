"""Client quotas of the ACL plan (issue 29: a service could grow the journal without bound)."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

from ledger import acl, quotas
from ledger.cli import main
from ledger.errors import LedgerError

NAMES = acl.principal_names()


def test_the_services_and_people_are_bounded_and_the_stages_are_not() -> None:
    planned = {q.role: q for q in quotas.plan_quotas(NAMES)}
    assert set(planned) == {"service", "reviewer", "operator"}
    assert planned["service"].principal == "User:service"
    assert set(planned["service"].values) == set(quotas.KEYS)
    for stage in ("processor", "authority", "relay"):
        assert stage not in planned


def test_overrides_change_or_remove_a_value_and_bad_ones_are_refused() -> None:
    overrides = quotas.parse_overrides(
        ["service:producer_byte_rate=2097152", "reviewer:producer_byte_rate=0"]
    )
    planned = {q.role: q for q in quotas.plan_quotas(NAMES, overrides)}
    assert planned["service"].values["producer_byte_rate"] == 2097152
    assert "producer_byte_rate" not in planned["reviewer"].values
    for bad in ("service:producer_byte_rate", "service:request_rate=5", "producer_byte_rate=5"):
        with pytest.raises(LedgerError, match="ROLE:KEY=BYTES_PER_SECOND"):
            quotas.parse_overrides([bad])
    with pytest.raises(LedgerError, match="unknown role"):
        quotas.plan_quotas(NAMES, {"nobody": {"producer_byte_rate": 1}})


def test_the_commands_set_each_user_quota() -> None:
    planned = quotas.plan_quotas({**NAMES, "operator": "Group:ops"})
    lines = quotas.kafka_configs_commands(planned, command_config="admin.properties")
    service = next(line for line in lines if "--entity-name service" in line)
    args = shlex.split(service.replace("$BOOTSTRAP", "b:9092"))
    assert args[args.index("--add-config") + 1] == ",".join(
        f"{k}={v}" for k, v in sorted(quotas.DEFAULT_QUOTAS["service"].items())
    )
    assert any(line.startswith("# Group:ops") for line in lines)  # not a user: said, not set


def test_check_reads_what_kafka_configs_describes() -> None:
    planned = quotas.plan_quotas(NAMES)
    service = quotas.DEFAULT_QUOTAS["service"]
    described = quotas.parse_described(
        "Quota configs for user-principal 'service' are consumer_byte_rate=1.0, "
        f"producer_byte_rate={float(service['producer_byte_rate'])}\n"
        "Quota configs for user-principal 'reviewer' are producer_byte_rate=262144.0\n"
        "some log line\n"
    )
    assert described["service"]["producer_byte_rate"] == service["producer_byte_rate"]
    problems = quotas.quota_problems(planned, described)
    assert any(p.startswith("User:service: consumer_byte_rate is 1,") for p in problems)
    assert any(p.startswith("User:operator: no producer_byte_rate") for p in problems)
    assert not any("service: producer_byte_rate" in p for p in problems)
    exact = {
        q.user: {k: float(v) for k, v in q.values.items()} for q in planned if q.user is not None
    }
    assert quotas.quota_problems(planned, exact) == []


def test_acl_plan_prints_the_kafka_configs_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_TOPIC_PREFIX", "tq")
    result = CliRunner().invoke(main, ["acl", "plan", "--format", "kafka-configs"])
    assert result.exit_code == 0, result.output
    assert "--entity-type users --entity-name service --add-config" in result.output
