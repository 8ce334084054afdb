"""Reservations at a sink (try-confirm-cancel): the hold verbs and what they answer.

:class:`Reservations` is the part of :class:`sinks.client.SinkClient` that
speaks the protocol's ``/reservations`` routes: take a bounded hold
(``reserve``), make the effect from it (``confirm``), release it
(``cancel``) and read it back (``read_hold``). Every expected outcome is a
:class:`HoldResult` value; only an answer outside the protocol raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from ledger.errors import SinkProtocolError
from sinks.exchange import HttpExchange, NoAnswer, json_body

HoldStatus = Literal[
    "held",
    "confirmed",
    "released",
    "absent",
    "rejected",
    "stale_token",
    "key_reused",
    "unsupported",
    "unavailable",
    "ambiguous",
]


@dataclass(frozen=True)
class HoldResult:
    """Outcome of a reservation call (try-confirm-cancel, ``/reservations``).

    Attributes:
        status: the hold as the sink reports it -- ``held``, ``confirmed``
            (the effect is made), ``released`` (cancelled, or expired after
            the contract's ``reservation_hold_s``), ``absent`` (never
            reserved) -- or ``rejected`` (a reserve refused: no hold),
            ``stale_token``, ``key_reused`` (held with other parameters),
            ``unsupported`` (no reservations), ``unavailable`` (not
            processed) or ``ambiguous`` (no answer: the call may have acted).
        operation_id: the operation (the hold's key).
        effect_id: the effect made by the confirmation, when confirmed.
        released_why: ``cancelled`` or ``expired`` when released.
        expires_at_ms: ledger time (ms) an unconfirmed hold is released.
        reserves: how many holds were taken under this key.
        http_status: the HTTP status, or ``None`` when no answer came.
        detail: a human-readable reason.
        sent: ``False`` when the request never left.
    """

    status: HoldStatus
    operation_id: str
    effect_id: str | None = None
    released_why: str | None = None
    expires_at_ms: int | None = None
    reserves: int = 0
    http_status: int | None = None
    detail: str = ""
    sent: bool = True


class Reservations:
    """The reservation verbs of one sink, over its HTTP exchange.

    Args:
        exchange: the sink client's :class:`~sinks.exchange.HttpExchange`.
    """

    def __init__(self, exchange: HttpExchange) -> None:
        self.exchange = exchange

    def hold(self, method: str, path: str, operation_id: str, **kwargs: Any) -> HoldResult:
        """Send one reservation call and read the hold it answers with."""
        answer = self.exchange.send(method, path, operation_id=operation_id, **kwargs)
        if isinstance(answer, NoAnswer):
            status: HoldStatus = "ambiguous" if answer.sent else "unavailable"
            return HoldResult(status, operation_id, detail=answer.detail, sent=answer.sent)
        code = answer.status_code
        body = json_body(answer)
        hold = body.get("status")
        if code in (200, 201, 409) and hold in ("held", "confirmed", "released"):
            return HoldResult(
                hold,
                operation_id,
                effect_id=body.get("effect_id"),
                released_why=body.get("released_why"),
                expires_at_ms=body.get("expires_at_ms"),
                reserves=int(body.get("reserves") or 0),
                http_status=code,
                detail=f"{hold}"
                + (f" ({body['released_why']})" if body.get("released_why") else ""),
            )
        if code == 404 and hold == "absent":
            return HoldResult("absent", operation_id, http_status=code, detail="absent")
        if code == 409 and body.get("error") == "stale_fencing_token":
            return HoldResult(
                "stale_token", operation_id, http_status=code, detail="stale_fencing_token"
            )
        if code == 409 and body.get("error") == "idempotency_key_reused":
            return HoldResult(
                "key_reused", operation_id, http_status=code, detail="idempotency_key_reused"
            )
        if code == 501:
            return HoldResult("unsupported", operation_id, http_status=code, detail=answer.text)
        if code == 503:
            return HoldResult("unavailable", operation_id, http_status=code, detail=answer.text)
        if code >= 500:
            return HoldResult("ambiguous", operation_id, http_status=code, detail=answer.text)
        if method == "POST" and path == "/reservations" and 400 <= code < 500:
            return HoldResult("rejected", operation_id, http_status=code, detail=answer.text)
        raise SinkProtocolError(
            method, path, code, answer.text, sink=self.exchange.base_url, operation_id=operation_id
        )

    def reserve(
        self,
        operation_id: str,
        parameter_digest: str,
        params: dict[str, Any],
        fencing_token: int | None,
        attempt_id: str,
        *,
        action: str,
        subject: str,
        purpose: str,
        decision_version: int,
    ) -> HoldResult:
        """Take a bounded hold for an operation's effect (the "try").

        The hold's key is the operation ID (sent as the idempotency key too):
        reserving again answers the hold as it stands, or takes a new hold
        when the sink released the last one. Arguments as :meth:`submit`.

        Returns:
            The hold (``held``, or ``confirmed`` when it already was), or a
            refusal; see :class:`HoldResult`.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        body: dict[str, Any] = {
            "operation_id": operation_id,
            "parameter_digest": parameter_digest,
            "params": params,
            "fencing_token": fencing_token,
            "attempt_id": attempt_id,
            "action": action,
            "subject": subject,
            "purpose": purpose,
            "decision_version": decision_version,
        }
        return self.hold(
            "POST",
            "/reservations",
            operation_id,
            headers={"Idempotency-Key": operation_id},
            json=body,
        )

    def confirm(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """Confirm a held reservation: the sink makes the effect (once).

        Returns:
            ``confirmed`` (with the effect ID), ``released`` (too late: the
            hold was cancelled or expired), ``absent``, or a failure.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        body = {"operation_id": operation_id, "fencing_token": fencing_token}
        return self.hold("POST", "/reservations/confirm", operation_id, json=body)

    def cancel(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """Cancel a held reservation: the sink releases it; no effect is made.

        Returns:
            ``released``, ``confirmed`` (too late: the effect is made),
            ``absent``, or a failure.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        body = {"operation_id": operation_id, "fencing_token": fencing_token}
        return self.hold("POST", "/reservations/cancel", operation_id, json=body)

    def read_hold(self, operation_id: str, fencing_token: int | None = None) -> HoldResult:
        """Read a reservation back: ``held``, ``confirmed``, ``released`` or ``absent``.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        path = f"/reservations/{quote(operation_id, safe=':')}"
        query = {} if fencing_token is None else {"fencing_token": str(fencing_token)}
        return self.hold("GET", path, operation_id, params=query)
