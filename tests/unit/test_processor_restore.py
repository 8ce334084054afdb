"""The processor's restore when the latest state record of an operation is refused.

A record that no trusted writer sealed (or one that does not decode) and that
is the latest of its key on ``ledger.state`` displaces the operation's
authentic state; after compaction nothing authentic of it is left there. The
processor then rebuilds the operation from its journal entries instead of
forgetting it, so a re-published intent is a duplicate (no second admission
request, no second dispatch), not a new operation. Kafka is replaced by
records handed to the restore in offset order (the broker test is
``tests/integration/test_forged_state.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from consumers.processor import Processor
from consumers.stage import Record, decode_record
from ledger.events import (
    Event,
    Intent,
    JournalEntry,
    OperatingEvent,
    OperationState,
    decode_event,
)
from ledger.fold import decide, journal_entry
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from tests.helpers import admission, intent, keyed, readback, receipt, stage_seal

OP = "refund:c6:v1"  # its key names partition 1 of 3 (murmur2_random)
PARTITION = 1


@dataclass
class Msg:
    """The parts of a consumed Kafka message the restore reads."""

    topic: str
    key_bytes: bytes | None
    value_bytes: bytes | None
    at: int
    header_list: list[Any] = field(default_factory=list)

    def key(self) -> bytes | None:
        return self.key_bytes

    def value(self) -> bytes | None:
        return self.value_bytes

    def headers(self) -> list[Any]:
        return self.header_list

    def timestamp(self) -> tuple[int, int]:
        return (2, 0)  # the broker's append time (LogAppendTime), as sealed topics keep it

    def partition(self) -> int:
        return PARTITION

    def offset(self) -> int:
        return self.at

    def error(self) -> None:
        return None


class FakeTopics:
    """Stands in for the processor's ``reader`` and ``settle`` (the ledger topics it reads)."""

    def settle(self, *_: Any, **__: Any) -> float:
        """Nothing is ever open on these topics: no wait (seconds)."""
        return 0.0

    def __init__(self, settings: LedgerSettings) -> None:
        self.settings = settings
        self.logs: dict[str, list[Msg]] = {"state": [], "journal": []}
        self.reads: list[str] = []

    def append(self, topic: str, key: str, value: bytes | None, *, sealed: bool = True) -> Msg:
        headers = stage_seal(self.settings, topic, key, value) if sealed else []
        msg = Msg(topic, key.encode(), value, len(self.logs[topic]), headers)
        self.logs[topic].append(msg)
        return msg

    def read_partition(
        self,
        settings: LedgerSettings,
        topic: str,
        partitions: set[int] | None,
        handle: Callable[[Record | None, Any], None],
        timeout_s: float = 60.0,
        *,
        decode: bool = True,
        keyring: Any = None,
        on_refused: Callable[[Any, str], None] | None = None,
        **_: Any,
    ) -> int:
        # A whole topic, or its tail (the journal chain's head, read on every restore).
        self.reads.append(topic if _.get("tail") is None else f"{topic} tail")
        count = 0
        for msg in self.logs[topic]:
            rec = decode_record(topic, msg) if decode else None  # type: ignore[arg-type]
            if keyring is not None:
                problem = keyring.check(
                    topic, msg.key() or b"", msg.value(), msg.headers(), rec.event if rec else None
                )
                if problem is not None:
                    if on_refused is not None:
                        on_refused(msg, problem)
                    continue
            handle(rec, msg)
            count += 1
        return count


class Captured:
    """A writer that keeps what the processor writes."""

    observe = None  # no metrics

    def __init__(self) -> None:
        self.written: list[tuple[str, str, Event | bytes | None]] = []

    def write(self, topic: str, key: str, event: Event | None) -> None:
        self.written.append((topic, key, event))

    def write_raw(self, topic: str, key: str, value: bytes | None, **_: Any) -> None:
        self.written.append((topic, key, decode_event(value) if topic == "journal" else value))

    def on(self, topic: str) -> list[Event | bytes | None]:
        return [value for t, _, value in self.written if t == topic]


def _settled(topics: FakeTopics) -> tuple[Intent, list[OperationState]]:
    """Record a refund to OUTCOME_VERIFIED: sealed journal entries and state records."""
    i = intent(OP)
    state: OperationState | None = None
    states: list[OperationState] = []
    events: list[Event] = [i, admission(i), receipt(OP, f"{OP}#1.1")]
    for n in range(4):
        event = events[n]
        decision = decide(state, event, f"in:{PARTITION}:{n}")
        entry = journal_entry(decision, event, event.to_bytes(), "in", PARTITION, n)
        topics.append("journal", OP, entry.to_bytes())
        if decision.state is not None:
            state = decision.state
            states.append(state)
            topics.append("state", OP, state.to_bytes())
        if n == 2:  # the verification the receipt dispatched, read back as matching
            [verify] = [o.event for o in decision.outputs if o.topic == "dispatches"]
            events.append(readback(OP, verify.dispatch_id, "MATCH", kind="POSTCONDITION"))  # type: ignore[attr-defined]
    assert states[-1].state == S.OUTCOME_VERIFIED, states[-1]
    return i, states


