"""``python -m ledger.cli``: the ``ledger`` command."""

from ledger.cli import main

main()
