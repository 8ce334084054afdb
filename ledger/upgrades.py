"""Recovery compatibility across sink releases: the release manifest and its rules.

A sink's effect contract has a version (the sink registry's
``contract_version``, 1 unless stated). Every dispatch carries the version it
was written under, and every ``ATTEMPTED`` receipt the version the relay sent
under. When a step of an in-flight operation is about to be performed under a
different version than the one the operation's effect was attempted (or
dispatched) under, the release manifest decides whether it may go on::

    {"release": "2026.12",
     "schemas": {"Dispatch": 3, ...},
     "sinks": {"payments": {"versions": {
        "1": {"contract": {...}},
        "2": {"contract": {...}, "resumes": {"1": ["ADMITTED"]}}}}}}

``resumes`` of version N lists, for each earlier version M, the in-flight
states (:data:`IN_FLIGHT`) in which an operation begun under M may go on
under N. Anything else is held: the version is not in the manifest, the
registry's contract for it differs from the manifest's, or the state is not
listed. When the manifest allows the step, the contract rules of
:mod:`ledger.contracts` still decide it (a contract without readback, or one
whose key retention is shorter than the operation's age, holds it as
unknown).

Pure: no I/O and no clock (the relay reads the file, see
:mod:`sinks.manifest`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ledger.contracts import EffectContract, Recovery, after_ambiguous_send
from ledger.events import Dispatch, OperationState
from ledger.serde import registry

#: The in-flight states a step may resume, as the relay meets them:
#: ``ADMITTED`` -- an execution dispatched but never sent;
#: ``EFFECT_PENDING`` -- an execution that may have left (a resume);
#: ``UNKNOWN_OUTCOME`` -- a reconciliation readback;
#: ``EFFECT_COMMITTED`` -- a postcondition verification.
InFlight = Literal["ADMITTED", "EFFECT_PENDING", "UNKNOWN_OUTCOME", "EFFECT_COMMITTED"]
IN_FLIGHT: tuple[InFlight, ...] = (
    "ADMITTED",
    "EFFECT_PENDING",
    "UNKNOWN_OUTCOME",
    "EFFECT_COMMITTED",
)


class ContractRelease(BaseModel):
    """One released version of a sink's contract.

    Attributes:
        contract: the contract that version declares.
        resumes: earlier version (as a string, JSON keys) -> the in-flight
            states an operation begun under it may resume in under this one.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    contract: EffectContract
    resumes: dict[str, list[InFlight]] = Field(default_factory=dict)


class SinkReleases(BaseModel):
    """Every released contract version of one sink (version as a string -> release)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    versions: dict[str, ContractRelease]

    @model_validator(mode="after")
    def _earlier_versions(self) -> SinkReleases:
        for version, release in self.versions.items():
            if not version.isdigit() or int(version) < 1:
                raise ValueError(f"contract version {version!r} is not a positive integer")
            for old in release.resumes:
                if old not in self.versions or int(old) >= int(version):
                    raise ValueError(
                        f"version {version} resumes from {old}, which is not an earlier "
                        "version in the manifest"
                    )
        return self


class ReleaseManifest(BaseModel):
    """The release manifest (``deploy/release-manifest.json``).

    Attributes:
        release: the release's name.
        schemas: Avro record name -> the schema version the release writes.
        sinks: sink name -> its released contract versions.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    release: str = Field(min_length=1)
    schemas: dict[str, int] = Field(default_factory=dict)
    sinks: dict[str, SinkReleases] = Field(default_factory=dict)


def state_of_step(kind: str, *, may_have_left: bool) -> InFlight:
    """The in-flight state a relay step resumes.

    Args:
        kind: the dispatch kind (``EXECUTE``, ``READBACK``, ``VERIFY``).
        may_have_left: for ``EXECUTE``, an earlier request may have reached the sink.

    Returns:
        One of :data:`IN_FLIGHT`.
    """
    if kind == "READBACK":
        return "UNKNOWN_OUTCOME"
    if kind == "VERIFY":
        return "EFFECT_COMMITTED"
    return "EFFECT_PENDING" if may_have_left else "ADMITTED"


def attempted_version(
    d: Dispatch,
    *,
    may_have_left: bool,
    dispatch_attempt: int | None = None,
    operation_attempt: int | None = None,
) -> int:
    """The contract version a step of ``d`` resumes from (the manifest's "from").

    A fresh execution (nothing of it may have left) resumes from the version
    it was dispatched under. Any other step -- an execution that may have
    left, a readback of an unknown outcome, a postcondition check -- resumes
    from the earliest version an attempt of the operation was sent under, in
    any dispatch and any epoch: a readback dispatched after the upgrade is
    still a readback of an effect attempted under the old contract (a
    readback stamped with the new version must not release what the
    manifest holds).

    Args:
        d: the dispatch the relay is about to perform.
        may_have_left: for ``EXECUTE``, an earlier request may have reached the sink.
        dispatch_attempt: the version this dispatch's first attempt was sent
            under, if one was.
        operation_attempt: the earliest version any receipt of the operation
            names, if known.

    Returns:
        The version (``None`` on the dispatch counts as 1).
    """
    stamped = d.contract_version or 1
    if d.kind == "EXECUTE" and not may_have_left:
        return stamped
    known = [v for v in (dispatch_attempt, operation_attempt) if v is not None]
    return min(known) if known else stamped


