"""``ledger reconcile run``'s text: a line per row, and what is left open (never a bare ``[]``)."""

from __future__ import annotations

from ledger.cli.reconcile_text import run_lines


def test_a_run_whose_only_open_work_is_stranded_names_it_on_stdout() -> None:
    (line,) = run_lines([], ["refund:stuck:v1"])
    assert line != "[]" and "1 operation(s) LEFT OPEN: refund:stuck:v1" in line
    assert "standard error" in line  # where its reason and remedy are


def test_each_readback_and_verification_is_a_line_and_a_clean_run_says_so() -> None:
    rows = [
        {"operation_id": "op-1", "sink": "mailer", "observed": "COMMITTED", "detail": "found"},
        {
            "operation_id": "op-2",
            "sink": "notary",
            "observed": "MATCH",
            "detail": "entry present",
            "kind": "POSTCONDITION",
        },
    ]
    lines = run_lines(rows, [])
    assert lines[0] == "op-1\tmailer\treadback COMMITTED\tfound"
    assert lines[1] == "op-2\tnotary\tverification MATCH\tentry present"
    assert lines[2].startswith("1 readback(s) and 1 verification(s) recorded; nothing left open")
    assert "and 5 more" in run_lines([], [f"op-{i}" for i in range(25)])[-1]
