"""The bad-input corpus (issue 11 item 10) on one real ledger.

One ledger (processor, authority kernel, relay, a reference payment gateway
and an unsafe sink) records a few operations first: three verified ones and
one held in UNKNOWN_OUTCOME at the unsafe sink. Then every case of
:mod:`tests.corpus` is written (bad bytes on every input topic, unsealed
records, odd operation IDs and params, forged records of every kind), a
good intent per partition is published after them, and the ledger is waited
on once. Each case is then checked on its own (the test ID names it): the
operating event of the expected kind about that exact record, by the stage
that reads it, and the case's operation where it has one. Ledger-wide checks
follow: no stage died, every partition kept moving, nothing recorded before
was lost, and the audit is clean and lists exactly the unauthenticated
records written.

Corrupted local files are checked in-process with click's ``CliRunner``:
each command that reads one exits non-zero with an error naming the file,
never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from consumers.auditor import DECODE_ALL, LATEST, run_audit
from consumers.reader import current_states, read_latest, read_topic
from ledger import topics
from ledger.audit import AuditReport
from ledger.authn import ROLE_OPERATOR, STAGE_KEY_ROLES, SigningKey
from ledger.cli import main as cli
from ledger.contracts import PAYMENT_GATEWAY, UNSAFE_SINK
from ledger.credentials import add_person, provision_keys
from ledger.errors import LedgerError
from ledger.events import (
    AdmissionRequest,
    ApprovalUse,
    CompensationTally,
    Dispatch,
    Disposition,
    Event,
    Intent,
    OperatingEvent,
    OperationState,
    PolicyChange,
    decode_event,
)
from ledger.kafka import client_config
from ledger.settings import LedgerSettings
from ledger.topology import TOPIC_BY_NAME
from producers.publisher import LedgerPublisher
from testbed import broker
from testbed.forge import forge
from testbed.harness import Harness
from tests import corpus, helpers
from tests.conftest import LOCAL_KAFKA_HOME
from tests.corpus import Case
from tests.integration.test_stages import REVIEWER, approve

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CASES = corpus.kafka_cases()
OPERATOR = "ops-corpus"
#: Good intents published after all the bad input (enough to cover every partition).
GOOD = [f"corpus:good:{i}" for i in range(9)]


def good_approval(op: str) -> str:
    """The approval of a good intent (these names cover every partition of admission-requests)."""
    return "ap-good-" + op.rsplit(":", 1)[1]


BASE = [f"corpus:base:{i}" for i in (1, 2, 3)]
HELD = "corpus:held"
PARAMS = {"account": "acct-1", "amount_minor": 100, "currency": "GBP"}


@dataclass(frozen=True)
class Written:
    """Where one case's record landed (``error``: the broker refused it)."""

    topic: str
    partition: int
    offset: int
    sealed: bool
    decodes: bool
    tombstone: bool
    error: str | None = None


@dataclass
class Observed:
    """What the ledger did, read once after it went quiet."""

    written: dict[str, Written]
    #: (source_topic, partition, offset) -> [(kind, component, reason)]
    by_position: dict[tuple[str, int, int], list[tuple[str, str, str]]]
    #: operation_id -> [(kind, component, reason)]
    by_operation: dict[str, list[tuple[str, str, str]]]
    states: dict[str, OperationState]
    effects: dict[str, int]
    before: dict[str, tuple[str, int]]
    base_before_restart: dict[str, tuple[str, int]]
    failed: dict[str, int]
    alive: dict[str, bool]
    audit: AuditReport
    partitions: dict[str, set[int]] = field(default_factory=dict)
    log_tail: str = ""


# ---------------------------------------------------------------------- building records


def intent_of(op: str, params: Any, approval: str | None) -> Intent:
    """A well-formed intent for ``params`` (a dict), or one whose params_json is ``params``
    as is (a string) with a digest that matches nothing."""
    if isinstance(params, str):
        return helpers.intent(op, amount=100, approval=approval).model_copy(
            update={"params_json": params, "parameter_digest": "0" * 64}
        )
    extra = dict(params)
    amount = extra.pop("amount_minor")
    return helpers.intent(op, amount=amount, approval=approval, **extra)


