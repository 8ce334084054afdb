"""The relay's requests to a sink: the only place a delivery step touches the sink.

Each function sends one request a delivery decision
(:func:`ledger.delivery.next_step`) asks for, with the fencing token and
idempotency key the sink's contract says to send, and returns the sink's
answer. Nothing here decides anything.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ledger.contracts import (
    EffectContract,
    fencing_token_for,
    sends_idempotency_key,
)
from ledger.delivery import Send
from ledger.errors import LedgerError
from ledger.events import Dispatch
from sinks.client import HoldResult
from sinks.port import SinkPort


def send_request(
    d: Dispatch, client: SinkPort, contract: EffectContract, send: Send
) -> tuple[Any, str]:
    """Send one request a decision asks for.

    Returns:
        ``(the sink's answer, the attempt's identity)``.

    Raises:
        LedgerError: a dispatch that predates the digest's inputs (not sent).
        SinkConfigError: the adapter refused its own configuration (not sent).
    """
    token = fencing_token_for(contract, d.fencing_token)
    if send.request == "readback":
        return client.readback(d.operation_id, token), d.dispatch_id
    if send.request == "read_hold":
        return client.read_hold(d.operation_id, token), d.dispatch_id
    if send.request == "confirm":
        return client.confirm(d.operation_id, token), d.dispatch_id
    if send.request == "cancel":
        return client.cancel(d.operation_id, token), d.dispatch_id
    if send.request == "reserve":
        return reserve(d, client, contract), d.dispatch_id
    return submit(d, client, contract, fresh_identity=send.fresh_identity)


def reserve(d: Dispatch, client: SinkPort, contract: EffectContract) -> HoldResult:
    """Take (or take again) the hold for dispatch ``d`` under the operation's key.

    Raises:
        LedgerError: ``d`` predates schema version 2 (not sent; a person decides).
    """
    params: dict[str, Any] = json.loads(d.params_json)
    if d.subject is None or d.purpose is None or d.decision_version is None:
        raise LedgerError(
            f"dispatch {d.dispatch_id} predates schema version 2 and lacks the inputs of "
            "its parameter digest that the sink checks; a person decides",
            operation_id=d.operation_id,
        )
    return client.reserve(
        d.operation_id,
        d.parameter_digest,
        params,
        fencing_token_for(contract, d.fencing_token),
        d.dispatch_id,
        action=d.action,
        subject=d.subject,
        purpose=d.purpose,
        decision_version=d.decision_version,
    )


def submit(
    d: Dispatch, client: SinkPort, contract: EffectContract, *, fresh_identity: bool
) -> tuple[Any, str]:
    """Submit ``d``'s effect; the answer and the attempt's identity (fresh: checkpoint-only).

    Raises:
        LedgerError: ``d`` predates schema version 2 (not sent; a person decides).
    """
    attempt_id = f"{d.dispatch_id}:{uuid.uuid4().hex[:8]}" if fresh_identity else d.dispatch_id
    params: dict[str, Any] = json.loads(d.params_json)
    if d.subject is None or d.purpose is None or d.decision_version is None:
        # A dispatch of schema version 1 cannot carry the digest's inputs
        # to the sink; held (as any per-dispatch error), never sent.
        raise LedgerError(
            f"dispatch {d.dispatch_id} predates schema version 2 and lacks the inputs of "
            "its parameter digest (subject, purpose, decision version) that the sink checks; "
            "a person decides (ledger reconcile dispose) or a new dispatch is issued",
            operation_id=d.operation_id,
        )
    keyed = sends_idempotency_key(contract, fresh_attempt_identity=fresh_identity)
    result = client.submit(
        d.operation_id,
        d.parameter_digest,
        params,
        fencing_token_for(contract, d.fencing_token),
        attempt_id,
        # The negative control sends a key of its own attempt: no deduplication.
        use_key=keyed or (contract.idempotent and fresh_identity),
        idempotency_key=None if keyed else attempt_id,
        action=d.action,
        subject=d.subject,
        purpose=d.purpose,
        decision_version=d.decision_version,
    )
    return result, attempt_id
