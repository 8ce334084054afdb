"""Former home of the publisher, kept so that old imports keep working.

``from producers.intents import IntentPublisher`` still works; new code uses
:mod:`producers.publisher` (:class:`~producers.publisher.LedgerPublisher`).
"""

from producers.publisher import IntentPublisher, LedgerPublisher, PublishedIntent, build_intent

__all__ = ["IntentPublisher", "LedgerPublisher", "PublishedIntent", "build_intent"]
