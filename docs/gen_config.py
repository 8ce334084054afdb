"""Write the configuration reference (docs/configuration.md) from the settings class.

The page is generated, never edited by hand: one row per field of
:class:`ledger.settings.LedgerSettings`, with its environment variable, its
type, its default and the description the class's docstring gives it (the
``Attributes:`` section, Google style). The page is committed, so that it
reads on the repository's own web view too; ``make docs`` and a unit test
(run by ``make check``) refuse a page that no longer matches the class.

Usage::

    python docs/gen_config.py           # rewrite docs/configuration.md
    python docs/gen_config.py --check   # exit 1, naming the remedy, when stale

Raises:
    SystemExit: 1 with ``--check`` when the page is stale; 2 when a field has
        no description in the docstring (the remedy: describe it there).
"""

from __future__ import annotations

import argparse
import enum
import inspect
import re
import sys
import types
import typing
from pathlib import Path

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from ledger.settings import _UNSET_MEANS, OTHER_PREFIXES, OTHER_VARIABLES, LedgerSettings

PAGE = Path(__file__).resolve().parent / "configuration.md"

#: Variables read besides the ``LEDGER_``-prefixed name of a field.
_ALIASES: dict[str, tuple[str, ...]] = {"bootstrap_servers": ("KAFKA_BOOTSTRAP_SERVERS",)}

#: Defaults computed when the process starts (a ``default_factory``), in words.
_FACTORY_DEFAULTS: dict[str, str] = {
    "bootstrap_servers": "`KAFKA_BOOTSTRAP_SERVERS`, else `127.0.0.1:{kafka_port}`",
    "run_dir": "`$LEDGER_HOME/.ledger` (`LEDGER_HOME`: the current directory)",
    "kafka_home": "`$LEDGER_HOME/.cache/kafka`",
}

#: Where a path left unset resolves (what ``ledger config`` prints for it).
_PATH_DEFAULTS: dict[str, str] = {
    "sinks_file": "`run_dir/sinks.json`",
    "trusted_keys_file": "`run_dir/trusted_keys.json`",
    "keys_dir": "`run_dir/keys`",
    "outcome_public_key_file": "`keys_dir/outcome.pub`",
    "witness_file": "`run_dir/witness/journal-heads.jsonl`",
    "release_manifest_file": "none: every change of a sink's contract version holds",
}


def attribute_docs(cls: type) -> dict[str, str]:
    """Each attribute's description from a Google-style ``Attributes:`` section.

    Args:
        cls: a class whose docstring has an ``Attributes:`` section, each entry
            ``name: text`` indented one level, its continuation lines deeper.

    Returns:
        Attribute name -> its description on one line (continuations joined).
    """
    doc = inspect.getdoc(cls) or ""
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in section.splitlines():
        entry = re.match(r"^    (\w+): (.*)$", line)
        if entry:
            current = found.setdefault(entry.group(1), [])
            current.append(entry.group(2))
        elif line.startswith("        ") and current is not None:
            current.append(line.strip())
        elif line.strip():
            current = None  # a new section, or text outside an entry
    return {name: " ".join(parts) for name, parts in found.items()}


def _type_name(annotation: object) -> str:
    """A field's type as a reader writes it (``int``, ``path or none``, ``text | json``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in parts)
        return f"{inner} or none" if len(parts) < len(typing.get_args(annotation)) else inner
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(name: str, info: FieldInfo) -> str:
    """A field's default in words: the value, what a factory computes, or what none means."""
    if info.default_factory is not None:
        return _FACTORY_DEFAULTS.get(name, "computed when the process starts")
    value = info.default
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return _PATH_DEFAULTS.get(name) or _UNSET_MEANS.get(name) or "none"
    value = getattr(value, "value", value)  # an enum member shows its value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def _constraints(info: FieldInfo) -> str:
    """Bounds a value must keep (``>= 1``, ``> 0``, length), in words; empty if none."""
    words = []
    for item in info.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if getattr(item, attr, None) is not None:
                words.append(f"{sign} {getattr(item, attr)}")
        if getattr(item, "min_length", None) is not None:
            words.append(f"at least {item.min_length} characters")
        if getattr(item, "max_length", None) is not None:
            words.append(f"at most {item.max_length} characters")
    return ", ".join(words)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: docstring roles and ``code`` as `code`."""
    text = re.sub(r":(?:func|meth|mod|class|attr):`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`").replace("|", "\\|")


def render(settings_cls: type[BaseSettings] = LedgerSettings) -> str:
    """The whole page, as Markdown.

    Args:
        settings_cls: the settings class to describe (the ledger's by default).

    Raises:
        SystemExit: 2 when a field of the settings class has no description.
    """
    docs = attribute_docs(settings_cls)
    missing = [name for name in settings_cls.model_fields if name not in docs]
    if missing:
        print(
            f"gen_config: no description for {', '.join(missing)}: add each to the "
            f"Attributes section of {settings_cls.__name__}'s docstring",
            file=sys.stderr,
        )
        sys.exit(2)
    prefix = settings_cls.model_config.get("env_prefix", "")
    rows = []
    for name, info in settings_cls.model_fields.items():
        names = [f"{prefix}{name}".upper(), *_ALIASES.get(name, ())]
        variable = "<br>".join(f"`{n}`" for n in names)
        kind = _type_name(info.annotation)
        bounds = _constraints(info)
        if bounds:
            kind = f"{kind} ({bounds})"
        rows.append(f"| {variable} | {kind} | {_default(name, info)} | {_cell(docs[name])} |")
    others = ", ".join(f"`{v}`" for v in sorted(OTHER_VARIABLES))
    families = ", ".join(f"`{p}*`" for p in OTHER_PREFIXES)
    return "\n".join(
        [
            "# Configuration reference",
            "",
            "<!-- Generated by docs/gen_config.py from ledger/settings.py: do not edit;",
            "     run `python docs/gen_config.py` after changing the settings. -->",
            "",
            "Every ledger process (stage, command, demo, test) reads its settings from",
            "the environment: the variable is the field's name upper-cased, with the",
            f"prefix `{prefix}`. `ledger config` prints each value in force and where it",
            f"came from. A `{prefix}*` variable that is no setting is ignored with a",
            "warning naming the setting it most likely meant. This page is generated from",
            f"`{settings_cls.__name__}` in `{settings_cls.__module__.replace('.', '/')}.py`;",
            "[Running the parts yourself](running.md) has the same settings as a table.",
            "",
            "| variable | type | default | meaning |",
            "|---|---|---|---|",
            *rows,
            "",
            "Read outside the settings class: " + others + "; and the families " + families,
            "(librdkafka client properties, see [Connecting to your Kafka cluster](kafka.md);",
            "the testbed's switches; the MCP gateway's sink names).",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """Write the page, or with ``--check`` compare it; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when the page differs from the settings"
    )
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(
                f"{PAGE.name} is stale (ledger/settings.py changed): run "
                "`python docs/gen_config.py` and commit the page",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
