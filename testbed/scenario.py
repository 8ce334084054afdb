"""Game-day scenario files (``shared/SCENARIOS.md``): parsing and validation.

A scenario is a JSON or YAML object with ``name``, ``format`` (1, the
default, 2 or 3), ``description``, ``mode``, ``inline_verify`` (default
true: the relay's ``LEDGER_RELAY_INLINE_VERIFY``; false keeps every
verification on the ``VERIFY`` dispatch path), ``sinks``,
``policy_version``, ``steps`` and ``expect``. Unknown keys are an
error naming the key and where it is; so are wrong types and unknown steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from consumers.hooks import Seam
from ledger.clock import MAX_ADVANCE_S
from ledger.contracts import EffectContract
from ledger.events import RecoveryReceipt
from ledger.topology import TOPICS
from testbed.errors import ScenarioError as ScenarioError  # re-exported: its old home

SEAM = Seam
SINK_FAULT = Literal[
    "commit_then_drop_response",
    "timeout_before_commit",
    "timeout_after_commit",
    "reject",
    "unavailable",
    "reset",
    "slow",
]


#: The stage components a scenario can pause, resume, scale or restart.
Component = Literal["processor", "authority", "relay"]

#: An instance name as the harness starts it (``--instance``), e.g. ``0`` or ``1``.
Instance = Annotated[int, Field(ge=0, le=63)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


#: A policy version as a scenario gives it: 1 or more (0 is not "the default").
PolicyVersion = Annotated[int, Field(ge=1)]


class Scope(_Strict):
    """What an approval covers.

    ``subject`` and ``max_amount_minor`` always; each optional field (format
    v2), when given, must equal the operation's own value for the approval
    to admit it (``currency`` and ``account`` are read from its ``params``).
    """

    subject: str
    max_amount_minor: int = Field(ge=0)
    operation_id: str | None = None
    action: str | None = None
    sink: str | None = None
    currency: str | None = None
    account: str | None = None
    purpose: str | None = None
    parameter_digest: str | None = None


class Approve(_Strict):
    """A review decision is published."""

    approval_id: str
    reviewer: str
    expires_at: int | float
    policy_version: PolicyVersion
    scope: Scope


class Revoke(_Strict):
    """An approval is withdrawn."""

    approval_id: str
    by: str


class Policy(_Strict):
    """The current policy version changes."""

    version: PolicyVersion


class IntentStep(_Strict):
    """A service publishes an intent."""

    operation_id: str
    sink: str
    action: str
    params: dict[str, Any]
    actor: str
    subject: str
    purpose: str
    decision_version: int
    approval_id: str | None = None
    compensates: str | None = None


class Fault(_Strict):
    """The component reaching ``seam`` (for that operation) dies there."""

    seam: SEAM
    operation_id: str | None = None
    times: int = Field(default=1, ge=1)


class SinkFault(_Strict):
    """A sink misbehaves once for an operation.

    ``reset`` and ``slow`` (format v3) are injected on the wire, so only a sink
    whose ``adapter`` is not ``reference`` takes them; ``slow`` delays every
    answer from then on by ``latency_ms``.
    """

    sink: str
    operation_id: str
    mode: SINK_FAULT
    latency_ms: int = Field(default=0, ge=0)


class Run(_Strict):
    """Run every component until the ledger is quiescent."""

    timeout_s: int | float = 60


class Restart(_Strict):
    """Restart crashed components (all, or one)."""

    component: Component | None = None


class Pause(_Strict):
    """A stage process is stopped (SIGSTOP) but stays alive with what it holds (format v2).

    Without ``seam`` the process stops at once. With ``seam`` (and
    ``operation_id``), an extension of this runner, the step arms a hook and
    the instance stops itself when it next reaches that seam for that
    operation: a stalled owner holding exactly that dispatch.
    """

    component: Component
    instance: Instance = 0
    seam: SEAM | None = None
    operation_id: str | None = None

    @model_validator(mode="after")
    def _seam_names_operation(self) -> Pause:
        if (self.seam is None) != (self.operation_id is None):
            raise ValueError("a pause at a seam needs both 'seam' and 'operation_id'")
        return self


class Resume(_Strict):
    """A process stopped by ``pause`` continues (SIGCONT) (format v2)."""

    component: Component
    instance: Instance = 0


class Scale(_Strict):
    """From now on ``instances`` instances of the component run (format v2).

    Extra instances are started (``1``, ``2`` ...) and surplus ones stopped,
    highest first, so the component's consumer group rebalances.
    """

    component: Component
    instances: int = Field(ge=1, le=64)


class Advance(_Strict):
    """Move the ledger clock forward."""

    seconds: int | float = Field(ge=0)


class Upgrade(_Strict):
    """A new release of a sink changes its effect contract from now on (format v2).

    The reference sink restarts with the new contract (same database, same
    token) and the sink registry names it with ``contract_version`` (default:
    one more than the sink's current version). In-flight operations resume
    under it only as far as the release manifest allows
    (``deploy/release-manifest.json``, :mod:`ledger.upgrades`).
    """

    sink: str
    contract: EffectContract
    contract_version: int | None = Field(default=None, ge=1)


#: Longest ``wait`` step (seconds): broker-side timers of the ledger run in
#: seconds (session 10 s, transaction 15 s by default); ten minutes is plenty.
MAX_WAIT_S = 600


class Wait(_Strict):
    """Wall-clock time passes with every stage as it is (format v3).

    Crashed stages stay down and paused ones stay paused, so broker-side
    timers run (transaction timeouts, session and poll timeouts); the ledger
    clock does not move.
    """

    seconds: int | float = Field(ge=0, le=MAX_WAIT_S)


class OffsetsReset(_Strict):
    """While the component's instances are down, its group's committed offsets go (format v3).

    ``to``: ``earliest`` (each input partition's first offset still held),
    ``latest`` (its last stable offset: what the group had not read is
    skipped) or ``deleted`` (the group and its offsets are deleted, as offset
    retention deletes an empty group's: the stage starts where a new reader
    does).
    """

    component: Component
    to: Literal["earliest", "latest", "deleted"]


class TopicConfigStep(_Strict):
    """A topic's configuration is changed (format v3), e.g. a retention on an audited topic.

    ``topic`` is a ledger topic's short name; ``config`` maps Kafka topic
    configs to their new values (strings, numbers or booleans; set on the
    topic itself). What the stages make of it at their next start is part of
    the scenario.
    """

    topic: str
    config: dict[str, str | int | bool] = Field(min_length=1)

    @model_validator(mode="after")
    def _known_topic(self) -> TopicConfigStep:
        names = [t.name for t in TOPICS]
        if self.topic not in names:
            raise ValueError(
                f"topic {self.topic!r} is not a ledger topic; short names are: {', '.join(names)}"
            )
        return self


class Skew(_Strict):
    """From now on the component reads the ledger clock shifted by ``seconds`` (format v3).

    Positive: its clock runs ahead; negative: behind. A later ``skew`` of the
    component replaces this one (``0`` ends it).
    """

    component: Component
    seconds: int | float = Field(ge=-MAX_ADVANCE_S, le=MAX_ADVANCE_S)


class ClaimStep(_Strict):
    """A resumer asks for ownership."""

    operation_id: str
    worker: str
    expected_version: Literal["current"] | int = "current"


class Race(_Strict):
    """Every worker reads the current version, then all claim at once."""

    operation_id: str
    workers: list[str] = Field(min_length=1)


class StaleDispatch(_Strict):
    """A worker that lost ownership sends the dispatch with the previous token."""

    operation_id: str
    worker: str


class Dispose(_Strict):
    """An attributable human disposition of an unknown outcome."""

    operation_id: str
    decision: Literal["committed", "absent", "abandon"]
    by: str
    evidence: str


class Forge(_Strict):
    """An attacker without a trusted key publishes the record that serves them best."""

    record: Literal[
        "approval_use",
        "admission",
        "dispatch",
        "readback",
        "disposition",
        "revocation",
        "policy",
        "state",
        "tombstone",
    ]
    topic: str | None = None
    operation_id: str | None = None
    approval_id: str | None = None
    fields: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _targets(self) -> Forge:
        if self.record == "tombstone" and not self.topic:
            raise ValueError("a forged tombstone needs 'topic' (a topic's short name)")
        if self.record != "tombstone" and self.topic is not None:
            raise ValueError("'topic' is only for a forged tombstone")
        needs_op = {"approval_use", "admission", "dispatch", "readback", "disposition", "state"}
        if self.record in needs_op and not self.operation_id:
            raise ValueError(f"a forged {self.record} needs 'operation_id'")
        if self.record == "revocation" and not self.approval_id:
            raise ValueError("a forged revocation needs 'approval_id'")
        return self


class Empty(_Strict):
    """A step with no fields."""


STEP_TYPES: dict[str, type[BaseModel]] = {
    "approve": Approve,
    "revoke": Revoke,
    "policy": Policy,
    "intent": IntentStep,
    "fault": Fault,
    "sink_fault": SinkFault,
    "run": Run,
    "restart": Restart,
    "pause": Pause,
    "resume": Resume,
    "scale": Scale,
    "advance": Advance,
    "upgrade": Upgrade,
    "wait": Wait,
    "offsets_reset": OffsetsReset,
    "topic_config": TopicConfigStep,
    "skew": Skew,
    "claim": ClaimStep,
    "race": Race,
    "stale_dispatch": StaleDispatch,
    "dispose": Dispose,
    "forge": Forge,
    "broker_restart": Empty,
    "compact": Empty,
    "audit": Empty,
}


#: Steps a file may use only when it says ``"format": 3`` (``pause`` at a seam
#: is older in this runner, so a format 2 file keeps it).
FORMAT_3_STEPS = frozenset({"wait", "offsets_reset", "topic_config", "skew"})


class Step(BaseModel):
    """One step: its kind and its parsed fields."""

    model_config = ConfigDict(frozen=True)
    kind: str
    args: Any


class Bound(_Strict):
    """``{"min": a, "max": b}``: either bound optional."""

    min: int | None = None
    max: int | None = None


Expected = Annotated[int | Bound, Field()]


class OpExpect(_Strict):
    """Expectations about one operation."""

    state: (
        Literal[
            "NOT_ADMITTED",
            "ADMITTED",
            "EFFECT_PENDING",
            "EFFECT_COMMITTED",
            "OUTCOME_VERIFIED",
            "UNKNOWN_OUTCOME",
            "NEEDS_REAUTHORISATION",
            "ABANDONED",
        ]
        | None
    ) = None
    effects: Expected | None = None
    reason_contains: str | None = None
    recovery_receipts_min: int | None = None
    operating_events: dict[str, Expected] | None = None
    #: The hold as a reservation sink reports it (format v2); ``null`` means
    #: the sink holds no reservation for the operation. Checked only when given.
    reservation: Literal["held", "confirmed", "released"] | None = None

    #: Field -> expected value on the operation's latest recovery receipt
    #: (format v2; strings match as case-insensitive substrings). Given as
    #: ``null``, the operation must have no recovery receipt.
    recovery_receipt: dict[str, str | int | bool | None] | None = None

    @model_validator(mode="after")
    def _receipt_fields_known(self) -> OpExpect:
        unknown = sorted(set(self.recovery_receipt or {}) - set(RecoveryReceipt.model_fields))
        if unknown:
            raise ValueError(
                f"recovery_receipt names unknown field(s) {', '.join(unknown)}; a recovery "
                f"receipt has {', '.join(RecoveryReceipt.model_fields)}"
            )
        return self

    @property
    def checks_recovery_receipt(self) -> bool:
        """Whether ``recovery_receipt`` was given (``null`` included)."""
        return "recovery_receipt" in self.model_fields_set

    #: the operation that compensated this one (format v2); an explicit
    #: ``null`` means none did (see :meth:`checks_compensated_by`).
    compensated_by: str | None = None

    def checks_compensated_by(self) -> bool:
        """Whether the scenario names ``compensated_by`` (``null`` included)."""
        return "compensated_by" in self.model_fields_set


class ClaimExpect(_Strict):
    """Expected outcome of one claim, in order."""

    worker: str
    accepted: bool


TOTALS = (
    "duplicate_effects",
    "unknown_outcomes_open",
    "stale_rejections",
    "reauthorisations",
    "accepted_claims",
    "rejected_claims",
    "drift_rejections",
    "postcondition_mismatches",
    "operating_events",
    "forgeries_refused",
    "reservations_released",
    "compensations",
    "compensation_failures",
    "compensation_attempts",
)


class Totals(_Strict):
    """Expected totals; each a number or a bound."""

    duplicate_effects: Expected | None = None
    unknown_outcomes_open: Expected | None = None
    stale_rejections: Expected | None = None
    reauthorisations: Expected | None = None
    accepted_claims: Expected | None = None
    rejected_claims: Expected | None = None
    drift_rejections: Expected | None = None
    postcondition_mismatches: Expected | None = None
    operating_events: Expected | None = None
    forgeries_refused: Expected | None = None
    reservations_released: Expected | None = None
    #: compensations whose effect settled (format v2).
    compensations: Expected | None = None
    #: dispatched compensations that did not settle: UNKNOWN_OUTCOME, or
    #: refused by the sink (format v2); out of ``compensation_attempts``.
    compensation_failures: Expected | None = None
    #: compensations dispatched at least once (the failures' denominator).
    compensation_attempts: Expected | None = None
    operating_events_by_kind: dict[str, Expected] | None = None


class AuditExpect(_Strict):
    """Expected auditor result."""

    violations: Expected | None = None
    unauthenticated_records: Expected | None = None


class Expect(_Strict):
    """What a scenario checks; it names only what it checks."""

    operations: dict[str, OpExpect] = Field(default_factory=dict)
    claims: list[ClaimExpect] | None = None
    totals: Totals = Field(default_factory=Totals)
    audit: AuditExpect | None = None


class SinkSpec(_Strict):
    """A sink started for the scenario: the reference gateway, or (format v3) a real
    system behind the named adapter, reached through a fault proxy.

    Attributes:
        adapter: ``reference`` (default), ``http-idempotency-key``, ``postgres`` or ``smtp``.
        config: the adapter's own settings, passed as written (the runner's
            defaults for the scenario's actions when absent).
    """

    contract: EffectContract
    adapter: Literal["reference", "http-idempotency-key", "postgres", "smtp"] = "reference"
    config: dict[str, Any] | None = None


class Scenario(BaseModel):
    """A parsed game-day scenario."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    format: Literal[1, 2, 3] = 1
    mode: Literal["ledger", "checkpoint-only"] = "ledger"
    inline_verify: bool = True
    sinks: dict[str, SinkSpec] = Field(default_factory=dict)
    policy_version: PolicyVersion = 1
    steps: list[Step]
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="before")
    @classmethod
    def _steps(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("a scenario must be an object")
        steps = data.get("steps")
        if not isinstance(steps, list) or not steps:
            raise ValueError("'steps' must be a non-empty list of one-key objects")
        parsed = []
        for n, raw in enumerate(steps):
            if not isinstance(raw, dict) or len(raw) != 1:
                raise ValueError(f"steps[{n}] must be an object with exactly one key")
            ((kind, args),) = raw.items()
            model = STEP_TYPES.get(kind)
            if model is None:
                raise ValueError(
                    f"steps[{n}]: unknown step {kind!r}; steps are: {', '.join(STEP_TYPES)}"
                )
            try:
                parsed.append(Step(kind=kind, args=model.model_validate(args or {})))
            except ValidationError as exc:
                raise ValueError(f"steps[{n}].{kind}: {_explain(exc)}") from None
        return {**data, "steps": parsed}

    @model_validator(mode="after")
    def _operations_named(self) -> Scenario:
        mentioned = {
            op
            for step in self.steps
            if (op := getattr(step.args, "operation_id", None)) is not None
        }
        for op in self.expect.operations:
            if op not in mentioned:
                raise ValueError(
                    f"expect.operations: {op!r} is not named by any step (a typo?); "
                    f"operations in the steps: {', '.join(sorted(mentioned)) or 'none'}"
                )
        return self

    @model_validator(mode="after")
    def _sinks_named(self) -> Scenario:
        for n, step in enumerate(self.steps):
            sink = getattr(step.args, "sink", None)
            if sink is not None and sink not in self.sinks:
                raise ValueError(
                    f"steps[{n}].{step.kind}: sink {sink!r} is not declared under 'sinks'"
                )
        return self

    @model_validator(mode="after")
    def _format_3_steps(self) -> Scenario:
        for n, step in enumerate(self.steps):
            if step.kind in FORMAT_3_STEPS and self.format < 3:
                raise ValueError(f'steps[{n}]: step {step.kind!r} needs "format": 3')
        return self

    @model_validator(mode="after")
    def _real_systems(self) -> Scenario:
        for name, spec in self.sinks.items():
            if spec.adapter != "reference" and self.format < 3:
                raise ValueError(f'sinks.{name}: adapter {spec.adapter!r} needs "format": 3')
        for n, step in enumerate(self.steps):
            if isinstance(step.args, Upgrade) and self.sinks[step.args.sink].adapter != "reference":
                raise ValueError(
                    f"steps[{n}].upgrade: only a reference sink can be upgraded in a scenario"
                )
            if step.kind != "sink_fault":
                continue
            fault = step.args
            assert isinstance(fault, SinkFault)
            if fault.mode in ("reset", "slow") and self.sinks[fault.sink].adapter == "reference":
                raise ValueError(
                    f"steps[{n}].sink_fault: {fault.mode!r} is injected on the wire, so it needs "
                    "a sink with an adapter (format 3), not the reference gateway"
                )
        return self


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key {where!r}")
        elif err["type"] == "missing":
            parts.append(f"missing key {where!r}")
        elif err["type"] == "value_error":
            parts.append(str(err["msg"]).removeprefix("Value error, "))
        else:
            parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)


def parse(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a scenario object.

    Raises:
        ScenarioError: naming the bad key or value and the file.
    """
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {_explain(exc)}", source=source) from None
    except ValueError as exc:
        raise ScenarioError(f"{source}: {exc}", source=source) from None


def load(path: Path) -> Scenario:
    """Read and validate a scenario file (``.json``, ``.yaml`` or ``.yml``).

    Raises:
        ScenarioError: unreadable file, bad JSON/YAML, or an invalid scenario.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}", source=str(path)) from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        raise ScenarioError(
            f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}", source=str(path)
        ) from None
    return parse(data, str(path))
