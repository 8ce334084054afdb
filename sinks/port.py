"""The sink port: what the relay, reconciler, auditor and console need of a sink.

Every external system the ledger acts on stands behind one *adapter*: an
object with the methods of :class:`SinkPort`, returning the outcome
vocabulary of :mod:`sinks.client` (``committed``, ``rejected``,
``stale_token``, ``key_reused``, ``unavailable``, ``ambiguous`` ...). No
caller knows how the adapter reaches its system (HTTP, SQL, SMTP ...).

An adapter kind is found by name (the ``adapter`` of a sink's entry in the
sink registry, :mod:`sinks.registry`): first among the kinds this package
ships (:data:`BUILTIN`), then among the ``ledger.sink_adapters`` entry points
of the installed distributions, so a team's own adapter is a package that
declares::

    [project.entry-points."ledger.sink_adapters"]
    my-api = "my_package.adapter:open_adapter"

where ``open_adapter(endpoint, *, timeout_s)`` returns a :class:`SinkPort`
and has an attribute ``capabilities`` (an :class:`AdapterCapabilities`): what
the adapter can honestly declare in a sink's contract. ``ledger sink
register`` refuses a contract that claims more (an adapter without readback
cannot declare ``readback: true``), and ``ledger sink check`` proves the
claims against the running system.

Rules every adapter keeps (the relay's correctness rests on them):

* An expected outcome is a value, never an exception. Only a caller or
  configuration problem raises (:class:`~ledger.errors.SinkProtocolError`,
  :class:`~ledger.errors.SinkAuthError`).
* ``unavailable`` (and ``sent=False``) only when the system certainly did not
  act: the request never left, or the system said so before acting.
* ``ambiguous`` whenever the system may have acted: the relay then holds the
  operation and reads it back; it never resubmits blindly.
* ``rejected`` only when the system definitely made no effect.
* Every call ends within the adapter's deadline (``timeout_s`` overall, not
  per read), and reads at most ``max_response_bytes`` of an answer (a factory
  that takes that keyword gets ``LEDGER_SINK_MAX_RESPONSE_BYTES``);
  :mod:`sinks.limits` has the pieces (a deadline, a capped reader, an httpx
  transport bounded by the deadline). A call stopped by either is
  ``ambiguous`` (``sent`` stays ``True``).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ledger.contracts import EffectContract, PostconditionQuery
from ledger.errors import SinkConfigError
from sinks.client import AccountCredits, HoldResult, ReadbackResult, SubmitResult

#: The entry-point group adapters are found in.
ENTRY_POINT_GROUP = "ledger.sink_adapters"


@runtime_checkable
class SinkPort(Protocol):
    """One sink, as the ledger's stages use it (see the module's rules)."""

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
        """Ask the system to make the effect (as :meth:`sinks.client.SinkClient.submit`)."""
        ...

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        """Whether the effect exists at the system (``unsupported`` without readback)."""
        ...

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
        """Take a bounded hold (try-confirm-cancel); ``unsupported`` without reservations."""
        ...

    def confirm(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """Confirm a hold: the system makes the effect, once."""
        ...

    def cancel(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """Cancel a hold: no effect is made."""
        ...

    def read_hold(self, operation_id: str, fencing_token: int | None = None) -> HoldResult:
        """Read a hold back."""
        ...

    def postcondition(self, query: PostconditionQuery, subject: str) -> AccountCredits:
        """Ask the contract's independent business query (``unsupported`` without one)."""
        ...

    def health_info(self) -> dict[str, Any] | None:
        """What the system says of itself when it answers, else ``None``."""
        ...

    def health(self) -> bool:
        """``True`` when the system answers."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True)
class AdapterCapabilities:
    """What an adapter can honestly offer; a sink's contract may claim no more.

    Attributes:
        idempotent: a resubmission under the same key can return the first outcome.
        readback: the adapter can read an effect back by operation ID.
        postcondition: the adapter can ask an independent business query.
        fencing: the adapter can refuse a lower fencing token.
        reservation: the adapter offers try-confirm-cancel.
    """

    idempotent: bool = False
    readback: bool = False
    postcondition: bool = False
    fencing: bool = False
    reservation: bool = False

    def overclaims(self, contract: EffectContract) -> list[str]:
        """The contract's claims this adapter cannot honour, by field name (empty: none)."""
        claims = {
            "idempotent": contract.idempotent,
            "readback": contract.readback,
            "postcondition": contract.postcondition_query() is not None,
            "fencing": contract.fencing,
            "reservation": contract.reservation,
        }
        return [name for name, claimed in claims.items() if claimed and not getattr(self, name)]


