"""Sink adapters beyond the ledger's own HTTP protocol.

Each module reaches one kind of external system (an SMTP server, an HTTP API that follows the
``Idempotency-Key`` header draft ...) and answers in the outcome vocabulary of :mod:`sinks.client`,
through the port :mod:`sinks.port` describes. A module's ``open_adapter(endpoint, *, timeout_s)`` is
what :data:`sinks.port.BUILTIN` names for its kind.
"""
