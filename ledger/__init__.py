"""Event-sourced recovery ledger on Apache Kafka.

The pure core (states and the transition table, events, identity, the fold,
authority and effect-contract rules, the auditor's invariants, errors) and
what every process shares (settings, clock, serde, Kafka client settings,
topic names and administration), with the CLI in :mod:`ledger.cli`.

Importing this package loads nothing: import the module you need, e.g.
``from ledger.states import RecoveryState`` or ``from ledger.fold import decide``.
"""
