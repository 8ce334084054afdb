"""Real external systems the sink adapters are tried against (not the ledger's
reference sinks): each runs as a child process that can be stopped or killed
like a production system, and keeps what it received in a file that tests
and game days read to count the effects the system holds."""
