"""Every call to a sink ends by its deadline and reads at most the size cap.

Each attack is a real TCP server on localhost (a thread): one that drips its
answer a byte at a time, one that drips even its status line, one that sends
an endless body, one that sends a huge body. The client must come back with
no answer (``ambiguous``) within the deadline plus a small margin, having
read no more than the cap.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from sinks.client import SinkClient

DEADLINE_S = 1.0
#: What a call may take beyond its deadline: the drip's step and scheduling.
MARGIN_S = 0.8
CAP = 64 * 1024


class Attacker:
    """A one-connection-at-a-time TCP server answering every request with ``answer``.

    Attributes:
        sent: bytes of answers the server managed to send, in all.
        hung_up: set once a client closed a connection in the middle of an answer.
    """

    def __init__(self, answer: Callable[[socket.socket, Attacker], None]) -> None:
        self.answer = answer
        self.sent = 0
        self.hung_up = threading.Event()
        self.stop = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            with conn:
                _read_request(conn)
                try:
                    self.answer(conn, self)
                except OSError:
                    self.hung_up.set()

    def send(self, conn: socket.socket, data: bytes) -> None:
        """Send ``data`` (raises ``OSError`` once the client hung up)."""
        conn.sendall(data)
        self.sent += len(data)


def _read_request(conn: socket.socket) -> None:
    """Read one request: its headers, then the body its Content-Length announces."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextmanager
def attacker(answer: Callable[[socket.socket, Attacker], None]) -> Iterator[Attacker]:
    server = Attacker(answer)
    server.thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.thread.join(timeout=5)
        server.server.close()


def drip_body(conn: socket.socket, server: Attacker) -> None:
    """Headers at once, then the body one byte every 0.3 s, for ever."""
    server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    server.send(conn, b"Content-Length: 1000\r\n\r\n")
    while not server.stop.is_set():
        server.send(conn, b" ")
        time.sleep(0.3)


def drip_status_line(conn: socket.socket, server: Attacker) -> None:
    """Even the status line, one byte every 0.3 s."""
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
        if server.stop.is_set():
            return
        server.send(conn, bytes([byte]))
        time.sleep(0.3)


def endless_body(conn: socket.socket, server: Attacker) -> None:
    """A chunked body that never ends, as fast as the client takes it."""
    server.send(conn, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 16384
    while not server.stop.is_set():
        server.send(conn, b"%x\r\n%s\r\n" % (len(chunk), chunk))


def huge_body(conn: socket.socket, server: Attacker) -> None:
    """50 MB of body with no length announced (the answer of a chunked stream)."""
    server.send(conn, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    for _ in range(50 * 1024 * 1024 // len(chunk)):
        server.send(conn, b"%x\r\n%s\r\n" % (len(chunk), chunk))
    server.send(conn, b"0\r\n\r\n")


def announced_huge(conn: socket.socket, server: Attacker) -> None:
    """A Content-Length of 50 MB, then the bytes."""
    server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 52428800\r\n\r\n")
    chunk = b"x" * 65536
    for _ in range(800):
        server.send(conn, chunk)


def client_of(server: Attacker) -> SinkClient:
    return SinkClient(
        f"http://127.0.0.1:{server.port}", timeout_s=DEADLINE_S, max_response_bytes=CAP
    )


def submit(client: SinkClient) -> object:
    return client.submit("op-1", "digest", {"account": "a"}, 1, "att-1", True)


@pytest.mark.parametrize("answer", [drip_body, drip_status_line], ids=["body", "status-line"])
def test_a_dripping_sink_is_cut_off_at_the_deadline(answer: Callable[..., None]) -> None:
    with attacker(answer) as server, client_of(server) as client:
        started = time.monotonic()
        result = submit(client)
        elapsed = time.monotonic() - started
        readback_started = time.monotonic()
        rb = client.readback("op-1", 1)
        readback_elapsed = time.monotonic() - readback_started
    assert result.status == "ambiguous" and result.sent  # type: ignore[attr-defined]
    assert "deadline" in result.detail  # type: ignore[attr-defined]
    assert elapsed < DEADLINE_S + MARGIN_S, f"the submit took {elapsed:.2f} s"
    assert rb.status == "ambiguous" and "deadline" in rb.detail
    assert readback_elapsed < DEADLINE_S + MARGIN_S, f"the readback took {readback_elapsed:.2f} s"


def test_an_endless_body_is_cut_off_by_the_cap_or_the_deadline() -> None:
    with attacker(endless_body) as server, client_of(server) as client:
        started = time.monotonic()
        result = submit(client)
        elapsed = time.monotonic() - started
        assert server.hung_up.wait(5)
    assert result.status == "ambiguous" and result.sent  # type: ignore[attr-defined]
    assert "cap of 65536 bytes" in result.detail  # type: ignore[attr-defined]
    assert elapsed < DEADLINE_S + MARGIN_S
    # The client hung up: the server could send no more than the cap and what
    # the two sockets' buffers hold, far from an endless body.
    assert server.sent < 16 * 1024 * 1024


def test_a_huge_body_is_not_read_past_the_cap() -> None:
    with attacker(huge_body) as server, client_of(server) as client:
        rb = client.readback("op-1", 1)
        assert server.hung_up.wait(5)
        account = client.account("acct-1")
    assert rb.status == "ambiguous" and "cap of 65536 bytes" in rb.detail
    assert account.status == "ambiguous" and "cap of 65536 bytes" in account.detail
    assert server.sent < 16 * 1024 * 1024  # of 50 MB


def test_a_huge_announced_body_is_refused_before_it_is_read() -> None:
    with attacker(announced_huge) as server, client_of(server) as client:
        result = submit(client)
        assert server.hung_up.wait(5)
    assert result.status == "ambiguous" and "announcing 52428800 bytes" in result.detail  # type: ignore[attr-defined]
    assert server.sent < 16 * 1024 * 1024


def test_a_refused_connection_is_still_not_sent() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    with SinkClient(f"http://127.0.0.1:{port}", timeout_s=DEADLINE_S) as client:
        result = submit(client)
    assert result.status == "unavailable" and not result.sent  # type: ignore[attr-defined]
