"""The configuration reference (docs/configuration.md) is generated from the settings class."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from pydantic_settings import BaseSettings, SettingsConfigDict

from ledger.settings import LedgerSettings
from tests.helpers import PROJECT_ROOT


def _generator() -> ModuleType:
    """docs/gen_config.py, loaded from its file (docs/ is no package)."""
    path = PROJECT_ROOT / "docs" / "gen_config.py"
    spec = importlib.util.spec_from_file_location("gen_config", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_the_committed_reference_matches_the_settings_class() -> None:
    page: Path = GEN.PAGE
    assert page.read_text() == GEN.render(), (
        "docs/configuration.md is stale: run `python docs/gen_config.py` and commit it"
    )


def test_every_setting_has_a_row_with_its_variable_and_description() -> None:
    page = GEN.render()
    described = GEN.attribute_docs(LedgerSettings)
    for name in LedgerSettings.model_fields:
        row = next(line for line in page.splitlines() if f"`LEDGER_{name.upper()}`" in line)
        # the description's first words, with the docstring's ``code`` as `code`
        first = described[name].replace("``", "`").split(" (")[0][:30]
        assert first in row, (name, row)
    assert "`KAFKA_BOOTSTRAP_SERVERS`" in page


class _Sample(BaseSettings):
    """A settings class for the generator.

    Attributes:
        port: the port (a number
            on two lines).
        mode: how it runs.

    Other:
        not an attribute: ignored.
    """

    model_config = SettingsConfigDict(env_prefix="SAMPLE_")

    port: int = 8080
    mode: str | None = None


def test_attributes_are_read_from_the_google_section_with_continuations() -> None:
    assert GEN.attribute_docs(_Sample) == {
        "port": "the port (a number on two lines).",
        "mode": "how it runs.",
    }
    page = GEN.render(_Sample)
    assert "| `SAMPLE_PORT` | int | `8080` | the port (a number on two lines). |" in page
    assert "| `SAMPLE_MODE` | str or none | none | how it runs. |" in page


class _Undescribed(BaseSettings):
    """A settings class whose field has no description.

    Attributes:
        port: the port.
    """

    port: int = 1
    secret: str = ""


def test_a_setting_without_a_description_is_refused_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        GEN.render(_Undescribed)
    assert stopped.value.code == 2
    assert "no description for secret" in capsys.readouterr().err
