"""A fault proxy on the wire between the relay and a real system (game-day format v3).

The adapters run unmodified: the relay reaches the real system (PostgreSQL,
an SMTP server, an HTTP API) through this TCP proxy on loopback, and a
scenario's ``sink_fault`` is injected here, into the bytes, for the one
operation it names.

Why not Toxiproxy: its toxics act on every connection of a proxy at once,
so "lose the response of *this* operation's commit" cannot be said without
racing the relay. This proxy looks for the operation on the wire instead: a
fault is armed with a *marker* (the bytes by which the adapter sends the
operation ID: in an HTTP body, in a SQL parameter, in a ``Message-ID``
header) and fires once, on the first connection whose client-to-system bytes
carry it, at that connection's *commit point*: the first client chunk, from
the marker's on, that holds ``commit_point`` (``COMMIT`` for a SQL
transaction, the ``<CRLF>.<CRLF>`` that ends an SMTP message; ``None``: the
marker's own chunk, for protocols of one request and one response).

Modes (as ``../shared/SCENARIOS.md`` names them):

* ``commit_then_drop_response`` -- the commit point reaches the system; every
  answer after it is dropped (the client's deadline passes).
* ``timeout_before_commit`` -- the commit point is held and never delivered;
  the system never commits (a SQL transaction is rolled back when the
  client gives up and the proxy closes the system's side).
* ``timeout_after_commit`` -- the system commits; its answer is delivered
  ``hold_s`` seconds late, after the client gave up.
* ``reset`` -- the commit point reaches the system, which answers; the
  client's side is reset (RST) instead of answered.
* ``slow`` -- from now on every answer of every connection is delayed by
  ``latency_ms``.

Everything listens on 127.0.0.1 only. The proxy runs in a thread of its own
(an asyncio loop); :meth:`FaultProxy.close` stops it and drops its connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

WireMode = Literal[
    "commit_then_drop_response", "timeout_before_commit", "timeout_after_commit", "reset", "slow"
]

#: The modes a proxy can inject; ``reject`` and ``unavailable`` are the real system's own.
WIRE_MODES: tuple[str, ...] = (
    "commit_then_drop_response",
    "timeout_before_commit",
    "timeout_after_commit",
    "reset",
    "slow",
)


@dataclass
class ArmedFault:
    """A fault waiting for its operation on the wire.

    Attributes:
        marker: the bytes that name the operation in the client's requests.
        mode: what to do at the commit point.
        commit_point: bytes that mark the commit in the client's stream, or
            ``None`` (the marker's own chunk).
        hold_s: how long a late answer is held (``timeout_after_commit``), seconds.
        fired: set once the fault acted.
    """

    marker: bytes
    mode: WireMode
    commit_point: bytes | None = None
    hold_s: float = 10.0
    fired: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Conn:
    """One proxied connection's fault state."""

    fault: ArmedFault | None = None
    seen: bytes = b""  # the tail of the client's stream, to find a marker split across chunks
    drop_down: bool = False
    blackhole_up: bool = False
    delay_down_s: float = 0.0
    reset_after_answer: bool = False


#: Default ports by URL scheme, for a URL that names none.
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "postgres": 5432, "smtp": 25}

#: Where a commit shows on the wire, by scheme (see :mod:`sinks.wire`): a SQL
#: transaction's COMMIT, the end of an SMTP message; HTTP has one request per answer.
COMMIT_POINTS: dict[str, bytes | None] = {
    "postgresql": b"COMMIT",
    "postgres": b"COMMIT",
    "smtp": b"\r\n.\r\n",
}


