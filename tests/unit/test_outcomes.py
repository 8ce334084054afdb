"""The outcome channel without a broker: derivation, signatures, keys, the waiter's rules, the SDK.

Issue 28: a least-privilege service could not learn an outcome (it needed the
stages' secret and internal topics), refusals arrived as timeouts, and a
wait cost the whole history.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger.authn import MacKey, SigningKey, seal_headers
from ledger.cli import main
from ledger.credentials import (
    MissingKeyError,
    keys_dir,
    outcome_key,
    outcome_keyring,
    outcome_public,
    provision_keys,
)
from ledger.events import Outcome, decode_event
from ledger.fold import decide
from ledger.outcomes import FINAL_KINDS, HELD_RELEASE, decided_outcome, kind_of, outcome_of
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.topology import partition_for
from producers.outcomes import OutcomeReader, OutcomeWatch
from producers.sdk import (
    Abandoned,
    Committed,
    Held,
    LedgerService,
    NeedsReauthorisation,
    Pending,
    Refused,
    Verified,
    result_of,
)
from tests import helpers

OP = "refund:c1:v1"

# ----------------------------------------------------------------- derivation


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        (S.OUTCOME_VERIFIED, "VERIFIED"),
        (S.NEEDS_REAUTHORISATION, "NEEDS_REAUTHORISATION"),
        (S.UNKNOWN_OUTCOME, "HELD"),
        (S.ABANDONED, "ABANDONED"),
        (S.NOT_ADMITTED, "PENDING"),
        (S.ADMITTED, "PENDING"),
        (S.EFFECT_PENDING, "PENDING"),
        (S.EFFECT_COMMITTED, "COMMITTED"),
    ],
)
def test_every_recovery_state_has_its_outcome_kind(state: S, kind: str) -> None:
    st = helpers.state(OP, state, version=4, reason="why").model_copy(
        update={
            "effect_id": "pay-9",
            "observation_source": "payments GET /accounts/acct-1",
            "observation_status": "VERIFIED",
            "approval_id": "ap-1",
            "admitted_policy_version": 2,
            "owner": "reconciliation" if state == S.UNKNOWN_OUTCOME else None,
        }
    )
    out = outcome_of(st, "processor:receipts:0:5", 1234)
    assert out.kind == kind == kind_of(st)
    assert (out.state, out.state_version, out.reason, out.at_ms) == (state, 4, "why", 1234)
    assert out.parameter_digest == st.parameter_digest and out.refusal_kind is None
    assert (out.kind in FINAL_KINDS) == (kind != "PENDING")
    if kind == "VERIFIED":
        assert out.effect_id == "pay-9" and out.policy_version == 2
        assert out.postcondition == "payments GET /accounts/acct-1: VERIFIED"
        assert out.remedy == ""
    elif kind == "COMMITTED":  # the receipt's evidence, and no claim of a postcondition
        assert out.effect_id == "pay-9" and out.policy_version == 2
        assert out.postcondition is None and "postcondition" in out.remedy
    else:
        assert out.postcondition is None and out.remedy
    if kind == "NEEDS_REAUTHORISATION":
        assert out.approval_id == "ap-1" and out.policy_version == 2
    else:
        assert out.approval_id is None
    if kind == "HELD":
        assert out.owner == "reconciliation" and out.release_condition == HELD_RELEASE
    else:
        assert out.owner is None and out.release_condition is None
    assert decode_event(out.to_bytes()) == out  # it fits its schema


def test_an_unknown_sink_is_refused_with_the_operating_events_kind_and_the_intents_digest() -> None:
    intent = helpers.intent(OP, sink="paymnets")
    decision = decide(None, intent, "intents:1:7", sink_problem="sink 'paymnets' is not registered")
    out = decided_outcome(None, decision, intent, "intents:1:7", 99)
    assert out is not None and out.kind == "REFUSED" and out.refusal_kind == "UNKNOWN_SINK"
    assert out.state is None and out.state_version == 0
    assert "paymnets" in out.reason and "register the sink" in out.remedy
    assert out.parameter_digest == intent.parameter_digest
    assert out.outcome_id == "processor:intents:1:7"  # names the intent it answers


def test_a_bad_intent_is_refused_as_bad_input() -> None:
    intent = helpers.intent(OP).model_copy(update={"parameter_digest": "v2:" + "0" * 64})
    decision = decide(None, intent, "intents:0:1")
    out = decided_outcome(None, decision, intent, "intents:0:1", 5)
    assert out is not None and (out.kind, out.refusal_kind) == ("REFUSED", "BAD_INPUT")


def test_every_intent_is_answered_a_republish_with_the_operations_current_outcome() -> None:
    intent = helpers.intent(OP)
    created = decide(None, intent, "intents:0:1")
    first = decided_outcome(None, created, intent, "intents:0:1", 5)
    assert first is not None and (first.kind, first.state) == ("PENDING", S.NOT_ADMITTED)
    settled = created.state.model_copy(  # type: ignore[union-attr]
        update={"state": S.OUTCOME_VERIFIED, "effect_id": "pay-1", "version": 5}
    )
    again = decide(settled, intent, "intents:0:9")
    assert again.outcome == "NOOP"
    out = decided_outcome(settled, again, intent, "intents:0:9", 6)
    assert out is not None and out.kind == "VERIFIED" and out.effect_id == "pay-1"
    assert out.outcome_id == "processor:intents:0:9"


def test_a_drifted_republish_is_refused_under_its_own_digest_not_the_operations() -> None:
    intent = helpers.intent(OP)
    state = decide(None, intent, "intents:0:1").state
    drifted = helpers.intent(OP, amount=6000)
    decision = decide(state, drifted, "intents:0:2")
    out = decided_outcome(state, decision, drifted, "intents:0:2", 7)
    assert out is not None and (out.kind, out.refusal_kind) == ("REFUSED", "PARAMETER_DRIFT")
    assert out.parameter_digest == drifted.parameter_digest != intent.parameter_digest
    assert out.state == S.NOT_ADMITTED  # the operation itself goes on


def test_other_inputs_publish_every_move_into_another_state_and_nothing_else() -> None:
    intent = helpers.intent(OP)
    created = decide(None, intent, "intents:0:1").state
    assert created is not None
    admitted = decide(created, helpers.admission(intent), "admissions:0:1")
    assert admitted.state is not None and admitted.state.state == S.EFFECT_PENDING
    pending = decided_outcome(created, admitted, helpers.admission(intent), "admissions:0:1", 1)
    assert pending is not None and (pending.kind, pending.state) == ("PENDING", S.EFFECT_PENDING)
    stale = decide(admitted.state, helpers.admission(intent), "admissions:0:3")
    assert stale.outcome != "APPLIED"  # the same decision again changes nothing
    assert decided_outcome(admitted.state, stale, helpers.admission(intent), "a:0:3", 2) is None
    refused = decide(created, helpers.admission(intent, admitted=False, reason="expired"), "a:0:2")
    out = decided_outcome(created, refused, helpers.admission(intent), "admissions:0:2", 8)
    assert out is not None and out.kind == "NEEDS_REAUTHORISATION" and "expired" in out.reason
    assert out.approval_id == "ap-1"
    settled = helpers.state(OP, S.OUTCOME_VERIFIED)
    claim = helpers.claim(OP, "w", settled.version)
    loop = decide(settled, claim, "claims:0:1")
    assert loop.outcome == "APPLIED" and loop.to_state == S.OUTCOME_VERIFIED  # a self-loop
    assert decided_outcome(settled, loop, claim, "claims:0:1", 9) is None


# ----------------------------------------------------------------- keys and signatures


@pytest.fixture
def stage_host(tmp_path: Path) -> LedgerSettings:
    settings = LedgerSettings(run_dir=tmp_path / "stages", topic_prefix="t", partitions=3)
    provision_keys(settings)
    return settings


@pytest.fixture
def service_host(tmp_path: Path, stage_host: LedgerSettings) -> LedgerSettings:
    """A service host: only the exported public key, in a file of its own."""
    public = tmp_path / "service" / "outcome.pub"
    public.parent.mkdir()
    public.write_text(
        CliRunner()
        .invoke(main, ["keys", "export", "--outcome-public"], env=_env(stage_host))
        .output
    )
    return LedgerSettings(
        run_dir=tmp_path / "service" / "run",
        topic_prefix="t",
        partitions=3,
        outcome_public_key_file=public,
    )


def _env(settings: LedgerSettings) -> dict[str, str]:
    return {"LEDGER_RUN_DIR": str(settings.run_dir), "LEDGER_TOPIC_PREFIX": settings.topic_prefix}


class FakeMessage:
    def __init__(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Any = None,
        partition: int = 0,
        offset: int = 0,
        error: Any = None,
    ) -> None:
        self._key, self._value, self._headers = key, value, headers
        self._partition, self._offset, self._error = partition, offset, error

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Any:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (2, 0)  # the broker's append time (LogAppendTime), as sealed topics keep it

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> Any:
        return self._error


def _outcome(op: str = OP, kind: str = "VERIFIED", ref: str = "intents:0:1", **kw: Any) -> Outcome:
    fields: dict[str, Any] = {
        "outcome_id": f"processor:{ref}",
        "operation_id": op,
        "kind": kind,
        "state": "OUTCOME_VERIFIED" if kind == "VERIFIED" else "NOT_ADMITTED",
        "reason": kind.lower(),
        "parameter_digest": "d1",
        "at_ms": 1,
    }
    return Outcome(**{**fields, **kw})


def _signed(
    sealer: Any, outcome: Outcome, partitions: int = 3, offset: int = 0, tamper: bool = False
) -> FakeMessage:
    key, value = outcome.operation_id.encode(), outcome.to_bytes()
    headers = seal_headers(sealer, "outcomes", key, value)
    if tamper:
        value = _outcome(outcome.operation_id, "HELD").to_bytes()
    return FakeMessage(key, value, headers, partition_for(key, partitions), offset)


def test_a_service_host_without_the_public_key_fails_naming_the_command_and_creates_nothing(
    tmp_path: Path,
) -> None:
    bare = LedgerSettings(run_dir=tmp_path / "svc", topic_prefix="t")
    for attempt in (lambda: outcome_public(bare), lambda: OutcomeReader(bare)):
        with pytest.raises(MissingKeyError) as caught:
            attempt()
        assert "ledger keys export --outcome-public" in str(caught.value)
    published: list[Any] = []
    with pytest.raises(MissingKeyError):
        LedgerService(bare, publisher=published)  # type: ignore[arg-type]
    assert published == [] and not (tmp_path / "svc").exists()  # no key, no folder


def test_the_exported_public_key_verifies_the_processors_outcomes_only(
    stage_host: LedgerSettings, service_host: LedgerSettings
) -> None:
    reader = OutcomeReader(service_host)
    signer = outcome_key(stage_host)
    assert outcome_public(service_host)[0] == signer.key_id
    good = _outcome()
    assert reader.authentic(_signed(signer, good), OP) == good
    forger = SigningKey(signer.key_id, Ed25519PrivateKey.generate(), "outcome", "t")
    stage_mac = MacKey(b"s" * 32, ledger_id="t")
    other_ledger = SigningKey(signer.key_id, signer.private, "outcome", "another-ledger")
    for refused in (
        FakeMessage(OP.encode(), good.to_bytes(), None, partition_for(OP, 3)),  # unsigned
        _signed(forger, good),  # another key under the same name
        _signed(stage_mac, good),  # the stages' MAC: not the outcome role
        _signed(other_ledger, good),  # sealed for another ledger
        _signed(signer, good, tamper=True),  # altered after signing
    ):
        assert reader.authentic(refused, OP) is None
    misplaced = _signed(signer, good)
    misplaced._partition = (misplaced._partition + 1) % 3
    assert reader.authentic(misplaced, OP) is None


def test_a_stage_host_holding_only_the_public_key_makes_no_outcome_key(
    service_host: LedgerSettings, tmp_path: Path
) -> None:
    folder = tmp_path / "pub-only" / "keys"
    folder.mkdir(parents=True)
    (folder / "outcome.pub").write_text(service_host.outcome_public_path().read_text())
    settings = LedgerSettings(run_dir=tmp_path / "pub-only", topic_prefix="t")
    made = provision_keys(settings)
    assert "outcome.key" not in made.created and not (folder / "outcome.key").exists()
    assert outcome_keyring(settings).trusted  # its public key is still the one trusted


def test_keys_export_fails_on_a_host_without_keys(tmp_path: Path) -> None:
    env = {"LEDGER_RUN_DIR": str(tmp_path / "none"), "LEDGER_TOPIC_PREFIX": "t"}
    result = CliRunner().invoke(main, ["keys", "export", "--outcome-public"], env=env)
    assert result.exit_code != 0 and "ledger keys init" in result.output
    assert not keys_dir(LedgerSettings(run_dir=tmp_path / "none")).exists()


# ----------------------------------------------------------------- the waiter's rules


class FakeConsumer:
    """Hands out prepared messages, then nothing (a partition at its end)."""

    def __init__(self, messages: list[FakeMessage]) -> None:
        self.messages = list(messages)
        self.closed = False

    def poll(self, timeout: float) -> FakeMessage | None:
        return self.messages.pop(0) if self.messages else None

    def close(self) -> None:
        self.closed = True


def _watch(stage_host: LedgerSettings, messages: list[FakeMessage]) -> OutcomeWatch:
    reader = OutcomeReader(stage_host, keyring=outcome_keyring(stage_host))
    return OutcomeWatch(reader, FakeConsumer(messages), OP, partition_for(OP, 3))  # type: ignore[arg-type]


def test_the_waiter_takes_nothing_before_the_answer_to_its_own_intent(
    stage_host: LedgerSettings,
) -> None:
    signer = outcome_key(stage_host)
    older = _signed(signer, _outcome(kind="NEEDS_REAUTHORISATION", ref="intents:0:3"))
    other_op = _signed(signer, _outcome("refund:other:v1", ref="intents:0:4"))
    forged = _signed(MacKey(b"x" * 32, ledger_id="t"), _outcome(ref="intents:0:5"))
    answer = _signed(signer, _outcome(kind="PENDING", ref="intents:0:5"))
    drift = _signed(signer, _outcome(kind="REFUSED", ref="intents:0:6", parameter_digest="d2"))
    settled = _signed(signer, _outcome(kind="VERIFIED", ref="receipts:0:2", effect_id="pay-1"))
    watch = _watch(stage_host, [older, other_op, forged, answer, drift, settled])
    found = watch.wait(5.0, answer_to=(0, 5), parameter_digest="d1")
    assert found.final and found.outcome is not None
    assert (found.outcome.kind, found.outcome.effect_id) == ("VERIFIED", "pay-1")
    assert (found.records_read, found.refused) == (6, 1)


def test_a_genuine_outcome_replayed_from_an_earlier_episode_is_not_believed(
    stage_host: LedgerSettings,
) -> None:
    """Tried as an attacker with write on ``outcomes`` and no key: an operation's genuine
    NEEDS_REAUTHORISATION, written again after the answer to its re-publish with an approval,
    was returned as the outcome while the refund went on to be paid. Versions never go back."""
    signer = outcome_key(stage_host)
    answer = _signed(signer, _outcome(kind="PENDING", ref="intents:0:5", state_version=5))
    replayed = _signed(
        signer, _outcome(kind="NEEDS_REAUTHORISATION", ref="intents:0:3", state_version=3)
    )
    old_refusal = _signed(signer, _outcome(kind="REFUSED", ref="intents:0:2", state_version=5))
    settled = _signed(
        signer,
        _outcome(kind="VERIFIED", ref="receipts:0:2", effect_id="pay-1", state_version=7),
    )
    watch = _watch(stage_host, [answer, replayed, old_refusal, settled])
    found = watch.wait(5.0, answer_to=(0, 5), parameter_digest="d1")
    assert found.final and found.outcome is not None
    assert (found.outcome.kind, found.outcome.effect_id) == ("VERIFIED", "pay-1")


def test_the_waiter_returns_the_last_outcome_seen_when_its_deadline_comes(
    stage_host: LedgerSettings,
) -> None:
    signer = outcome_key(stage_host)
    answer = _signed(signer, _outcome(kind="PENDING", ref="intents:0:5"))
    found = _watch(stage_host, [answer]).wait(0.3, answer_to=(0, 5))
    assert not found.final and found.outcome is not None and found.outcome.kind == "PENDING"
    nothing = _watch(stage_host, []).wait(0.2, answer_to=(0, 5))
    assert nothing.outcome is None and not nothing.final


# ----------------------------------------------------------------- the SDK


def test_each_outcome_kind_becomes_its_typed_result() -> None:
    verified = result_of(_outcome(effect_id="pay-1", postcondition="GET: VERIFIED"), OP)
    assert verified == Verified(OP, "pay-1", "GET: VERIFIED", None, "verified")
    reauth = result_of(
        _outcome(kind="NEEDS_REAUTHORISATION", approval_id="ap-1", policy_version=2, remedy="r"),
        OP,
    )
    assert reauth == NeedsReauthorisation(OP, "needs_reauthorisation", "ap-1", 2, "r")
    held = result_of(_outcome(kind="HELD", owner="reconciliation", release_condition="c"), OP)
    assert held == Held(OP, "reconciliation", "c", "held", None)
    refused = result_of(_outcome(kind="REFUSED", refusal_kind="UNKNOWN_SINK", remedy="fix"), OP)
    assert refused == Refused(OP, "UNKNOWN_SINK", "refused", "fix")
    assert result_of(_outcome(kind="ABANDONED", remedy="new id"), OP) == Abandoned(
        OP, "abandoned", "new id"
    )
    committed = result_of(_outcome(kind="COMMITTED", effect_id="mail-1", remedy="look"), OP)
    assert committed == Committed(OP, "mail-1", None, "committed", "look")
    assert result_of(_outcome(kind="PENDING"), OP, 7) == Pending(OP, "NOT_ADMITTED", "pending", 7)
    assert result_of(None, OP).state is None  # type: ignore[union-attr]
    with pytest.raises(dataclasses.FrozenInstanceError):
        verified.effect_id = "other"  # type: ignore[misc]


class FakePublisher:
    def __init__(self) -> None:
        self.intents: list[Any] = []

    def publish_intent(self, intent: Any) -> Any:
        self.intents.append(intent)
        return type("Published", (), {"partition": 2, "offset": 40 + len(self.intents)})()

    def close(self) -> None:
        pass


class FakeReader:
    """Answers each watch with the outcome of the intent's position (what the processor does)."""

    def __init__(self, kinds: list[str]) -> None:
        self.kinds = kinds
        self.waits: list[tuple[Any, Any]] = []

    def watch(self, operation_id: str, timeout_s: float = 10.0) -> Any:
        reader = self

        class Watch:
            def wait(self, timeout_s: float, *, answer_to: Any, parameter_digest: Any) -> Any:
                from producers.outcomes import Waited

                reader.waits.append((answer_to, parameter_digest))
                kind = reader.kinds.pop(0)
                out = _outcome(operation_id, kind, parameter_digest=parameter_digest)
                return Waited(out, kind != "PENDING", 3, 0)

            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

        return Watch()


