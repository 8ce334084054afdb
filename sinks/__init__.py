"""The sink side of the ledger: the protocol a sink speaks and the client the relay uses.

* :mod:`sinks.client` -- the synchronous HTTP client the relay, reconcilers and
  auditor use (submit with idempotency key and fencing token, readback by
  operation ID, postcondition query, health); it maps every HTTP answer and
  transport failure to a typed result.
* :mod:`sinks.registry` -- the sink registry file (name -> URL and contract)
  that the relay, reconcilers, auditor and CLI read.

The reference sinks that speak this protocol for demos and tests (a payment
gateway with faults, and an unsafe sink) live in :mod:`testbed.sinks`.
"""
