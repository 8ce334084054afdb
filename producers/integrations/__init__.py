"""Integrations with the engines services already run (workflow engines, agent runtimes).

Each module adapts one engine to :class:`producers.sdk.LedgerService` and is
an optional extra (``pip install 'kafka-recovery-ledger[<engine>]'``): the
engine is imported only by its own module, so ``import producers`` never needs it.
"""
