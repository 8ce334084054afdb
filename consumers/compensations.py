"""What the processor observes for a compensation, and for its original's tally.

The fold (:mod:`ledger.fold.compensation`, :mod:`ledger.fold.tally`) is
pure: what it needs from outside (other partitions of ``ledger.state``, the
sink registry) is observed here, passed in as :class:`CompensationFacts`
and journaled with the decision, so replay decides the same.

* :func:`observe_compensation`: for a compensation's intent, the original
  and the other compensations of it as ``ledger.state`` (every partition)
  and the processor's own open transaction hold them.
* :func:`observe_tally`: for a tally request folded by the original's
  owner, the original's amount as its sink's contract names it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import Message

from consumers.stage import Record, key_text
from ledger.authority import DEFAULT_AMOUNT_FIELD
from ledger.errors import LedgerError
from ledger.events import Intent, OperationState
from ledger.fold import CompensationFacts, account_of, amount_of, priors_of
from sinks.registry import RegistryFile, SinkEndpoint

log = logging.getLogger(__name__)


def _sinks(registry: RegistryFile) -> Mapping[str, SinkEndpoint]:
    try:
        return registry.current()
    except LedgerError:
        return {}  # unreadable: the original's sink counts as unregistered (refused)


def _facts(
    found: OperationState | None,
    sinks: Mapping[str, SinkEndpoint],
    own_sink: str,
    *,
    prior: tuple[OperationState, ...] = (),
) -> CompensationFacts:
    """The facts of ``found`` (the original) for a compensation on ``own_sink``."""
    fields = {name: e.contract.amount_field for name, e in sinks.items()}
    original_sink = found.sink if found is not None else None
    endpoint = sinks.get(original_sink) if original_sink is not None else None
    own = sinks.get(own_sink)
    return CompensationFacts(
        original_state=str(found.state) if found is not None else None,
        original_sink=original_sink,
        consequence=endpoint.contract.consequence if endpoint is not None else None,
        compensable=own.contract.compensable if own is not None else False,
        observed_scope=found is not None,
        original_subject=found.subject if found is not None else None,
        original_account=account_of(found.params_json) if found is not None else None,
        original_amount_minor=(
            amount_of(found.params_json, fields.get(found.sink, DEFAULT_AMOUNT_FIELD))[0]
            if found is not None
            else None
        ),
        amount_field=own.contract.amount_field if own is not None else DEFAULT_AMOUNT_FIELD,
        prior=priors_of(found.operation_id, prior, fields) if found is not None else (),
        tally=True,
    )


def observe_compensation(
    intent: Intent,
    read_state: Callable[[Callable[[Record | None, Message], None]], object],
    mine: Callable[[str], OperationState | None],
    pending: Iterable[str],
    registry: RegistryFile,
) -> CompensationFacts:
    """What the ledger knows of the original a compensation names, and of its compensations.

    A compensation's key differs from its original's, and from its
    siblings', so they may sit on other processors' partitions: every
    partition of ``ledger.state`` is read (``read_committed``, seals
    checked) for the original and for the other compensations of it, and
    the processor's own decisions (``mine``: its table with its open
    transaction laid over it) are laid over what was read. A stale read is
    safe for the original: settled states only move on to settled states,
    so an original seen settled stays settled, and one not yet seen settled
    is refused (publish the compensation again, under a new ID, once it
    has). For the siblings a stale read is not enough (two compensations
    decided at once on two partitions each see the other not yet): the
    checks here refuse what is already visible, and the original's owner
    decides the claim on the effect (``tally`` true, :mod:`ledger.fold.tally`).

    Args:
        intent: an intent whose ``compensates`` is set.
        read_state: reads every partition of ``ledger.state`` into the
            callback it is given (as :func:`~consumers.stage.read_partition`).
        mine: the processor's own state of an operation (its open
            transaction first; ``None`` when it holds none).
        pending: the operations decided in its open transaction (not yet
            on ``ledger.state``).
        registry: the sink registry (consequence class, ``compensable``,
            where each sink's amount is).

    Returns:
        The observed :class:`CompensationFacts`.
    """
    original = intent.compensates or ""
    read: dict[str, OperationState] = {}

    def load(rec: Record | None, msg: Message) -> None:
        if rec is None or not isinstance(rec.event, OperationState):
            read.pop(key_text(msg), None)  # a tombstone or another kind ends what was read
            return
        if rec.key == original or rec.event.compensates == original:
            read[rec.key] = rec.event
        else:
            read.pop(rec.key, None)

    read_state(load)
    for op in [*read, *pending]:
        st = mine(op)
        if st is not None and (op == original or st.compensates == original):
            read[op] = st
    found = read.pop(original, None)
    read.pop(intent.operation_id, None)
    log.info(
        "processor: compensation %s: read %s from ledger.state: %s, %d other compensation(s)",
        intent.operation_id,
        original,
        found.state if found is not None else "unknown",
        len(read),
    )
    return _facts(found, _sinks(registry), intent.sink, prior=tuple(read.values()))


def observe_tally(original: OperationState, registry: RegistryFile) -> CompensationFacts:
    """The original as its owner observes it when folding a tally request.

    The tally needs the original's amount, read from the parameter its
    sink's contract names (the registry as it is now); the rest is the
    original's own state. (``compensable`` and ``amount_field`` describe
    the original's own sink here; the tally does not use them.)

    Args:
        original: the original's state (this processor owns it).
        registry: the sink registry.

    Returns:
        The facts, ``tally`` true.
    """
    return _facts(original, _sinks(registry), original.sink)
