"""Producers: everything that publishes into the ledger (services, review systems, operators).

:class:`LedgerPublisher` (also importable as ``IntentPublisher``, its former
name) validates each record against its Avro schema and produces it
idempotently with the ``murmur2_random`` partitioner. :class:`LedgerService`
(:mod:`producers.sdk`) is the service's one call: publish an intent and get
its typed outcome from the signed outcome channel.
"""

from producers.publisher import IntentPublisher, LedgerPublisher, PublishedIntent
from producers.sdk import LedgerService

__all__ = ["IntentPublisher", "LedgerPublisher", "LedgerService", "PublishedIntent"]
