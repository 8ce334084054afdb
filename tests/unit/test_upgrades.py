"""Upgrades: the release manifest, and which resumes a new contract version may make."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.audit.invariants import unstamped
from ledger.contracts import PAYMENT_GATEWAY, UNSAFE_SINK, EffectContract
from ledger.events import Dispatch, OperationState
from ledger.serde import schema_files
from ledger.states import RecoveryState as S
from ledger.upgrades import (
    IN_FLIGHT,
    ReleaseManifest,
    attempted_version,
    state_of_step,
    stranded_by,
    upgrade_hold,
)
from sinks.registry import SinkEndpoint, load_manifest, load_sinks, save_sinks

MANIFEST_FILE = Path(__file__).resolve().parents[2] / "deploy" / "release-manifest.json"
MANIFEST = load_manifest(MANIFEST_FILE)
V2 = MANIFEST.sinks["payments"].versions["2"].contract
V3 = MANIFEST.sinks["payments"].versions["3"].contract


def test_manifest_matches_the_code_contracts() -> None:
    assert MANIFEST.sinks["payments"].versions["1"].contract == PAYMENT_GATEWAY
    assert MANIFEST.sinks["unsafe"].versions["1"].contract == UNSAFE_SINK


def test_manifest_names_every_current_schema_version() -> None:
    current = {}
    for path in schema_files():
        raw = json.loads(path.read_text())
        current[raw["name"]] = raw.get("version", 1)
    assert MANIFEST.schemas == current, (
        "deploy/release-manifest.json 'schemas' must list every schema's current version"
    )


def test_manifest_resumes_only_from_earlier_versions() -> None:
    bad = {
        "release": "x",
        "sinks": {"s": {"versions": {"1": {"contract": {}, "resumes": {"2": ["ADMITTED"]}}}}},
    }
    with pytest.raises(ValueError, match="not an earlier version"):
        ReleaseManifest.model_validate(bad)
    with pytest.raises(ValueError):
        ReleaseManifest.model_validate(
            {
                "release": "x",
                "sinks": {
                    "s": {
                        "versions": {
                            "1": {"contract": {}},
                            "2": {"contract": {}, "resumes": {"1": ["OUTCOME_VERIFIED"]}},
                        }
                    }
                },
            }
        )


def test_same_version_is_never_held() -> None:
    assert (
        upgrade_hold(
            None, "payments", from_version=1, to_version=1, contract=V2, state="EFFECT_PENDING"
        )
        is None
    )


def test_a_state_the_manifest_does_not_list_is_held_naming_both_versions() -> None:
    reason = upgrade_hold(
        MANIFEST, "payments", from_version=1, to_version=2, contract=V2, state="EFFECT_PENDING"
    )
    assert reason is not None
    assert "version 1" in reason and "version 2" in reason and "EFFECT_PENDING" in reason


def test_a_state_the_manifest_lists_goes_on() -> None:
    assert (
        upgrade_hold(
            MANIFEST, "payments", from_version=1, to_version=2, contract=V2, state="ADMITTED"
        )
        is None
    )
    for state in IN_FLIGHT:
        assert (
            upgrade_hold(
                MANIFEST, "payments", from_version=1, to_version=3, contract=V3, state=state
            )
            is None
        )


def test_a_registry_contract_other_than_the_manifests_is_held() -> None:
    other = V3.model_copy(update={"key_retention_s": 5})
    reason = upgrade_hold(
        MANIFEST, "payments", from_version=1, to_version=3, contract=other, state="ADMITTED"
    )
    assert reason is not None and "differs" in reason


def test_unknown_version_or_no_manifest_is_held() -> None:
    unknown = upgrade_hold(
        MANIFEST, "payments", from_version=1, to_version=9, contract=V3, state="ADMITTED"
    )
    assert unknown is not None and "lists no contract version 9" in unknown
    none = upgrade_hold(
        None, "payments", from_version=1, to_version=2, contract=V2, state="ADMITTED"
    )
    assert none is not None and "no release manifest" in none


def test_state_of_step() -> None:
    assert state_of_step("EXECUTE", may_have_left=False) == "ADMITTED"
    assert state_of_step("EXECUTE", may_have_left=True) == "EFFECT_PENDING"
    assert state_of_step("READBACK", may_have_left=True) == "UNKNOWN_OUTCOME"
    assert state_of_step("VERIFY", may_have_left=False) == "EFFECT_COMMITTED"


def _state(op: str, state: S, sink: str = "payments", admitted_at_ms: int = 0) -> OperationState:
    return OperationState(
        operation_id=op,
        state=state,
        version=3,
        epoch=1,
        parameter_digest="d",
        sink=sink,
        action="refund",
        params_json="{}",
        actor="a",
        subject="s",
        purpose="p",
        decision_version=1,
        amount_minor=100,
        admitted_at_ms=admitted_at_ms,
    )


STATES = [
    _state("pending", S.EFFECT_PENDING),
    _state("admitted", S.ADMITTED),
    _state("unknown", S.UNKNOWN_OUTCOME),
    _state("done", S.OUTCOME_VERIFIED),
    _state("elsewhere", S.EFFECT_PENDING, sink="mailer"),
]


def test_check_lists_what_a_release_without_readback_strands() -> None:
    found = stranded_by(
        STATES, MANIFEST, "payments", current_version=1, proposed_version=2, proposed=V2, now_ms=0
    )
    assert [(s.operation_id, s.state) for s in found] == [
        ("pending", "EFFECT_PENDING"),
        ("unknown", "UNKNOWN_OUTCOME"),
    ]
    assert all("version 1" in s.reason and "version 2" in s.reason for s in found)


def test_check_passes_a_release_the_manifest_allows() -> None:
    assert (
        stranded_by(
            STATES,
            MANIFEST,
            "payments",
            current_version=1,
            proposed_version=3,
            proposed=V3,
            now_ms=10**9,
        )
        == []
    )


def test_check_applies_the_contract_rules_when_the_manifest_allows() -> None:
    # A manifest that allows every resume still cannot make a short key retention
    # cover an operation older than it, on a sink without readback.
    lax = ReleaseManifest.model_validate(
        {
            "release": "lax",
            "sinks": {
                "payments": {
                    "versions": {
                        "1": {"contract": PAYMENT_GATEWAY.model_dump()},
                        "2": {"contract": V2.model_dump(), "resumes": {"1": list(IN_FLIGHT)}},
                    }
                }
            },
        }
    )
    young = stranded_by(
        STATES, lax, "payments", current_version=1, proposed_version=2, proposed=V2, now_ms=1_000
    )
    assert young == []
    old = stranded_by(
        STATES,
        lax,
        "payments",
        current_version=1,
        proposed_version=2,
        proposed=V2,
        now_ms=120_000,
    )
    assert [s.operation_id for s in old] == ["pending", "unknown"]
    assert all("key retention" in s.reason for s in old)


def test_registry_keeps_the_contract_version(tmp_path: Path) -> None:
    path = tmp_path / "sinks.json"
    save_sinks(
        path,
        {
            "a": SinkEndpoint(url="http://x", contract=EffectContract()),
            "b": SinkEndpoint(url="http://y", contract=V2, contract_version=2),
        },
    )
    loaded = load_sinks(path)
    assert loaded["a"].contract_version == 1
    assert loaded["b"].contract_version == 2


def test_the_audit_compares_dispatches_without_the_processors_stamp() -> None:
    d = Dispatch(
        dispatch_id="op#1.1",
        operation_id="op",
        kind="EXECUTE",
        sink="payments",
        action="refund",
        params_json="{}",
        parameter_digest="d",
        fencing_token=1,
        state_version=2,
    )
    stamped = d.model_copy(update={"contract_version": 2, "schema_versions_json": "{}"})
    assert stamped != d
    assert unstamped(stamped) == d
    assert unstamped(stamped.model_copy(update={"fencing_token": 2})) != d


def _dispatch(kind: str, version: int | None) -> Dispatch:
    return Dispatch(
        dispatch_id="op#2.3",
        operation_id="op",
        kind=kind,  # type: ignore[arg-type]
        sink="payments",
        action="refund",
        params_json="{}",
        parameter_digest="d",
        fencing_token=2,
        state_version=3,
        contract_version=version,
    )


def test_a_fresh_execution_resumes_from_the_version_it_was_dispatched_under() -> None:
    d = _dispatch("EXECUTE", 4)
    assert attempted_version(d, may_have_left=False, operation_attempt=1) == 4
    assert attempted_version(_dispatch("EXECUTE", None), may_have_left=False) == 1


def test_a_readback_dispatched_after_the_upgrade_resumes_from_the_attempts_version() -> None:
    """A readback stamped 4 of an effect attempted under 1 is a step from 1 (the hole it closes)."""
    readback = _dispatch("READBACK", 4)
    assert attempted_version(readback, may_have_left=False, operation_attempt=1) == 1
    assert attempted_version(readback, may_have_left=False) == 4  # never attempted: its own
    resumed = _dispatch("EXECUTE", 4)
    both = {"dispatch_attempt": 3, "operation_attempt": 1}
    assert attempted_version(resumed, may_have_left=True, **both) == 1
    held = upgrade_hold(
        MANIFEST,
        "payments",
        from_version=attempted_version(readback, may_have_left=False, operation_attempt=1),
        to_version=4,
        contract=MANIFEST.sinks["payments"].versions["4"].contract,
        state="UNKNOWN_OUTCOME",
    )
    assert held is not None and "from version 1 to version 4" in held
