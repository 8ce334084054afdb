"""Producers: what services and review systems use to write to the ledger."""

from producers.intents import IntentPublisher, PublishedIntent

__all__ = ["IntentPublisher", "PublishedIntent"]
