"""No sink can stall the others, on the real broker.

A sink that drips its every answer one byte at a time, for ever, is
registered beside a live reference sink. The live sink's operations reach a
verified outcome promptly: the dripping sink's calls end at their deadline
(``LEDGER_SINK_TIMEOUT_S``), the relay performs each sink's dispatches in a
lane of its own, and it asks a sink that used up a deadline nothing more in
that pass (its operation is parked, then held for a person).
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from consumers.reader import current_states
from ledger.contracts import PAYMENT_GATEWAY
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from producers.publisher import LedgerPublisher
from sinks.registry import SinkEndpoint, load_sinks, save_sinks
from testbed.harness import Harness
from tests.integration.test_sink_failures import publish, wait_until
from tests.integration.test_stages import approve

pytestmark = pytest.mark.integration

STOP = threading.Event()


class _Drip(socketserver.StreamRequestHandler):
    """Reads the request's headers, answers them, then drips the body for ever."""

    def handle(self) -> None:
        while self.rfile.readline() not in (b"\r\n", b""):
            pass
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            while not STOP.is_set():
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.3)
        except OSError:
            return  # the client hung up


@pytest.fixture
def dripping_sink() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Drip)
    server.daemon_threads = True
    STOP.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        STOP.set()
        server.shutdown()
        server.server_close()


def test_a_dripping_sink_does_not_hold_up_a_live_sink(
    ledger_settings: LedgerSettings, dripping_sink: str
) -> None:
    settings = ledger_settings.model_copy(
        update={"sink_timeout_s": 1.0, "sink_retry_attempts": 4, "sink_retry_backoff_s": 0.5}
    )
    harness = Harness(settings, create=False)
    pub = LedgerPublisher(settings)
    try:
        harness.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
        registry = load_sinks(settings.sinks_path())
        registry["dripbank"] = SinkEndpoint(url=dripping_sink, contract=PAYMENT_GATEWAY)
        save_sinks(settings.sinks_path(), registry)
        harness.start_all()
        harness.wait_quiescent(90)
        dripped = [f"refund:drip{n}:v1" for n in range(3)]
        live = [f"refund:live{n}:v1" for n in range(3)]
        for op in [*dripped, *live]:
            approve(pub, f"ap-{op}")
        # The dripping sink's operations first: before the change, the relay
        # sat on the first of them for as long as the drip lasted.
        for op in dripped:
            publish(pub, op, "dripbank", f"ap-{op}")
        started = time.monotonic()
        for op in live:
            publish(pub, op, "payments", f"ap-{op}")

        def state(op: str) -> object:
            return getattr(current_states(settings).get(op), "state", None)

        wait_until(
            "the live sink's operations",
            lambda: all(state(op) == S.OUTCOME_VERIFIED for op in live),
            60,
        )
        took = time.monotonic() - started
        assert all(harness.effects("payments", op) == 1 for op in live)
        # None of the dripping sink's operations can be verified: at most held.
        assert all(state(op) in (S.EFFECT_PENDING, S.UNKNOWN_OUTCOME) for op in dripped)
        # Each dispatch to the dripping sink would cost a deadline (1 s) per
        # request; the live ones may wait for one deadline per pass, no more.
        assert took < 30, f"the live sink's operations took {took:.1f} s"

        # The dripping sink's operations are held for a person, the relay alive.
        wait_until(
            "the dripping sink's operations held",
            lambda: all(state(op) == S.UNKNOWN_OUTCOME for op in dripped),
            120,
        )
        held = current_states(settings)[dripped[0]]
        assert "deadline" in held.reason, held.reason
        assert harness.alive("relay")
        assert harness.failed() == {}
    finally:
        pub.close()
        harness.stop()
