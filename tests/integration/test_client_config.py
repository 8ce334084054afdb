"""One Kafka client configuration on the real broker (issue 12, item 1).

The settings point every client at a port where no Kafka answers; only the
properties file (``LEDGER_KAFKA_CONFIG_FILE``) names the broker. The stages
(processes of their own), the publisher, the harness's readers and the CLI
then reach it, so every one of them took its properties from the file. A file
that weakens a producer is refused before a stage touches Kafka.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from consumers.reader import current_states
from ledger.cli import main as cli
from ledger.contracts import PAYMENT_GATEWAY
from ledger.kafka import bootstrap_servers
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from testbed.harness import Harness, settings_env
from tests.integration.test_stages import approve, publish

pytestmark = pytest.mark.integration


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound here but not listening: a connection to it is refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.fixture
def file_only(ledger_settings: LedgerSettings, tmp_path: Path, dead_port: int) -> LedgerSettings:
    """The test's settings, with the broker named only in a properties file."""
    path = tmp_path / "client.properties"
    path.write_text(
        "# the broker is named here and nowhere else\n"
        f"bootstrap.servers={ledger_settings.bootstrap_servers}\n"
        "client.id=ledger-file-test\n"
        "socket.timeout.ms=10000\n"
    )
    return ledger_settings.model_copy(
        update={"bootstrap_servers": f"127.0.0.1:{dead_port}", "kafka_config_file": path}
    )


def test_stages_publisher_and_cli_reach_the_broker_through_the_file_alone(
    file_only: LedgerSettings, kafka_bootstrap: str
) -> None:
    assert bootstrap_servers(file_only) == kafka_bootstrap != file_only.bootstrap_servers
    harness = Harness(file_only, create=False)
    harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
    pub = LedgerPublisher(file_only)
    op = "refund:client-config:v1"
    try:
        approve(pub)
        publish(pub, op)
        harness.start_all()
        harness.wait_quiescent(90)
        assert current_states(file_only)[op].state == S.OUTCOME_VERIFIED
        assert harness.effects("payments", op) == 1
        env = settings_env(file_only)
        result = CliRunner().invoke(cli, ["state"], env=env)
        assert result.exit_code == 0, result.output
        assert f"{op}\t{S.OUTCOME_VERIFIED}" in result.output
        stage_log = (file_only.run_dir / "logs" / "processor-0.log").read_text()
        assert f"bootstrap.servers={kafka_bootstrap} ({file_only.kafka_config_file}:2)" in (
            stage_log
        )
        shown = CliRunner().invoke(cli, ["config"], env=env)
        assert f"bootstrap.servers={kafka_bootstrap}  # {file_only.kafka_config_file}:2" in (
            shown.output
        )
    finally:
        pub.close()
        harness.stop()


def test_a_stage_refuses_a_file_that_weakens_its_producer(
    file_only: LedgerSettings, tmp_path: Path
) -> None:
    assert file_only.kafka_config_file is not None
    with file_only.kafka_config_file.open("a") as f:
        f.write("acks=1\n")
    done = subprocess.run(
        [sys.executable, "-m", "ledger.cli", "processor"],
        env=settings_env(file_only),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert f"({file_only.kafka_config_file}:5)" in done.stderr
    assert "acks=1" in done.stderr and "it must be all" in done.stderr
