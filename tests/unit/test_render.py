"""The shared Jinja2 environment: escaping, the fmt filter, the macros."""

from __future__ import annotations

import jinja2
import pytest

from ledger.reports.render import environment, fmt, render


def test_values_are_escaped_and_svg_marked_safe_is_not() -> None:
    page = (
        environment()
        .from_string(
            '{% import "macros.html.j2" as m %}{{ m.table(["op"], [[op]]) }}{{ m.plot(svg) }}'
        )
        .render(op="<script>x</script>", svg="<svg></svg>")
    )
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert '<div class="plot"><svg></svg></div>' in page


def test_a_name_missing_from_the_context_is_an_error() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render("base.html.j2")


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "—"), (True, "yes"), (3, "3"), (2.0, "2"), (0.123456, "0.1235"), (1234.5, "1234")],
)
def test_fmt(value: object, text: str) -> None:
    assert fmt(value) == text