def test_perform_publishes_the_same_intent_each_time_and_waits_for_its_answer() -> None:
    publisher, reader = FakePublisher(), FakeReader(["PENDING", "VERIFIED"])
    service = LedgerService(
        LedgerSettings(),
        actor="svc",
        publisher=publisher,
        reader=reader,  # type: ignore[arg-type]
    )
    args: dict[str, Any] = {
        "operation_id": OP,
        "sink": "payments",
        "action": "refund",
        "params": {"account": "acct-1", "amount_minor": 5000, "currency": "GBP"},
        "subject": "customer-1",
        "purpose": "fee-remediation",
        "approval_id": "ap-1",
        "wait_s": 1.0,
    }
    first = service.perform(**args)
    assert isinstance(first, Pending) and first.state == "NOT_ADMITTED"
    again = service.perform(**args)
    assert isinstance(again, Verified)
    one, two = publisher.intents
    assert one.model_dump(exclude={"published_at_ms"}) == two.model_dump(
        exclude={"published_at_ms"}
    )
    assert [w[0] for w in reader.waits] == [(2, 41), (2, 42)]  # each waits for its own answer
    assert {w[1] for w in reader.waits} == {one.parameter_digest}


def test_perform_async_runs_several_operations_at_once() -> None:
    publisher, reader = FakePublisher(), FakeReader(["VERIFIED", "REFUSED"])
    service = LedgerService(LedgerSettings(), publisher=publisher, reader=reader)  # type: ignore[arg-type]

    async def both() -> list[Any]:
        return list(
            await asyncio.gather(
                *(
                    service.perform_async(
                        operation_id=f"refund:a{n}:v1",
                        sink="payments",
                        action="refund",
                        params={"account": "acct-1", "amount_minor": 100, "currency": "GBP"},
                        subject="customer-1",
                        purpose="p",
                        wait_s=1.0,
                    )
                    for n in (1, 2)
                )
            )
        )

    results = asyncio.run(both())
    assert sorted(type(r).__name__ for r in results) == ["Refused", "Verified"]
    assert sorted(i.operation_id for i in publisher.intents) == ["refund:a1:v1", "refund:a2:v1"]


