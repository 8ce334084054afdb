"""One overall deadline for one adapter call, whatever the system does.

A socket timeout bounds each read, not a call: a server that drips one byte
per second under a 2 s read timeout could hold a call forever. A
:class:`Deadline` bounds the whole call instead: at the end of its budget a
timer shuts down every socket the call registered (``socket.shutdown``, which
wakes a read blocked in another thread), so the call's next or current read
fails at once and the adapter reports what that means (``ambiguous`` once a
request may have left). Sockets come from :meth:`Deadline.watch`, or for
httpx from :meth:`Deadline.httpx_trace` as the ``trace`` extension of a
request sent over a new connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType
from typing import Any, Self


class Deadline:
    """The deadline of one call, as a context manager.

    Args:
        budget_s: the call's whole budget, in seconds (from entering the context).

    Attributes:
        budget_s: as given.
    """

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._at = time.monotonic() + budget_s
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._expired = False
        self._done = False
        self._timer = threading.Timer(budget_s, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Self:
        self._at = time.monotonic() + self.budget_s
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            self._done = True
            self._sockets.clear()
        self._timer.cancel()

    def remaining_s(self) -> float:
        """Seconds left (0.0 once passed); use it as each operation's own timeout."""
        return max(0.0, self._at - time.monotonic())

    def passed(self) -> bool:
        """Whether the budget is spent (the sockets have then been shut down)."""
        return self._expired or time.monotonic() >= self._at

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down when the deadline passes (at once if it has)."""
        with self._lock:
            if self._done:
                return
            self._sockets.append(sock)
            if self._expired:
                _shut(sock)

    def httpx_trace(self, event: str, info: dict[str, Any]) -> None:
        """An httpx ``trace`` extension that watches the socket of each new connection."""
        if event != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            self.watch(sock)

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed or never connected: nothing to wake
        sock.shutdown(socket.SHUT_RDWR)
