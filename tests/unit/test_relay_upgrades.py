"""The relay checks each step against the release manifest before it contacts a sink.

The sink's URL answers nothing: a step that went on would raise
:class:`SinkNotReachedError`; a held one returns its receipt or observation
and a ``CONTRACT_UPGRADE_HOLD`` operating event without a request.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.relay import Relay
from consumers.stage import Record
from ledger.contracts import PAYMENT_GATEWAY
from ledger.errors import SinkNotReachedError
from ledger.events import Dispatch, EffectReceipt, OperatingEvent, Readback
from ledger.settings import LedgerSettings
from sinks.registry import SinkEndpoint, load_manifest, save_sinks
from testbed.gameday import RELEASE_MANIFEST
from tests.helpers import keyed

V2 = load_manifest(RELEASE_MANIFEST).sinks["payments"].versions["2"].contract
NOWHERE = "http://127.0.0.1:9"  # discard port: nothing listens


def _relay(tmp_path: Path, *, version: int, manifest: bool = True) -> Relay:
    contract = PAYMENT_GATEWAY if version == 1 else V2
    save_sinks(
        tmp_path / "sinks.json",
        {"payments": SinkEndpoint(url=NOWHERE, contract=contract, contract_version=version)},
    )
    settings = keyed(
        LedgerSettings(
            run_dir=tmp_path,
            release_manifest_file=RELEASE_MANIFEST if manifest else None,
            sink_timeout_s=0.5,
        )
    )
    return Relay(settings)


def _dispatch(kind: str = "EXECUTE", version: int | None = 1) -> Dispatch:
    return Dispatch(
        dispatch_id="refund:1:v1#1.1",
        operation_id="refund:1:v1",
        kind=kind,  # type: ignore[arg-type]
        sink="payments",
        action="refund",
        params_json='{"account":"a","amount_minor":1}',
        parameter_digest="0" * 64,
        fencing_token=1,
        state_version=2,
        subject="s",
        purpose="p",
        decision_version=1,
        contract_version=version,
    )


def test_a_resume_the_manifest_does_not_allow_is_held_unsent(tmp_path: Path) -> None:
    relay = _relay(tmp_path, version=2)
    (topic, key, receipt), (event_topic, _, event) = relay.dispatcher.perform(
        _dispatch(), fresh=False
    )
    assert (topic, key) == ("receipts", "refund:1:v1")
    assert isinstance(receipt, EffectReceipt) and receipt.status == "AMBIGUOUS"
    # It names the version the effect was attempted under, not the new one.
    assert receipt.on_resume and receipt.contract_version == 1
    assert "from version 1 to version 2" in receipt.detail
    assert "EFFECT_PENDING" in receipt.detail
    assert event_topic == "operating-events" and isinstance(event, OperatingEvent)
    assert event.kind == "CONTRACT_UPGRADE_HOLD" and event.operation_id == "refund:1:v1"


def test_a_reconciliation_readback_is_held_as_unknown(tmp_path: Path) -> None:
    relay = _relay(tmp_path, version=2)
    (topic, _, readback), (_, _, event) = relay.dispatcher.perform(
        _dispatch("READBACK"), fresh=True
    )
    assert topic == "readbacks" and isinstance(readback, Readback)
    assert readback.status == "UNKNOWN" and "UNKNOWN_OUTCOME" in readback.detail
    assert isinstance(event, OperatingEvent) and event.kind == "CONTRACT_UPGRADE_HOLD"


def test_a_step_the_manifest_allows_goes_on_to_the_sink(tmp_path: Path) -> None:
    relay = _relay(tmp_path, version=2)
    # Never sent under version 1: version 2 may send it (ADMITTED is listed).
    with pytest.raises(SinkNotReachedError):
        relay.dispatcher.perform(_dispatch(), fresh=True)


def test_an_unchanged_version_goes_on(tmp_path: Path) -> None:
    relay = _relay(tmp_path, version=1)
    with pytest.raises(SinkNotReachedError):
        relay.dispatcher.perform(_dispatch(version=None), fresh=False)  # None reads as version 1


def test_the_first_attempts_version_counts(tmp_path: Path) -> None:
    relay = _relay(tmp_path, version=2)
    relay.book.attempt_versions["refund:1:v1#1.1"] = 2  # first sent under version 2 already
    with pytest.raises(SinkNotReachedError):  # V2: key still kept, resubmitted
        relay.dispatcher.perform(_dispatch(version=1), fresh=False)


def test_without_a_manifest_any_change_is_held(tmp_path: Path) -> None:
    relay = _relay(tmp_path, version=2, manifest=False)
    (_, _, receipt), _event = relay.dispatcher.perform(_dispatch(), fresh=True)
    assert isinstance(receipt, EffectReceipt) and receipt.status == "AMBIGUOUS"
    assert "nothing was sent" in receipt.detail and "no release manifest" in receipt.detail


def test_the_processor_stamps_the_registrys_version_and_the_schema_versions(
    tmp_path: Path,
) -> None:
    import json

    from consumers.processor import Processor

    _relay(tmp_path, version=2)  # writes the registry: payments at version 2
    processor = Processor(keyed(LedgerSettings(run_dir=tmp_path)))
    stamped = processor.facts.stamped(_dispatch(version=None))
    assert stamped.contract_version == 2
    versions = json.loads(stamped.schema_versions_json or "{}")
    assert versions["Dispatch"] >= 3 and versions["EffectReceipt"] >= 3 and "Readback" in versions
    other = processor.facts.stamped(_dispatch(version=None).model_copy(update={"sink": "unknown"}))
    assert other.contract_version is None


def _attempted(dispatch_id: str, version: int, offset: int) -> Record:
    receipt = EffectReceipt(
        operation_id="refund:1:v1",
        dispatch_id=dispatch_id,
        status="ATTEMPTED",
        sink="payments",
        attempt_id=dispatch_id,
        fencing_token=1,
        observed_at_ms=offset,
        first_attempt_at_ms=offset,
        detail="about to send",
        observer="relay-0",
        contract_version=version,
    )
    return Record("receipts", 0, offset, "refund:1:v1", b"", receipt)


@pytest.mark.parametrize(
    ("versions", "held"),
    [((1, 2), False), ((2, 1), True), ((1,), True), ((2,), False)],
    ids=["read-back-absent-then-attempted-under-2", "latest-under-1", "only-1", "only-2"],
)
def test_a_readback_resumes_from_the_operations_latest_attempt(
    tmp_path: Path, versions: tuple[int, ...], held: bool
) -> None:
    """Seen in the 4,000-case mission (refund:01397:v1): an attempt under version
    1 was read back absent, the operation was dispatched again and attempted
    under the new version, and a readback was then held "from 1" -- until
    compaction removed the version 1 receipt and a later readback went
    through. The latest receipt names the attempt in question and is the one
    compaction keeps: the answer no longer depends on compaction."""
    relay = _relay(tmp_path, version=2)
    for n, version in enumerate(versions):
        relay.book.apply("refund:1:v1", _attempted(f"refund:1:v1#{n + 1}.{n + 1}", version, n))
    readback = _dispatch("READBACK", version=2)
    try:
        outputs = relay.dispatcher.perform(readback, fresh=True)
    except SinkNotReachedError:
        outputs = []  # it went on to the sink (which answers nothing here)
    holds = [
        e
        for _, _, e in outputs
        if isinstance(e, OperatingEvent) and e.kind == "CONTRACT_UPGRADE_HOLD"
    ]
    assert bool(holds) == held, outputs
