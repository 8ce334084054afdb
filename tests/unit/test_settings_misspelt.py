"""A misspelt ``LEDGER_*`` variable is named with the setting it most likely meant.

Unwarned, ``LEDGER_TOPIC_PREFX=prod`` silently runs against the default
``ledger.*`` topics.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from ledger import settings as settings_module
from ledger.settings import LedgerSettings, unknown_variables


def test_a_misspelt_setting_is_matched_to_the_closest_known_one() -> None:
    found = dict(
        unknown_variables(
            {
                "LEDGER_TOPIC_PREFX": "prod",
                "LEDGER_PARTITION_COUNT": "3",
                "LEDGER_QWXZ": "1",
                "LEDGER_PARTITIONS": "3",  # a setting
                "LEDGER_HOME": ".",  # read by the settings' defaults
                "LEDGER_KAFKA_SASL_USERNAME": "svc",  # librdkafka pass-through
                "PATH": "/bin",
            }
        )
    )
    assert found == {
        "LEDGER_TOPIC_PREFX": "LEDGER_TOPIC_PREFIX",
        "LEDGER_PARTITION_COUNT": "LEDGER_PARTITIONS",
        "LEDGER_QWXZ": None,
    }


def test_every_setting_is_known() -> None:
    env = {f"LEDGER_{name.upper()}": "x" for name in LedgerSettings.model_fields}
    assert unknown_variables(env) == []


def test_the_settings_warn_once_per_variable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(settings_module, "_warned", set())
    monkeypatch.setenv("LEDGER_TOPIC_PREFX", "prod")
    with caplog.at_level(logging.WARNING, logger="ledger.settings"):
        first = LedgerSettings()
        LedgerSettings()
    assert first.topic_prefix == "ledger"  # ignored, as the warning says
    warned = [r.getMessage() for r in caplog.records if "LEDGER_TOPIC_PREFX" in r.getMessage()]
    assert len(warned) == 1
    assert "did you mean LEDGER_TOPIC_PREFIX?" in warned[0]


def test_the_cli_warns_on_stderr_and_still_runs() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGER_")}
    env["LEDGER_TOPIC_PREFX"] = "prod"
    done = subprocess.run(
        [sys.executable, "-m", "ledger.cli", "config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "LEDGER_TOPIC_PREFX" in done.stderr
    assert "LEDGER_TOPIC_PREFIX" in done.stderr