def valid_record(topic: str, op: str, ctx: Ledger) -> Event:
    """A well-formed record of the kind ``topic`` holds, about ``op`` (or approval ``op``)."""
    i = helpers.intent(op, approval=f"ap-none-{op}")
    records: dict[str, Event] = {
        "intents": i,
        "admissions": helpers.admission(i),
        "receipts": helpers.receipt(op, f"{op}#1"),
        "readbacks": helpers.readback(op, f"{op}#1"),
        "claims": helpers.claim(op, "corpus-worker", 1),
        "dispositions": Disposition(
            disposition_id=f"disposition:{op}",
            operation_id=op,
            decision="ABSENT",
            by=OPERATOR,
            evidence="corpus",
            disposed_at_ms=0,
        ),
        "admission-requests": AdmissionRequest(
            operation_id=op,
            approval_id=op,
            parameter_digest="0" * 64,
            subject="customer-1",
            amount_minor=1,
            state_version=1,
        ),
        "approvals": REVIEWER.sign(
            helpers.approval(approval_id=op), ledger_id=ctx.settings.ledger_identity
        ),
        "approval-uses": ApprovalUse(
            approval_id=op,
            operation_id=op,
            parameter_digest="0" * 64,
            consumed_at_ms=0,
            decided_by="authority-0",
        ),
        "policy": PolicyChange(version=1, set_by=OPERATOR, effective_at_ms=0),
        # A real dispatch (an authentic outbox record the audit can account for).
        "dispatches": ctx.base_dispatch,
        # The record a forger would want: a grant of a compensation's claim.
        "compensation-tally": CompensationTally(
            tally_id=f"tally:{op}",
            operation_id=op,
            kind="GRANTED",
            original="refund:corpus-original:v1",
            compensation=op,
            request_state_version=1,
        ),
    }
    return records[topic]


def wrong_type(topic: str, case_id: str, ctx: Ledger) -> tuple[str, Event]:
    """``(key, event)``: a valid record of another type, keyed where it would be read.

    On the processor's topics it is keyed by a verified operation, so the
    fold sees it (and must refuse it without changing the operation).
    """
    if corpus.STAGE_INPUTS[topic] == "processor":
        op = BASE[list(corpus.STAGE_INPUTS).index(topic) % len(BASE)]
        return op, ctx.base_dispatch.model_copy(update={"operation_id": op})
    key = f"corpus:{case_id}"
    if topic == "dispatches":
        return key, helpers.readback(key, f"{key}#1")
    return key, ctx.base_dispatch.model_copy(update={"operation_id": key})


