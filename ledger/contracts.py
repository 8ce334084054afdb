"""Effect contracts: what a sink can prove about its effects.

The field names follow ``shared/SCENARIOS.md``. Automatic resume is allowed
only where the contract supplies the evidence a step needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Consequence = Literal["reversible-internal", "reversible-external", "irreversible"]


class EffectContract(BaseModel):
    """What one sink declares it can do.

    Attributes:
        idempotent: a resubmission with the same idempotency key (the operation
            ID) returns the first outcome instead of making a second effect.
        readback: ``GET /operations/{id}`` answers authoritatively whether the
            operation committed, for every operation ever committed.
        postcondition: the sink offers an independent business query (the
            account's credit) to verify an effect.
        fencing: the sink refuses requests whose fencing token is lower than
            the highest it has seen for that operation.
        key_retention_s: how long (ledger clock, seconds) the sink keeps an
            idempotency key after it first saw it; after that a resubmission
            is a new effect.
        consequence: consequence class of the effect.
        compensable: a compensating operation exists.
        reservation: try-confirm-cancel is offered.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    idempotent: bool = False
    readback: bool = False
    postcondition: bool = False
    fencing: bool = False
    key_retention_s: int = Field(default=0, ge=0)
    consequence: Consequence = "irreversible"
    compensable: bool = False
    reservation: bool = False


#: The reference payment gateway's contract (idempotent, readback, fencing,
#: postcondition; keys kept seven days).
PAYMENT_GATEWAY = EffectContract(
    idempotent=True,
    readback=True,
    postcondition=True,
    fencing=True,
    key_retention_s=7 * 24 * 3600,
    consequence="irreversible",
)

#: The deliberately unsafe sink: no idempotency key, no readback.
UNSAFE_SINK = EffectContract(consequence="irreversible")


class SinkEndpoint(BaseModel):
    """Where a sink answers and what it declares.

    Attributes:
        url: base URL, e.g. ``http://127.0.0.1:8123``.
        contract: the sink's effect contract.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    contract: EffectContract


def load_sinks(path: Path) -> dict[str, SinkEndpoint]:
    """Read the sink registry (JSON object: name -> {url, contract}).

    Returns:
        An empty dict when the file does not exist.

    Raises:
        pydantic.ValidationError: when an entry is malformed.
    """
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {name: SinkEndpoint.model_validate(entry) for name, entry in raw.items()}


def save_sinks(path: Path, sinks: dict[str, SinkEndpoint]) -> None:
    """Write the sink registry atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v.model_dump() for k, v in sinks.items()}, indent=2))
    tmp.replace(path)
