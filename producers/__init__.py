"""Producers: everything that publishes into the ledger (services, review systems, operators).

:class:`LedgerPublisher` (also importable as ``IntentPublisher``, its former
name) validates each record against its Avro schema and produces it
idempotently with the ``murmur2_random`` partitioner.
"""

from producers.publisher import IntentPublisher, LedgerPublisher, PublishedIntent

__all__ = ["IntentPublisher", "LedgerPublisher", "PublishedIntent"]
