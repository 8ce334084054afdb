"""The fee-remediation mission's plan: its cases and its faults, from a seed.

Everything here is a pure function of :class:`MissionOptions` (and so of the
seed): the same options give the same cases, the same eligibility decisions,
the same approvals that expire before use and the same faults armed against
the same operations, in ``ledger`` and in ``checkpoint-only`` mode alike. That
is what makes the two modes comparable (``ledger mission compare``).

A case is one customer charged a fee in error. Its chain of operations:

1. **eligibility** - a pure decision over the case's data, cheap to replay,
   never an operation of the ledger (it has no effect outside);
2. **review** - a signed approval: a human reviewer's above
   :attr:`MissionOptions.review_threshold_minor`, the policy engine's below;
   some approvals expire before they are used, and the policy version changes
   part-way through the mission, so some operations need reauthorisation;
3. **refund** (``refund:{case}:v1``) through the payment gateway;
4. **notification** (``notify:{case}:v1``) through a mail sink with no
   readback; it may only describe a verified refund, so it is published only
   once the refund is ``OUTCOME_VERIFIED``;
5. **goodwill credit** (``goodwill:{case}:v1``) for the larger fees, a
   reversible-internal credit on the customer's account (the ``credits``
   sink), published beside the refund under the policy engine's approval. When
   the refund is refused (the gateway rejects it, or it cannot be authorised),
   the credit is **compensated automatically**: ``goodwill-reversal:{case}:v1``
   is its own operation naming the credit in ``compensates``, under a fresh
   standing policy approval;
6. **callback booking** (``callback:{case}:v1``) for some customers, through a
   booking sink that offers try-confirm-cancel (``reservation: true``): the
   relay reserves a slot and confirms it only while the admission stands.
   It is published with the notification.

Part-way through, the payment gateway releases contract version
:data:`GATEWAY_UPGRADE_VERSION` (:data:`PAYMENT_GATEWAY_V4`); the refunds in
flight cross it and resume only as far as ``deploy/release-manifest.json``
allows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from ledger.contracts import PAYMENT_GATEWAY, EffectContract

#: Seams of ``testbed.faults`` and the stage that reaches each.
SEAM_STAGE: dict[str, str] = {
    "before_admission": "authority",
    "after_admission_before_dispatch": "processor",
    "after_dispatch_before_send": "relay",
    "after_sink_commit_before_receipt": "relay",
    "after_receipt_before_commit": "relay",
    "after_commit_before_verification": "relay",
    "after_reserve_before_confirm": "relay",
}

#: Seams an ordinary (non-reservation) operation reaches.
PLAIN_SEAMS: tuple[str, ...] = tuple(s for s in SEAM_STAGE if s != "after_reserve_before_confirm")
#: Seams a callback booking reaches (the reservation's own first).
BOOKING_SEAMS: tuple[str, ...] = (
    "after_reserve_before_confirm",
    "before_admission",
    "after_admission_before_dispatch",
    "after_dispatch_before_send",
)

#: Fault modes of the reference sinks (``POST /admin/faults``).
SINK_FAULT_MODES: tuple[str, ...] = (
    "reject",
    "unavailable",
    "timeout_before_commit",
    "commit_then_drop_response",
    "timeout_after_commit",
)

#: Sinks that ``real_sinks`` puts on real systems: sink name -> adapter.
REAL_SINKS: dict[str, str] = {"payments": "postgres", "mailer": "smtp"}

#: The deadline of every call to a real system in the mission, in seconds (its
#: registry entry's ``timeout_s``). The reference sinks answer in one round trip
#: and keep the mission's 0.5 s; an SMTP send is about eight round trips through
#: the fault proxy, which at 0.5 s on a busy machine ran out often enough to hold
#: one notification in six as an unknown outcome with no fault armed.
REAL_SINK_TIMEOUT_S = 3.0

#: Fault modes on the wire between the relay and a real system (``sinks.wire``).
WIRE_FAULT_MODES: tuple[str, ...] = (
    "timeout_before_commit",
    "commit_then_drop_response",
    "timeout_after_commit",
    "reset",
)

#: The mail sink: sends cannot be read back nor deduplicated. A wrong or
#: repeated notification can be corrected by a follow-up message, so its
#: consequence class is ``reversible-external``. A send carries no amount
#: (``amount_field=None``: no approval's amount cap applies to it).
MAILER = EffectContract(consequence="reversible-external", amount_field=None)

#: The goodwill ledger: an internal credit on the customer's account, read
#: back and verified like a refund, and compensable (a reversal is its own
#: operation on the same sink).
CREDITS = EffectContract(
    idempotent=True,
    readback=True,
    postcondition=True,
    fencing=True,
    key_retention_s=7 * 24 * 3600,
    consequence="reversible-internal",
    compensable=True,
)

#: The callback booking sink: try-confirm-cancel, an unconfirmed slot is
#: released by the sink after :attr:`~ledger.contracts.EffectContract.reservation_hold_s`
#: (ledger clock). A booking carries no amount.
CALLBACKS = EffectContract(
    idempotent=True,
    readback=True,
    fencing=True,
    key_retention_s=7 * 24 * 3600,
    reservation=True,
    reservation_hold_s=30,
    consequence="reversible-external",
    amount_field=None,
)

#: Sink name -> contract, as the mission registers them.
MISSION_SINKS: dict[str, EffectContract] = {
    "payments": PAYMENT_GATEWAY,
    "mailer": MAILER,
    "credits": CREDITS,
    "callbacks": CALLBACKS,
}

#: The payment gateway's release the mission deploys part-way through: the
#: same guarantees, idempotency keys kept two days instead of seven. The
#: release manifest (``deploy/release-manifest.json``, version 4) lets a
#: refund begun under version 1 resume under it only before anything may
#: have left (``ADMITTED``) or for its postcondition (``EFFECT_COMMITTED``):
#: a send that may have left under version 1 (``EFFECT_PENDING``) or an
#: unknown outcome waiting for a readback is held, because version 4's
#: readback does not answer for version 1's keys.
PAYMENT_GATEWAY_V4 = PAYMENT_GATEWAY.model_copy(update={"key_retention_s": 2 * 24 * 3600})
GATEWAY_UPGRADE_VERSION = 4

#: Share of the cases started after which the gateway upgrade is released.
UPGRADE_AT = 0.4

#: Fees at or above this (minor units) come with a goodwill credit.
GOODWILL_MIN_FEE_MINOR = 7_500
#: The goodwill credit (minor units, GBP).
GOODWILL_MINOR = 1_000
#: Share of customers who book a callback.
CALLBACK_RATE = 0.10
#: Compensations are few (one per refused refund), so their sink faults are
#: drawn at this many times the sink-fault rate, for failures to occur at all.
COMPENSATION_FAULT_FACTOR = 4.0

#: Consequence class of the pure eligibility step (no effect outside the workflow).
PURE_CLASS = "reversible-internal"

#: Days of the billing outage in which fees were charged in error (inclusive).
OUTAGE_DAYS = (5, 94)

Mode = Literal["ledger", "checkpoint-only"]


@dataclass(frozen=True)
class MissionOptions:
    """What to run.

    Attributes:
        cases: number of cases.
        crash_rate: probability, per operation, that a stage process is
            SIGKILLed at a seam while handling it (0..1).
        seed: random seed; the same seed gives the same cases and faults.
        mode: ``ledger``, or ``checkpoint-only`` (the negative control: the
            relay trusts its checkpoint and resubmits without readback).
        instances: instances of each stage in the same consumer groups.
        sink_fault_rate: probability, per operation, of a sink fault
            (``None``: the crash rate).
        review_threshold_minor: refunds at or above this amount (minor
            currency units) need a human reviewer's approval.
        expiring_rate: share of approvals that expire before they are used.
        race_rate: share of refunds raced by two resumers (``None``: half
            the crash rate).
        window: cases in flight at once.
        broker_restart: restart the (local) broker once, part-way through.
        chaos_every: a SIGKILL (or, with two instances, a pause that makes a
            zombie) at an arbitrary point every this many cases started;
            0 disables.
        brokers: broker nodes of the local cluster the mission runs on
            (1, or 3 for a KRaft cluster).
        broker_chaos: hit the cluster with broker faults in turn while the
            mission runs (``testbed.mission.chaos``); needs ``brokers >= 3``.
        real_sinks: refunds go to a real PostgreSQL database through the
            ``postgres`` adapter and notifications to a real SMTP server
            through the ``smtp`` adapter (:data:`REAL_SINKS`), each behind a
            fault proxy; their sink faults are injected on the wire
            (:data:`WIRE_FAULT_MODES`) and their effects counted by the
            systems themselves. The gateway upgrade is left out (it is a
            release of the reference gateway).
    """

    cases: int = 300
    crash_rate: float = 0.05
    seed: int = 7
    mode: Mode = "ledger"
    instances: int = 1
    sink_fault_rate: float | None = None
    review_threshold_minor: int = 10_000
    expiring_rate: float = 0.05
    race_rate: float | None = None
    window: int = 200
    broker_restart: bool = True
    chaos_every: int = 500
    brokers: int = 1
    broker_chaos: bool = False
    real_sinks: bool = False

    def __post_init__(self) -> None:
        for name in ("crash_rate", "expiring_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {value}")
        for name in ("sink_fault_rate", "race_rate"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {value}")
        if self.cases < 1:
            raise ValueError("a mission needs at least one case")
        if self.instances not in (1, 2, 3, 4):
            raise ValueError("instances must be between 1 and 4")
        if self.window < 1:
            raise ValueError("window must be at least 1")
        if self.brokers < 1:
            raise ValueError("brokers must be at least 1")
        if self.broker_chaos and self.brokers < 3:
            raise ValueError(
                "broker chaos needs a cluster of at least 3 brokers (--brokers 3): "
                "with fewer, a killed node takes the evidence with it"
            )
        if self.mode not in ("ledger", "checkpoint-only"):
            raise ValueError(f"mode must be ledger or checkpoint-only, not {self.mode!r}")

    @property
    def sink_faults(self) -> float:
        """The sink-fault rate in force."""
        return self.crash_rate if self.sink_fault_rate is None else self.sink_fault_rate

    @property
    def races(self) -> float:
        """The resumer-race rate in force."""
        return self.crash_rate / 2 if self.race_rate is None else self.race_rate


@dataclass(frozen=True)
class OpFaults:
    """Faults armed against one operation.

    Attributes:
        seam: a seam at which the stage handling it is SIGKILLed, or ``None``.
        sink_fault: a sink fault mode armed for it, or ``None``.
        race: two resumers race to claim it while it is in flight.
    """

    seam: str | None = None
    sink_fault: str | None = None
    race: bool = False


@dataclass(frozen=True)
class Case:
    """One customer's case.

    Attributes:
        number: case number (0-based).
        customer: the represented subject, e.g. ``customer-00042``.
        account: account to credit.
        fee_minor: the fee to refund (minor currency units, GBP).
        charged_day: day the fee was charged (0..99).
        already_refunded: the fee was refunded by hand before the mission.
        expiring: the first approval expires before it is used.
        refund: faults armed against the refund.
        notify: faults armed against the notification.
        goodwill: faults armed against the goodwill credit, or ``None`` when
            the case gets no goodwill credit.
        reversal: faults armed against the credit's compensation, should the
            refund be refused.
        callback: faults armed against the callback booking, or ``None``
            when the customer books no callback.
    """

    number: int
    customer: str
    account: str
    fee_minor: int
    charged_day: int
    already_refunded: bool
    expiring: bool
    refund: OpFaults = field(default_factory=OpFaults)
    notify: OpFaults = field(default_factory=OpFaults)
    goodwill: OpFaults | None = None
    reversal: OpFaults = field(default_factory=OpFaults)
    callback: OpFaults | None = None

    @property
    def refund_op(self) -> str:
        """The refund's operation ID (stable: chosen before the first attempt)."""
        return f"refund:{self.number:05d}:v1"

    @property
    def notify_op(self) -> str:
        """The notification's operation ID."""
        return f"notify:{self.number:05d}:v1"

    @property
    def goodwill_op(self) -> str:
        """The goodwill credit's operation ID."""
        return f"goodwill:{self.number:05d}:v1"

    @property
    def reversal_op(self) -> str:
        """The goodwill credit's compensation (its own operation ID)."""
        return f"goodwill-reversal:{self.number:05d}:v1"

    @property
    def callback_op(self) -> str:
        """The callback booking's operation ID."""
        return f"callback:{self.number:05d}:v1"

    def operations(self) -> dict[str, str]:
        """Every operation the case may publish: operation ID -> sink.

        The reversal is listed only for a case with a goodwill credit; whether
        it is published depends on the refund's fate.
        """
        ops = {self.refund_op: "payments", self.notify_op: "mailer"}
        if self.goodwill is not None:
            ops[self.goodwill_op] = "credits"
            ops[self.reversal_op] = "credits"
        if self.callback is not None:
            ops[self.callback_op] = "callbacks"
        return ops


