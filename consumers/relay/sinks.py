"""The relay's sinks: the registry file as read last well, and one adapter per sink.

A corrupted registry never stops the relay: the content last read well
stands and the problem is reported once (:class:`~consumers.localfiles.LastGood`).
Each adapter sits behind a :class:`~consumers.sinkpool.PassGuard`, and is
opened again when its registry entry changes (a corrected bearer token is
picked up without a restart).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from consumers.localfiles import LastGood
from consumers.sinkpool import PassGuard
from ledger.contracts import marks_attempt_alone
from ledger.errors import LocalFileError
from ledger.settings import LedgerSettings
from sinks.port import SinkPort, open_sink
from sinks.registry import RegistryFile, SinkEndpoint

#: Opens the adapter of a sink: ``(name, registry entry) -> adapter``.
SinkOpener = Callable[[str, SinkEndpoint], SinkPort]


class SinkDesk:
    """The sink registry and the sinks' adapters, shared by the relay's sink lanes.

    Args:
        settings: ledger settings (registry path, sink deadline, response bound).
        lock: held for what the sink lanes share (the relay's).
        on_problem: called once per problem with a corrupted registry file.
        open_client: opens a sink's adapter (default: the adapter its entry
            names, :func:`sinks.port.open_sink`); tests pass a misbehaving one.

    Attributes:
        registry: the registry file (re-read when it changes).
        last_good: the registry as last read well.
        clients: ``sink -> its adapter`` (behind a pass guard once used).
    """

    def __init__(
        self,
        settings: LedgerSettings,
        lock: threading.RLock,
        on_problem: Callable[[LocalFileError], None],
        open_client: SinkOpener | None = None,
    ) -> None:
        self.settings = settings
        self._lock = lock
        self.registry = RegistryFile(settings.sinks_path())
        self.last_good = LastGood(
            "sink registry", self.registry.current, component="relay", on_problem=on_problem
        )
        self.clients: dict[str, SinkPort] = {}
        self._opened_for: dict[str, SinkEndpoint] = {}
        self._open = open_client if open_client is not None else self._open_adapter

    def _open_adapter(self, name: str, endpoint: SinkEndpoint) -> SinkPort:
        return open_sink(
            endpoint,
            timeout_s=endpoint.deadline_s(self.settings.sink_timeout_s),
            name=name,
            max_response_bytes=self.settings.sink_max_response_bytes,
        )

    def endpoint(self, name: str) -> SinkEndpoint | None:
        """The sink's entry as the registry file says now (``None``: not registered).

        The file is re-read when it changes; while it is corrupted, the content
        last read well stands (a ``LOCAL_FILE`` operating event says so).

        Raises:
            LocalFileError: the registry is corrupted and was never read well.
        """
        with self._lock:
            return self.last_good.read().get(name)

    def problem(self, name: str) -> str:
        """Why sink ``name`` has no usable entry, naming the registry."""
        return self.registry.problem(name) or f"sink {name!r} is not registered"

    def version_of(self, sink: str) -> int | None:
        """The sink's contract version in the registry now (``None``: unknown)."""
        try:
            endpoint = self.endpoint(sink)
        except LocalFileError:
            return None
        return endpoint.contract_version if endpoint is not None else None

    def marks_alone(self, sink: str) -> bool:
        """Whether a dispatch to ``sink`` is marked attempted alone.

        That is, just before its own send: a sink without readback
        (:func:`~ledger.contracts.marks_attempt_alone`).
        """
        try:
            endpoint = self.endpoint(sink)
        except LocalFileError:
            return False  # the dispatch's own handling reports the registry
        return endpoint is not None and marks_attempt_alone(endpoint.contract)

    def client(self, name: str, endpoint: SinkEndpoint) -> SinkPort:
        """The adapter of sink ``name``, opened again when its registry entry changed.

        Raises:
            SinkConfigError: when the entry names an unknown adapter or an invalid config.
        """
        with self._lock:
            deadline_s = endpoint.deadline_s(self.settings.sink_timeout_s)
            client = self.clients.get(name)
            if client is None or self._opened_for.get(name, endpoint) != endpoint:
                if client is not None:
                    client.close()
                client = PassGuard(self._open(name, endpoint), name, deadline_s)
                self.clients[name] = client
            elif not isinstance(client, PassGuard):  # an adapter put there by hand (tests)
                client = PassGuard(client, name, deadline_s)
                self.clients[name] = client
            self._opened_for[name] = endpoint
            return client

    def new_pass(self) -> None:
        """Start a new pass: every sink that stalled in the last one is asked again."""
        for guard in self.clients.values():
            if isinstance(guard, PassGuard):
                guard.new_pass()

    def close(self) -> None:
        """Close every adapter."""
        for client in self.clients.values():
            client.close()
