"""A service with only the core dependencies publishes an intent (no extras installed).

``pip install kafka-recovery-ledger`` with no extras must be enough for a
service that only publishes intents: the console (Starlette, uvicorn), spans
over OTLP and plots are extras, and the testbed a distribution of its own.
The publishing process here runs with those modules made unimportable, as
they would be in such an install, and its intent must land on the
``intents`` topic.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib

import pytest

from consumers.reader import read_topic
from ledger.events import Intent
from ledger.settings import LedgerSettings
from testbed.harness import settings_env
from tests.helpers import PROJECT_ROOT

pytestmark = pytest.mark.integration

#: What a core install lacks: every extra's top-level modules and the testbed.
EXTRAS_ONLY = (
    "starlette",
    "uvicorn",
    "opentelemetry.exporter",
    "matplotlib",
    "psycopg",
    "aiosmtpd",
    "langgraph",
    "mcp",
    "dbos",
    "testbed",
)

PUBLISH = textwrap.dedent(
    """
    import sys
    for name in {blocked!r}:
        sys.modules[name] = None  # `import name` now raises ImportError, as if not installed
    from producers.publisher import LedgerPublisher
    from ledger.settings import LedgerSettings
    pub = LedgerPublisher(LedgerSettings())
    pub.publish(
        operation_id="refund:core-only:v1",
        sink="payments",
        action="refund",
        params={{"account": "acct-1", "amount_minor": 500, "currency": "GBP"}},
        actor="svc",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
    )
    pub.close()
    loaded = sorted(n for n in {blocked!r} if sys.modules.get(n) is not None)
    print("loaded:", loaded)
    """
)


def test_a_service_without_extras_publishes_an_intent(ledger_settings: LedgerSettings) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PUBLISH.format(blocked=EXTRAS_ONLY)],
        env=settings_env(ledger_settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout
    landed = [
        r.event
        for r in read_topic(ledger_settings, "intents")
        if isinstance(r.event, Intent) and r.event.operation_id == "refund:core-only:v1"
    ]
    assert len(landed) == 1 and json.loads(landed[0].params_json)["amount_minor"] == 500


def test_the_console_without_its_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger import extras
    from ledger.errors import MissingExtraError

    monkeypatch.setitem(extras.EXTRA_MODULES, "console", ("no_such_module_for_this_test",))
    with pytest.raises(MissingExtraError, match=r"pip install 'kafka-recovery-ledger\[console\]'"):
        extras.require_extra("console", "ledger console")


def test_the_core_dependencies_hold_no_extra() -> None:
    """The product's own dependency list leaves the console, OTLP and the testbed to extras."""
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    core = [d.split(">")[0].split("[")[0].strip() for d in project["dependencies"]]
    extras_only = {"starlette", "uvicorn", "opentelemetry-exporter-otlp-proto-http", "matplotlib"}
    assert not extras_only & set(core), core
    assert {"console", "otlp", "sink-toolkit"} <= set(project["optional-dependencies"])
