"""Effect contracts: what a sink can prove about its effects.

The field names follow ``shared/SCENARIOS.md``. Automatic resume is allowed
only where the contract supplies the evidence a step needs.
"""

from __future__ import annotations

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
