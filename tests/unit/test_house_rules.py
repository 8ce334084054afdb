"""The house rules the code review would otherwise have to remember.

Each rule reads the product's source (``ledger``, ``consumers``, ``producers``,
``sinks``) or the tests with :mod:`ast` and names every place that breaks it:

* rooms stay small: no product file over 1,000 lines, no class over 400;
* Kafka transactions begin in one place (the runtime's transaction object),
  and consumers are made in one place (``ledger.kafka.make_consumer``, which
  the runtime's client factory and reader use);
* the CLI is the composition root: its modules import at the top, never
  inside a function;
* a topic's name is spelt once, in :class:`ledger.topology.Topic`;
* ``type: ignore`` says why; tests never replace a method on an object
  (``type: ignore[method-assign]``): a misbehaving part is injected through
  a constructor instead.

``KNOWN`` lists the places that still break a rule (none today); a rule
whose known list names a place that no longer breaks it fails too, so the
list only shrinks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from ledger.topology import Topic

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("ledger", "consumers", "producers", "sinks")

MAX_FILE_LINES = 1000
MAX_CLASS_LINES = 400

#: Places that still break a rule (rule -> names), emptied as the rooms are split.
KNOWN: dict[str, set[str]] = {
    "file_lines": set(),
    "class_lines": set(),
    "begin_transaction": set(),
    "consumer_made": set(),
    "cli_local_import": set(),
    "ignore_without_reason": set(),
    "method_assign": set(),
    "topic_literal": set(),
}


def _files(*roots: str) -> Iterator[Path]:
    for root in roots:
        yield from sorted((ROOT / root).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _check(rule: str, found: set[str]) -> None:
    known = KNOWN[rule]
    new = sorted(found - known)
    mended = sorted(known - found)
    assert not new, f"{rule}: {new}"
    assert not mended, f"{rule}: no longer broken, take them off KNOWN: {mended}"


def _calls(path: Path, attribute: str) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == attribute)
            or (isinstance(node.func, ast.Name) and node.func.id == attribute)
        )
    ]


def test_no_product_file_is_over_a_thousand_lines() -> None:
    found = {_rel(p) for p in _files(*PRODUCT) if len(p.read_text().splitlines()) > MAX_FILE_LINES}
    _check("file_lines", found)


def test_no_product_class_is_over_four_hundred_lines() -> None:
    found: set[str] = set()
    for path in _files(*PRODUCT):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.add(f"{_rel(path)}:{node.name}")
    _check("class_lines", found)


def test_transactions_begin_only_in_the_runtime_transaction() -> None:
    found = {
        _rel(p)
        for p in _files(*PRODUCT)
        if _rel(p) != "consumers/runtime/txn.py" and _calls(p, "begin_transaction")
    }
    _check("begin_transaction", found)


def test_consumers_are_made_only_by_the_client_factory_and_the_reader() -> None:
    allowed = {"ledger/kafka.py", "consumers/runtime/clients.py", "consumers/runtime/reader.py"}
    found = {_rel(p) for p in _files(*PRODUCT) if _rel(p) not in allowed and _calls(p, "Consumer")}
    _check("consumer_made", found)


def test_the_cli_imports_at_the_top_of_its_modules() -> None:
    found: set[str] = set()
    for path in _files("ledger/cli"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        found.add(_rel(path))
    _check("cli_local_import", found)


_IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<rest>.*)$")


def test_every_type_ignore_in_the_product_says_why() -> None:
    found: set[str] = set()
    for path in _files(*PRODUCT):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = _IGNORE.search(line)
            if match and not match.group("rest").strip().startswith("#"):
                found.add(f"{_rel(path)}:{number}")
    # Line numbers move with every edit: a known place is its file.
    _check("ignore_without_reason", {f.rsplit(":", 1)[0] for f in found})


def test_tests_never_replace_a_method_on_an_object() -> None:
    found = {_rel(p) for p in _files("tests") if "type: ignore[method-assign]" in p.read_text()}
    found.discard(_rel(Path(__file__)))
    _check("method_assign", found)


TOPIC_LITERAL_EXEMPT = {
    # the one place the names are spelt
    "ledger/topology.py",
}


def _topic_literals(path: Path, names: set[str]) -> list[int]:
    """Lines where a topic name is passed to a call or compared as a string literal."""
    tree = ast.parse(path.read_text())
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(a, ast.Constant) and a.value in names for a in args):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(a, ast.Constant) and a.value in names for a in sides):
                lines.append(node.lineno)
    return lines


def test_topic_names_are_spelt_only_in_the_topology() -> None:
    # Words that are also ordinary field values ("state", "policy", "claims",
    # "reconciliation", "outcomes", "heads") are checked only where a settings
    # object turns them into a topic name.
    names = {t.value for t in Topic}
    common = {"state", "policy", "claims", "reconciliation", "outcomes", "heads"}
    found: set[str] = set()
    for path in _files(*PRODUCT):
        rel = _rel(path)
        if rel in TOPIC_LITERAL_EXEMPT:
            continue
        text = path.read_text()
        if _topic_literals(path, names - common) or re.search(
            r"\.topic\(\s*\"(" + "|".join(sorted(common)) + r")\"", text
        ):
            found.add(rel)
    _check("topic_literal", found)
