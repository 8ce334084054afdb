"""The pure fold: (state, input event) -> (new state, outputs).

This package is the processor's whole decision logic and the auditor's replay
function. It reads no clock, draws no random numbers and does no I/O: every
time it uses comes from a recorded event (an admission's evaluation time, an
observation's time), and every ID it makes is derived from the input's
position (``ref``). Replaying the journal through :func:`decide` therefore
reproduces ``ledger.state`` exactly.

The transition table (:data:`ledger.states.TRANSITIONS`) is law: every state
change goes through one function, ``_move``, which checks each hop of the
move against the table and refuses any other with a ``FORBIDDEN_TRANSITION``
operating event. A compound move (an admission: ``NOT_ADMITTED -> ADMITTED ->
EFFECT_PENDING``) is checked and recorded hop by hop (:attr:`Decision.hops`).

The fold is split by input kind: :mod:`~ledger.fold.core` (decisions,
outputs, the one move, refusals, receipts), :mod:`~ledger.fold.intents`,
:mod:`~ledger.fold.admissions`, :mod:`~ledger.fold.effects` (receipts and
readbacks), :mod:`~ledger.fold.claims`, :mod:`~ledger.fold.dispositions` and
:mod:`~ledger.fold.tally` (a compensation's claim on its original's effect);
:mod:`~ledger.fold.apply` routes an input to its module (:func:`decide`) and
:mod:`~ledger.fold.journal` records decisions and replays them. Import from
``ledger.fold``: the modules are its layout, not its interface.
"""

from ledger.fold.apply import decide
from ledger.fold.compensation import (
    SETTLED,
    CompensationCounts,
    CompensationFacts,
    PriorCompensation,
    account_of,
    amount_of,
    compensation_counts,
    compensation_refusal,
    priors_of,
)
from ledger.fold.core import (
    STAY,
    Decision,
    Hop,
    Observation,
    ObservedFields,
    Outcome,
    Output,
    current_dispatch_id,
    dispatch_id,
)
from ledger.fold.effects import MAX_ABSENT_RETRIES, MAX_UNAVAILABLE
from ledger.fold.intents import intent_digest_problem
from ledger.fold.journal import (
    drifts,
    hop_names,
    journal_entry,
    keeps_intent,
    ref_of,
    repeats,
    replay,
    replay_decisions,
)

__all__ = [
    "MAX_ABSENT_RETRIES",
    "MAX_UNAVAILABLE",
    "SETTLED",
    "STAY",
    "CompensationCounts",
    "CompensationFacts",
    "Decision",
    "Hop",
    "Observation",
    "ObservedFields",
    "Outcome",
    "Output",
    "PriorCompensation",
    "account_of",
    "amount_of",
    "compensation_counts",
    "compensation_refusal",
    "current_dispatch_id",
    "decide",
    "dispatch_id",
    "hop_names",
    "intent_digest_problem",
    "journal_entry",
    "keeps_intent",
    "priors_of",
    "ref_of",
    "drifts",
    "repeats",
    "replay",
    "replay_decisions",
]
