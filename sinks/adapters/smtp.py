"""The ``smtp`` adapter: an effect is one email, sent through an SMTP server.

An SMTP server offers no idempotency key and no readback: once a message may
have been taken, nothing can ask whether it was, so an ambiguous send is held
by the relay (``UNKNOWN_OUTCOME``) and never sent again. Declare such a sink's
contract with nothing it cannot honour (``idempotent``, ``readback``,
``postcondition``, ``fencing`` and ``reservation`` all false; ``amount_field:
null`` for a notification). The operation ID travels with the message, so a
recipient can still deduplicate:

* ``Message-ID: <ID@ledger>`` where ``ID`` is the operation ID with every
  character other than an ASCII letter, a digit, ``-`` or ``_`` replaced by
  ``=XX`` per UTF-8 byte (upper-case hex), e.g. ``notify:1842:v3`` →
  ``<notify=3A1842=3Av3@ledger>`` (a valid ``dot-atom-text``; reversed by
  :func:`operation_id_of`);
* ``X-Ledger-Operation-Id: notify:1842:v3`` (the ID as is).

Registry entry (:class:`~sinks.registry.SinkEndpoint`): ``url`` is
``smtp://HOST[:PORT]`` (port 25 by default); ``token``, if given, is
``USER:PASSWORD`` for SMTP AUTH (PLAIN or LOGIN, as the server offers);
``config`` keys, all optional:

* ``from`` -- the sender address (default ``ledger@example.invalid``);
* ``to_template`` -- the recipient (default ``{account}@example.invalid``);
* ``subject_template`` -- default ``Ledger operation {operation_id}``;
* ``body_template`` -- default ``This message was sent for ledger operation
  {operation_id}.``;
* ``starttls`` -- upgrade the connection with STARTTLS before AUTH and MAIL
  (default false).

Templates are ``str.format`` over the operation's parameters plus
``operation_id``.

Outcomes of :meth:`SmtpAdapter.submit`, all within one deadline of
``timeout_s`` seconds for the whole exchange (a socket timeout per read, and
the sockets shut down when the deadline passes, :mod:`sinks.adapters.deadline`):

* no connection, or no greeting (refused, unreachable, a 4xx/5xx greeting):
  ``unavailable``, ``sent=False``;
* a 4xx reply to EHLO, MAIL FROM, RCPT TO or DATA, or the connection lost
  before the server asked for the message: ``unavailable``, ``sent=False``
  (no message was sent, so none can have been taken);
* a 5xx reply to MAIL FROM, RCPT TO or DATA: ``rejected`` (the server refused
  the message before taking it);
* once the message was sent: ``250`` → ``committed`` (``effect_id`` the
  Message-ID, ``committed_ms`` the local wall clock in ms); ``5xx`` →
  ``rejected`` and ``4xx`` → ``unavailable``, ``sent=False`` (RFC 5321: the
  server did not accept the message); anything else -- no reply in time,
  the connection dropped, the deadline passed, a reply outside the
  protocol -- ``ambiguous`` (the server may hold the message).

Refused credentials raise :class:`~ledger.errors.SinkAuthError` (as an HTTP
sink's 401 to a submit: a configuration problem, nothing was sent); a
template naming a parameter the operation lacks raises
:class:`~ledger.errors.SinkConfigError` before anything is sent.
"""

from __future__ import annotations

import email.policy
import re
import smtplib
import ssl
import time
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ledger.errors import SinkAuthError, SinkConfigError
from sinks.adapters.deadline import Deadline
from sinks.client import SubmitResult
from sinks.port import AdapterCapabilities, UnsupportedParts

#: Characters of an operation ID that stand as they are in a Message-ID.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_MESSAGE_ID = re.compile(r"<([A-Za-z0-9_=-]*)@ledger>")
_ESCAPE = re.compile(r"=([0-9A-F]{2})")


def message_id(operation_id: str) -> str:
    """The Message-ID of an operation's email (see the module docstring).

    Args:
        operation_id: the operation ID, e.g. ``notify:1842:v3``.

    Returns:
        e.g. ``<notify=3A1842=3Av3@ledger>``.
    """
    left = "".join(
        ch if ch in _PLAIN else "".join(f"={b:02X}" for b in ch.encode()) for ch in operation_id
    )
    return f"<{left}@ledger>"


def operation_id_of(value: str) -> str | None:
    """The operation ID a Message-ID of :func:`message_id` carries, else ``None``."""
    match = _MESSAGE_ID.fullmatch(value.strip())
    if match is None:
        return None
    left, raw = match.group(1), bytearray()
    i = 0
    while i < len(left):
        if left[i] == "=":
            if not _ESCAPE.match(left, i):
                return None
            raw += bytes.fromhex(left[i + 1 : i + 3])
            i += 3
        else:
            raw += left[i].encode()
            i += 1
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


