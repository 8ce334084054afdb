"""One bounded call of the ``postgres`` adapter: its deadline, and what a failure means.

:class:`Deadline` gives every call of :mod:`sinks.adapters.postgres` one
overall budget (``timeout_s``) shared by its three guards:

* the connect: ``connect_timeout`` (whole seconds; psycopg and libpq raise
  anything under 2 to 2, so a call whose budget is under 2 s may spend 2 s
  connecting to a host that does not answer);
* the server: ``statement_timeout`` and ``lock_timeout`` (the budget, in ms,
  set in the session's ``options``) stop a statement the client gave up on,
  so its row locks are freed; ``idle_in_transaction_session_timeout`` (twice
  the budget) ends the session of a client that vanished mid-transaction;
* the client: :class:`Watchdog` shuts the connection's socket down at the
  deadline, whatever the server does (even a server that stopped answering
  but still acknowledges TCP), so the waiting call fails at once.

:func:`classify` turns a psycopg error into what it tells about the effect,
by the phase of the transaction it happened in (see :data:`Phase`). The
rule that matters: before ``COMMIT`` is sent, a failure of any kind leaves
no effect (the transaction cannot commit without it); once ``COMMIT`` is
sent, only an answer from the server that it rolled back says so -- a lost
connection or a deadline is ``ambiguous``.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import psycopg

#: Where a submit's transaction was when it failed: taking the fence and
#: looking the key up (``book``), running the configured effect statement
#: (``effect``), writing the operations row (``record``), waiting for the
#: answer to ``COMMIT`` (``commit``).
Phase = Literal["book", "effect", "record", "commit"]

#: What a failure means: the configuration is wrong (raise), the database
#: refused the request (``rejected``), no effect was made and asking again is
#: safe (``unavailable``), the key names another effect (``key_reused``), or
#: the effect may have committed (``ambiguous``).
Verdict = Literal["config", "rejected", "unavailable", "key_reused", "ambiguous"]

#: SQLSTATE classes and codes of a transient refusal: the connection
#: (08), a rolled-back transaction (40: serialization failure, deadlock),
#: resources (53), a lock not granted (55P03), an operator or timeout
#: intervention (57: query_canceled, admin_shutdown ...), a system error (58).
_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
_TRANSIENT_CODES = ("55P03", "55006")
#: SQLSTATE classes of a configuration problem in the adapter's own
#: statements: authorisation (28), a missing database (3D), a missing
#: table, column or privilege (42).
_CONFIG_CLASSES = ("28", "3D", "42")


class Deadline:
    """The overall budget of one call.

    Args:
        timeout_s: seconds from now the call must end by.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._ends = time.monotonic() + timeout_s

    def left_s(self) -> float:
        """Seconds left (0 when spent)."""
        return max(0.0, self._ends - time.monotonic())

    def connect_timeout_s(self) -> int:
        """The ``connect_timeout`` for what is left (whole seconds, at least 2: libpq's floor)."""
        return max(2, math.ceil(self.left_s()))


def session_options(timeout_s: float, existing: str | None = None) -> str:
    """The ``options`` connection parameter: the server-side guards of a ``timeout_s`` budget.

    Args:
        timeout_s: the adapter's deadline (seconds).
        existing: ``options`` the DSN already carries (kept, ours after it).

    Returns:
        e.g. ``-c statement_timeout=2000 -c lock_timeout=2000
        -c idle_in_transaction_session_timeout=4000``.
    """
    ms = max(1, int(timeout_s * 1000))
    ours = (
        f"-c statement_timeout={ms} -c lock_timeout={ms} "
        f"-c idle_in_transaction_session_timeout={2 * ms}"
    )
    return f"{existing} {ours}" if existing else ours


class Watchdog:
    """Shut a connection's socket down when a call's deadline passes.

    Use it with ``with``: leaving the block disarms it; a watchdog that fired
    says so in :attr:`fired`, and its connection is unusable afterwards.

    Args:
        connection: the call's connection.
        deadline: the call's deadline.
    """

    def __init__(self, connection: psycopg.Connection[Any], deadline: Deadline) -> None:
        self.fired = False
        self._connection = connection
        self._done = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline.left_s(), self._fire)
        self._timer.daemon = True

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True

    def _fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            # A duplicate of the socket's descriptor: shutting it down ends the
            # exchange of the original too (the waiting call reads an EOF),
            # while psycopg still owns, and later closes, the original.
            with contextlib.suppress(OSError, ValueError):
                fd = os.dup(self._connection.pgconn.socket)
                with socket.socket(fileno=fd) as dup:
                    dup.shutdown(socket.SHUT_RDWR)


@dataclass(frozen=True)
class Failure:
    """What one failed call means.

    Attributes:
        verdict: see :data:`Verdict`.
        detail: the reason, for the result's ``detail``.
        sqlstate: the server's SQLSTATE, or ``None`` when it gave no answer.
    """

    verdict: Verdict
    detail: str
    sqlstate: str | None


def _answered(exc: BaseException, fired: bool) -> str | None:
    """The SQLSTATE the server answered with, or ``None`` when no answer came."""
    state = getattr(exc, "sqlstate", None)
    return None if fired or not state else str(state)


def _transient(state: str) -> bool:
    return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_CODES


def classify(phase: Phase, exc: BaseException, *, fired: bool, timeout_s: float) -> Failure:
    """What a psycopg error in a submit's transaction says about the effect.

    Args:
        phase: where the transaction was (see :data:`Phase`).
        exc: the error psycopg raised.
        fired: whether the call's watchdog shut the connection down.
        timeout_s: the call's budget (for the detail).

    Returns:
        The verdict: before ``COMMIT`` was sent, ``rejected`` for the server's
        refusal of the effect statement (a constraint, a type, a trigger's
        error), ``config`` for the adapter's own statements failing on the
        schema or privileges, ``key_reused`` when the operations row collides,
        else ``unavailable`` (nothing committed); after, ``rejected`` or
        ``unavailable`` only when the server answered that the commit failed,
        else ``ambiguous``.
    """
    state = _answered(exc, fired)
    text = f"{type(exc).__name__}: {str(exc).strip()}"[:1000]
    lost = f"no answer within {timeout_s:g} s" if fired else "the connection was lost"
    if phase == "commit":
        if state is not None and state.startswith("23"):
            return Failure("rejected", f"COMMIT refused, rolled back: {text}", state)
        if state is not None and state.startswith("40"):
            return Failure("unavailable", f"COMMIT rolled back by the server: {text}", state)
        return Failure(
            "ambiguous",
            f"COMMIT was sent and {lost}: the effect may have committed (read it back): {text}",
            state,
        )
    if state is None:
        import psycopg

        if phase == "effect" and isinstance(exc, psycopg.ProgrammingError) and not fired:
            # Raised before anything was sent: the params do not fit effect_sql.
            return Failure("rejected", f"effect_sql cannot take these params: {text}", None)
        return Failure("unavailable", f"{lost} before COMMIT: rolled back, no effect: {text}", None)
    if _transient(state):
        return Failure("unavailable", f"refused before COMMIT, no effect: {text}", state)
    if phase == "effect" or state.startswith("22"):
        return Failure("rejected", f"the database refused the effect: {text}", state)
    if phase == "record" and state.startswith("23"):
        return Failure("key_reused", f"the idempotency key names another effect: {text}", state)
    if state[:2] in _CONFIG_CLASSES:
        return Failure("config", text, state)
    return Failure("unavailable", f"refused before COMMIT, no effect: {text}", state)