def proxied_url(url: str, port: int) -> tuple[str, tuple[str, int]]:
    """``url`` with its host and port replaced by the proxy's; and the original target."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    target_port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc)), (host, target_port)


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:<port>`` to ``target_host:target_port``.

    Args:
        target_host: the real system's host (loopback).
        target_port: the real system's port.

    Attributes:
        port: the port the proxy listens on (picked free at :meth:`start`).
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.latency_s = 0.0
        self._armed: list[ArmedFault] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # ------------------------------------------------------------------ control

    def start(self) -> FaultProxy:
        """Listen on a free loopback port; returns ``self``."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self

    def arm(
        self,
        marker: bytes,
        mode: WireMode,
        *,
        commit_point: bytes | None = None,
        hold_s: float = 10.0,
        latency_ms: int = 0,
    ) -> ArmedFault | None:
        """Arm one fault for the operation ``marker`` names (``slow``: for every answer).

        Args:
            marker: the operation's bytes on the wire.
            mode: one of :data:`WIRE_MODES`.
            commit_point: see the module docstring.
            hold_s: the delay of a late answer, seconds.
            latency_ms: ``slow``'s delay of every answer, milliseconds.

        Returns:
            The armed fault (``fired`` is set when it acted), or ``None`` for ``slow``.

        Raises:
            ValueError: for a mode the wire cannot inject.
        """
        if mode == "slow":
            self.latency_s = latency_ms / 1000.0
            return None
        if mode not in WIRE_MODES:
            raise ValueError(f"the fault proxy cannot inject {mode!r} (it can: {WIRE_MODES})")
        fault = ArmedFault(marker, mode, commit_point, hold_s)
        with self._lock:
            self._armed.append(fault)
        return fault

    def clear(self) -> None:
        """Disarm every fault and the latency."""
        with self._lock:
            self._armed.clear()
        self.latency_s = 0.0

    def close(self) -> None:
        """Stop listening, drop every connection and stop the loop."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the loop

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    def _take(self, conn: _Conn, chunk: bytes) -> None:
        """Bind an armed fault to this connection when its marker passes."""
        if conn.fault is not None:
            return
        window = conn.seen + chunk
        with self._lock:
            for fault in self._armed:
                if fault.marker in window:
                    self._armed.remove(fault)
                    conn.fault = fault
                    break
        conn.seen = window[-256:]

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            system_r, system_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()  # the system is down: so is the proxied connection
            return
        self._writers.update((client_w, system_w))
        conn = _Conn()
        up = asyncio.create_task(self._pump_up(conn, client_r, system_w, client_w))
        down = asyncio.create_task(self._pump_down(conn, system_r, client_w))
        # Either side closing ends the connection (a late answer to a client that
        # gave up is never delivered: that client is gone).
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for task in (up, down):
            task.cancel()
        for writer in (client_w, system_w):
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _pump_up(
        self,
        conn: _Conn,
        client_r: asyncio.StreamReader,
        system_w: asyncio.StreamWriter,
        client_w: asyncio.StreamWriter,
    ) -> None:
        """Client to system: find the operation, act at its commit point."""
        while chunk := await client_r.read(65536):
            if conn.blackhole_up:
                continue
            self._take(conn, chunk)
            fault = conn.fault
            if fault is not None and not fault.fired.is_set():
                at_commit = fault.commit_point is None or fault.commit_point in chunk
                if at_commit:
                    fault.fired.set()
                    if fault.mode == "timeout_before_commit":
                        conn.blackhole_up = True
                        continue
                    if fault.mode == "commit_then_drop_response":
                        conn.drop_down = True
                    elif fault.mode == "timeout_after_commit":
                        conn.delay_down_s = fault.hold_s
                    elif fault.mode == "reset":
                        conn.reset_after_answer = True
            system_w.write(chunk)
            await system_w.drain()
        # the client closed its side: so does the proxy toward the system
        with contextlib.suppress(Exception):
            system_w.close()
        if conn.drop_down or conn.blackhole_up:
            client_w.transport.abort()

    async def _pump_down(
        self, conn: _Conn, system_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        """System to client: answers, dropped, delayed or reset as the fault says."""
        while chunk := await system_r.read(65536):
            if conn.reset_after_answer:
                _reset(client_w)
                return
            if conn.drop_down:
                continue
            delay = conn.delay_down_s or self.latency_s
            if delay:
                await asyncio.sleep(delay)
            if client_w.is_closing():
                return
            client_w.write(chunk)
            with contextlib.suppress(ConnectionError):
                await client_w.drain()
        with contextlib.suppress(Exception):
            client_w.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s socket with a TCP RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
