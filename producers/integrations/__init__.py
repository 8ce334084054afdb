"""Integrations with the engines services already run.

Workflow engines, agent runtimes, tool protocols.

Each module adapts one engine to :class:`producers.sdk.LedgerService`: it
performs consequential effects through the ledger, keeps only references and
observed outcomes in the engine's own state (never a reusable grant or key),
and is an optional extra (``pip install 'kafka-recovery-ledger[<engine>]'``):
the engine is imported only by its own module, so ``import producers`` never
needs it.
"""