def upgrade_hold(
    manifest: ReleaseManifest | None,
    sink: str,
    *,
    from_version: int,
    to_version: int,
    contract: EffectContract,
    state: InFlight,
) -> str | None:
    """Why a step may not go on under the sink's current contract version, or ``None``.

    Args:
        manifest: the release manifest, or ``None`` when none is configured
            (then any change of version is held).
        sink: the sink's name.
        from_version: the contract version the operation's effect was
            attempted (or, never sent, dispatched) under.
        to_version: the version the sink registry declares now.
        contract: the contract the sink registry declares now.
        state: the in-flight state the step resumes.

    Returns:
        ``None`` when the versions are equal or the manifest allows the step
        (the contract rules then decide it); otherwise the reason, naming both
        versions and the remedy.
    """
    if from_version == to_version:
        return None
    head = (
        f"{sink} changed its contract from version {from_version} to version {to_version} "
        f"while the operation was {state}"
    )
    remedy = "a person decides (ledger dispose), or the release manifest allows it"
    if manifest is None:
        return f"{head}, and no release manifest is configured; {remedy}"
    releases = manifest.sinks.get(sink)
    release = releases.versions.get(str(to_version)) if releases else None
    if release is None:
        return (
            f"{head}, and release {manifest.release} lists no contract version {to_version} "
            f"of {sink}; {remedy}"
        )
    if release.contract != contract:
        return (
            f"{head}, and the registry's contract version {to_version} differs from the one "
            f"release {manifest.release} lists; {remedy}"
        )
    allowed = release.resumes.get(str(from_version), [])
    if state not in allowed:
        listed = ", ".join(allowed) or "no state"
        return (
            f"{head}; release {manifest.release} lets version {to_version} resume only "
            f"{listed} from version {from_version}; {remedy}"
        )
    return None


#: The records a dispatch's answers are written with (the dispatch itself,
#: the relay's receipt and readback).
DISPATCH_RECORDS = ("Dispatch", "EffectReceipt", "Readback")


def schema_versions(names: tuple[str, ...] = DISPATCH_RECORDS) -> dict[str, int]:
    """The current schema version of each named record (from the shipped ``schemas``).

    Args:
        names: Avro record names.

    Returns:
        ``{name: version}``.

    Raises:
        DecodeError: a name has no schema.
    """
    reg = registry()
    return {name: reg.schema(name).version for name in names}


@dataclass(frozen=True)
class Stranded:
    """An in-flight operation a proposed contract change would hold.

    Attributes:
        operation_id: the operation.
        state: its recovery state now.
        reason: why its next step could not go on under the proposed contract.
    """

    operation_id: str
    state: str
    reason: str


def stranded_by(
    states: Iterable[OperationState],
    manifest: ReleaseManifest | None,
    sink: str,
    *,
    current_version: int,
    proposed_version: int,
    proposed: EffectContract,
    now_ms: int,
) -> list[Stranded]:
    """The in-flight operations of ``sink`` that a proposed contract would strand.

    Each is checked as the relay would check its next step after the change
    (:func:`upgrade_hold`, from ``current_version``), and, when the manifest
    allows the step, against the proposed contract's rules for a request that
    may have reached the sink (:func:`~ledger.contracts.after_ambiguous_send`),
    for ``EFFECT_PENDING`` and ``UNKNOWN_OUTCOME``. An operation's age is
    counted from its admission (the state table does not hold the first
    attempt, which came later), so the key-retention check errs towards
    holding.

    Args:
        states: operation states (the state table).
        manifest: the release manifest (``None``: none configured).
        sink: the sink whose contract changes.
        current_version: the contract version in force now.
        proposed_version: the version the change would register.
        proposed: the proposed contract.
        now_ms: ledger time now (ms).

    Returns:
        The stranded operations, sorted by operation ID.
    """
    found: list[Stranded] = []
    for st in sorted(states, key=lambda s: s.operation_id):
        state = str(st.state)
        if st.sink != sink or state not in IN_FLIGHT:
            continue
        in_flight: InFlight = state
        reason = upgrade_hold(
            manifest,
            sink,
            from_version=current_version,
            to_version=proposed_version,
            contract=proposed,
            state=in_flight,
        )
        if reason is None and in_flight in ("EFFECT_PENDING", "UNKNOWN_OUTCOME"):
            first = st.admitted_at_ms if st.admitted_at_ms is not None else now_ms
            decision = after_ambiguous_send(proposed, first_seen_ms=first, now_ms=now_ms)
            if decision.action is Recovery.HOLD_UNKNOWN:
                reason = (
                    f"under {sink}'s contract version {proposed_version} (now {current_version}) "
                    f"a resume would be held: {decision.reason}"
                )
        if reason is not None:
            found.append(Stranded(st.operation_id, state, reason))
    return found