class SmtpConfig(BaseModel):
    """The ``config`` of an ``smtp`` sink (keys and defaults: the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    sender: str = Field(default="ledger@example.invalid", alias="from", min_length=3)
    to_template: str = Field(default="{account}@example.invalid", min_length=1)
    subject_template: str = "Ledger operation {operation_id}"
    body_template: str = "This message was sent for ledger operation {operation_id}.\n"
    starttls: bool = False


class SmtpAdapter(UnsupportedParts):
    """One SMTP server as a sink (see the module docstring).

    Args:
        host: the server's host.
        port: its port.
        config: the sink's settings.
        timeout_s: the overall deadline of every call, in seconds.
        credentials: ``(user, password)`` for SMTP AUTH, or ``None``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        config: SmtpConfig,
        *,
        timeout_s: float,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.config = config
        self.timeout_s = timeout_s
        self.credentials = credentials
        self.url = f"smtp://{host}:{port}"

    def message(self, operation_id: str, params: dict[str, Any]) -> EmailMessage:
        """The email of an operation (headers and body from the templates).

        Raises:
            SinkConfigError: when a template names a parameter the operation lacks.
        """
        values = {**params, "operation_id": operation_id}
        cfg = self.config
        try:
            to = cfg.to_template.format_map(values)
            subject = cfg.subject_template.format_map(values)
            body = cfg.body_template.format_map(values)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise SinkConfigError(
                f"the smtp sink {self.url} cannot fill its templates for {operation_id} "
                f"({type(exc).__name__}: {exc}); nothing was sent. Fix to_template, "
                "subject_template or body_template in the sink's config (they may name the "
                f"parameters {sorted(values)})",
                sink=self.url,
                operation_id=operation_id,
            ) from exc
        msg = EmailMessage()
        msg["From"] = cfg.sender
        msg["To"] = to
        msg["Subject"] = subject
        msg["Date"] = formatdate(localtime=False, usegmt=True)
        msg["Message-ID"] = message_id(operation_id)
        msg["X-Ledger-Operation-Id"] = operation_id
        msg.set_content(body)
        return msg

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
        """Send the operation's email once (arguments as :class:`sinks.port.SinkPort`).

        The fencing token, the key and the digest's inputs are not sent: an
        SMTP server can use none of them.

        Returns:
            The outcome; see the module docstring.

        Raises:
            SinkAuthError: when the server refuses the credentials (nothing was sent).
            SinkConfigError: when a template cannot be filled (nothing was sent).
        """
        msg = self.message(operation_id, params)
        with Deadline(self.timeout_s) as deadline:
            return self._send(operation_id, msg, deadline)

    def _connect(self, deadline: Deadline) -> smtplib.SMTP:
        """A connection past EHLO (and STARTTLS, AUTH); raises what smtplib raises."""
        smtp = smtplib.SMTP(timeout=max(deadline.remaining_s(), 0.001))
        try:
            smtp.connect(self.host, self.port)
            if smtp.sock is not None:
                deadline.watch(smtp.sock)
            smtp.ehlo()
            if self.config.starttls:
                smtp.starttls(context=ssl.create_default_context())
                if smtp.sock is not None:
                    deadline.watch(smtp.sock)
                smtp.ehlo()
            if self.credentials is not None:
                smtp.login(*self.credentials)
        except BaseException:
            smtp.close()
            raise
        return smtp

    def _send(self, operation_id: str, msg: EmailMessage, deadline: Deadline) -> SubmitResult:
        def not_sent(detail: str) -> SubmitResult:
            return SubmitResult("unavailable", operation_id, detail=detail, sent=False)

        try:
            smtp = self._connect(deadline)
        except smtplib.SMTPAuthenticationError as exc:
            raise SinkAuthError(
                "POST",
                "SMTP AUTH",
                exc.smtp_code,
                _text(exc.smtp_error),
                sink=self.url,
                operation_id=operation_id,
            ) from exc
        except smtplib.SMTPNotSupportedError as exc:
            raise SinkConfigError(
                f"the smtp server {self.url} does not offer {exc}; nothing was sent. Set "
                "'starttls' in the sink's config, or register the sink without a token",
                sink=self.url,
                operation_id=operation_id,
            ) from exc
        except (OSError, smtplib.SMTPException) as exc:
            return not_sent(f"no SMTP session with {self.url}: {_why(exc, deadline)}")
        try:
            return self._transaction(smtp, operation_id, msg, deadline, not_sent)
        finally:
            try:
                smtp.quit()
            except (OSError, smtplib.SMTPException):
                smtp.close()

    def _transaction(
        self,
        smtp: smtplib.SMTP,
        operation_id: str,
        msg: EmailMessage,
        deadline: Deadline,
        not_sent: Callable[[str], SubmitResult],
    ) -> SubmitResult:
        """MAIL, RCPT, DATA and the message, classified as the module docstring says."""
        try:
            steps: list[tuple[str, Callable[[], tuple[int, bytes]], tuple[int, ...]]] = [
                ("MAIL FROM", lambda: smtp.mail(self.config.sender), (250,)),
                ("RCPT TO", lambda: smtp.rcpt(str(msg["To"])), (250, 251)),
                ("DATA", lambda: smtp.docmd("DATA"), (354,)),
            ]
            for step, command, ok in steps:  # one at a time: a refusal ends the transaction
                code, reply = command()
                if code not in ok:
                    text = f"{step} answered {code} {_text(reply)}"
                    if 500 <= code < 600:
                        return SubmitResult("rejected", operation_id, detail=text)
                    return not_sent(f"{text}; no message was sent")
        except (OSError, smtplib.SMTPException) as exc:
            return not_sent(f"{_why(exc, deadline)} before the message was sent")
        payload = msg.as_bytes(policy=email.policy.SMTP)
        payload = re.sub(rb"(?m)^\.", b"..", payload)
        if not payload.endswith(b"\r\n"):
            payload += b"\r\n"
        try:
            smtp.send(payload + b".\r\n")
            code, reply = smtp.getreply()
        except (OSError, smtplib.SMTPException) as exc:
            return SubmitResult(
                "ambiguous",
                operation_id,
                detail=f"the message was sent but {_why(exc, deadline)} before the server "
                "confirmed it: it may hold the message",
            )
        text = f"the message was answered {code} {_text(reply)}"
        if code == 250:
            return SubmitResult(
                "committed",
                operation_id,
                effect_id=message_id(operation_id),
                committed_ms=int(time.time() * 1000),
            )
        if 500 <= code < 600:
            return SubmitResult("rejected", operation_id, detail=text)
        if 400 <= code < 500:
            return not_sent(f"{text}: the server did not accept it")
        return SubmitResult("ambiguous", operation_id, detail=f"{text}, outside the protocol")

    def health_info(self) -> dict[str, Any] | None:
        """The server's greeting and EHLO answer when it answers NOOP with 250, else ``None``.

        Raises:
            SinkAuthError: when the server refuses the credentials.
        """
        with Deadline(self.timeout_s) as deadline:
            try:
                smtp = self._connect(deadline)
            except smtplib.SMTPAuthenticationError as exc:
                raise SinkAuthError(
                    "AUTH", "SMTP AUTH", exc.smtp_code, _text(exc.smtp_error), sink=self.url
                ) from exc
            except (OSError, smtplib.SMTPException):
                return None
            try:
                code, _ = smtp.noop()
                ehlo = _text(smtp.ehlo_resp or b"").splitlines()
            except (OSError, smtplib.SMTPException):
                return None
            finally:
                smtp.close()
        if code != 250:
            return None
        return {"status": "ok", "server": ehlo[0] if ehlo else "", "extensions": ehlo[1:]}

    def health(self) -> bool:
        """``True`` when the server answers EHLO and NOOP."""
        return self.health_info() is not None

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)


