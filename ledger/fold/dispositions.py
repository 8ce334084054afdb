"""Dispositions: an attributable human decision releases an unknown outcome.

A disposition names the unknown-outcome episode it answers (``episode``: the
state version at which the operation entered UNKNOWN_OUTCOME, see
:func:`~ledger.fold.core.episode`) and is applied only in that episode. An
authentic disposition appended again in a later episode of the same
operation (a replay) changes nothing and is reported (``REPLAYED``). A
disposition written before schema version 2 names no episode: it applies
only to an episode that began before version 5 of the state (which names
none either), never to one this release began.
"""

from __future__ import annotations

from ledger.events import Disposition, OperationState
from ledger.fold.core import (
    Decision,
    Observation,
    _forbidden,
    _move,
    _reconciliation_done,
    _recovery_receipt,
    _replayed,
)
from ledger.fold.effects import _absent_retry, _committed
from ledger.states import RecoveryState as S


def _disposition(state: OperationState, d: Disposition, ref: str) -> Decision:
    """An attributable human decision releases an unknown outcome (never a timer).

    Only in the episode it names (``d.episode == state.entered_version``);
    in any other it is refused as ``REPLAYED`` and the state stays.
    """
    if state.state != S.UNKNOWN_OUTCOME:
        target = {"COMMITTED": S.EFFECT_COMMITTED, "ABSENT": S.ADMITTED, "ABANDON": S.ABANDONED}
        # Refused on its evidence, not the table: a disposition releases only
        # UNKNOWN_OUTCOME (NOT_ADMITTED -> ADMITTED is in the table, but its
        # evidence is an admission, never a disposition).
        return _forbidden(
            state,
            state.operation_id,
            (S(state.state), target[d.decision]),
            ref,
            f"disposition {d.decision} by {d.by} applies only to UNKNOWN_OUTCOME",
        )
    if d.episode != state.entered_version:
        return _replayed(
            state,
            ref,
            f"disposition {d.disposition_id} {d.decision} by {d.by}",
            "no episode (written before dispositions named one)"
            if d.episode is None
            else f"episode {d.episode}",
            "If this operation needs a disposition, dispose of it again ('ledger reconcile "
            "dispose' names the current episode itself)",
        )
    source = f"disposition by {d.by}: {d.evidence}"
    if d.decision == "COMMITTED":
        return _committed(
            state,
            ref,
            Observation(source, "COMMITTED (disposition)", d.disposed_at_ms, True, d.by),
            effect_id=state.effect_id,
        )
    if d.decision == "ABSENT":
        return _absent_retry(
            state,
            ref,
            Observation(source, "ABSENT (disposition)", d.disposed_at_ms, True, d.by),
            by_person=True,
        )
    obs = Observation(source, "ABANDON (disposition)", d.disposed_at_ms, True, d.by)
    receipt = _recovery_receipt(
        state,
        ref,
        obs,
        action="ABANDON",
        effect_id=None,
        postcondition="not checked: operation abandoned",
        uncertainty=f"whether the effect committed at {state.sink} (accepted by {d.by})",
        owner=d.by,
        release="none: abandoned by an attributable disposition",
    )
    return _move(
        state,
        S.ABANDONED,
        ref,
        f"abandoned by {d.by}: {d.evidence}",
        (receipt, _reconciliation_done(state)),
        **obs.fields(),
        recovery_receipts=state.recovery_receipts + 1,
    )
