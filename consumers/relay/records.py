"""What the relay records about a dispatch: receipts, readbacks, operating events, log lines.

Everything here only builds values: no sink, no Kafka, no clock (times are
passed in). :class:`Recorder` holds the two facts every record of this relay
carries: its observer name and the sink's contract version now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from ledger.errors import SinkNotReachedError
from ledger.events import Dispatch, EffectReceipt, Event, OperatingEvent, Readback
from ledger.topology import Topic

#: One output of the relay: ``(short topic, key, event)``.
Output = tuple[str, str, Event]

# Every relay module logs as ``consumers.relay``: operators filter on that name.
log = logging.getLogger("consumers.relay")


def say(d: Dispatch, attempt: int, what: str, detail: str) -> None:
    """One INFO line about a request to a sink: operation, sink, attempt, fencing token."""
    log.info(
        "relay: %s %s %s at %s (dispatch %s, attempt %d, fencing token %d): %s",
        what,
        d.kind,
        d.operation_id,
        d.sink,
        d.dispatch_id,
        attempt,
        d.fencing_token,
        detail,
    )


def say_outcome(d: Dispatch, attempt: int, event: Event) -> None:
    """One INFO line per receipt or readback the relay records for dispatch ``d``."""
    if isinstance(event, EffectReceipt):
        held = " (held as UNKNOWN_OUTCOME)" if event.status in {"AMBIGUOUS", "UNREACHABLE"} else ""
        checked = (
            ""
            if event.postcondition_status is None
            else f"; postcondition {event.postcondition_status} read right after it: "
            f"{event.postcondition_detail}"
        )
        say(d, attempt, "outcome", f"receipt {event.status}{held}: {event.detail}{checked}")
    elif isinstance(event, Readback):
        held = " (held as UNKNOWN_OUTCOME)" if event.status == "UNKNOWN" else ""
        say(d, attempt, "outcome", f"{event.kind} readback {event.status}{held}: {event.detail}")


def dispatch_event(d: Dispatch, kind: str, reason: str) -> Output:
    """The relay's operating event of ``kind`` about dispatch ``d`` (one per dispatch and kind)."""
    event = OperatingEvent(
        event_id=f"relay:{d.dispatch_id}:{kind}",
        operation_id=d.operation_id,
        component="relay",
        kind=kind,
        reason=reason,
    )
    return (Topic.OPERATING_EVENTS, d.operation_id, event)


def not_sent(
    d: Dispatch,
    detail: str,
    kind: Literal["SINK_UNREACHABLE", "UNKNOWN_SINK"],
    fresh: bool,
    readback_on_resume: bool | None,
) -> SinkNotReachedError:
    """The error for a dispatch whose next request could not be sent (or tried).

    The request is what performing the dispatch would have sent first: the
    submit of a fresh execution, the postcondition query of a verification,
    else a readback (of an execution met again after a crash: a resume's).
    """
    request: Literal["submit", "readback", "postcondition"] = (
        "postcondition"
        if d.kind == "VERIFY"
        else "submit"
        if d.kind == "EXECUTE" and fresh and readback_on_resume is None
        else "readback"
    )
    on_resume = d.on_resume if readback_on_resume is None else readback_on_resume
    if d.kind == "EXECUTE" and readback_on_resume is None and not fresh:
        on_resume = True
    return SinkNotReachedError(detail, kind=kind, request=request, on_resume=on_resume, sink=d.sink)


class Recorder:
    """Builds the relay's receipts and readbacks of a dispatch.

    Args:
        observer: the relay instance's name in its records (``relay-<instance>``).
        version_of: ``sink -> its contract version in the registry now``
            (``None``: unknown), named by every receipt unless told otherwise.
    """

    def __init__(self, observer: str, version_of: Callable[[str], int | None]) -> None:
        self.observer = observer
        self.version_of = version_of

    def receipt(
        self,
        d: Dispatch,
        status: str,
        first: int,
        now: int,
        detail: str,
        *,
        effect_id: str | None = None,
        attempt_id: str | None = None,
        on_resume: bool = False,
        reservation: str | None = None,
        contract_version: int | None = None,
    ) -> EffectReceipt:
        """A receipt of ``d`` (times in ms).

        ``contract_version`` is the version its effect was attempted under (default: the sink's
        version in the registry now).
        """
        return EffectReceipt(
            operation_id=d.operation_id,
            dispatch_id=d.dispatch_id,
            status=status,  # type: ignore[arg-type]  # one of the receipt statuses, from the caller
            sink=d.sink,
            attempt_id=attempt_id or d.dispatch_id,
            fencing_token=d.fencing_token,
            effect_id=effect_id,
            observed_at_ms=now,
            first_attempt_at_ms=first,
            detail=detail,
            on_resume=on_resume,
            observer=self.observer,
            reservation=reservation,  # type: ignore[arg-type]  # a reservation status or None
            contract_version=(
                contract_version if contract_version is not None else self.version_of(d.sink)
            ),
        )

    def attempt_marker(self, d: Dispatch, now: int) -> EffectReceipt:
        """The ``ATTEMPTED`` receipt committed before ``d`` may leave (``now`` in ms)."""
        return EffectReceipt(
            operation_id=d.operation_id,
            dispatch_id=d.dispatch_id,
            status="ATTEMPTED",
            sink=d.sink,
            attempt_id=d.dispatch_id,
            fencing_token=d.fencing_token,
            observed_at_ms=now,
            first_attempt_at_ms=now,
            detail="about to send",
            observer=self.observer,
            contract_version=self.version_of(d.sink),
        )

    def observation(
        self,
        d: Dispatch,
        kind: str,
        status: str,
        source: str,
        detail: str,
        now: int,
        *,
        effect_id: str | None = None,
        on_resume: bool,
    ) -> Output:
        """A readback record answering dispatch ``d`` (key: operation ID; ``now`` in ms)."""
        return (
            Topic.READBACKS,
            d.operation_id,
            Readback(
                operation_id=d.operation_id,
                dispatch_id=d.dispatch_id,
                kind=kind,  # type: ignore[arg-type]  # EFFECT or POSTCONDITION, from the caller
                status=status,  # type: ignore[arg-type]  # a readback status, from the caller
                source=source,
                effect_id=effect_id,
                observed_at_ms=now,
                detail=detail,
                on_resume=on_resume,
                observer=self.observer,
                fencing_token=d.fencing_token,
            ),
        )

    def unobserved(self, d: Dispatch, reason: str, now: int) -> Output:
        """An UNKNOWN observation of what ``d`` reads back.

        Its postcondition for a VERIFY, else its effect (nothing was observed: ``reason``).
        """
        kind = "POSTCONDITION" if d.kind == "VERIFY" else "EFFECT"
        return self.observation(d, kind, "UNKNOWN", d.sink, reason, now, on_resume=d.on_resume)
