"""Everything that demonstrates, exercises or breaks the ledger; the product never imports it.

The testbed is a distribution of its own (``kafka-recovery-ledger-testbed``,
``testbed/pyproject.toml``); the product's wheel carries none of it.

* :mod:`testbed.broker` -- the local single-node KRaft broker from Maven jars.
* :mod:`testbed.cluster` -- a local cluster of several nodes, optionally secured.
* :mod:`testbed.launcher` -- the one launcher both use: a node's java process.
* :mod:`testbed.errors` -- the testbed's own errors (scenarios, reference sinks).
* :mod:`testbed.sinks` -- reference sinks (gateway, store, process) and their admin client.
* :mod:`testbed.faults` -- fault hooks armed in a run folder (SIGKILL at a seam).
* :mod:`testbed.stage` -- ``python -m testbed.stage``: a stage with those hooks armed.
* :mod:`testbed.harness` -- starts, kills and restarts stages and sinks.
* :mod:`testbed.demo`, :mod:`testbed.gameday`, :mod:`testbed.scenario` -- the demo and game days.
* :mod:`testbed.mission` -- the fee-remediation mission: plan, run, report (a typed
  model, :mod:`testbed.mission.model`), HTML.
* :mod:`testbed.cli` -- these as ``ledger`` commands (a plug-in, entry point ``ledger.cli``).
"""
