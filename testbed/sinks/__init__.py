"""Reference sinks: HTTP gateways that honour an :class:`~ledger.contracts.EffectContract`.

* :mod:`testbed.sinks.store` -- the durable SQLite store of one sink (effects,
  fences, armed faults, counters).
* :mod:`testbed.sinks.gateway` -- the Starlette app (the contract switches
  idempotency, readback, postcondition and fencing on or off) and its
  ``python -m testbed.sinks.gateway`` entry point.
* :mod:`testbed.sinks.process` -- run a gateway as a subprocess (start, stop,
  SIGKILL, restart on the same database).
* :mod:`testbed.sinks.admin` -- the client of the reference sinks' admin API.
"""
