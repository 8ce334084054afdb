"""Reference effect sinks: HTTP gateways that honour an :class:`EffectContract`.

* :mod:`sinks.store` -- the durable SQLite store of one sink (effects, fences,
  armed faults, counters).
* :mod:`sinks.gateway` -- the Starlette app (one implementation; the contract
  switches idempotency, readback, postcondition and fencing on or off) and the
  ``python -m sinks.gateway`` entry point.
* :mod:`sinks.client` -- the synchronous client the relay, reconcilers and
  tests use; it maps every HTTP answer and transport failure to a typed result.
* :mod:`sinks.process` -- run a gateway as a subprocess (start, stop, SIGKILL,
  restart on the same database).
* :mod:`sinks.registry` -- the sink registry file (name -> URL and contract)
  that the relay, reconcilers, auditor and CLI read.
"""
