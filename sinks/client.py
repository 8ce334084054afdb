"""Synchronous client of a reference sink (see :mod:`testbed.sinks.gateway`).

Every expected outcome is a value, never an exception: the methods return
frozen result objects whose ``status`` says what happened. Transport
failures are translated once, in :meth:`sinks.exchange.HttpExchange.send`:

* the request certainly did not leave (connection refused, connect or pool
  timeout): a submit is ``unavailable`` (safe to retry);
* the request may have left (read or write timeout, connection dropped
  mid-exchange) or the sink answered 5xx other than 503: a submit is
  ``ambiguous`` -- the effect may or may not have happened, and only a new
  observation (readback) may decide.

Only answers that mean the caller or the sink is broken (400, an unknown
route, a body that is not the protocol's) raise
:class:`~ledger.errors.SinkProtocolError`. A 401 or 403 from any route raises
:class:`~ledger.errors.SinkAuthError`: the sink refused the caller's bearer
token before looking at the request, which is a configuration problem (the
``token`` of the sink's entry in the sink registry), never a rejection of
the operation. Every call carries ``Authorization: Bearer <token>`` when the
client has a token. Admin calls raise
:class:`~ledger.errors.SinkUnavailableError` (retryable) when the sink gives
no answer. Both are :class:`~ledger.errors.SinkError`, hence
:class:`~ledger.errors.LedgerError`; no httpx transport error leaves this
module.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import quote

import httpx

from ledger.contracts import PostconditionQuery
from ledger.errors import SinkError, SinkUnavailableError
from ledger.errors import SinkProtocolError as SinkProtocolError  # re-exported: its old home
from sinks.exchange import Answer, HttpExchange, NoAnswer, json_body
from sinks.holds import HoldResult as HoldResult  # re-exported: its old home
from sinks.holds import HoldStatus as HoldStatus  # re-exported: its old home
from sinks.holds import Reservations
from sinks.limits import DEFAULT_MAX_RESPONSE_BYTES

SubmitStatus = Literal[
    "committed", "rejected", "stale_token", "key_reused", "unavailable", "ambiguous"
]
ReadbackStatus = Literal["committed", "absent", "unsupported", "stale_token", "ambiguous"]
AccountStatus = Literal["observed", "unsupported", "ambiguous"]

#: The answer types and body reader under the names importers (the testbed's
#: admin client) know them by.
_Answer = Answer
_NoAnswer = NoAnswer
_json = json_body

#: Former names of the client's errors, kept for importers.
SinkClientError = SinkError
SinkUnreachableError = SinkUnavailableError


@dataclass(frozen=True)
class SubmitResult:
    """Outcome of ``POST /operations``.

    Attributes:
        status: ``committed`` (new effect or idempotent replay), ``rejected``
            (the sink refused the effect; none happened), ``stale_token`` (a
            newer owner holds the operation), ``key_reused`` (the key names an
            effect with another parameter digest), ``unavailable`` (the
            request was not processed; none happened) or ``ambiguous`` (the
            effect may have happened).
        operation_id: the operation submitted.
        effect_id: the sink's effect ID when committed.
        committed_ms: ledger time (ms) of the commit when committed.
        replayed: ``True`` when the sink answered with an earlier effect.
        highest_token: the sink's highest fencing token, for ``stale_token``.
        http_status: the HTTP status, or ``None`` when no answer came.
        detail: a human-readable reason for any status but ``committed``.
        sent: ``False`` when the request never left (the connection was
            refused or could not be made): the sink cannot have received it.
    """

    status: SubmitStatus
    operation_id: str
    effect_id: str | None = None
    committed_ms: int | None = None
    replayed: bool = False
    highest_token: int | None = None
    http_status: int | None = None
    detail: str = ""
    sent: bool = True


@dataclass(frozen=True)
class ReadbackResult:
    """Outcome of ``GET /operations/{operation_id}``.

    Attributes:
        status: ``committed``, ``absent``, ``unsupported`` (the contract has
            no readback), ``stale_token`` or ``ambiguous`` (no observation).
        operation_id: the operation read back.
        effect_id: the first effect's ID when committed.
        committed_ms: ledger time (ms) of the first effect when committed.
        parameter_digest: digest the first effect was made with.
        effects: how many effects the sink holds for the operation.
        highest_token: the sink's highest fencing token, for ``stale_token``.
        http_status: the HTTP status, or ``None`` when no answer came.
        detail: a human-readable reason for any status but ``committed``.
        sent: ``False`` when the request never left (no observation was
            made, and asking again is safe).
    """

    status: ReadbackStatus
    operation_id: str
    effect_id: str | None = None
    committed_ms: int | None = None
    parameter_digest: str | None = None
    effects: int = 0
    highest_token: int | None = None
    http_status: int | None = None
    detail: str = ""
    sent: bool = True


@dataclass(frozen=True)
class Credit:
    """One credit to an account (postcondition evidence).

    Attributes:
        operation_id: the operation that made it.
        amount_minor: amount in minor units.
        effect_id: the sink's effect ID.
    """

    operation_id: str
    amount_minor: int
    effect_id: str


@dataclass(frozen=True)
class AccountCredits:
    """Outcome of ``GET /accounts/{account}``.

    Attributes:
        status: ``observed``, ``unsupported`` (no postcondition query) or
            ``ambiguous`` (no observation).
        account: the account queried.
        credited_minor: sum of the credits in minor units.
        credits: the credits, oldest first.
        http_status: the HTTP status, or ``None`` when no answer came.
        detail: a human-readable reason for any status but ``observed``.
        sent: ``False`` when the request never left (asking again is safe).
    """

    status: AccountStatus
    account: str
    credited_minor: int = 0
    credits: tuple[Credit, ...] = ()
    http_status: int | None = None
    detail: str = ""
    sent: bool = True


def postcondition_source(query: PostconditionQuery, subject: str) -> str:
    """Name the request that answers a postcondition query (for readback records).

    Args:
        query: the contract's postcondition query.
        subject: the subject queried (e.g. the account).

    Returns:
        The request, e.g. ``GET /accounts/acct-1``.
    """
    match query.query:
        case "account-credits":
            return f"GET /accounts/{subject}"


def _submit_result(
    answer: Answer | NoAnswer, operation_id: str, path: str, sink: str
) -> SubmitResult:
    """What a submit's answer (or its absence) says; see :class:`SubmitResult`.

    Raises:
        SinkProtocolError: an answer outside the protocol.
    """
    if isinstance(answer, NoAnswer):
        status: SubmitStatus = "ambiguous" if answer.sent else "unavailable"
        return SubmitResult(status, operation_id, detail=answer.detail, sent=answer.sent)
    code = answer.status_code
    body = json_body(answer)
    if code in (200, 201) and body.get("status") == "committed":
        return SubmitResult(
            "committed",
            operation_id,
            effect_id=body["effect_id"],
            committed_ms=body["committed_ms"],
            replayed=bool(body.get("replayed", False)),
            http_status=code,
        )
    if code == 409 and body.get("error") == "stale_fencing_token":
        return SubmitResult(
            "stale_token",
            operation_id,
            highest_token=body.get("highest"),
            http_status=code,
            detail="stale_fencing_token",
        )
    if code == 409 and body.get("error") == "idempotency_key_reused":
        return SubmitResult(
            "key_reused", operation_id, http_status=code, detail="idempotency_key_reused"
        )
    if 400 <= code < 500:
        # Any other refusal (422, a 400 for params it cannot take, 404 for
        # a route it does not have ...) is definite: no effect was made.
        return SubmitResult("rejected", operation_id, http_status=code, detail=answer.text)
    if code == 503:
        return SubmitResult("unavailable", operation_id, http_status=code, detail=answer.text)
    if code >= 500 and code != 501:
        return SubmitResult("ambiguous", operation_id, http_status=code, detail=answer.text)
    raise SinkProtocolError("POST", path, code, answer.text, sink=sink, operation_id=operation_id)


def _readback_result(
    answer: Answer | NoAnswer, operation_id: str, path: str, sink: str
) -> ReadbackResult:
    """What a readback's answer (or its absence) says; see :class:`ReadbackResult`.

    Raises:
        SinkProtocolError: an answer outside the protocol.
    """
    if isinstance(answer, NoAnswer):
        return ReadbackResult("ambiguous", operation_id, detail=answer.detail, sent=answer.sent)
    code = answer.status_code
    body = json_body(answer)
    if code == 200 and body.get("status") == "committed":
        return ReadbackResult(
            "committed",
            operation_id,
            effect_id=body["effect_id"],
            committed_ms=body["committed_ms"],
            parameter_digest=body.get("parameter_digest"),
            effects=int(body["effects"]),
            http_status=code,
        )
    if code == 404 and body.get("status") == "absent":
        return ReadbackResult("absent", operation_id, http_status=code, detail="absent")
    if code == 501:
        return ReadbackResult(
            "unsupported", operation_id, http_status=code, detail=str(body.get("error", ""))
        )
    if code == 409 and body.get("error") == "stale_fencing_token":
        return ReadbackResult(
            "stale_token",
            operation_id,
            highest_token=body.get("highest"),
            http_status=code,
            detail="stale_fencing_token",
        )
    if code >= 500:
        return ReadbackResult("ambiguous", operation_id, http_status=code, detail=answer.text)
    raise SinkProtocolError("GET", path, code, answer.text, sink=sink, operation_id=operation_id)


def _account_result(
    answer: Answer | NoAnswer, account: str, path: str, sink: str
) -> AccountCredits:
    """What an account query's answer (or its absence) says; see :class:`AccountCredits`.

    Raises:
        SinkProtocolError: an answer outside the protocol.
    """
    if isinstance(answer, NoAnswer):
        return AccountCredits("ambiguous", account, detail=answer.detail, sent=answer.sent)
    code = answer.status_code
    body = json_body(answer)
    if code == 200 and "credited_minor" in body:
        credits = tuple(
            Credit(c["operation_id"], int(c["amount_minor"]), c["effect_id"])
            for c in body.get("credits", [])
        )
        return AccountCredits(
            "observed",
            account,
            credited_minor=int(body["credited_minor"]),
            credits=credits,
            http_status=code,
        )
    if code == 501:
        return AccountCredits(
            "unsupported", account, http_status=code, detail=str(body.get("error", ""))
        )
    if code >= 500:
        return AccountCredits("ambiguous", account, http_status=code, detail=answer.text)
    raise SinkProtocolError("GET", path, code, answer.text, sink=sink)


class SinkClient:
    """Client of one reference sink.

    Args:
        base_url: the sink's URL, e.g. ``http://127.0.0.1:8123``.
        timeout_s: the overall deadline of every call, from its start to the
            last byte of its answer (seconds; not per read). A submit that
            exceeds it is ``ambiguous``; a readback observes nothing.
        max_response_bytes: the most bytes of one answer read (default 1 MiB);
            a longer answer is no answer (a submit is ``ambiguous``).
        token: the sink's bearer token (from the sink registry), sent as
            ``Authorization: Bearer <token>`` on every call; ``None`` sends none.
        transport: an httpx transport to send through instead of the network
            (e.g. ``httpx.MockTransport`` in unit tests of callers).

    Attributes:
        token: as given (callers compare it with the registry's to reuse a client).
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 2.0,
        *,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.token = token
        #: the HTTP side: pool, deadline, size cap, span, transport failures.
        self._wire = HttpExchange(
            base_url,
            timeout_s,
            token=token,
            transport=transport,
            max_response_bytes=max_response_bytes,
        )
        #: the reservation verbs (try-confirm-cancel) over the same exchange.
        self._holds = Reservations(self._wire)

    @property
    def base_url(self) -> str:
        """The sink's URL, without a trailing slash."""
        return self._wire.base_url

    @property
    def timeout_s(self) -> float:
        """The overall deadline of every call (seconds)."""
        return self._wire.timeout_s

    @property
    def max_response_bytes(self) -> int:
        """The most bytes of one answer read."""
        return self._wire.max_response_bytes

    def close(self) -> None:
        """Close the connection pool."""
        self._wire.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(
        self, method: str, path: str, *, operation_id: str | None = None, **kwargs: Any
    ) -> Answer | NoAnswer:
        """Send one request and read its answer, within the deadline and the size cap.

        See :meth:`sinks.exchange.HttpExchange.send`: in a client span, every
        transport failure translated once.

        Raises:
            SinkAuthError: if the sink answers 401 or 403 (its token is not ours).
        """
        return self._wire.send(method, path, operation_id=operation_id, **kwargs)

    def submit(
        self,
        operation_id: str,
        parameter_digest: str,
        params: dict[str, Any],
        fencing_token: int | None,
        attempt_id: str,
        use_key: bool,
        *,
        action: str | None = None,
        subject: str | None = None,
        purpose: str | None = None,
        decision_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> SubmitResult:
        """Ask the sink to perform an operation's effect.

        The sink recomputes ``parameter_digest`` from ``params``, ``action``,
        ``subject``, ``purpose``, ``decision_version`` and its own name
        (:func:`ledger.identity.parameter_digest`) and refuses a mismatch; a
        digest input given as ``None`` is left out of the request (the
        reference gateway then refuses it as malformed).

        Args:
            operation_id: the stable operation ID.
            parameter_digest: digest of the semantic parameters.
            params: the parameters (``account``, ``amount_minor``,
                ``currency`` ...).
            fencing_token: the operation's current fencing token, or ``None``.
            attempt_id: this attempt's identity.
            use_key: send an ``Idempotency-Key`` header.
            action: the action (a digest input).
            subject: the represented subject (a digest input).
            purpose: the declared purpose (a digest input).
            decision_version: the business decision's version (a digest input).
            idempotency_key: the key to send when ``use_key``; default the
                operation ID (a fresh attempt identity sends its own).

        Returns:
            The outcome; see :class:`SubmitResult`. Any other 4xx than the
            named 409s is ``rejected`` (no effect was made).

        Raises:
            SinkAuthError: if the sink refuses the token (401/403): a
                configuration problem; no effect was made.
            SinkProtocolError: if the sink answers outside the protocol
                (e.g. 501 to a submit).
        """
        path = "/operations"
        headers = {"Idempotency-Key": idempotency_key or operation_id} if use_key else {}
        body: dict[str, Any] = {
            "operation_id": operation_id,
            "parameter_digest": parameter_digest,
            "params": params,
            "fencing_token": fencing_token,
            "attempt_id": attempt_id,
        }
        inputs = {
            "action": action,
            "subject": subject,
            "purpose": purpose,
            "decision_version": decision_version,
        }
        body.update({name: value for name, value in inputs.items() if value is not None})
        answer = self._send("POST", path, operation_id=operation_id, headers=headers, json=body)
        return _submit_result(answer, operation_id, path, self.base_url)

    def readback_source(self, operation_id: str) -> str:
        """The request a readback of ``operation_id`` is (named in readback records)."""
        return f"GET /operations/{operation_id}"

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        """Read back whether an operation committed at the sink.

        Args:
            operation_id: the stable operation ID.
            fencing_token: the operation's current fencing token, or ``None``.

        Returns:
            The observation; see :class:`ReadbackResult`.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        path = f"/operations/{quote(operation_id, safe=':')}"
        query = {} if fencing_token is None else {"fencing_token": str(fencing_token)}
        answer = self._send("GET", path, operation_id=operation_id, params=query)
        return _readback_result(answer, operation_id, path, self.base_url)

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

        See :meth:`Reservations.reserve <sinks.holds.Reservations.reserve>`;
        arguments as :meth:`submit`.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        return self._holds.reserve(
            operation_id,
            parameter_digest,
            params,
            fencing_token,
            attempt_id,
            action=action,
            subject=subject,
            purpose=purpose,
            decision_version=decision_version,
        )

    def confirm(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """Confirm a held reservation: the sink makes the effect (once).

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        return self._holds.confirm(operation_id, fencing_token)

    def cancel(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """Cancel a held reservation: the sink releases it; no effect is made.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        return self._holds.cancel(operation_id, fencing_token)

    def read_hold(self, operation_id: str, fencing_token: int | None = None) -> HoldResult:
        """Read a reservation back: ``held``, ``confirmed``, ``released`` or ``absent``.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        return self._holds.read_hold(operation_id, fencing_token)

    def account(self, account: str) -> AccountCredits:
        """Query an account's credits (the postcondition).

        Args:
            account: the account, e.g. ``acct-1``.

        Returns:
            The observation; see :class:`AccountCredits`.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        path = f"/accounts/{quote(account, safe=':')}"
        answer = self._send("GET", path)
        return _account_result(answer, account, path, self.base_url)

    def postcondition(self, query: PostconditionQuery, subject: str) -> AccountCredits:
        """Ask the postcondition query a contract declares.

        Args:
            query: the contract's postcondition query.
            subject: the subject to query (e.g. the account).

        Returns:
            The observation; see :class:`AccountCredits`.

        Raises:
            SinkAuthError: if the sink refuses the token (401/403).
            SinkProtocolError: if the sink answers outside the protocol.
        """
        match query.query:
            case "account-credits":
                return self.account(subject)

    def health_info(self) -> dict[str, Any] | None:
        """Return the ``/health`` body (name, pid, contract), or ``None`` when down.

        Raises:
            SinkAuthError: if the sink asks for a token it was not given (401/403).
        """
        answer = self._send("GET", "/health")
        if isinstance(answer, NoAnswer) or answer.status_code != 200:
            return None
        body = json_body(answer)
        return body if body.get("status") == "ok" else None

    def health(self) -> bool:
        """Return ``True`` when the sink answers ``/health``."""
        return self.health_info() is not None


def open_adapter(
    endpoint: Any, *, timeout_s: float, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
) -> SinkClient:
    """The ``http`` adapter (:mod:`sinks.port`): a :class:`SinkClient` for a registry entry.

    Args:
        endpoint: the sink's :class:`~sinks.registry.SinkEndpoint` (``url``, ``token``).
        timeout_s: the overall deadline of every call, in seconds.
        max_response_bytes: the most bytes of one answer read.
    """
    return SinkClient(
        endpoint.url,
        timeout_s=timeout_s,
        token=endpoint.token,
        max_response_bytes=max_response_bytes,
    )
