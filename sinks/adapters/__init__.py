"""Sink adapters: one module per kind of external system the ledger can act on.

Each module offers ``open_adapter(endpoint, *, timeout_s)`` returning an object
with the methods of :class:`sinks.port.SinkPort`, and declares what it can
honestly offer as ``open_adapter.capabilities``; :data:`sinks.port.BUILTIN`
names the ones this package ships.
"""