def malformed(case: Case, ctx: Ledger) -> tuple[bytes | None, bytes | None]:
    """``(key, value)`` of a malformed case."""
    key = f"corpus:{case.id}"
    v = case.variant
    if v == "empty":
        return key.encode(), b""
    if v == "random":
        return key.encode(), corpus.garbage(case.id)
    if v == "truncated":
        raw = valid_record(case.topic, key, ctx).to_bytes()
        return key.encode(), raw[: len(raw) // 2]
    if v == "fingerprint":
        return key.encode(), corpus.unknown_fingerprint(case.id)
    if v == "wrong-type":
        k, event = wrong_type(case.topic, case.id, ctx)
        return k.encode(), event.to_bytes()
    if v == "value-over":
        return key.encode(), corpus.over_value()
    if v == "key-over":
        return corpus.over_key(case.id), valid_record(case.topic, key, ctx).to_bytes()
    if v == "no-key":
        return b"", valid_record(case.topic, key, ctx).to_bytes()
    if v == "tombstone":
        return key.encode(), None
    raise AssertionError(v)


# ---------------------------------------------------------------------- the ledger


class Ledger:
    """The one ledger every case is written to."""

    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings
        self.harness = Harness(settings, create=False)
        self.pub = LedgerPublisher(settings)
        self.raw = Producer(
            client_config(settings, partitioner="murmur2_random", **{"linger.ms": 5})
        )
        key, _ = add_person(settings, ROLE_OPERATOR, OPERATOR)
        self.operator = SigningKey(key.key_id, key.private, ROLE_OPERATOR, settings.ledger_identity)
        self.base_dispatch: Dispatch
        self.written: dict[str, Written] = {}

    def seal(self, topic: str, key: bytes, value: bytes | None) -> list[Any] | None:
        """Headers a real writer of ``topic`` would put on this record."""
        if topic == "intents":
            return None
        if {"authority", *STAGE_KEY_ROLES} & set(TOPIC_BY_NAME[topic].auth):
            return helpers.stage_seal(self.settings, topic, key.decode("utf-8", "replace"), value)
        from ledger.authn import AUTH_HEADER

        return [(AUTH_HEADER, self.operator.seal(topic, key, value))]

    def write(
        self, case_id: str, topic: str, key: bytes | None, value: bytes | None, sealed: bool
    ) -> None:
        """Produce one record; its position is recorded under ``case_id`` on delivery."""
        headers = self.seal(topic, key or b"", value) if sealed else None
        try:
            decode_event(value)
            decodes = True
        except Exception:
            decodes = False

        def delivered(err: KafkaError | None, msg: Message) -> None:
            self.written[case_id] = Written(
                topic,
                msg.partition() or 0,
                msg.offset() or 0,
                sealed,
                decodes,
                value is None,
                None if err is None else str(err),
            )

        self.raw.produce(
            self.settings.topic(topic), key=key, value=value, headers=headers, on_delivery=delivered
        )
        self.raw.poll(0)

    def flush(self) -> None:
        """Wait for every delivery report."""
        assert self.raw.flush(60) == 0

    def publish(self, op: str, approval: str, sink: str = "payments") -> None:
        """Publish a good intent through the publisher."""
        self.pub.publish(
            operation_id=op,
            sink=sink,
            action="refund",
            params=PARAMS,
            actor="svc",
            subject="customer-1",
            purpose="fee-remediation",
            decision_version=1,
            approval_id=approval,
        )


def _settings(kafka_bootstrap: str, base: Path) -> LedgerSettings:
    settings = LedgerSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:12]}",
        partitions=3,
        run_dir=base / "run",
        clock="manual",
        kafka_home=LOCAL_KAFKA_HOME,
    )
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    topics.create_topics(settings)
    return settings


def _drop_topics(settings: LedgerSettings) -> None:
    with contextlib.suppress(Exception):  # cleanup must not fail the test
        _drop(settings)


def _drop(settings: LedgerSettings) -> None:
    admin = AdminClient(
        {"bootstrap.servers": settings.bootstrap_servers}, logger=broker.CLIENT_LOGGER
    )
    doomed = [
        n for n in admin.list_topics(timeout=10).topics if n.startswith(settings.topic_prefix + ".")
    ]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            with contextlib.suppress(Exception):  # cleanup must not fail the test
                future.result(timeout=30)


def _snapshot(states: dict[str, OperationState], ops: list[str]) -> dict[str, tuple[str, int]]:
    return {op: (str(states[op].state), states[op].version) for op in ops if op in states}