def _forged(states: list[OperationState]) -> bytes:
    """What an attacker without a key writes under the key: an in-flight state."""
    return (
        states[-1]
        .model_copy(update={"state": S.ADMITTED, "version": states[-1].version + 1})
        .to_bytes()
    )


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[Processor, FakeTopics]:
    settings = keyed(LedgerSettings(run_dir=tmp_path))
    topics = FakeTopics(settings)
    return Processor(settings, reader=topics.read_partition, settle=topics.settle), topics


def _intent_record(i: Intent, offset: int = 7) -> Record:
    return Record("intents", PARTITION, offset, OP, i.to_bytes(), i)


def _rebuilt_events(processor: Processor) -> list[OperatingEvent]:
    return [e for _, e in processor.notes if e.kind == "STATE_REBUILT"]


def test_a_compacted_away_state_is_rebuilt_from_the_journal(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    processor, topics = ledger
    i, states = _settled(topics)
    forged = topics.append("state", OP, _forged(states), sealed=False)
    topics.logs["state"] = [forged]  # compaction kept only the latest record of the key

    processor.on_assign({PARTITION})

    assert processor.current(OP) == states[-1]
    assert topics.reads == ["state", "journal", "journal tail"]
    [event] = _rebuilt_events(processor)
    assert (event.source_topic, event.source_partition, event.source_offset) == (
        "state",
        PARTITION,
        forged.at,
    )
    assert event.operation_id == OP
    assert f"at state:{PARTITION}:{forged.at}, displaced" in event.reason
    assert "no earlier authentic state record" in event.reason
    assert "OUTCOME_VERIFIED" in event.reason and "4 journal entries" in event.reason
    assert [e.kind for _, e in processor.notes].count("UNAUTHENTICATED") == 1
    assert processor.resume_queue == []  # settled: nothing to claim

    # The same intent again is a duplicate: no admission request, no dispatch;
    # the rebuilt state is written again (sealed by the writer) before it.
    out = Captured()
    processor.handle([_intent_record(i)], out)  # type: ignore[arg-type]
    assert out.on("admission-requests") == [] and out.on("dispatches") == []
    assert out.on("state") == [states[-1].to_bytes()]
    [entry] = out.on("journal")
    assert isinstance(entry, JournalEntry) and entry.outcome == "NOOP"
    assert "duplicate intent" in entry.reason
    kinds = [e.kind for e in out.on("operating-events") if isinstance(e, OperatingEvent)]
    assert "STATE_REBUILT" in kinds and "UNAUTHENTICATED" in kinds
    processor.after_commit()
    again = Captured()
    processor.handle([_intent_record(i, offset=8)], again)  # type: ignore[arg-type]
    assert again.on("state") == []  # written once


def test_an_aborted_transaction_writes_the_rebuilt_state_again(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    processor, topics = ledger
    i, states = _settled(topics)
    topics.logs["state"] = [topics.append("state", OP, _forged(states), sealed=False)]
    processor.on_assign({PARTITION})
    processor.handle([_intent_record(i)], Captured())  # type: ignore[arg-type]
    processor.rebuild()  # the transaction aborted
    retry = Captured()
    processor.handle([_intent_record(i)], retry)  # type: ignore[arg-type]
    assert retry.on("state") == [states[-1].to_bytes()]


def test_a_revoked_partition_drops_the_rebuilt_state(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    processor, topics = ledger
    _, states = _settled(topics)
    topics.logs["state"] = [topics.append("state", OP, _forged(states), sealed=False)]
    processor.on_assign({PARTITION})
    processor.on_revoke({PARTITION})
    assert processor.reasserts.committed == {} and processor.current(OP) is None


def test_a_refused_latest_record_over_authentic_ones_is_checked_against_the_journal(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    """Not compacted yet: the journal's state wins, and the event says what was read before."""
    processor, topics = ledger
    _, states = _settled(topics)
    topics.append("state", OP, b"\x00not a state")  # sealed, but does not decode
    processor.on_assign({PARTITION})
    assert processor.current(OP) == states[-1]
    [event] = _rebuilt_events(processor)
    assert "does not decode" in event.reason
    assert f"last authentic state record says OUTCOME_VERIFIED v{states[-1].version}" in (
        event.reason
    )
    assert [e.kind for _, e in processor.notes].count("BAD_INPUT") == 1


def test_an_authentic_latest_record_reads_no_journal(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    processor, topics = ledger
    _, states = _settled(topics)
    forged = topics.append("state", OP, _forged(states), sealed=False)
    topics.logs["state"].remove(forged)
    topics.logs["state"].insert(len(topics.logs["state"]) - 1, forged)  # then the real latest
    processor.on_assign({PARTITION})
    assert topics.reads == ["state", "journal tail"]
    assert processor.current(OP) == states[-1]
    assert _rebuilt_events(processor) == [] and processor.reasserts.committed == {}


def test_a_forged_state_with_no_journal_behind_it_restores_nothing(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    processor, topics = ledger
    _, states = _settled(topics)
    topics.logs["journal"] = []
    topics.logs["state"] = [topics.append("state", OP, _forged(states), sealed=False)]
    processor.on_assign({PARTITION})
    assert processor.current(OP) is None
    assert _rebuilt_events(processor) == []
    assert [e.kind for _, e in processor.notes] == ["UNAUTHENTICATED"]


def test_unauthentic_journal_entries_are_not_replayed(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    """An attacker's journal entry cannot shape the rebuilt state either."""
    processor, topics = ledger
    _, states = _settled(topics)
    sealed = list(topics.logs["journal"])
    topics.logs["journal"] = [
        *sealed[:2],
        *(topics.append("journal", OP, m.value_bytes, sealed=False) for m in sealed[2:]),
    ]
    topics.logs["state"] = [topics.append("state", OP, _forged(states), sealed=False)]
    processor.on_assign({PARTITION})
    rebuilt = processor.current(OP)
    assert rebuilt is not None and rebuilt.state == S.EFFECT_PENDING
    assert rebuilt == states[1]


def test_a_settled_operation_is_never_sent_to_the_kernel_again(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    """Why the kernel's redelivery rule cannot readmit a settled operation's consumed
    approval: the processor that knows the operation (rebuilt or restored) asks for no
    admission, and an admission that arrives anyway (a forged or late one) is ignored."""
    _, topics = ledger
    i, states = _settled(topics)
    verified = states[-1]
    again = decide(verified, i, "intents:1:99")
    assert again.outcome == "NOOP" and again.outputs == ()
    late = decide(verified, admission(i), "admissions:1:99")
    assert late.outcome != "APPLIED"
    assert not [o for o in late.outputs if o.topic in ("dispatches", "admission-requests")]


def test_an_older_authentic_state_appended_again_does_not_take_the_operation_back(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    """Issue 26: a genuine earlier state record copied to the end of ``ledger.state``."""
    processor, topics = ledger
    _, states = _settled(topics)
    old = states[1]  # EFFECT_PENDING, sealed by the processor when it was written
    assert old.state == S.EFFECT_PENDING
    copy = topics.append("state", OP, old.to_bytes())  # the same bytes and seal, later

    processor.on_assign({PARTITION})

    assert processor.current(OP) == states[-1]  # the highest version stands
    assert processor.resume_queue == []  # settled: nothing to claim, nothing re-sent
    assert topics.reads == ["state", "journal tail"] and processor.reasserts.committed == {}
    [event] = [e for _, e in processor.notes if e.kind == "REPLAYED"]
    assert (event.source_topic, event.source_offset, event.operation_id) == ("state", copy.at, OP)
    assert f"at version {old.version} (EFFECT_PENDING)" in event.reason
    assert f"older than version {states[-1].version}" in event.reason


def test_a_state_sealed_by_a_key_not_held_here_is_held_never_rebuilt_over(
    ledger: tuple[Processor, FakeTopics],
) -> None:
    """It may be the operation's newest authentic state (a lost key): rebuilding an older
    state from the journal and writing it again would read that evidence as absent, and
    the next restore would hold nothing (attacker trial)."""
    from ledger.authn import AUTH_HEADER, MacKey, seal_headers

    processor, topics = ledger
    _, states = _settled(topics)
    newer = states[-1].model_copy(update={"version": states[-1].version + 1}).to_bytes()
    lost = MacKey(b"l" * 32, ledger_id=topics.settings.ledger_identity)
    headers = seal_headers(lost, "state", OP.encode(), newer) or []
    assert headers[0][0] == AUTH_HEADER
    msg = Msg("state", OP.encode(), newer, len(topics.logs["state"]), headers)
    topics.logs["state"].append(msg)
    for _ in range(2):  # and again at the next restore: nothing was written over it
        processor.on_assign({PARTITION})
        assert OP in processor.unverifiable_held()
        assert "sealed by unknown key" in processor.unverifiable_held()[OP]
        assert processor.reasserts.committed == {} and _rebuilt_events(processor) == []
        assert [e.kind for _, e in processor.notes][-1] == "UNVERIFIABLE"
        processor.on_revoke({PARTITION})
