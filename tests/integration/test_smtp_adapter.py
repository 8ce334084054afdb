"""The ``smtp`` sink adapter against a real SMTP server (aiosmtpd in a child process).

No Kafka: each test submits through the adapter the sink port opens and
counts what the server holds (:class:`testbed.realsys.smtp.MailStore`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledger.contracts import EffectContract
from ledger.errors import SinkConfigError
from sinks.adapters.smtp import SmtpAdapter, message_id, operation_id_of
from sinks.client import SubmitResult
from sinks.port import SinkPort, capabilities_of, open_sink
from sinks.registry import SinkEndpoint
from testbed.realsys.smtp import SmtpServer

pytestmark = pytest.mark.integration

#: What an SMTP sink can honestly declare: nothing but a notification.
NOTIFY = EffectContract(amount_field=None)


def adapter(url: str, *, timeout_s: float = 2.0, **config: object) -> SinkPort:
    endpoint = SinkEndpoint(
        url=url,
        contract=NOTIFY,
        adapter="smtp",
        config={"from": "ledger@example.invalid", **config},
    )
    return open_sink(endpoint, timeout_s=timeout_s)


def submit(port: SinkPort, operation_id: str, account: str = "acct-1") -> SubmitResult:
    return port.submit(operation_id, "digest", {"account": account}, None, "attempt", False)


@pytest.fixture(scope="module")
def mail(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmtpServer]:
    server = SmtpServer(
        tmp_path_factory.mktemp("smtp"), reject_rcpt="refused-*", tempfail_rcpt="later-*"
    )
    with server:
        yield server


def test_a_sent_message_is_committed_and_carries_the_operation_id(mail: SmtpServer) -> None:
    sink = adapter(mail.url, to_template="{account}@mail.invalid")
    before = int(time.time() * 1000)
    result = submit(sink, "notify:1842:v3")
    after = int(time.time() * 1000)
    assert result.status == "committed", result
    assert result.effect_id == "<notify=3A1842=3Av3@ledger>" == message_id("notify:1842:v3")
    assert result.committed_ms is not None and before <= result.committed_ms <= after
    [kept] = mail.store.messages("notify:1842:v3")
    assert kept["message_id"] == result.effect_id
    assert operation_id_of(kept["message_id"]) == "notify:1842:v3"
    assert kept["rcpt_tos"] == ["acct-1@mail.invalid"]
    assert kept["mail_from"] == "ledger@example.invalid"


def test_a_refused_recipient_is_rejected_and_nothing_is_held(mail: SmtpServer) -> None:
    result = submit(adapter(mail.url), "notify:refused:v1", account="refused-7")
    assert result.status == "rejected", result
    assert "550" in result.detail
    assert mail.store.count("notify:refused:v1") == 0


def test_a_transient_refusal_before_data_is_unavailable_and_not_sent(mail: SmtpServer) -> None:
    result = submit(adapter(mail.url), "notify:later:v1", account="later-7")
    assert (result.status, result.sent) == ("unavailable", False), result
    assert mail.store.count("notify:later:v1") == 0


def test_a_missing_template_parameter_sends_nothing(mail: SmtpServer) -> None:
    sink = adapter(mail.url, subject_template="Refund {amount_minor}")
    with pytest.raises(SinkConfigError, match="subject_template"):
        submit(sink, "notify:template:v1")
    assert mail.store.count("notify:template:v1") == 0


def test_a_server_that_is_down_is_unavailable_then_takes_the_retry(tmp_path: Path) -> None:
    server = SmtpServer(tmp_path, "down").start()
    server.stop()
    sink = adapter(server.url)
    assert not sink.health()
    result = submit(sink, "notify:down:v1")
    assert (result.status, result.sent) == ("unavailable", False), result
    with server.start():  # the same port again
        assert sink.health()
        assert submit(sink, "notify:down:v1").status == "committed"
        assert server.store.count("notify:down:v1") == 1


@pytest.mark.parametrize(("reply", "status"), [(554, "rejected"), (451, "unavailable")])
def test_a_refusal_of_the_message_itself_is_no_effect(
    tmp_path: Path, reply: int, status: str
) -> None:
    with SmtpServer(tmp_path, data_reply=reply) as server:
        result = submit(adapter(server.url), "notify:data:v1")
        assert result.status == status, result
        assert result.status == "rejected" or not result.sent
        assert str(reply) in result.detail
        assert server.store.count("notify:data:v1") == 0


def test_a_reply_later_than_the_deadline_is_ambiguous_and_the_server_holds_it(
    tmp_path: Path,
) -> None:
    with SmtpServer(tmp_path, reply_delay_ms=4000) as server:
        started = time.monotonic()
        result = submit(adapter(server.url, timeout_s=1.0), "notify:late:v1")
        elapsed = time.monotonic() - started
        assert result.status == "ambiguous", result
        assert elapsed < 2.0
        assert server.store.count("notify:late:v1") == 1  # taken: resending would be a second


def _dripping_smtp(stop: threading.Event) -> tuple[socket.socket, threading.Thread]:
    """A server that greets, then answers EHLO with a continuation line every 0.2 s."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"220 drip.invalid ESMTP\r\n")
            conn.recv(1024)
            while not stop.wait(0.2):
                try:
                    conn.sendall(b"250-still talking\r\n")
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_the_deadline_bounds_the_whole_call_not_each_read() -> None:
    stop = threading.Event()
    listener, thread = _dripping_smtp(stop)
    try:
        url = f"smtp://127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        result = submit(adapter(url, timeout_s=1.0), "notify:drip:v1")
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()
    assert (result.status, result.sent) == ("unavailable", False), result
    assert "deadline" in result.detail
    assert elapsed < 1.8


def test_the_kind_declares_nothing_it_cannot_do(mail: SmtpServer) -> None:
    caps = capabilities_of("smtp")
    assert not (caps.idempotent or caps.readback or caps.postcondition or caps.fencing)
    assert isinstance(adapter(mail.url), SmtpAdapter)
    claims = SinkEndpoint(
        url=mail.url, contract=NOTIFY.model_copy(update={"readback": True}), adapter="smtp"
    )
    with pytest.raises(SinkConfigError, match="readback"):
        open_sink(claims, timeout_s=1.0)
    assert adapter(mail.url).readback("notify:1842:v3", None).status == "unsupported"