def _why(exc: BaseException, deadline: Deadline) -> str:
    if deadline.passed():
        return f"the deadline of {deadline.budget_s:g} s passed ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"


def open_adapter(endpoint: Any, *, timeout_s: float) -> SmtpAdapter:
    """The ``smtp`` adapter of a registry entry (see the module docstring).

    Args:
        endpoint: the sink's :class:`~sinks.registry.SinkEndpoint`.
        timeout_s: the overall deadline of every call, in seconds.

    Raises:
        SinkConfigError: when the URL is not ``smtp://HOST[:PORT]``, the config
            has unknown or invalid keys, the token is not ``USER:PASSWORD``, or
            the contract claims what SMTP cannot do.
    """
    url = urlsplit(endpoint.url)
    try:
        port = url.port or 25
    except ValueError as exc:
        raise SinkConfigError(f"the smtp sink's url {endpoint.url!r} has an invalid port") from exc
    if url.scheme != "smtp" or not url.hostname:
        raise SinkConfigError(
            f"the smtp sink's url {endpoint.url!r} is not smtp://HOST[:PORT]; register the sink "
            "again with such a url"
        )
    try:
        config = SmtpConfig.model_validate(endpoint.config)
    except ValidationError as exc:
        raise SinkConfigError(
            f"the smtp sink {endpoint.url} has an invalid config ({exc.errors()[0]['msg']} at "
            f"{exc.errors()[0]['loc']}); the keys are from, to_template, subject_template, "
            "body_template and starttls"
        ) from exc
    credentials: tuple[str, str] | None = None
    if endpoint.token is not None:
        user, colon, password = endpoint.token.partition(":")
        if not colon or not user:
            raise SinkConfigError(
                f"the token of the smtp sink {endpoint.url} is not USER:PASSWORD; set it so, or "
                "register the sink without a token"
            )
        credentials = (user, password)
    claimed = capabilities.overclaims(endpoint.contract)
    if claimed:
        raise SinkConfigError(
            f"the contract of the smtp sink {endpoint.url} claims {', '.join(claimed)}, which "
            "SMTP cannot honour; register it with those set to false"
        )
    return SmtpAdapter(url.hostname, port, config, timeout_s=timeout_s, credentials=credentials)


#: SMTP offers none of it: no key, no readback, no query, no fencing, no holds.
capabilities = AdapterCapabilities()
open_adapter.capabilities = capabilities  # type: ignore[attr-defined]  # the sink registry reads this function attribute (sinks.adapters)
