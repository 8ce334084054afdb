"""Integrations with the engines services already run (DBOS, LangGraph, MCP ...).

Each module imports its engine itself and is installed with its own extra
(``pip install 'kafka-recovery-ledger[dbos]'`` ...), so ``import producers``
needs none of them. Every integration performs consequential operations
through :class:`producers.sdk.LedgerService` under a stable operation ID, and
keeps in the engine's checkpoint only references (operation ID, approval ID)
and the observed outcome, never a reusable grant or key.
"""
