"""The ``http-idempotency-key`` sink adapter against a real API that follows the draft.

No Kafka: the API (:mod:`testbed.realsys.keyed_api`) runs in a child process
and its store says how many refunds (effects) it holds per operation.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.contracts import ACCOUNT_CREDITS, EffectContract
from ledger.errors import SinkAuthError, SinkConfigError
from sinks.client import SubmitResult
from sinks.port import SinkPort, open_sink
from sinks.registry import SinkEndpoint
from testbed.realsys.keyed_api import KeyedApiServer

pytestmark = pytest.mark.integration

REFUNDS = EffectContract(idempotent=True, readback=True, postcondition=True, key_retention_s=86_400)
CONFIG: dict[str, Any] = {
    "submit": {"method": "POST", "path": "/refunds"},
    "readback_path": "/refunds/by-operation/{operation_id}",
    "postcondition_path": "/accounts/{subject}",
    "committed_ms_field": "created_ms",
}


def adapter(
    server: KeyedApiServer,
    *,
    timeout_s: float = 3.0,
    token: str | None = None,
    contract: EffectContract = REFUNDS,
    **config: Any,
) -> SinkPort:
    endpoint = SinkEndpoint(
        url=server.url,
        contract=contract,
        token=token or server.token,
        adapter="http-idempotency-key",
        config={**CONFIG, **config},
    )
    return open_sink(endpoint, timeout_s=timeout_s)


def submit(
    sink: SinkPort,
    operation_id: str,
    amount_minor: int = 500,
    *,
    account: str = "acct-1",
    use_key: bool = True,
) -> SubmitResult:
    params = {"account": account, "amount_minor": amount_minor}
    return sink.submit(operation_id, "digest", params, None, "attempt", use_key)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedApiServer]:
    with KeyedApiServer(tmp_path_factory.mktemp("keyed")) as server:
        yield server


@pytest.fixture(scope="module")
def slow_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedApiServer]:
    """An API that takes 2 s to make a refund (the in-flight and deadline cases)."""
    server = KeyedApiServer(tmp_path_factory.mktemp("slow"), "slow", process_delay_ms=2000)
    with server:
        yield server


def wait_until(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_refund_is_committed_and_observed(api: KeyedApiServer) -> None:
    sink = adapter(api)
    result = submit(sink, "refund:1:v1", account="acct-observed")
    assert result.status == "committed", result
    [refund] = api.store.refunds(operation_id="refund:1:v1")
    assert result.effect_id == refund["id"]
    assert result.committed_ms == refund["created_ms"]
    back = sink.readback("refund:1:v1", None)
    assert (back.status, back.effect_id, back.effects) == ("committed", refund["id"], 1)
    credits = sink.postcondition(ACCOUNT_CREDITS, "acct-observed")
    assert credits.status == "observed"
    assert credits.credited_minor == 500
    assert [(c.operation_id, c.amount_minor, c.effect_id) for c in credits.credits] == [
        ("refund:1:v1", 500, refund["id"])
    ]
    assert sink.readback("refund:never:v1", None).status == "absent"


def test_a_replay_answers_the_same_refund_and_makes_no_second(api: KeyedApiServer) -> None:
    sink = adapter(api)
    first = submit(sink, "refund:2:v1")
    again = submit(sink, "refund:2:v1")
    assert first.status == again.status == "committed"
    assert again.effect_id == first.effect_id
    assert api.store.effects("refund:2:v1") == 1


def test_the_key_with_another_payload_is_key_reused(api: KeyedApiServer) -> None:
    sink = adapter(api)
    assert submit(sink, "refund:3:v1", 500).status == "committed"
    reused = submit(sink, "refund:3:v1", 900)
    assert (reused.status, reused.http_status) == ("key_reused", 422), reused
    assert [r["amount_minor"] for r in api.store.refunds(operation_id="refund:3:v1")] == [500]


def test_a_status_map_overrides_the_default_meaning(api: KeyedApiServer) -> None:
    sink = adapter(api, status_map={"422": "rejected"})
    assert submit(sink, "refund:map:v1", 500).status == "committed"
    assert submit(sink, "refund:map:v1", 900).status == "rejected"


def test_a_second_submit_while_the_first_is_in_flight_is_ambiguous(
    slow_api: KeyedApiServer,
) -> None:
    sink = adapter(slow_api)
    first: list[SubmitResult] = []
    worker = threading.Thread(target=lambda: first.append(submit(sink, "refund:4:v1")))
    worker.start()
    wait_until(lambda: slow_api.store.key_state("refund:4:v1") == "processing")
    second = submit(sink, "refund:4:v1")
    assert (second.status, second.http_status) == ("ambiguous", 409), second
    assert second.sent
    worker.join(timeout=10)
    assert first[0].status == "committed", first
    back = sink.readback("refund:4:v1", None)
    assert (back.status, back.effects, back.effect_id) == ("committed", 1, first[0].effect_id)
    assert slow_api.store.effects("refund:4:v1") == 1


def test_an_answer_later_than_the_deadline_is_ambiguous_and_read_back_later(
    slow_api: KeyedApiServer,
) -> None:
    sink = adapter(slow_api, timeout_s=0.5)
    started = time.monotonic()
    result = submit(sink, "refund:5:v1")
    assert result.status == "ambiguous" and result.sent, result
    assert time.monotonic() - started < 1.2
    wait_until(lambda: slow_api.store.effects("refund:5:v1") == 1)
    assert adapter(slow_api).readback("refund:5:v1", None).status == "committed"


def test_a_keyless_submit_is_not_sent_and_names_the_remedy(api: KeyedApiServer) -> None:
    result = submit(adapter(api), "refund:6:v1", use_key=False)
    assert (result.status, result.sent, result.http_status) == ("unavailable", False, 400)
    assert "idempotent: true" in result.detail
    assert api.store.effects("refund:6:v1") == 0


def test_a_contract_that_claims_more_than_the_config_answers_is_refused(
    api: KeyedApiServer,
) -> None:
    with pytest.raises(SinkConfigError, match="readback_path"):
        adapter(api, readback_path=None)
    with pytest.raises(SinkConfigError, match="postcondition_path"):
        adapter(api, postcondition_path=None)
    with pytest.raises(SinkConfigError, match="submit"):
        open_sink(
            SinkEndpoint(url=api.url, contract=REFUNDS, adapter="http-idempotency-key"),
            timeout_s=1.0,
        )


@pytest.mark.parametrize(
    ("account", "amount", "status"),
    [
        ("fail-503", 500, "unavailable"),
        ("fail-500", 500, "ambiguous"),
        ("fail-429", 500, "unavailable"),
        ("acct-1", -5, "rejected"),  # 400 with the key: the API refused the refund itself
    ],
)
def test_the_api_s_refusals_map_to_their_outcomes(
    api: KeyedApiServer, account: str, amount: int, status: str
) -> None:
    operation_id = f"refund:{account}:{amount}"
    result = submit(adapter(api), operation_id, amount, account=account)
    assert result.status == status, result
    assert result.sent
    assert api.store.effects(operation_id) == 0


def test_a_wrong_token_is_a_configuration_error(api: KeyedApiServer) -> None:
    with pytest.raises(SinkAuthError):
        submit(adapter(api, token="not-the-token"), "refund:7:v1")
    assert api.store.effects("refund:7:v1") == 0


def test_an_api_that_is_down_is_unavailable_and_not_sent(tmp_path: Path) -> None:
    server = KeyedApiServer(tmp_path, "down").start()
    server.stop()
    sink = adapter(server)
    assert not sink.health()
    result = submit(sink, "refund:8:v1")
    assert (result.status, result.sent) == ("unavailable", False), result
    assert sink.readback("refund:8:v1", None).status == "ambiguous"


def _dripping_http(stop: threading.Event, body: bytes | None) -> socket.socket:
    """Answers 200 and then drips its body a byte every 0.2 s (or one large body at once)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            if body is not None:
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                conn.sendall(head + body)
                stop.wait(5)
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            while not stop.wait(0.2):
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    return listener


@pytest.mark.parametrize("body", [None, b"{" + b" " * (2 * 1024 * 1024) + b"}"])
def test_the_deadline_and_the_size_cap_bound_every_call(body: bytes | None) -> None:
    stop = threading.Event()
    listener = _dripping_http(stop, body)
    try:
        endpoint = SinkEndpoint(
            url=f"http://127.0.0.1:{listener.getsockname()[1]}",
            contract=EffectContract(idempotent=True),
            adapter="http-idempotency-key",
            config={"submit": {"path": "/refunds"}},
        )
        started = time.monotonic()
        result = submit(open_sink(endpoint, timeout_s=1.0), "refund:9:v1")
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        listener.close()
    assert result.status == "ambiguous" and result.sent, result
    assert ("deadline" if body is None else "max_response_bytes") in result.detail
    assert elapsed < 1.8
