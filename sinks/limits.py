"""Limits every call to a sink keeps: an overall deadline and a response-size cap.

A sink is outside the ledger's trust boundary: it may answer slowly, drip its
answer a byte at a time, never finish, or send far more than any answer of
its protocol needs. A per-read timeout bounds none of these (each byte
resets it), so every adapter bounds each call twice:

* **deadline** -- the call ends at most ``timeout_s`` seconds after it began,
  whatever the sink does (:class:`Deadline`, made current for the network
  code with :func:`within`);
* **size** -- at most ``max_bytes`` of the answer are held in memory
  (:func:`read_capped`); past them the rest is not read.

A call stopped by either has no answer: a request that may have acted
(a submit, a confirmation) is ``ambiguous``, a readback or a postcondition
query observed nothing (``ambiguous``), exactly as for a dropped connection.

For HTTP adapters built on httpx, :func:`bounded_transport` gives a
transport whose every socket operation (connect, each read and write, the
response's headers included) waits no longer than the current deadline
leaves, so a sink dripping its headers is cut off too. Adapters of other
protocols make their calls inside :func:`within` and read through
:func:`read_capped` where they read a stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

#: Default cap of one answer from a sink (bytes): 1 MiB, far above any answer
#: of the reference protocol (``LEDGER_SINK_MAX_RESPONSE_BYTES``).
DEFAULT_MAX_RESPONSE_BYTES = 1 << 20


@dataclass(frozen=True)
class Deadline:
    """The moment a call to a sink must have ended.

    Attributes:
        at: monotonic time of the deadline (seconds, :func:`time.monotonic`).
        budget_s: the whole budget it was started with (seconds).
    """

    at: float
    budget_s: float

    @classmethod
    def start(cls, budget_s: float) -> Deadline:
        """A deadline ``budget_s`` seconds from now."""
        return cls(time.monotonic() + budget_s, budget_s)

    def remaining(self) -> float:
        """Seconds left (``0.0`` once passed)."""
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        """``True`` once the deadline has passed."""
        return time.monotonic() >= self.at


_CURRENT: ContextVar[Deadline | None] = ContextVar("sink_deadline", default=None)


@contextmanager
def within(deadline: Deadline) -> Iterator[Deadline]:
    """Make ``deadline`` the current one (for :func:`bounded_transport`) inside the block.

    The deadline is per thread (a context variable): calls made at once from
    several threads keep their own.
    """
    token = _CURRENT.set(deadline)
    try:
        yield deadline
    finally:
        _CURRENT.reset(token)


def current() -> Deadline | None:
    """The current deadline (see :func:`within`), or ``None``."""
    return _CURRENT.get()


@dataclass(frozen=True)
class Capped:
    """What :func:`read_capped` read.

    Attributes:
        body: the bytes read (at most the cap).
        received: how many bytes were read in all.
        stopped: why reading stopped before the end (``None``: the whole answer
            was read), e.g. ``answer larger than 1048576 bytes``.
    """

    body: bytes
    received: int
    stopped: str | None = None


def read_capped(chunks: Iterable[bytes], deadline: Deadline, max_bytes: int) -> Capped:
    """Read an answer's chunks until its end, the deadline or the cap, whichever is first.

    Args:
        chunks: the answer's body, chunk by chunk (a read blocked in the
            iterator itself must be bounded by the caller, e.g. by
            :func:`bounded_transport`).
        deadline: when reading must stop.
        max_bytes: the most bytes to keep; an answer longer than that is not
            read further.

    Returns:
        The body and, when reading stopped early, why.
    """
    parts: list[bytes] = []
    received = 0
    for chunk in chunks:
        received += len(chunk)
        if received > max_bytes:
            return Capped(
                b"".join(parts),
                received,
                f"answer larger than the cap of {max_bytes} bytes "
                "(LEDGER_SINK_MAX_RESPONSE_BYTES); the rest was not read",
            )
        parts.append(chunk)
        if deadline.passed():
            return Capped(b"".join(parts), received, _late(deadline, received))
    return Capped(b"".join(parts), received)


def _late(deadline: Deadline, received: int) -> str:
    return (
        f"no complete answer within the deadline of {deadline.budget_s:g} s "
        f"({received} bytes of it read); LEDGER_SINK_TIMEOUT_S sets the deadline"
    )


def deadline_detail(deadline: Deadline, received: int = 0) -> str:
    """The detail of a call the deadline stopped (``received``: bytes of the answer read)."""
    return _late(deadline, received)


def _clamp(
    timeout: float | None, late: type[httpcore.TimeoutException] = httpcore.ReadTimeout
) -> float | None:
    """``timeout`` shortened to what the current deadline leaves.

    Raises:
        httpcore.TimeoutException: ``late`` (default a read timeout), when the
            current deadline has passed.
    """
    deadline = _CURRENT.get()
    if deadline is None:
        return timeout
    left = deadline.remaining()
    if left <= 0:
        raise late(_late(deadline, 0))
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every wait ends by the current deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _clamp(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(
            self._inner.start_tls(
                ssl_context, server_hostname, _clamp(timeout, httpcore.ConnectTimeout)
            )
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's socket backend, each wait shortened to the current deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host,
            port,
            _clamp(timeout, httpcore.ConnectTimeout),
            local_address=local_address,
            socket_options=socket_options,
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(
            path, _clamp(timeout, httpcore.ConnectTimeout), socket_options=socket_options
        )
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bounded_transport() -> httpx.BaseTransport:
    """An httpx transport whose socket waits end by the current deadline (:func:`within`).

    Outside :func:`within` it behaves as :class:`httpx.HTTPTransport` (HTTP/1.1,
    default TLS context and pool limits). A deadline that passes while the
    request is sent or its headers or body are read raises
    :class:`httpx.ReadTimeout` (or the connect or write timeout of that phase),
    and the connection is closed.
    """
    transport = httpx.HTTPTransport()
    limits = httpx.Limits()
    # httpx takes no network backend; its pool is replaced by an equal one that has ours.
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=_DeadlineBackend(),
    )
    return transport