def eligible(case: Case) -> bool:
    """The eligibility step: a pure decision over the case's own data.

    A fee is refunded when it was charged during the billing outage and was not
    already refunded by hand. Replaying it after a crash costs nothing and has
    no effect outside, which is why it needs no ledger entry.
    """
    first, last = OUTAGE_DAYS
    return first <= case.charged_day <= last and not case.already_refunded


def plan(options: MissionOptions) -> list[Case]:
    """The mission's cases and the faults armed against their operations.

    Coverage is guaranteed, not left to chance: the first crashes planned
    cycle through every seam, and the first sink faults through every mode
    (as long as the rates plan at least that many), so every named seam and
    fault mode is exercised in every mission big enough to hold them.

    Returns:
        ``options.cases`` cases, numbered from 0.
    """
    rng = random.Random(options.seed)
    seams = list(PLAIN_SEAMS)
    modes = list(SINK_FAULT_MODES)
    wire_modes = list(WIRE_FAULT_MODES)
    crashes = sink_faults = bookings = reversals = 0
    cases = []

    def faults(sink: str) -> OpFaults:
        nonlocal crashes, sink_faults
        seam = mode = None
        if rng.random() < options.crash_rate:
            seam = seams[crashes] if crashes < len(seams) else rng.choice(seams)
            crashes += 1
        if rng.random() < options.sink_faults:
            drawn = wire_modes if options.real_sinks and sink in REAL_SINKS else modes
            mode = drawn[sink_faults] if sink_faults < len(drawn) else rng.choice(drawn)
            sink_faults += 1
        race = sink == "payments" and rng.random() < options.races
        return OpFaults(seam, mode, race)

    def booking_faults() -> OpFaults:
        # The reservation sink's calls take no sink faults: crashes only, the
        # reservation's own seam first.
        nonlocal bookings
        if rng.random() >= options.crash_rate:
            return OpFaults()
        pool = BOOKING_SEAMS
        seam = pool[bookings] if bookings < len(pool) else rng.choice(pool)
        bookings += 1
        return OpFaults(seam=seam)

    def reversal_faults() -> OpFaults:
        # The first compensation fault planned is a rejection (a failure the
        # report must count), then any mode.
        nonlocal reversals
        seam = rng.choice(seams) if rng.random() < options.crash_rate else None
        mode = None
        if rng.random() < min(1.0, options.sink_faults * COMPENSATION_FAULT_FACTOR):
            mode = "reject" if reversals == 0 else rng.choice(modes)
            reversals += 1
        return OpFaults(seam, mode)

    for n in range(options.cases):
        fee = rng.choice((500, 1_500, 2_500, 3_500, 4_900, 7_500, 12_000, 25_000, 40_000))
        cases.append(
            Case(
                number=n,
                customer=f"customer-{n:05d}",
                account=f"acct-{n:05d}",
                fee_minor=fee,
                charged_day=rng.randrange(100),
                already_refunded=rng.random() < 0.03,
                expiring=rng.random() < options.expiring_rate,
                refund=faults("payments"),
                notify=faults("mailer"),
                goodwill=faults("credits") if fee >= GOODWILL_MIN_FEE_MINOR else None,
                reversal=reversal_faults(),
                callback=booking_faults() if rng.random() < CALLBACK_RATE else None,
            )
        )
    return cases
