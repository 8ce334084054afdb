"""The relay: the transactional outbox's other half.

It reads committed dispatches (``read_committed``), performs them against the
sinks, and records what it saw. For an ``EXECUTE`` dispatch it first commits
an ``ATTEMPTED`` receipt (so a restarted relay knows the request may have
left), then calls the sink with the operation ID as idempotency key and the
operation's fencing token, then writes the receipt in a transaction with its
consumer offsets. A dispatch it meets again after a crash is never sent
blindly: it reads the effect back first (or, for an idempotent sink without
readback, resubmits under the same key while the sink still keeps it), and
otherwise records an ambiguous outcome.

Where the sink's contract offers a postcondition query, the relay asks it
right after a committed execution and records the verdict (``MATCH`` or
``MISMATCH``) in the ``COMMITTED`` receipt itself: one record, one
transaction, and the processor verifies without a ``VERIFY`` dispatch, a
round trip through the processor less (``LEDGER_RELAY_INLINE_VERIFY``,
default on). A query that does not answer leaves the receipt plain, and
the ``VERIFY`` path verifies as before.

A sink whose contract offers reservations (try-confirm-cancel) is never
sent a plain submit: the relay reserves a bounded hold, then confirms it
only while the operation's admission still stands (its approval not
revoked, the policy version unchanged since admission) and cancels it
otherwise; a dispatch met again reads the hold back first (confirmed:
recorded; held: confirmed or cancelled as above; released by the sink:
reserved again under the same key while the admission stands). The check is
the pure rule :func:`ledger.authority.admission_withdrawn` over the
approvals and policy tables the relay follows (authenticated records only),
made right before the confirmation it guards: it can only withdraw an
admission, never grant one (docs/architecture.md, "How it works": who decides). Every end
of a hold is a receipt (``COMMITTED`` with ``reservation: CONFIRMED``,
``CANCELLED``, ``EXPIRED``), journaled by the processor.

A request that never reached its sink (the connection was refused or could
not be made, or the sink is not in the registry) cannot have made an effect:
the relay parks its dispatch and tries again after a growing backoff
(:func:`~ledger.contracts.after_unreached`, ``LEDGER_SINK_RETRY_*``), while it
goes on with every other dispatch; the consumer offset is held back at the
oldest parked dispatch of each partition, so a relay that crashes meets it
again. Once the budget is spent it records the request as never delivered (an
``UNREACHABLE`` receipt, or an ``UNKNOWN`` readback) with an operating event
(``SINK_UNREACHABLE`` or ``UNKNOWN_SINK``): the processor holds the operation
for a person, its admission intact, instead of abandoning it.

In ``checkpoint-only`` mode (the negative control) it does what naive
runtimes do: trusts only its own checkpoint (the committed offset) and
resubmits with a fresh attempt identity (and a fresh idempotency key, the
attempt's, so a sink that requires a key still makes a second effect).

A sink that refuses the relay's bearer token (401/403,
:class:`~ledger.errors.SinkAuthError`) refused that request before looking at
it, and the operation is not at fault: it is never a rejection. When the
refused request was the first and only submit of the dispatch, no effect was
made and the execution gets an ``UNAVAILABLE`` receipt (the processor
re-dispatches within its unavailable budget, as for an outage). When an
earlier request of the dispatch may have reached the sink (a resume, or a
readback after a timed-out submit), the execution is held ``AMBIGUOUS``
(UNKNOWN_OUTCOME, for reconciliation once the token is fixed); a readback or
postcondition is observed ``UNKNOWN``. Each comes with a ``SINK_AUTH_FAILED``
operating event naming the sink and the remedy, and the relay rereads the
sink registry before its next request, so a corrected token is picked up
without a restart.

Before it contacts a sink for a step, the relay checks the step against the
release manifest (``LEDGER_RELEASE_MANIFEST_FILE``, :mod:`ledger.upgrades`)
when the sink's contract version in the registry differs from the one the
operation's first attempt was sent under (else its dispatch's): the relay is
the one stage that knows the contract it is about to act under, and the fold
stays pure. A step the manifest does not allow is not sent; it is recorded as
the relay records any step it cannot complete (an ``AMBIGUOUS`` receipt or an
``UNKNOWN`` observation, in its own topics) with a ``CONTRACT_UPGRADE_HOLD``
operating event naming both versions. Every receipt carries the contract
version the relay acted under.

A corrupted sink registry or clock file never stops it: the content last read
well stands, the problem is logged and published once as a ``LOCAL_FILE``
operating event, and at start it waits for a readable file
(:mod:`consumers.localfiles`).

The package keeps each concern in a room of its own, the :class:`Relay`
stage wiring them to the exactly-once loop:

* :mod:`~consumers.relay.stage`: the stage (batches, transactions, retries);
* :mod:`~consumers.relay.dispatch`: performing one dispatch (the pure
  delivery rule carried out), its failures kept to its operation;
* :mod:`~consumers.relay.calls`: the requests to a sink, and nothing else;
* :mod:`~consumers.relay.postcondition`: verification;
* :mod:`~consumers.relay.parking`: unreached sinks, backoff and budget;
* :mod:`~consumers.relay.upgrade`: the release manifest's upgrade hold;
* :mod:`~consumers.relay.admission`: the approvals and policy tables;
* :mod:`~consumers.relay.attempts`, :mod:`~consumers.relay.handover`,
  :mod:`~consumers.relay.notes`, :mod:`~consumers.relay.records`,
  :mod:`~consumers.relay.sinks`: what the relay remembers and records.
"""

from consumers.relay.parking import Parked
from consumers.relay.records import Output
from consumers.relay.stage import Relay

__all__ = ["Output", "Parked", "Relay"]