def _inject(ctx: Ledger) -> None:
    """Write every case (forged ones through testbed.forge)."""
    s = ctx.settings
    for case in CASES:
        if case.kind == "malformed":
            key, value = malformed(case, ctx)
            ctx.write(case.id, case.topic, key, value, case.sealed == "writer")
        elif case.kind == "unsealed":
            op = f"corpus:{case.id}"
            event = valid_record(case.topic, op, ctx)
            if case.topic == "approvals":
                event = event.model_copy(update={"signature": None, "key_id": None})
            elif case.topic == "dispatches":
                event = event.model_copy(update={"operation_id": op, "dispatch_id": f"{op}#1"})
            ctx.write(case.id, case.topic, op.encode(), event.to_bytes(), False)
        elif case.kind == "odd-id":
            op = str(case.extra["operation_id"])
            raw = helpers.intent(op, approval="ap-none").to_bytes()
            ctx.write(case.id, "intents", op.encode("utf-8", "surrogatepass"), raw, False)
        elif case.kind == "odd-params":
            assert case.operation is not None
            approval = f"ap-{case.operation}"
            approve(ctx.pub, approval, max_amount=9000)
            intent = intent_of(case.operation, case.extra["params"], approval)
            if "digest" in case.extra:
                intent = intent.model_copy(update={"parameter_digest": case.extra["digest"]})
            ctx.write(case.id, "intents", case.operation.encode(), intent.to_bytes(), False)
    ctx.flush()
    now = ctx.harness.clock.now_ms()
    targets: dict[str, dict[str, str]] = {
        "held": {"operation_id": HELD},
        "unapproved": {"operation_id": "corpus:unapproved"},
        "consumed": {"approval_id": "ap-base-1"},
        "good": {},
        "policy": {},
        "base": {},
    }
    for case in CASES:
        if case.kind != "forged" or case.variant == "state" or case.topic == "state":
            continue
        target = str(case.extra["target"])
        args: dict[str, Any] = dict(targets[target])
        if target == "base":
            args = {"operation_id": case.operation}
        if target == "good":
            assert case.operation is not None
            args = {"approval_id": good_approval(case.operation)}
        if target == "consumed" and case.variant == "approval_use":
            args["operation_id"] = case.operation
        if case.variant == "tombstone":
            args["topic"] = case.topic
            if case.topic == "policy":
                args = {"topic": "policy"}
        forged = forge(s, case.variant, now_ms=now, **args)
        assert forged.topic == case.topic, (case.id, forged)
        ctx.written[case.id] = Written(
            forged.topic, forged.partition, forged.offset, False, True, case.variant == "tombstone"
        )