class UnsupportedParts:
    """Answers for the parts of the port an adapter does not offer.

    Mix it in before an adapter's own methods: readback, reservations and the
    postcondition query answer ``unsupported`` (which the relay reads as "this
    sink cannot tell", never as "absent").
    """

    def readback(self, operation_id: str, fencing_token: int | None) -> ReadbackResult:
        """``unsupported``: this adapter cannot read an effect back."""
        return ReadbackResult("unsupported", operation_id, detail="no readback", sent=False)

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
        """``unsupported``: no reservations."""
        return HoldResult("unsupported", operation_id, detail="no reservations", sent=False)

    def confirm(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """``unsupported``: no reservations."""
        return HoldResult("unsupported", operation_id, detail="no reservations", sent=False)

    def cancel(self, operation_id: str, fencing_token: int | None) -> HoldResult:
        """``unsupported``: no reservations."""
        return HoldResult("unsupported", operation_id, detail="no reservations", sent=False)

    def read_hold(self, operation_id: str, fencing_token: int | None = None) -> HoldResult:
        """``unsupported``: no reservations."""
        return HoldResult("unsupported", operation_id, detail="no reservations", sent=False)

    def postcondition(self, query: PostconditionQuery, subject: str) -> AccountCredits:
        """``unsupported``: no postcondition query."""
        return AccountCredits("unsupported", subject, detail="no postcondition query", sent=False)


#: An adapter factory: ``(endpoint, *, timeout_s) -> SinkPort``, with ``capabilities``.
AdapterFactory = Callable[..., SinkPort]

#: The kinds this package ships: kind -> "module:attribute" of the factory.
BUILTIN: dict[str, str] = {
    "http": "sinks.client:open_adapter",
    "reference": "sinks.client:open_adapter",
    "postgres": "sinks.adapters.postgres:open_adapter",
    "smtp": "sinks.adapters.smtp:open_adapter",
    "http-idempotency-key": "sinks.adapters.idempotency_key:open_adapter",
}


def readback_source(port: Any, operation_id: str) -> str:
    """How an adapter names its readback of ``operation_id``, for the readback record.

    An optional part of the port: an adapter may offer
    ``readback_source(operation_id) -> str`` (e.g. ``GET /operations/OP``, or
    the SQL it runs); one that does not is named ``readback of OP``.
    """
    describe = getattr(port, "readback_source", None)
    return describe(operation_id) if callable(describe) else f"readback of {operation_id}"


def _load(target: str) -> AdapterFactory:
    module, _, attribute = target.partition(":")
    imported = importlib.import_module(module)
    factory: AdapterFactory = getattr(imported, attribute)
    return factory


def adapter_kinds() -> list[str]:
    """Every adapter kind that can be named: the built-in ones and the entry points'."""
    found = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(set(BUILTIN) | found)


def adapter_factory(kind: str) -> AdapterFactory:
    """The factory of adapter ``kind``.

    Raises:
        SinkConfigError: when no built-in kind or entry point has that name (the
            message lists the kinds there are).
    """
    if kind in BUILTIN:
        return _load(BUILTIN[kind])
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == kind:
            factory: AdapterFactory = ep.load()
            return factory
    raise SinkConfigError(
        f"no sink adapter named {kind!r} (known: {', '.join(adapter_kinds())}); install the "
        f"package that provides it (entry point group {ENTRY_POINT_GROUP!r}) or fix the "
        "sink's 'adapter' in the sink registry"
    )


def capabilities_of(kind: str) -> AdapterCapabilities:
    """What adapter ``kind`` can offer (its factory's ``capabilities``; all of it when unsaid).

    Raises:
        SinkConfigError: as :func:`adapter_factory`.
    """
    caps = getattr(adapter_factory(kind), "capabilities", None)
    return (
        caps
        if isinstance(caps, AdapterCapabilities)
        else AdapterCapabilities(
            idempotent=True, readback=True, postcondition=True, fencing=True, reservation=True
        )
    )


_SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def resolve_secrets(text: str, *, sink: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace every ``${NAME}`` in ``text`` with the environment variable ``NAME``.

    A sink's ``url`` and ``token`` in the registry may name their secrets
    instead of holding them (``postgresql://relay:${PAYMENTS_DB_PASSWORD}@db/pay``,
    ``"token": "${PAYMENTS_TOKEN}"``): only a process given the variable (the
    relay, the reconciler, the auditor with readback) can reach the sink; the
    processor and the other stages read the same registry for contracts and
    never hold the secret.

    Raises:
        SinkConfigError: when a named variable is not set in this process.
    """
    env = os.environ if environ is None else environ

    def _value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise SinkConfigError(
                f"sink {sink!r} names the secret ${{{name}}}, which is not set in this "
                f"process: export {name} for the stages that call {sink} (the relay, the "
                "reconciler, the auditor with readback)",
                sink=sink,
            )
        return env[name]

    return _SECRET_REF.sub(_value, text)


def open_sink(
    endpoint: Any,
    *,
    timeout_s: float,
    name: str = "",
    max_response_bytes: int | None = None,
) -> SinkPort:
    """Open the adapter a sink registry entry names, its secrets resolved.

    Args:
        endpoint: the sink's :class:`~sinks.registry.SinkEndpoint`.
        timeout_s: the overall deadline of every call, in seconds.
        name: the sink's name, for messages; passed to factories that take a
            ``name`` keyword (an input of the parameter digest, which an
            adapter may recompute).
        max_response_bytes: the most bytes of one answer an adapter reads
            (:mod:`sinks.limits`); passed to factories that take a
            ``max_response_bytes`` keyword (``None``: the adapter's default).

    Returns:
        The adapter, ready to call.

    Raises:
        SinkConfigError: when the adapter kind is unknown, its configuration is
            invalid or a secret it names is not set (see :func:`resolve_secrets`).
    """
    who = name or endpoint.url
    resolved = endpoint.model_copy(
        update={
            "url": resolve_secrets(endpoint.url, sink=who),
            "token": None if endpoint.token is None else resolve_secrets(endpoint.token, sink=who),
        }
    )
    factory = adapter_factory(endpoint.adapter)
    extra: dict[str, Any] = {}
    if max_response_bytes is not None and _takes(factory, "max_response_bytes"):
        extra["max_response_bytes"] = max_response_bytes
    if name and _takes(factory, "name"):
        extra["name"] = name
    return factory(resolved, timeout_s=timeout_s, **extra)


def _takes(factory: AdapterFactory, keyword: str) -> bool:
    """Whether ``factory`` accepts the keyword argument ``keyword``."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == keyword or p.kind is p.VAR_KEYWORD for p in parameters)
