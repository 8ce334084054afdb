"""Real systems behind a game day's sinks (format v3): started, faulted on the wire, counted.

A scenario's sink that names an ``adapter`` other than ``reference`` gets the
real system that adapter speaks to, started on loopback for the run:

=========================  ===================================================
``postgres``               Debian's PostgreSQL server (:mod:`testbed.realsys.postgres`)
``smtp``                   an aiosmtpd server (:mod:`testbed.realsys.smtp`)
``http-idempotency-key``   a refunds API per the Idempotency-Key draft
                           (:mod:`testbed.realsys.keyed_api`)
=========================  ===================================================

The relay reaches it through a fault proxy (:mod:`sinks.wire`), so a
``sink_fault`` is injected on the wire and the adapter runs unmodified. The
sink registry names the adapter, the proxy's address and the adapter's
config (the scenario's, or the defaults here for the scenario's actions: a
refund credits the account named in ``params``, an email is one message).
``effects`` count what the real system itself holds per operation: rows, messages,
refunds. ``reject`` and ``unavailable`` are the real system's own refusals
and are not injected on the wire; a scenario that asks for them on a real
system is refused with a message that says so.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ledger.contracts import EffectContract
from sinks.client import ReadbackResult, SubmitResult
from sinks.port import SinkPort, open_sink
from sinks.registry import SinkEndpoint
from sinks.wire import COMMIT_POINTS, WIRE_MODES, FaultProxy, proxied_url
from testbed.errors import ScenarioError


class RealSink:
    """One real system, its fault proxy and its registry entry.

    Args:
        name: the sink's name in the scenario.
        adapter: ``postgres``, ``smtp`` or ``http-idempotency-key``.
        contract: the contract the scenario declares.
        config: the adapter's config from the scenario, or ``None`` for the defaults.
        run_dir: the run folder (the system's files go under ``real-sinks/NAME``).
        timeout_s: the deadline of every call to the system, in seconds (the
            registry entry's ``timeout_s``; late answers are held past it).
    """

    def __init__(
        self,
        name: str,
        adapter: str,
        contract: EffectContract,
        config: dict[str, Any] | None,
        run_dir: Path,
        timeout_s: float,
    ) -> None:
        self.name = name
        self.adapter = adapter
        self.contract = contract
        self.config = config
        self.folder = run_dir / "real-sinks" / name
        self.timeout_s = timeout_s
        self.pid: int | None = None  # no stage-like process of the testbed's to watch
        self.proxy: FaultProxy | None = None
        self._system: Any = None
        self._token: str | None = None
        self._url = ""
        self._held: dict[str, int] | None = None  # what the system held when it stopped
        self.endpoint: SinkEndpoint | None = None

    # ------------------------------------------------------------------ life

    def start(self) -> SinkEndpoint:
        """Start the system and its proxy; the registry entry that reaches it.

        Raises:
            SinkStartError: when the system cannot be started (the message names why).
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any]
        if self.adapter == "postgres":
            from testbed.realsys.postgres import PostgresServer

            pg = PostgresServer(database="ledger_sink").start()
            self._system = pg
            self._url = pg.dsn
            target = ("127.0.0.1", pg.port)
            config = {}
        elif self.adapter == "smtp":
            from testbed.realsys.smtp import SmtpServer

            smtp = SmtpServer(self.folder, self.name).start()
            self._system = smtp
            self._url = smtp.url
            target = ("127.0.0.1", smtp.port)
            config = {}
        elif self.adapter == "http-idempotency-key":
            from testbed.realsys.keyed_api import KeyedApiServer

            api = KeyedApiServer(
                self.folder, self.name, retention_s=max(1, self.contract.key_retention_s)
            ).start()
            self._system = api
            self._url = api.url
            self._token = api.token
            target = ("127.0.0.1", api.port)
            config = {"submit": {"method": "POST", "path": "/refunds"}}
            if self.contract.readback:
                config["readback_path"] = "/refunds/by-operation/{operation_id}"
            if self.contract.postcondition_query() is not None:
                config["postcondition_path"] = "/accounts/{subject}"
        else:
            raise ScenarioError(f"sink {self.name}: no real system for adapter {self.adapter!r}")
        self.proxy = FaultProxy(*target).start()
        self.endpoint = SinkEndpoint(
            url=proxied_url(self._url, self.proxy.port)[0],
            contract=self.contract,
            token=self._token,
            adapter=self.adapter,
            config=self.config if self.config is not None else config,
            timeout_s=self.timeout_s,
        )
        return self.endpoint

    def stop(self) -> None:
        """Stop the proxy and the system (its folder stays, for the record); what the
        system held is kept, so :meth:`effects` still answers."""
        if self.proxy is not None:
            self.proxy.close()
        if self._system is not None and self._held is None:
            with contextlib.suppress(Exception):
                self._held = self.effects()
            with contextlib.suppress(Exception):
                self._system.stop()

    def is_running(self) -> bool:
        """``True`` while the system runs."""
        system = self._system
        if system is None:
            return False
        running = getattr(system, "running", None)
        if isinstance(running, bool):
            return running
        return bool(system.is_running())

    # ------------------------------------------------------------------ faults

    def arm(self, operation_id: str, mode: str, latency_ms: int = 0) -> None:
        """Arm a game day's ``sink_fault`` on the wire for ``operation_id``.

        Raises:
            ScenarioError: for a mode the wire cannot inject (``reject``, ``unavailable``).
        """
        assert self.proxy is not None
        if mode not in WIRE_MODES:
            raise ScenarioError(
                f"sink_fault {mode!r} on {self.name} ({self.adapter}): a real system refuses "
                f"in its own way, which this runner cannot arm yet; faults on the wire are "
                f"{', '.join(WIRE_MODES)}"
            )
        self.proxy.arm(
            operation_id.encode(),
            mode,  # type: ignore[arg-type]
            commit_point=COMMIT_POINTS.get(self._url.partition("://")[0]),
            hold_s=2 * self.timeout_s + 1,
            latency_ms=latency_ms,
        )

    # ------------------------------------------------------------------ counts

    def effects(self) -> dict[str, int]:
        """Operation -> how many effects the real system holds for it (held at its stop)."""
        if self._held is not None:
            return dict(self._held)
        counts: dict[str, int] = {}
        if self.adapter == "postgres":
            import psycopg

            from sinks.adapters.postgres_schema import DEFAULT_EFFECT_COUNT_SQL

            with psycopg.connect(self._url, connect_timeout=5) as db:
                try:
                    rows = db.execute(DEFAULT_EFFECT_COUNT_SQL).fetchall()
                except psycopg.errors.UndefinedTable:  # the adapter never made an effect
                    return {}
            return {str(op): int(n) for op, n in rows}
        if self.adapter == "smtp":
            for message in self._system.store.messages():
                op = message.get("operation_id")
                if op:
                    counts[op] = counts.get(op, 0) + 1
            return counts
        for refund in self._system.store.refunds():
            counts[refund["operation_id"]] = counts.get(refund["operation_id"], 0) + 1
        return counts

    def client(self) -> RealSinkView:
        """What the game day asks of a sink (the reference sink's client's shape)."""
        return RealSinkView(self)


class RealSinkView:
    """A real sink seen as the game day and the mission see a reference sink's client.

    Requests (``submit`` ...) go through the sink's adapter, as the relay's do
    (through the fault proxy); a ``stale_token`` answer to one is counted in
    :meth:`stats` (a real system keeps no such counter of its own).
    """

    def __init__(self, sink: RealSink) -> None:
        self.sink = sink
        self._port: SinkPort | None = None
        self._stale = 0

    def _adapter(self) -> SinkPort:
        if self._port is None:
            assert self.sink.endpoint is not None, "the sink is not started"
            self._port = open_sink(
                self.sink.endpoint, timeout_s=self.sink.timeout_s, name=self.sink.name
            )
        return self._port

    def submit(self, *args: Any, **kwargs: Any) -> SubmitResult:
        """Submit through the adapter (see :meth:`sinks.port.SinkPort.submit`)."""
        result = self._adapter().submit(*args, **kwargs)
        self._stale += result.status == "stale_token"
        return result

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        """Read back through the adapter."""
        return self._adapter().readback(operation_id, fencing_token)

    def close(self) -> None:
        """Close the adapter, if one was opened."""
        if self._port is not None:
            self._port.close()
            self._port = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def effects(self) -> dict[str, int]:
        """Operation -> effects held by the real system."""
        return self.sink.effects()

    def stats(self) -> dict[str, int]:
        """The stale tokens refused to requests made through this view."""
        return {"stale_rejections": self._stale}

    def arm_fault(self, operation_id: str, mode: str, latency_ms: int = 0) -> None:
        """Arm a fault on the wire (see :meth:`RealSink.arm`)."""
        self.sink.arm(operation_id, mode, latency_ms)
