"""The auditor: replays the whole ledger and proves its invariants.

Reads ``ledger.journal`` and the compacted topics from the beginning
(``read_committed``, no consumer group), asks every sink that offers
readback how many effects it holds per operation, and runs the pure checks
of :mod:`ledger.audit`. Reading the journal (never compacted) and the latest
value per key of the compacted topics gives the same answer before and after
log compaction.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from consumers.reader import read_latest, read_topic
from ledger.audit import AuditReport, audit
from ledger.events import Dispatch, JournalEntry, OperationState, RecoveryReceipt
from ledger.settings import LedgerSettings
from sinks.client import SinkClient
from sinks.registry import load_sinks

log = logging.getLogger(__name__)


def run_audit(settings: LedgerSettings, *, read_sinks: bool = True) -> AuditReport:
    """Audit one ledger.

    Args:
        settings: the ledger's settings.
        read_sinks: also read back effect counts from sinks with readback.

    Returns:
        The report (``violations`` empty when every invariant holds).

    Raises:
        LedgerError: a topic could not be read to its end.
    """
    # The four topics are read at once (each reader waits on the broker in
    # librdkafka, outside the GIL).
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="audit-read") as pool:
        journal_f = pool.submit(read_topic, settings, "journal")
        latest_f = {
            t: pool.submit(read_latest, settings, t)
            for t in ("state", "dispatches", "recovery-receipts")
        }
        journal = [r.event for r in journal_f.result() if isinstance(r.event, JournalEntry)]
        states = {
            k: r.event
            for k, r in latest_f["state"].result().items()
            if isinstance(r.event, OperationState)
        }
        dispatches = {
            k: r.event
            for k, r in latest_f["dispatches"].result().items()
            if isinstance(r.event, Dispatch)
        }
        receipts = {
            k: r.event
            for k, r in latest_f["recovery-receipts"].result().items()
            if isinstance(r.event, RecoveryReceipt)
        }
    sink_effects: dict[str, int] | None = None
    if read_sinks:
        sink_effects = {}
        sinks = load_sinks(settings.sinks_path())
        for op, state in states.items():
            endpoint = sinks.get(state.sink)
            if endpoint is None or not endpoint.contract.readback:
                continue
            with SinkClient(
                endpoint.url, timeout_s=settings.sink_timeout_s, token=endpoint.token
            ) as client:
                result = client.readback(op, None)
            if result.status == "committed":
                sink_effects[op] = result.effects
            elif result.status == "ambiguous":
                log.warning("auditor: %s readback of %s gave no answer", state.sink, op)
    return audit(journal, states, dispatches, receipts, sink_effects)
