"""The postgres sink adapter on a real PostgreSQL server (no Kafka).

One server per module (:class:`testbed.realsys.postgres.PostgresServer`);
every test uses operation IDs and accounts of its own. The lost-response
tests put a small TCP proxy between the adapter and the server that reads
the server's messages and, once armed, drops (or holds) the one that
answers ``COMMIT`` -- after the server has committed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Literal

import psycopg
import pytest

from ledger.contracts import ACCOUNT_CREDITS, EffectContract
from ledger.errors import SinkConfigError
from ledger.identity import parameter_digest
from sinks.adapters.postgres import PostgresAdapter
from sinks.port import open_sink
from sinks.registry import SinkEndpoint
from testbed.realsys.postgres import PostgresServer

pytestmark = pytest.mark.integration

TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


def _adapter(dsn: str, timeout_s: float = TIMEOUT_S, **config: Any) -> PostgresAdapter:
    endpoint = SinkEndpoint(url=dsn, contract=EffectContract(), adapter="postgres", config=config)
    adapter = open_sink(endpoint, timeout_s=timeout_s)
    assert isinstance(adapter, PostgresAdapter)
    return adapter


@pytest.fixture
def sink(pg: PostgresServer) -> Iterator[PostgresAdapter]:
    adapter = _adapter(pg.dsn)
    yield adapter
    adapter.close()


def _ids() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"op-{tag}", f"acct-{tag}"


def _count(dsn: str, sql: str, *args: Any) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, args).fetchone()
    assert row is not None
    return int(row[0])


def _credits(dsn: str, op: str) -> int:
    return _count(dsn, "SELECT count(*) FROM ledger_credits WHERE operation_id = %s", op)


def _ops_rows(dsn: str, op: str) -> int:
    return _count(dsn, "SELECT count(*) FROM ledger_operations WHERE operation_id = %s", op)


def _params(account: str, amount_minor: int = 500) -> dict[str, Any]:
    return {"account": account, "amount_minor": amount_minor, "currency": "EUR"}


def test_a_submit_commits_once_and_a_replay_answers_the_same_effect(
    pg: PostgresServer, sink: PostgresAdapter
) -> None:
    op, account = _ids()
    first = sink.submit(op, "digest-a", _params(account), 1, "attempt-1", True)
    assert first.status == "committed" and not first.replayed
    assert first.effect_id and first.committed_ms and first.committed_ms > 0
    again = sink.submit(op, "digest-a", _params(account), 1, "attempt-2", True)
    assert again.status == "committed" and again.replayed
    assert (again.effect_id, again.committed_ms) == (first.effect_id, first.committed_ms)
    assert _credits(pg.dsn, op) == 1 and _ops_rows(pg.dsn, op) == 1


def test_other_parameters_under_the_key_are_refused_and_make_nothing(
    pg: PostgresServer, sink: PostgresAdapter
) -> None:
    op, account = _ids()
    assert sink.submit(op, "digest-a", _params(account), 1, "a1", True).status == "committed"
    drift = sink.submit(op, "digest-b", _params(account, 900), 1, "a2", True)
    assert drift.status == "key_reused" and "digest-a" in drift.detail
    assert _credits(pg.dsn, op) == 1 and _ops_rows(pg.dsn, op) == 1


def test_parameters_that_are_not_the_admitted_ones_never_reach_the_database(
    pg: PostgresServer,
) -> None:
    """Opened for a named sink, the adapter recomputes the parameter digest (the sink's
    name is one of its inputs) and refuses a mismatch before it writes anything."""
    endpoint = SinkEndpoint(url=pg.dsn, contract=EffectContract(), adapter="postgres")
    adapter = open_sink(endpoint, timeout_s=TIMEOUT_S, name="payments")
    op, account = _ids()
    who = {"action": "refund", "subject": "customer-1", "purpose": "p", "decision_version": 1}
    admitted = parameter_digest(params=_params(account), sink="payments", **who)  # type: ignore[arg-type]
    try:
        swapped = adapter.submit(op, admitted, _params("acct-attacker"), 1, "a1", True, **who)  # type: ignore[arg-type]
        assert swapped.status == "rejected" and not swapped.sent, swapped
        assert "parameter_digest_mismatch" in swapped.detail
        assert _credits(pg.dsn, op) == 0 and _ops_rows(pg.dsn, op) == 0
        ok = adapter.submit(op, admitted, _params(account), 1, "a2", True, **who)  # type: ignore[arg-type]
        assert ok.status == "committed" and _credits(pg.dsn, op) == 1
    finally:
        adapter.close()


def test_a_lower_fencing_token_is_refused_on_submit_and_readback(
    pg: PostgresServer, sink: PostgresAdapter
) -> None:
    op, account = _ids()
    # A readback with token 3 raises the fence: a submit with 2 is then stale.
    assert sink.readback(op, 3).status == "absent"
    stale = sink.submit(op, "digest-a", _params(account), 2, "zombie", True)
    assert stale.status == "stale_token" and stale.highest_token == 3
    assert _credits(pg.dsn, op) == 0 and _ops_rows(pg.dsn, op) == 0
    assert sink.submit(op, "digest-a", _params(account), 4, "owner", True).status == "committed"
    late = sink.readback(op, 3)
    assert late.status == "stale_token" and late.highest_token == 4
    assert sink.readback(op, None).status == "committed"  # no token: not fenced


def test_readback_answers_committed_with_its_effects_or_absent(sink: PostgresAdapter) -> None:
    op, account = _ids()
    assert sink.readback(op, None).status == "absent"
    made = sink.submit(op, "digest-a", _params(account), 1, "a1", True)
    seen = sink.readback(op, 1)
    assert seen.status == "committed" and seen.effects == 1
    assert (seen.effect_id, seen.committed_ms) == (made.effect_id, made.committed_ms)
    assert seen.parameter_digest == "digest-a"
    # Without a key every submit is an effect of its own, and readback counts them.
    sink.submit(op, "digest-a", _params(account), 1, "a2", False)
    assert sink.readback(op, 1).effects == 2


def test_the_postcondition_sums_the_accounts_credits(sink: PostgresAdapter) -> None:
    op, account = _ids()
    assert sink.postcondition(ACCOUNT_CREDITS, account).credited_minor == 0
    first = sink.submit(op, "d", _params(account, 500), None, "a1", True)
    second = sink.submit(op + "-2", "d", _params(account, 250), None, "a1", True)
    observed = sink.postcondition(ACCOUNT_CREDITS, account)
    assert observed.status == "observed" and observed.credited_minor == 750
    assert [(c.operation_id, c.amount_minor, c.effect_id) for c in observed.credits] == [
        (op, 500, first.effect_id),
        (op + "-2", 250, second.effect_id),
    ]


def test_a_stopped_server_is_unavailable_and_nothing_was_sent(
    pg: PostgresServer, sink: PostgresAdapter
) -> None:
    op, account = _ids()
    assert sink.health()  # a connection is open when the server goes away
    pg.halt()
    try:
        down = sink.submit(op, "d", _params(account), 1, "a1", True)
        assert down.status == "unavailable" and not down.sent
        assert sink.readback(op, 1).status == "ambiguous" and not sink.readback(op, 1).sent
        assert sink.health_info() is None
    finally:
        pg.start()
    assert sink.submit(op, "d", _params(account), 1, "a1", True).status == "committed"
    assert _credits(pg.dsn, op) == 1


def test_an_effect_the_database_refuses_is_rejected_and_leaves_no_record(
    pg: PostgresServer,
) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS positive_credits ("
            " effect_id text PRIMARY KEY, account text NOT NULL,"
            " amount_minor bigint NOT NULL CHECK (amount_minor > 0))"
        )
    effect_sql = (
        "INSERT INTO positive_credits (effect_id, account, amount_minor) "
        "VALUES (%(effect_id)s, %(account)s, %(amount_minor)s)"
    )
    adapter = _adapter(pg.dsn, effect_sql=effect_sql)
    try:
        op, account = _ids()
        refused = adapter.submit(op, "d", _params(account, -5), 1, "a1", True)
        assert refused.status == "rejected" and "positive_credits_amount_minor_check" in (
            refused.detail
        )
        assert _ops_rows(pg.dsn, op) == 0 and adapter.readback(op, 1).status == "absent"
        # The connection is still good, and the same operation can still be made.
        assert adapter.submit(op, "d", _params(account, 5), 1, "a2", True).status == "committed"
        assert _ops_rows(pg.dsn, op) == 1
    finally:
        adapter.close()


def test_a_wrong_password_is_a_configuration_error(pg: PostgresServer) -> None:
    adapter = _adapter(pg.dsn.replace(pg.password, "not-the-password"))
    try:
        with pytest.raises(SinkConfigError, match="password authentication failed") as caught:
            adapter.submit("op-x", "d", _params("acct-x"), 1, "a1", True)
        assert pg.password not in caught.value.message
    finally:
        adapter.close()


# ---------------------------------------------------------------------- lost responses


class CommitCutter:
    """A TCP proxy to the server that, once armed, cuts the answer to ``COMMIT``.

    It parses the server's messages (type byte, 4-byte length) and, when an
    armed connection meets ``CommandComplete`` for ``COMMIT`` -- sent after
    the commit is durable -- either closes both sides without forwarding it
    (``drop``) or forwards nothing more and keeps the connection open (``hold``).
    """

    def __init__(self, port: int, mode: Literal["drop", "hold"]) -> None:
        self.mode = mode
        self.armed = threading.Event()
        self.cut = threading.Event()
        self._upstream = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._upstream))
            self._sockets += [client, server]
            threading.Thread(target=self._forward, args=(client, server), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client), daemon=True).start()

    @staticmethod
    def _forward(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        buffer = b""
        try:
            while data := server.recv(65536):
                buffer += data
                while len(buffer) >= 5:
                    size = 1 + int.from_bytes(buffer[1:5], "big")
                    if len(buffer) < size:
                        break
                    message, buffer = buffer[:size], buffer[size:]
                    if self.armed.is_set() and message[:1] == b"C" and message[5:11] == b"COMMIT":
                        self.cut.set()
                        if self.mode == "drop":
                            # shutdown, not only close: the other pump is blocked
                            # in recv on these sockets, and close alone sends no FIN.
                            for sock in (client, server):
                                with contextlib.suppress(OSError):
                                    sock.shutdown(socket.SHUT_RDWR)
                                sock.close()
                        return
                    client.sendall(message)
        except OSError:
            pass

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def _through(pg: PostgresServer, cutter: CommitCutter) -> str:
    # No SSL or GSS negotiation: the proxy reads only typed messages.
    dsn = pg.dsn.replace(f":{pg.port}/", f":{cutter.port}/")
    return f"{dsn}?sslmode=disable&gssencmode=disable"


def test_a_response_lost_after_commit_is_ambiguous_and_the_database_holds_one_effect(
    pg: PostgresServer,
) -> None:
    cutter = CommitCutter(pg.port, "drop")
    adapter = _adapter(_through(pg, cutter))
    try:
        op, account = _ids()
        assert _healthy(adapter)  # connected, tables made: the next COMMIT is the effect's
        cutter.armed.set()
        lost = adapter.submit(op, "digest-a", _params(account), 1, "a1", True)
        assert cutter.cut.is_set()
        assert lost.status == "ambiguous" and lost.sent
        assert "COMMIT was sent and the connection was lost" in lost.detail
        cutter.armed.clear()
        seen = adapter.readback(op, 1)
        assert seen.status == "committed" and seen.effects == 1
        # Sent again under its key, it replays: the database still counts one effect.
        again = adapter.submit(op, "digest-a", _params(account), 1, "a2", True)
        assert again.status == "committed" and again.replayed
        assert again.effect_id == seen.effect_id
        assert _credits(pg.dsn, op) == 1 and _ops_rows(pg.dsn, op) == 1
    finally:
        adapter.close()
        cutter.close()


def _healthy(adapter: PostgresAdapter, within_s: float = 60.0) -> bool:
    """Ask ``health()`` until it answers True or ``within_s`` seconds pass: one health
    check has the adapter's short deadline, which a busy machine can miss once."""
    ends = time.monotonic() + within_s
    while not adapter.health():
        if time.monotonic() > ends:
            return False
    return True


def test_a_commit_answer_that_never_comes_ends_at_the_deadline_as_ambiguous(
    pg: PostgresServer,
) -> None:
    cutter = CommitCutter(pg.port, "hold")
    adapter = _adapter(_through(pg, cutter), timeout_s=1.0)
    try:
        op, account = _ids()
        assert _healthy(adapter)
        cutter.armed.set()
        began = time.monotonic()
        held = adapter.submit(op, "digest-a", _params(account), 1, "a1", True)
        took = time.monotonic() - began
        assert held.status == "ambiguous" and "no answer within 1 s" in held.detail
        assert 0.9 <= took < 1.9, took
        cutter.armed.clear()
        seen = adapter.readback(op, 1)  # a fresh connection: the old one was shut
        assert seen.status == "committed" and seen.effects == 1
    finally:
        adapter.close()
        cutter.close()
