"""HTML from Jinja2 templates: one environment for every page the ledger renders.

The audit page, an operation's history, the operator console and the
testbed's mission reports are all templates (``ledger/templates/*.html.j2``,
shipped in the wheel; the testbed adds its own folder with
``environment("testbed")``). Autoescaping is on: values are escaped unless a
template marks them ``|safe`` (inline SVG plots rendered by matplotlib are the
one such value). The shared layout is ``base.html.j2`` (``{% block body %}``),
the shared pieces are the macros in ``macros.html.j2`` (tables, badges, plots).

Needs only Jinja2 (a core dependency): plots come from
:mod:`ledger.reports.plots`, which needs matplotlib (the ``[plots]`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import cache
from typing import Any

from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined, select_autoescape

__all__ = ["environment", "fmt", "render"]


def fmt(value: Any) -> str:
    """A value as display text (not yet escaped).

    Integers plainly, floats to 4 significant digits (whole numbers without a fraction), ``None`` as
    a dash, booleans as yes/no, mappings as ``k: v, ...`` and sequences comma-joined.
    """
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        if abs(value) >= 1000:
            return f"{value:.0f}"
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


@cache
def environment(*packages: str) -> Environment:
    """The Jinja2 environment for templates of ``packages``, then the ledger's own.

    The Jinja2 environment for templates of ``packages`` (each a package
    with a ``templates`` folder, searched first) and then the ledger's own.

    Args:
        packages: extra template packages, e.g. ``("testbed",)``.

    Returns:
        A cached environment: autoescape on, undefined names raise
        (:class:`jinja2.StrictUndefined`), the ``fmt`` filter of :func:`fmt`.
    """
    loaders = [PackageLoader(p, "templates") for p in (*packages, "ledger")]
    env = Environment(
        loader=ChoiceLoader(loaders),
        autoescape=select_autoescape(enabled_extensions=("html", "j2"), default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["fmt"] = fmt
    return env


def render(template: str, /, *, packages: tuple[str, ...] = (), **context: Any) -> str:
    """Render one template to a string.

    Args:
        template: the template's name, e.g. ``"audit.html.j2"``.
        packages: extra template packages searched before the ledger's.
        context: the template's variables.

    Raises:
        jinja2.TemplateNotFound: no such template.
        jinja2.UndefinedError: the template used a name not in ``context``.
    """
    return environment(*packages).get_template(template).render(**context)
