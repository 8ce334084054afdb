"""Integrations with the engines services already run (workflow engines, agent
runtimes, tool protocols): each performs consequential effects through
:class:`producers.sdk.LedgerService`, keeps only references and observed
outcomes in the engine's own state (never a reusable grant or key), and needs
its engine only as an optional extra, imported inside its own module.
"""