@pytest.fixture(scope="module")
def observed(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    """Run the ledger once: record, inject every case, publish good intents, observe."""
    settings = _settings(kafka_bootstrap, tmp_path_factory.mktemp("corpus"))
    ctx = Ledger(settings)
    h = ctx.harness
    try:
        h.start_sink("payments", PAYMENT_GATEWAY, hang_s=1.0)
        h.start_sink("unsafe", UNSAFE_SINK, hang_s=1.0)
        # 1. Operations recorded before any bad input.
        for n, op in enumerate(BASE, start=1):
            approve(ctx.pub, f"ap-base-{n}")
            ctx.publish(op, f"ap-base-{n}")
        approve(ctx.pub, "ap-held")
        h.arm("after_sink_commit_before_receipt", HELD)
        ctx.publish(HELD, "ap-held", sink="unsafe")
        h.start_all()
        h.wait_quiescent(120)
        h.restart()  # the relay died after the unsafe sink's effect: the outcome is unknown
        h.wait_quiescent(120)
        states = current_states(settings)
        base_before = _snapshot(states, BASE)
        assert {v[0] for v in base_before.values()} == {"OUTCOME_VERIFIED"}, base_before
        assert states[HELD].state == "UNKNOWN_OUTCOME", states[HELD]
        dispatch = read_latest(settings, "dispatches")[BASE[0]].event
        assert isinstance(dispatch, Dispatch)
        ctx.base_dispatch = dispatch

        # 2. Forged state records are read by a processor that restarts.
        for case in CASES:
            if case.kind == "forged" and case.topic == "state":
                args: dict[str, Any] = {"operation_id": case.operation}
                if case.variant == "tombstone":
                    args["topic"] = "state"
                f = forge(settings, case.variant, **args)
                ctx.written[case.id] = Written(
                    f.topic, f.partition, f.offset, False, True, case.variant == "tombstone"
                )
        h.kill("processor")
        h.restart("processor")
        h.wait_quiescent(120)
        before = _snapshot(current_states(settings), [*BASE, HELD])

        # 3. Every other case, then the intents that must still go through.
        for op in GOOD:
            approve(ctx.pub, good_approval(op))
        ctx.publish("corpus:unapproved", "ap-missing")
        _inject(ctx)
        ctx.publish("corpus:second", "ap-base-1")
        for op in GOOD:
            ctx.publish(op, good_approval(op))
        h.wait_quiescent(240)
        yield _observe(ctx, before, base_before)
    finally:
        ctx.pub.close()
        h.stop()
        _drop_topics(settings)


def _events(settings: LedgerSettings) -> list[OperatingEvent]:
    return [
        r.event
        for r in read_topic(settings, "operating-events")
        if isinstance(r.event, OperatingEvent)
    ]


def _expected_positions(written: dict[str, Written]) -> set[tuple[str, int, int]]:
    return {
        (w.topic, w.partition, w.offset)
        for case in CASES
        if case.expect is not None
        and case.match == "position"
        and (w := written.get(case.id)) is not None
        and w.error is None
    }


def _observe(
    ctx: Ledger, before: dict[str, tuple[str, int]], base_before: dict[str, tuple[str, int]]
) -> Observed:
    settings, h = ctx.settings, ctx.harness
    # The authority kernel reports table records when it catches its tables up
    # (about once a second, after the harness saw its inputs done): wait,
    # bounded, until every expected position has an event.
    wanted = _expected_positions(ctx.written)
    deadline = time.monotonic() + 60
    while True:
        events = _events(settings)
        seen = {(e.source_topic, e.source_partition, e.source_offset) for e in events}
        if wanted <= seen or time.monotonic() > deadline:
            break
        h.wait_quiescent(60)
    by_position: dict[tuple[str, int, int], list[tuple[str, str, str]]] = {}
    by_operation: dict[str, list[tuple[str, str, str]]] = {}
    for e in events:
        item = (e.kind, e.component, e.reason)
        if e.source_topic is not None:
            by_position.setdefault(
                (e.source_topic, e.source_partition or 0, e.source_offset or 0), []
            ).append(item)
        if e.operation_id:
            by_operation.setdefault(e.operation_id, []).append(item)
    states = current_states(settings)
    effects = {}
    for op, st in states.items():
        if op.startswith("corpus:") and st.sink in h.sinks:
            effects[op] = h.effects(st.sink, op)
    partitions: dict[str, set[int]] = {"intents": set(), "admission-requests": set()}
    latest_intents = read_latest(settings, "intents")
    for op in GOOD:
        partitions["intents"].add(latest_intents[op].partition)
    requests = [
        r
        for r in read_topic(settings, "admission-requests")
        if isinstance(r.event, AdmissionRequest)
    ]
    partitions["admission-requests"] = {
        r.partition for r in requests if r.event.operation_id in GOOD
    }
    return Observed(
        written=dict(ctx.written),
        by_position=by_position,
        by_operation=by_operation,
        states=states,
        effects=effects,
        before=before,
        base_before_restart=base_before,
        failed=h.failed(),
        alive={c: h.alive(c) for c in ("processor", "authority", "relay")},
        audit=run_audit(settings),
        partitions=partitions,
        log_tail=h.log_tail(15),
    )


# ---------------------------------------------------------------------- per case


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(observed: Observed, case: Case) -> None:
    """The expected operating event about the exact record, and the operation's outcome."""
    written = observed.written.get(case.id)
    assert written is not None, f"{case.id}: never written"
    assert written.error is None, f"{case.id}: the broker refused it: {written.error}"
    where = (written.topic, written.partition, written.offset)
    if case.expect is not None:
        if case.match == "position":
            events = observed.by_position.get(where, [])
        else:
            assert case.operation is not None
            events = observed.by_operation.get(case.operation, [])
        kinds = [(kind, component) for kind, component, _ in events]
        assert (case.expect, case.stage) in kinds, (
            f"{case.id} ({case.writes}) at {where}: expected {case.expect} by {case.stage}, "
            f"got {events}"
        )
        reasons = [r for k, c, r in events if (k, c) == (case.expect, case.stage)]
        assert all(reasons), events
    if case.operation is not None and case.outcome is not None:
        state = observed.states.get(case.operation)
        assert state is not None, f"{case.id}: {case.operation} has no state"
        assert state.state == case.outcome, (case.id, state.state, state.reason)
        assert str(case.extra.get("reason", "")) in (state.reason or ""), (case.id, state.reason)
        if case.operation in observed.before:
            assert (str(state.state), state.version) == observed.before[case.operation], case.id
    if case.operation is not None and case.effects is not None:
        assert observed.effects.get(case.operation, 0) == case.effects, (case.id, observed.effects)


# ---------------------------------------------------------------------- the ledger as a whole


def test_no_stage_died(observed: Observed) -> None:
    assert observed.failed == {}, observed.log_tail
    assert all(observed.alive.values()), (observed.alive, observed.log_tail)


def test_every_partition_keeps_moving(observed: Observed) -> None:
    """Good intents published after all the bad input verify (one effect each), every partition."""
    for op in GOOD:
        state = observed.states.get(op)
        assert state is not None and state.state == "OUTCOME_VERIFIED", (op, state)
        assert observed.effects.get(op) == 1, (op, observed.effects.get(op))
    assert observed.partitions["intents"] == {0, 1, 2}, observed.partitions
    assert observed.partitions["admission-requests"] == {0, 1, 2}, observed.partitions


def test_nothing_recorded_is_lost(observed: Observed) -> None:
    """Operations recorded before the bad input keep their state and version."""
    assert set(observed.before) == {*BASE, HELD}
    now = _snapshot(observed.states, [*BASE, HELD])
    assert now == observed.before
    assert {op: observed.before[op] for op in BASE} == observed.base_before_restart
    assert all(observed.effects.get(op) == 1 for op in [*BASE, HELD]), observed.effects


def _audit_expectation(w: Written) -> str | None:
    """What the auditor must say of one written record (its documented rules).

    An audited, sealed topic's record that no trusted writer sealed is
    listed as unauthenticated, unless the auditor decodes the topic's every
    record (or the latest per key) and it does not decode: then it is listed
    as undecodable (a stage refused it, so it is not a violation).
    """
    spec = TOPIC_BY_NAME[w.topic]
    if not spec.audited or not spec.auth:
        return None
    if not w.tombstone and not w.decodes and w.topic in DECODE_ALL:
        return "undecodable"
    if not w.sealed:
        return "unauthenticated"
    if not w.tombstone and not w.decodes and w.topic in LATEST:
        return "undecodable"
    return None


def test_audit_is_clean_and_lists_exactly_the_unauthenticated_records(observed: Observed) -> None:
    """A clean audit: no violation. ``unauthenticated_records`` are exactly the unsealed and
    forged records on audited topics, and ``undecodable_records`` exactly the undecodable
    ones the auditor reads, each refused by a stage as a dead letter (so handled, not a
    violation)."""
    expected = {cid: _audit_expectation(w) for cid, w in observed.written.items()}
    assert observed.audit.violations == []
    undecodable = {
        (r["topic"], r["partition"], r["offset"]) for r in observed.audit.undecodable_records
    }
    assert undecodable == {
        (w.topic, w.partition, w.offset)
        for cid, w in observed.written.items()
        if expected[cid] == "undecodable"
    }
    listed = {
        (r["topic"], r["partition"], r["offset"]) for r in observed.audit.unauthenticated_records
    }
    assert listed == {
        (w.topic, w.partition, w.offset)
        for cid, w in observed.written.items()
        if expected[cid] == "unauthenticated"
    }


# ---------------------------------------------------------------------- odd IDs, publisher side


@pytest.mark.parametrize("name", list(corpus.ODD_IDS))
def test_publisher_refuses_odd_ids(name: str, tmp_path: Path) -> None:
    """The publisher refuses the same IDs before anything reaches Kafka."""
    settings = LedgerSettings(bootstrap_servers="127.0.0.1:1", run_dir=tmp_path)
    pub = LedgerPublisher(settings)
    try:
        with pytest.raises(LedgerError):
            pub.publish(
                operation_id=corpus.ODD_IDS[name],
                sink="payments",
                action="refund",
                params=PARAMS,
                actor="svc",
                subject="customer-1",
                purpose="fee-remediation",
                decision_version=1,
                approval_id="ap-1",
            )
    finally:
        pub.close()


# ---------------------------------------------------------------------- local files


@dataclass(frozen=True)
class FileCase:
    """A corrupted local file and the command that reads it.

    Attributes:
        id: the case's name.
        path: the file, relative to the run folder.
        content: what it is corrupted to.
        args: the ``ledger`` command that reads it.
    """

    id: str
    path: str
    content: bytes
    args: tuple[str, ...]


_PUBLISH = (
    "intent", "publish", "--operation-id", "refund:files:v1", "--sink", "payments",
    "--action", "refund", "--params", json.dumps(PARAMS), "--actor", "svc",
    "--subject", "customer-1", "--purpose", "p", "--decision-version", "1", "--wait-s", "0",
)  # fmt: skip
_APPROVE = (
    "approve", "--approval-id", "ap-files", "--reviewer", "rev-files",
    "--subject", "customer-1", "--max-amount-minor", "1", "--operation-id", "refund:1:v1",
    "--open", "account", "--open", "action", "--open", "sink", "--open", "currency",
)  # fmt: skip
_CORRUPTIONS = {"garbage": b"\x00\xff{not json", "empty": b"", "wrong-shape": b'["a", 1]'}

FILE_CASES = [
    FileCase(f"{name}-{how}", path, content, args)
    for name, path, args in (
        ("sinks", "sinks.json", _PUBLISH),
        ("trusted-keys", "trusted_keys.json", ("keys", "show")),
        ("clock", "clock", ("clock", "show")),
        ("deployment-key", "keys/deployment.key", ("keys", "show")),
        ("stage-keys", "keys/stage-keys.json", ("keys", "show")),
        ("authority-key", "keys/authority.key", ("keys", "init")),
        ("authority-pub", "keys/authority.pub", ("keys", "show")),
        ("reviewer-key", "reviewers/rev-files.key", _APPROVE),
    )
    for how, content in _CORRUPTIONS.items()
    # An empty clock file reads as 0 by design (ManualClock.now_ms: ``int(text or "0")``).
    if (name, how) != ("clock", "empty")
]


@pytest.fixture(scope="module")
def file_ledger(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LedgerSettings]:
    """A ledger with topics (commands that publish check them first); files in its run folder."""
    settings = _settings(kafka_bootstrap, tmp_path_factory.mktemp("files"))
    try:
        yield settings
    finally:
        _drop_topics(settings)


@pytest.mark.parametrize("case", FILE_CASES, ids=[c.id for c in FILE_CASES])
def test_corrupted_local_file(case: FileCase, file_ledger: LedgerSettings, tmp_path: Path) -> None:
    """The command exits non-zero with an error naming the file, and no traceback."""
    settings = file_ledger.model_copy(update={"run_dir": tmp_path})
    provision_keys(settings)
    add_person(settings, "reviewer", "rev-files")
    (tmp_path / "clock").write_text("0")
    (tmp_path / "sinks.json").write_text("{}")
    path = tmp_path / case.path
    path.write_bytes(case.content)
    env = {
        "LEDGER_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "LEDGER_TOPIC_PREFIX": settings.topic_prefix,
        "LEDGER_RUN_DIR": str(tmp_path),
        "LEDGER_CLOCK": "manual",
        "LEDGER_PARTITIONS": "3",
    }
    result = CliRunner().invoke(cli, list(case.args), env=env)
    out = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code != 0, out
    assert "Traceback" not in out, out
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert str(path) in out or path.name in out, out
