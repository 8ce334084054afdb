"""Operation identity, canonical encoding, the transition table, and core purity."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import ForbiddenTransitionError, InputBoundsError, LedgerError
from ledger.identity import (
    canonical_json,
    check_operation_id,
    digest_version,
    operation_id,
    operation_id_problem,
    parameter_digest,
)
from ledger.states import TRANSITIONS, evidence_for
from ledger.states import RecoveryState as S


def digest(**over):
    base = dict(
        action="refund",
        params={"a": 1, "b": [1, 2]},
        subject="s",
        purpose="p",
        decision_version=1,
        sink="payments",
    )
    base.update(over)
    return parameter_digest(**base)


def test_digest_ignores_key_order_but_binds_every_semantic_field() -> None:
    assert digest() == digest(params={"b": [1, 2], "a": 1})
    others = [
        digest(action="charge"),
        digest(params={"a": 2, "b": [1, 2]}),
        digest(subject="t"),
        digest(purpose="q"),
        digest(decision_version=2),
        digest(sink="refunds"),
    ]
    assert len({digest(), *others}) == 7


def test_digest_version_2_binds_the_sink_and_says_so_version_1_does_not() -> None:
    v2 = digest()
    assert v2.startswith("v2:") and len(v2) == 3 + 64 and digest_version(v2) == 2
    v1 = digest(version=1)
    assert len(v1) == 64 and digest_version(v1) == 1
    assert digest(version=1, sink="refunds") == v1  # the earlier releases' digest
    assert v1 != v2.removeprefix("v2:")
    with pytest.raises(LedgerError):
        digest(version=3)


def test_canonical_json_refuses_non_json() -> None:
    with pytest.raises(LedgerError):
        canonical_json({"x": {1, 2}})
    with pytest.raises(LedgerError):
        canonical_json({"x": float("nan")})
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'


def test_operation_id_is_stable_and_refuses_ambiguous_parts() -> None:
    assert operation_id("refund", "1842", 3) == "refund:1842:v3"
    with pytest.raises(LedgerError):
        operation_id("refund", "18:42", 3)


def test_table_forbids_leaving_unknown_outcome_on_a_timer() -> None:
    # No direct hop: a retry leaves UNKNOWN_OUTCOME through ADMITTED on a new
    # observation, two hops the fold records one by one (tests/test_fold_hops.py).
    with pytest.raises(ForbiddenTransitionError):
        evidence_for(S.UNKNOWN_OUTCOME, S.EFFECT_PENDING)
    assert evidence_for(S.EFFECT_COMMITTED, S.OUTCOME_VERIFIED)
    assert evidence_for(S.UNKNOWN_OUTCOME, S.ADMITTED)
    assert evidence_for(S.ADMITTED, S.EFFECT_PENDING)
    # Self-loops are not hops: the table has none.
    assert all(a != b for a, b in TRANSITIONS)


LEDGER = Path(__file__).parents[2] / "ledger"
PURE = [
    "identity.py",
    "states.py",
    "fold/__init__.py",
    "fold/core.py",
    "fold/intents.py",
    "fold/admissions.py",
    "fold/effects.py",
    "fold/claims.py",
    "fold/compensation.py",
    "fold/tally.py",
    "fold/dispositions.py",
    "fold/apply.py",
    "fold/journal.py",
    "outcomes.py",
    "authority.py",
    "events.py",
    "serde.py",
    "errors.py",
    "contracts.py",
]
IO_MODULES = {
    "confluent_kafka",
    "socket",
    "httpx",
    "random",
    "time",
    "datetime",
    "uuid",
    "os",
    "subprocess",
    "sqlite3",
}


@pytest.mark.parametrize("name", PURE)
def test_core_imports_no_io_clock_or_randomness(name: str) -> None:
    tree = ast.parse((LEDGER / name).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & IO_MODULES, imported & IO_MODULES


def test_every_module_of_the_fold_is_checked_for_purity() -> None:
    fold = {f"fold/{p.name}" for p in (LEDGER / "fold").glob("*.py")}
    assert "fold/core.py" in fold and fold <= set(PURE), fold - set(PURE)


def test_state_machine_module_loads_no_avro_kafka_or_settings() -> None:
    """``import ledger.states`` in a fresh interpreter pulls in none of the heavy layers."""
    probe = (
        "import sys, ledger.states; "
        "print(','.join(m for m in ('fastavro', 'confluent_kafka', 'pydantic_settings', "
        "'pydantic', 'click', 'cryptography') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"importing ledger.states loaded {out}"


@pytest.mark.parametrize(
    "op, problem",
    [
        ("refund:1842:v3", None),
        ("notify:00004:v1", None),
        ("a", None),
        ("!~" * 100, None),
        ("", "empty"),
        ("r" * 201, "201 characters"),
        ("refund 1:v1", "U+0020"),
        ("refund:26\n:v1", "U+000A"),
        ("refund:\x00:v1", "U+0000"),
        ("refund:\u202e1:v1", "U+202E"),
        ("refund:caf\u00e9:v1", "U+00E9"),
    ],
)
def test_operation_id_grammar(op: str, problem: str | None) -> None:
    found = operation_id_problem(op)
    if problem is None:
        assert found is None and check_operation_id(op) == op
    else:
        assert found is not None and problem in found
        with pytest.raises(InputBoundsError, match="refund:1842:v3"):
            check_operation_id(op)


def test_the_publisher_refuses_an_operation_id_outside_the_grammar() -> None:
    from producers.publisher import build_intent

    with pytest.raises(InputBoundsError):
        build_intent(
            operation_id="refund:26\n:v1",
            sink="payments",
            action="refund",
            params={"amount_minor": 1},
            actor="svc",
            subject="c",
            purpose="p",
            decision_version=1,
        )


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    action=st.text(),
    params=st.dictionaries(st.text(), _json_values, max_size=4),
    subject=st.text(),
    purpose=st.text(),
    decision_version=st.integers() | st.booleans(),
    sink=st.text(),
    version=st.sampled_from([1, 2]),
    checked=st.booleans(),
)
def test_digest_is_the_sha256_of_the_canonical_json_of_its_fields(
    action: str,
    params: dict,
    subject: str,
    purpose: str,
    decision_version: int,
    sink: str,
    version: int,
    checked: bool,
) -> None:
    # parameter_digest writes the outer object out itself; its text must be
    # canonical_json's of the whole object, byte for byte (sinks recompute it).
    fields = {
        "action": action,
        "decision_version": int(decision_version),
        "params": params,
        "purpose": purpose,
        "subject": subject,
        **({"sink": sink} if version == 2 else {}),
    }
    body = json.dumps(
        fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    want = hashlib.sha256(body.encode("utf-8")).hexdigest()
    got = parameter_digest(
        action=action,
        params=params,
        subject=subject,
        purpose=purpose,
        decision_version=decision_version,
        sink=sink,
        version=version,
        params_checked=checked,
    )
    assert got == (f"v2:{want}" if version == 2 else want)


def test_digest_of_fields_that_are_not_text_is_what_it_was() -> None:
    # Not text (the models never pass it): the generic canonical encoding.
    assert digest(action=None) == digest(action=None)
    assert digest(action=None) != digest(action="None")
    with pytest.raises(LedgerError):
        digest(subject=b"s")
