"""Reference sinks: contract behaviour, faults, and durability (no Kafka needed).

Most tests run the gateway app in this process (uvicorn on a thread, a real
socket on 127.0.0.1, a manual clock in ``tmp_path``) and drive it through
:class:`SinkClient`. The faults that hang and the restart tests use a real
``python -m testbed.sinks.gateway`` subprocess (:class:`SinkProcess`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette

from ledger.clock import ManualClock
from ledger.contracts import (
    PAYMENT_GATEWAY,
    UNSAFE_SINK,
    EffectContract,
    judge_postcondition,
    postcondition_request,
)
from ledger.identity import parameter_digest
from sinks.client import SinkProtocolError, SubmitResult, postcondition_source
from testbed.sinks.admin import ReferenceSinkClient as SinkClient
from testbed.sinks.gateway import bind_socket, create_app
from testbed.sinks.process import SinkProcess
from testbed.sinks.store import FaultMode, SinkStore, StoreError

ACCOUNT = "acct-1842"
PARAMS: dict[str, object] = {"account": ACCOUNT, "amount_minor": 5000, "currency": "GBP"}

#: The bearer token of the in-process sinks.
TOKEN = "test-token-0123456789abcdef"

#: Client timeout versus the sink's fault hang (seconds): the client gives up first.
CLIENT_TIMEOUT_S = 0.3
HANG_S = 1.0


@contextmanager
def serve_in_thread(app: Starlette) -> Iterator[str]:
    """Serve ``app`` on a free 127.0.0.1 port from a thread; yield its URL."""
    sock = bind_socket(0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "sink app did not start"
            time.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@dataclass
class LocalSink:
    """An in-process sink: its client and the ledger clock it reads."""

    client: SinkClient
    clock: ManualClock


MakeSink = Callable[..., LocalSink]


@pytest.fixture
def make_sink(tmp_path: Path) -> Iterator[MakeSink]:
    """Build in-process sinks sharing one manual clock in ``tmp_path``."""
    clock = ManualClock(tmp_path / "clock")
    with ExitStack() as stack:

        def make(contract: EffectContract, name: str = "payments") -> LocalSink:
            app = create_app(
                name,
                contract,
                tmp_path / f"{name}.sqlite",
                clock,
                token=TOKEN,
                fault_injection=True,
            )
            url = stack.enter_context(serve_in_thread(app))
            client = stack.enter_context(SinkClient(url, token=TOKEN))
            return LocalSink(client, clock)

        yield make


def digest_of(params: dict[str, object], sink: str = "payments") -> str:
    """The digest the ledger binds these params to (action refund, subject and purpose fixed)."""
    return parameter_digest(
        action="refund",
        params=params,
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
        sink=sink,
    )


def submit(
    client: SinkClient,
    op: str,
    *,
    params: dict[str, object] | None = None,
    token: int | None = 1,
    attempt: str = "attempt-1",
    use_key: bool = True,
    key: str | None = None,
    sink: str = "payments",
) -> SubmitResult:
    """Submit as the relay does: the digest of ``params`` and its inputs, the key ``key or op``."""
    sent = dict(params or PARAMS)
    return client.submit(
        op,
        digest_of(sent, sink),
        sent,
        token,
        attempt,
        use_key,
        action="refund",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
        idempotency_key=key,
    )


# --- idempotency -----------------------------------------------------------------------------


def test_idempotent_replay_returns_the_same_effect_and_makes_no_second(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    first = submit(sink.client, "refund:1842:v3", attempt="a1")
    again = submit(sink.client, "refund:1842:v3", attempt="a2")

    assert first.status == "committed" and first.http_status == 201 and not first.replayed
    assert again.status == "committed" and again.http_status == 200 and again.replayed
    assert again.effect_id == first.effect_id
    assert again.committed_ms == first.committed_ms
    assert sink.client.effects() == {"refund:1842:v3": 1}
    assert sink.client.stats()["replays"] == 1


def test_key_reused_with_another_digest_is_refused_and_counted(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    assert submit(sink.client, "refund:1").status == "committed"

    drift = submit(sink.client, "refund:1", params={**PARAMS, "amount_minor": 9})

    assert drift.status == "key_reused" and drift.http_status == 409
    assert sink.client.effects() == {"refund:1": 1}
    assert sink.client.stats()["drift_rejections"] == 1


def test_a_fresh_key_per_attempt_is_a_new_effect_even_when_idempotent(
    make_sink: MakeSink,
) -> None:
    """What the checkpoint-only negative control does: the key deduplicates nothing."""
    sink = make_sink(PAYMENT_GATEWAY)
    one = submit(sink.client, "refund:1", key="refund:1:a1", attempt="a1")
    two = submit(sink.client, "refund:1", key="refund:1:a2", attempt="a2")

    assert one.effect_id != two.effect_id
    assert sink.client.effects() == {"refund:1": 2}


def test_key_expiry_makes_resubmission_a_new_effect_but_readback_still_answers(
    make_sink: MakeSink,
) -> None:
    contract = PAYMENT_GATEWAY.model_copy(update={"key_retention_s": 10})
    sink = make_sink(contract)
    first = submit(sink.client, "refund:1", attempt="a1")

    sink.clock.set_ms(9_999)  # one millisecond before the key is forgotten
    assert submit(sink.client, "refund:1", attempt="a2").effect_id == first.effect_id

    sink.clock.set_ms(10_000)
    second = submit(sink.client, "refund:1", attempt="a3")
    assert second.status == "committed" and not second.replayed
    assert second.effect_id != first.effect_id
    assert second.committed_ms == 10_000
    assert sink.client.effects() == {"refund:1": 2}

    readback = sink.client.readback("refund:1", 1)
    assert readback.status == "committed"
    assert readback.effect_id == first.effect_id  # the first effect, whatever the retention
    assert readback.effects == 2

    # The key is fresh again from 10 s: the second effect now replays.
    sink.clock.advance(5)
    assert submit(sink.client, "refund:1", attempt="a4").effect_id == second.effect_id


def test_expired_key_with_another_digest_is_a_new_effect_not_drift(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY.model_copy(update={"key_retention_s": 1}))
    submit(sink.client, "refund:1")
    sink.clock.advance(1)

    assert submit(sink.client, "refund:1", params={**PARAMS, "amount_minor": 1}).status == (
        "committed"
    )
    assert sink.client.stats()["drift_rejections"] == 0


# --- fencing ---------------------------------------------------------------------------------


def test_lower_fencing_token_is_refused_and_counted(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    assert submit(sink.client, "refund:1", token=2).status == "committed"

    stale = submit(sink.client, "refund:1", token=1)

    assert stale.status == "stale_token"
    assert stale.highest_token == 2
    assert stale.http_status == 409
    assert sink.client.stats()["stale_rejections"] == 1
    assert sink.client.effects() == {"refund:1": 1}


def test_readback_with_a_higher_token_raises_the_bar(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    submit(sink.client, "refund:1", token=1)

    assert sink.client.readback("refund:1", 5).status == "committed"
    stale_submit = submit(sink.client, "refund:1", token=4)
    stale_readback = sink.client.readback("refund:1", 3)

    assert stale_submit.status == "stale_token" and stale_submit.highest_token == 5
    assert stale_readback.status == "stale_token" and stale_readback.highest_token == 5
    assert sink.client.stats()["stale_rejections"] == 2
    # An equal token is the current owner's, and readback without a token is not fenced.
    assert sink.client.readback("refund:1", 5).status == "committed"
    assert sink.client.readback("refund:1", None).status == "committed"


def test_readback_of_an_absent_operation_still_records_its_token(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)

    assert sink.client.readback("refund:new", 7).status == "absent"
    assert submit(sink.client, "refund:new", token=6).status == "stale_token"
    assert sink.client.effects() == {}


def test_sink_without_fencing_ignores_tokens(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY.model_copy(update={"fencing": False}))
    submit(sink.client, "refund:1", token=9)

    assert submit(sink.client, "refund:1", token=1).status == "committed"
    assert sink.client.stats()["stale_rejections"] == 0


# --- unsafe sink and postcondition -----------------------------------------------------------


def test_unsafe_sink_makes_two_effects_and_offers_no_readback(make_sink: MakeSink) -> None:
    sink = make_sink(UNSAFE_SINK, name="unsafe")
    one = submit(sink.client, "refund:unsafe", attempt="a1", use_key=False, sink="unsafe")
    two = submit(sink.client, "refund:unsafe", attempt="a2", use_key=False, sink="unsafe")

    assert one.status == two.status == "committed"
    assert one.effect_id != two.effect_id
    assert not two.replayed
    assert sink.client.effects() == {"refund:unsafe": 2}
    assert sink.client.readback("refund:unsafe", 1).status == "unsupported"
    assert sink.client.account(ACCOUNT).status == "unsupported"


def test_postcondition_sums_the_credits_of_an_account(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    submit(sink.client, "refund:1", params={**PARAMS, "account": "acct-a", "amount_minor": 5000})
    submit(sink.client, "refund:1", params={**PARAMS, "account": "acct-a", "amount_minor": 5000})
    submit(sink.client, "refund:2", params={**PARAMS, "account": "acct-a", "amount_minor": 700})
    submit(sink.client, "refund:3", params={**PARAMS, "account": "acct-b", "amount_minor": 1})

    credits = sink.client.account("acct-a")

    assert credits.status == "observed"
    assert credits.credited_minor == 5700  # the replay did not credit twice
    assert [(c.operation_id, c.amount_minor) for c in credits.credits] == [
        ("refund:1", 5000),
        ("refund:2", 700),
    ]
    assert sink.client.account("acct-nobody").credited_minor == 0


def test_the_contracts_postcondition_query_asked_and_judged(make_sink: MakeSink) -> None:
    """What the relay does for a VERIFY: the contract names the query, the core judges."""
    sink = make_sink(PAYMENT_GATEWAY)
    submit(sink.client, "refund:1", params=PARAMS)
    submit(sink.client, "refund:2", params=PARAMS, key="k-1")
    submit(sink.client, "refund:2", params=PARAMS, key="k-2")  # a duplicate effect

    def verify(op: str, contract: EffectContract = PAYMENT_GATEWAY) -> tuple[str, str, str]:
        ask = postcondition_request(contract, PARAMS)
        observation = sink.client.postcondition(ask.query, ask.subject) if ask.offered else None
        status, detail = judge_postcondition(contract, PARAMS, observation, op)
        return postcondition_source(ask.query, ask.subject), status, detail

    assert verify("refund:1") == (
        f"GET /accounts/{ACCOUNT}",
        "MATCH",
        f"account {ACCOUNT} shows one credit of 5000 for the operation",
    )
    assert verify("refund:2")[1:] == (
        "MISMATCH",
        f"account {ACCOUNT} shows 2 credit(s) [5000, 5000] for the operation; expected one of 5000",
    )
    assert verify("refund:1", UNSAFE_SINK) == (
        f"GET /accounts/{ACCOUNT}",
        "UNSUPPORTED",
        "the sink offers no postcondition query",
    )
    # a contract that declares a query its sink does not answer: no observation
    unsafe = make_sink(UNSAFE_SINK, name="unsafe")
    ask = postcondition_request(PAYMENT_GATEWAY, PARAMS)
    seen = unsafe.client.postcondition(ask.query, ask.subject)
    assert judge_postcondition(PAYMENT_GATEWAY, PARAMS, seen, "refund:1") == (
        "UNKNOWN",
        "postcondition_not_supported",
    )


# --- faults that answer at once --------------------------------------------------------------


def test_reject_fault_makes_no_effect_and_fires_once(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    sink.client.arm_fault("refund:1", "reject")

    rejected = submit(sink.client, "refund:1")
    assert rejected.status == "rejected" and rejected.http_status == 422
    assert sink.client.effects() == {}

    assert submit(sink.client, "refund:1").status == "committed"
    assert sink.client.effects() == {"refund:1": 1}


def test_unavailable_fault_fires_the_armed_number_of_times(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    sink.client.arm_fault("refund:1", "unavailable", times=2)

    assert [submit(sink.client, "refund:1").status for _ in range(3)] == [
        "unavailable",
        "unavailable",
        "committed",
    ]
    assert sink.client.effects() == {"refund:1": 1}
    assert sink.client.stats()["unavailable"] == 2


def test_faults_are_per_operation(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)
    sink.client.arm_fault("refund:1", "reject")

    assert submit(sink.client, "refund:2").status == "committed"
    assert submit(sink.client, "refund:1").status == "rejected"


def test_malformed_requests_are_refused(make_sink: MakeSink) -> None:
    sink = make_sink(PAYMENT_GATEWAY)

    refused = sink.client.submit(
        "refund:1",
        "",  # empty digest
        PARAMS,
        1,
        "a1",
        True,
        action="refund",
        subject="customer-1",
        purpose="fee-remediation",
        decision_version=1,
    )
    assert (refused.status, refused.http_status) == ("rejected", 400)
    assert sink.client.effects() == {}
    with pytest.raises(SinkProtocolError):
        sink.client.arm_fault("refund:1", "explode")  # type: ignore[arg-type]


def test_store_refuses_another_sinks_database(tmp_path: Path) -> None:
    SinkStore(tmp_path / "db.sqlite", "payments").close()

    with pytest.raises(StoreError, match="belongs to sink 'payments'"):
        SinkStore(tmp_path / "db.sqlite", "unsafe")


# --- real server: hanging faults, unreachable sink, durability --------------------------------


@pytest.fixture(scope="module")
def live_sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SinkProcess]:
    run_dir = tmp_path_factory.mktemp("live-sink")
    with SinkProcess(
        "payments", PAYMENT_GATEWAY, run_dir, hang_s=HANG_S, fault_injection=True
    ) as sink:
        yield sink


@pytest.fixture
def live_client(live_sink: SinkProcess) -> Iterator[SinkClient]:
    with live_sink.client(timeout_s=CLIENT_TIMEOUT_S) as client:
        yield client


@pytest.mark.parametrize("mode", ["commit_then_drop_response", "timeout_after_commit"])
def test_lost_response_is_ambiguous_but_the_effect_committed(
    live_client: SinkClient, mode: FaultMode
) -> None:
    op = f"refund:{mode}"
    live_client.arm_fault(op, mode)

    result = submit(live_client, op)

    assert result.status == "ambiguous" and result.http_status is None
    assert live_client.effects().get(op) == 1
    assert live_client.readback(op, 1).status == "committed"
    # The retry with the same key replays instead of paying twice.
    assert submit(live_client, op, attempt="a2").replayed
    assert live_client.effects().get(op) == 1


def test_timeout_before_commit_is_ambiguous_and_makes_no_effect(live_client: SinkClient) -> None:
    op = "refund:timeout_before_commit"
    live_client.arm_fault(op, "timeout_before_commit")

    assert submit(live_client, op).status == "ambiguous"
    assert op not in live_client.effects()
    assert live_client.readback(op, 1).status == "absent"
    assert submit(live_client, op, attempt="a2").status == "committed"
    assert live_client.effects().get(op) == 1


def test_a_504_answer_is_ambiguous(live_sink: SinkProcess) -> None:
    op = "refund:504"
    with live_sink.client(timeout_s=HANG_S + 5) as patient:
        patient.arm_fault(op, "timeout_after_commit")
        result = submit(patient, op)

        assert result.status == "ambiguous" and result.http_status == 504
        assert patient.effects().get(op) == 1


def test_a_hanging_request_does_not_block_others(live_sink: SinkProcess) -> None:
    op = "refund:hang"
    done = threading.Event()
    with live_sink.client(timeout_s=HANG_S + 5) as patient, live_sink.client() as other:
        patient.arm_fault(op, "timeout_before_commit")

        def hang() -> None:
            submit(patient, op)
            done.set()

        worker = threading.Thread(target=hang)
        worker.start()
        try:
            started = time.monotonic()
            while other.stats()["timeouts"] == 0:  # wait until the hang has begun
                assert time.monotonic() - started < HANG_S
            assert submit(other, "refund:not-blocked").status == "committed"
            assert other.readback("refund:not-blocked", 1).status == "committed"
            assert not done.is_set(), "the other requests finished only after the hang"
        finally:
            worker.join()


def test_unreachable_sink_is_unavailable_for_submit_and_ambiguous_for_readback(
    tmp_path: Path,
) -> None:
    sink = SinkProcess("payments", PAYMENT_GATEWAY, tmp_path).start()
    url = sink.url
    sink.stop()

    with SinkClient(url, timeout_s=CLIENT_TIMEOUT_S) as client:
        assert submit(client, "refund:1").status == "unavailable"
        assert client.readback("refund:1", 1).status == "ambiguous"
        assert client.account(ACCOUNT).status == "ambiguous"
        assert client.health() is False


def test_effects_and_fences_survive_a_sigkill_and_restart(tmp_path: Path) -> None:
    with SinkProcess(
        "payments", PAYMENT_GATEWAY, tmp_path, hang_s=HANG_S, fault_injection=True
    ) as sink:
        with sink.client() as client:
            first = submit(client, "refund:1", token=3)
            assert client.readback("refund:1", 4).status == "committed"
            assert submit(client, "refund:1", token=2).status == "stale_token"
            client.arm_fault("refund:2", "reject", times=2)
            assert submit(client, "refund:2", token=1).status == "rejected"
        old_pid, old_port = sink.pid, sink.port

        sink.kill()
        assert not sink.is_running()
        sink.restart()

        assert sink.pid != old_pid
        assert sink.port == old_port
        with sink.client() as client:
            assert client.effects() == {"refund:1": 1}
            assert client.stats()["stale_rejections"] == 1
            replay = submit(client, "refund:1", token=4)
            assert replay.replayed and replay.effect_id == first.effect_id
            stale = submit(client, "refund:1", token=3)
            assert stale.status == "stale_token" and stale.highest_token == 4
            # The second firing of the armed fault survived the crash too.
            assert submit(client, "refund:2", token=1).status == "rejected"
            assert submit(client, "refund:2", token=1).status == "committed"

        sink.stop()  # graceful stop and start keep everything as well
        sink.restart()
        with sink.client() as client:
            assert client.effects() == {"refund:1": 1, "refund:2": 1}
            assert client.account(ACCOUNT).credited_minor == 10_000


def test_restart_moves_to_a_free_port_when_the_old_one_is_taken(tmp_path: Path) -> None:
    with SinkProcess("payments", PAYMENT_GATEWAY, tmp_path) as sink:
        with sink.client() as client:
            submit(client, "refund:1")
        old_port = sink.port
        sink.stop()
        squatter = bind_socket(old_port)
        try:
            sink.restart()
            assert sink.port != old_port
            with sink.client() as client:
                assert client.effects() == {"refund:1": 1}
        finally:
            squatter.close()
