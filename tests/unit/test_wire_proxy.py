"""The fault proxy: each wire fault acts once, on the operation it names, at its commit point."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from sinks.wire import FaultProxy


class _LineServer(socketserver.ThreadingTCPServer):
    """A real system in miniature: each line received is committed, then answered."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.committed: list[bytes] = []
        super().__init__(("127.0.0.1", 0), _LineHandler)


class _LineHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _LineServer)
        for line in self.rfile:
            server.committed.append(line.strip())
            self.wfile.write(b"OK " + line)


@pytest.fixture
def wire() -> Iterator[tuple[_LineServer, FaultProxy]]:
    server = _LineServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = FaultProxy("127.0.0.1", server.server_address[1]).start()
    yield server, proxy
    proxy.close()
    server.shutdown()
    server.server_close()


def _ask(port: int, line: bytes, timeout_s: float = 0.5) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(line + b"\n")
        return s.recv(1024)


def _eventually(predicate: object, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def test_without_a_fault_the_proxy_passes_everything(wire: tuple[_LineServer, FaultProxy]) -> None:
    server, proxy = wire
    assert _ask(proxy.port, b"refund:1") == b"OK refund:1\n"
    assert server.committed == [b"refund:1"]


def test_commit_then_drop_response_commits_and_answers_nothing_once(
    wire: tuple[_LineServer, FaultProxy],
) -> None:
    server, proxy = wire
    fault = proxy.arm(b"refund:2", "commit_then_drop_response")
    assert _ask(proxy.port, b"refund:1") == b"OK refund:1\n"  # another operation: untouched
    with pytest.raises(TimeoutError):
        _ask(proxy.port, b"refund:2")
    assert fault is not None and fault.fired.is_set()
    assert _eventually(lambda: b"refund:2" in server.committed)
    assert _ask(proxy.port, b"refund:2") == b"OK refund:2\n"  # fired once: the next passes
    assert server.committed.count(b"refund:2") == 2


def test_timeout_before_commit_never_delivers_the_request(
    wire: tuple[_LineServer, FaultProxy],
) -> None:
    server, proxy = wire
    proxy.arm(b"refund:3", "timeout_before_commit")
    with pytest.raises(TimeoutError):
        _ask(proxy.port, b"refund:3")
    assert _ask(proxy.port, b"refund:4") == b"OK refund:4\n"
    assert b"refund:3" not in server.committed


def test_timeout_after_commit_answers_too_late(wire: tuple[_LineServer, FaultProxy]) -> None:
    server, proxy = wire
    proxy.arm(b"refund:5", "timeout_after_commit", hold_s=2.0)
    with pytest.raises(TimeoutError):
        _ask(proxy.port, b"refund:5", timeout_s=0.5)
    assert server.committed == [b"refund:5"]


def test_reset_after_the_request_was_sent(wire: tuple[_LineServer, FaultProxy]) -> None:
    server, proxy = wire
    proxy.arm(b"refund:6", "reset")
    with pytest.raises(ConnectionResetError):
        _ask(proxy.port, b"refund:6", timeout_s=5.0)
    assert server.committed == [b"refund:6"]


def test_the_commit_point_waits_for_its_bytes(wire: tuple[_LineServer, FaultProxy]) -> None:
    server, proxy = wire
    proxy.arm(b"op:7", "timeout_before_commit", commit_point=b"COMMIT")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5) as s:
        s.sendall(b"BEGIN op:7\n")
        assert s.recv(1024) == b"OK BEGIN op:7\n"  # the marker passed; not the commit yet
        s.sendall(b"COMMIT\n")
        with pytest.raises(TimeoutError):
            s.recv(1024)
    assert server.committed == [b"BEGIN op:7"]


def test_slow_delays_every_answer(wire: tuple[_LineServer, FaultProxy]) -> None:
    _, proxy = wire
    proxy.arm(b"", "slow", latency_ms=300)
    started = time.monotonic()
    assert _ask(proxy.port, b"refund:8", timeout_s=5.0) == b"OK refund:8\n"
    assert time.monotonic() - started >= 0.3
    with pytest.raises(ValueError, match="cannot inject"):
        proxy.arm(b"x", "reject")  # type: ignore[arg-type]
