"""Reading an effect back from its sink: shared by the relay and the reconcilers."""

from __future__ import annotations

from ledger.contracts import EffectContract, fencing_token_for, readback_unsupported
from ledger.delivery import READBACK_STATUS
from sinks.port import SinkPort


def read_effect(
    client: SinkPort, contract: EffectContract, operation_id: str, token: int
) -> tuple[str, str, str | None]:
    """Read an effect back by operation ID.

    Sends the operation's fencing token when the sink fences; a sink without
    readback is ``UNSUPPORTED`` without a request (both as the contract says:
    :func:`~ledger.contracts.fencing_token_for`,
    :func:`~ledger.contracts.readback_unsupported`).

    Args:
        client: the sink's client.
        contract: the sink's contract.
        operation_id: the operation to read back.
        token: the operation's current fencing token.

    Returns:
        ``(ReadbackStatus, detail, effect_id)``; ``effect_id`` is ``None``
        unless the effect committed.
    """
    unsupported = readback_unsupported(contract)
    if unsupported is not None:
        return "UNSUPPORTED", unsupported, None
    rb = client.readback(operation_id, fencing_token_for(contract, token))
    return READBACK_STATUS[rb.status], rb.detail or rb.status, rb.effect_id