def test_wait_for_on_a_host_without_keys_stops_and_creates_none(tmp_path: Path) -> None:
    from producers.publisher import LedgerPublisher

    bare = LedgerSettings(run_dir=tmp_path / "svc", topic_prefix="t", kafka_port=1)
    pub = LedgerPublisher(bare)
    try:
        with pytest.raises(MissingKeyError):
            pub.wait_for(OP, {"OUTCOME_VERIFIED"}, timeout_s=1.0)
    finally:
        pub.producer.flush(0)
    assert not (tmp_path / "svc").exists()


# ----------------------------------------------------------------- the processor writes them


def test_the_processor_answers_every_intent_and_announces_settlements_in_the_same_batch(
    tmp_path: Path,
) -> None:
    from consumers.processor import Processor
    from consumers.stage import Record
    from ledger.contracts import PAYMENT_GATEWAY
    from ledger.credentials import stage_sealer
    from sinks.registry import SinkEndpoint, save_sinks
    from tests.unit.test_processor_verify import Captured

    settings = helpers.keyed(LedgerSettings(run_dir=tmp_path))
    save_sinks(
        settings.sinks_path(),
        {"payments": SinkEndpoint(url="http://payments.test", contract=PAYMENT_GATEWAY)},
    )
    processor = Processor(settings)
    good = helpers.intent(OP)
    typo = helpers.intent("refund:typo:v1", sink="paymnets")
    events = [good, typo, helpers.admission(good, admitted=False, reason="expired"), good]
    out = Captured()
    batches: list[list[str]] = []
    for n, event in enumerate(events):
        key = event.operation_id  # type: ignore[attr-defined]
        rec = Record("intents", 0, n, key, event.to_bytes(), event, timestamp_ms=1000 + n)
        before = len(out.written)
        processor.handle([rec], out)  # type: ignore[arg-type]
        processor.after_commit()
        batches.append([t for t, _, _ in out.written[before:]])
    told = [(k, e) for t, k, e in out.written if t == "outcomes"]
    assert [(k, e.kind, e.state, e.at_ms) for k, e in told] == [  # type: ignore[union-attr]
        (OP, "PENDING", "NOT_ADMITTED", 1000),
        ("refund:typo:v1", "REFUSED", None, 1001),
        (OP, "NEEDS_REAUTHORISATION", "NEEDS_REAUTHORISATION", 1002),
        (OP, "NEEDS_REAUTHORISATION", "NEEDS_REAUTHORISATION", 1003),  # the re-publish
    ]
    # Each outcome is written in the batch (transaction) of the decision it derives from.
    assert all(b.count("outcomes") == 1 and "journal" in b for b in batches), batches
    # ... and signed with the outcome key: the processor's only outcome sealer.
    sealer = stage_sealer(settings, "processor")("outcomes")
    assert sealer.key_id == outcome_key(settings).key_id and sealer.role == "outcome"
    with pytest.raises(Exception, match="only the processor"):
        stage_sealer(settings, "relay")("outcomes")


def test_a_publish_not_acknowledged_says_it_may_still_be_delivered() -> None:
    from ledger.errors import DeliveryUnknownError

    class Unacknowledged(FakePublisher):
        def publish_intent(self, intent: Any) -> Any:
            self.intents.append(intent)
            raise DeliveryUnknownError(
                "Intent 'refund:c1:v1' was not acknowledged within 30 s: it may still be "
                "delivered (this client keeps trying), so it has not failed; publish the same "
                "operation again to find out, which is always safe"
            )

    publisher, reader = Unacknowledged(), FakeReader([])
    service = LedgerService(LedgerSettings(), publisher=publisher, reader=reader)  # type: ignore[arg-type]
    with pytest.raises(DeliveryUnknownError, match="publish the same operation again") as caught:
        service.perform(
            operation_id=OP,
            sink="payments",
            action="refund",
            params={"account": "acct-1", "amount_minor": 100, "currency": "GBP"},
            subject="customer-1",
            purpose="p",
        )
    assert caught.value.retryable and reader.waits == []  # nothing was waited for


def test_a_wait_with_no_answer_to_anchor_on_skips_outcomes_below_its_floor(
    stage_host: LedgerSettings,
) -> None:
    """A wait started by time (``since``) reads a margin before the publish: a genuine
    final outcome of an earlier episode there is skipped under the caller's floor."""
    signer = outcome_key(stage_host)
    earlier = _signed(signer, _outcome(kind="ABANDONED", ref="intents:0:1", state_version=2))
    settled = _signed(
        signer,
        _outcome(kind="VERIFIED", ref="receipts:0:2", effect_id="pay-1", state_version=6),
    )
    unfloored = _watch(stage_host, [earlier, settled]).wait(2.0)
    assert unfloored.outcome is not None and unfloored.outcome.kind == "ABANDONED"
    found = _watch(stage_host, [earlier, settled]).wait(2.0, min_state_version=4)
    assert found.final and found.outcome is not None
    assert (found.outcome.kind, found.outcome.effect_id) == ("VERIFIED", "pay-1")
