"""The journal's hash chain: the chain function, the processor's keeper, the verifier
(every kind of tampering), the heads and their file witness, and repeats by reference."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from consumers.heads import FileWitness, HeadsPublisher, read_witness_file
from consumers.journal_chain import JournalChain, read_heads
from ledger.audit.chain import Link, PartitionRead, WitnessedHead, verify_chains
from ledger.audit.report import AuditReport
from ledger.chain import ChainHead, entry_hash, genesis
from ledger.cli.audit import audit_lines
from ledger.credentials import load_keyring, stage_sealer
from ledger.events import Event, JournalEntry, decode_event
from ledger.fold import (
    decide,
    drifts,
    journal_entry,
    keeps_intent,
    ref_of,
    repeats,
    replay_decisions,
)
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from tests.helpers import admission, intent, keyed

LEDGER = "ledger-a"


class Out:
    """A writer that keeps the raw records written and acknowledges them at given offsets."""

    observe = None

    def __init__(self) -> None:
        self.records: list[tuple[str, str, bytes, int | None]] = []
        self.acks: list[tuple[Any, bytes, bytes, int]] = []

    def write_raw(
        self,
        topic: str,
        key: str,
        value: bytes | None,
        on_delivery: Any = None,
        partition: int | None = None,
    ) -> None:
        self.records.append((topic, key, value or b"", partition))
        if on_delivery is not None:
            self.acks.append((on_delivery, key.encode(), value or b"", partition or 0))

    def deliver(self, first_offset: int) -> None:
        """The broker's answers, at consecutive offsets from ``first_offset``."""
        for n, (callback, key, value, partition) in enumerate(self.acks):
            callback(None, _Msg(partition, first_offset + n, key, value))
        self.acks.clear()


class _Msg:
    def __init__(self, partition: int, offset: int, key: bytes, value: bytes) -> None:
        self._p, self._o, self._k, self._v = partition, offset, key, value

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return self._v


def entry(n: int) -> JournalEntry:
    i = intent(f"refund:c{n}:v1")
    return journal_entry(decide(None, i, f"intents:0:{n}"), i, i.to_bytes(), "intents", 0, n)


def chain_of(count: int, partition: int = 0) -> tuple[list[Link], list[bytes], JournalChain]:
    """``count`` entries linked by the processor's keeper, committed one transaction each."""
    keeper = JournalChain(LEDGER, lambda ps: {})
    links: list[Link] = []
    values: list[bytes] = []
    for n in range(count):
        out = Out()
        keeper.write(out, partition, f"refund:c{n}:v1", entry(n))  # type: ignore[arg-type]
        keeper.commit()
        out.deliver(n)
        [(_, key, value, _)] = out.records
        e = decode_event(value)
        assert isinstance(e, JournalEntry)
        links.append(Link(n, e.chain_seq, e.chain_prev, entry_hash(partition, key.encode(), value)))
        values.append(value)
    return links, values, keeper


def read(links: list[Link], start: int = 0, end: int | None = None) -> PartitionRead:
    last = links[-1].offset + 1 if links else 0
    return PartitionRead(0, start, last if end is None else end, tuple(links))


def head_of(link: Link, source: str = "witness") -> WitnessedHead:
    assert link.seq is not None
    return WitnessedHead(0, link.offset, link.seq, link.digest, source)


def kinds(links: list[Link], heads: list[WitnessedHead] = [], start: int = 0) -> list[str]:  # noqa: B006
    return [f.text() for f in verify_chains(LEDGER, [read(links, start)], heads).findings]


# ---------------------------------------------------------------- the chain function


def test_genesis_names_the_ledger_and_the_partition() -> None:
    assert genesis(LEDGER, 0) != genesis(LEDGER, 1) != genesis("ledger-b", 1)
    assert genesis(LEDGER, 0) == genesis(LEDGER, 0) and len(genesis(LEDGER, 0)) == 64


def test_an_entry_hash_covers_partition_key_and_every_byte_unambiguously() -> None:
    base = entry_hash(0, b"ab", b"c")
    assert base != entry_hash(1, b"ab", b"c")
    assert base != entry_hash(0, b"a", b"bc")  # lengths are part of the encoding
    assert base != entry_hash(0, b"ab", b"d")


def test_the_keeper_links_each_entry_to_the_one_before() -> None:
    links, _, keeper = chain_of(4)
    assert [link.seq for link in links] == [0, 1, 2, 3]
    assert links[0].prev == genesis(LEDGER, 0)
    assert [link.prev for link in links[1:]] == [link.digest for link in links[:-1]]
    assert keeper.heads() == {0: ChainHead(0, 3, links[-1].digest, 3)}


def test_an_aborted_transaction_leaves_no_link_behind() -> None:
    links, _, keeper = chain_of(2)
    keeper.write(Out(), 0, "refund:x:v1", entry(9))  # type: ignore[arg-type]
    keeper.abort()
    out = Out()
    linked = keeper.write(out, 0, "refund:y:v1", entry(8))  # type: ignore[arg-type]
    assert (linked.chain_seq, linked.chain_prev) == (2, links[-1].digest)


def test_a_restored_head_continues_the_chain() -> None:
    links, _, _ = chain_of(3)
    keeper = JournalChain(LEDGER, lambda ps: {0: ChainHead(0, 2, links[-1].digest, 2)})
    keeper.restore({0, 1})
    linked = keeper.write(Out(), 0, "refund:z:v1", entry(7))  # type: ignore[arg-type]
    assert (linked.chain_seq, linked.chain_prev) == (3, links[-1].digest)
    other = keeper.write(Out(), 1, "refund:w:v1", entry(6))  # type: ignore[arg-type]
    assert (other.chain_seq, other.chain_prev) == (0, genesis(LEDGER, 1))


# ---------------------------------------------------------------- the verifier


def test_an_intact_chain_and_its_heads_have_no_finding() -> None:
    links, _, _ = chain_of(5)
    report = verify_chains(LEDGER, [read(links)], [head_of(links[2]), head_of(links[4])])
    assert report.findings == [] and report.links_checked == 5 and report.heads_checked == 2
    assert report.starts[0].offset == 0 and report.starts[0].unchained == 0


def test_entries_deleted_from_the_front_are_named() -> None:
    links, _, _ = chain_of(6)
    [found] = kinds(links[3:], start=3)
    assert found.startswith("deleted journal:0:..2:") and "entries 0..2 are gone" in found


def test_entries_deleted_from_the_middle_are_named() -> None:
    links, _, _ = chain_of(6)
    [found] = kinds(links[:2] + links[4:])
    assert found.startswith("deleted journal:0:2..3:") and "entries 2..3 are missing" in found


def test_a_whole_partition_deleted_is_named_by_its_witnessed_head() -> None:
    links, _, _ = chain_of(4)
    [found] = kinds([], [head_of(links[3])], start=4)
    assert found.startswith("truncated journal:0:") or found.startswith("deleted journal:0:")


def test_a_cut_off_tail_is_named_truncated() -> None:
    links, _, _ = chain_of(6)
    [found] = kinds(links[:4], [head_of(links[5])])
    assert found.startswith("truncated journal:0:4..5:") and "chain_seq 5" in found


def test_a_rewritten_entry_is_named_by_the_next_link() -> None:
    links, values, _ = chain_of(5)
    forged = values[2].replace(b"c2", b"c9")
    links[2] = Link(2, links[2].seq, links[2].prev, entry_hash(0, b"refund:c2:v1", forged))
    [found] = kinds(links)
    assert found.startswith("rewritten journal:0:2..3:")


def test_a_rewritten_last_entry_is_named_by_the_witnessed_head() -> None:
    links, _, _ = chain_of(4)
    witnessed = head_of(links[3], "witness FILE line 2")
    links[3] = Link(3, 3, links[3].prev, "0" * 64)  # re-chained, so only the head can tell
    [found] = kinds(links, [witnessed])
    assert found.startswith("rewritten journal:0:3:") and "witness FILE line 2" in found


def test_an_inserted_entry_is_named_rewritten() -> None:
    links, _, _ = chain_of(4)
    copy = Link(2, links[1].seq, links[1].prev, links[1].digest)
    shifted = [Link(link.offset + 1, link.seq, link.prev, link.digest) for link in links[2:]]
    found = kinds(links[:2] + [copy] + shifted)
    assert any(f.startswith("rewritten journal:0:2:") and "repeats" in f for f in found)


def test_a_record_that_is_no_entry_inside_the_chain_is_named_rewritten() -> None:
    links, _, _ = chain_of(3)
    garbage = Link(3, None, None, "f" * 64, "it does not decode")
    [found] = kinds(links + [garbage])
    assert found.startswith("rewritten journal:0:3:") and "does not decode" in found


def test_a_chain_of_another_ledger_is_named_rewritten() -> None:
    links, _, _ = chain_of(2)
    [found] = [f.text() for f in verify_chains("ledger-b", [read(links)]).findings]
    assert found.startswith("rewritten journal:0:0:") and "genesis" in found


def test_entries_from_before_the_chain_read_as_they_are() -> None:
    links, _, _ = chain_of(3)
    legacy = [Link(n, None, None, "e" * 64) for n in range(2)]
    moved = [Link(link.offset + 2, link.seq, link.prev, link.digest) for link in links]
    report = verify_chains(LEDGER, [read(legacy + moved)])
    assert report.findings == []
    assert (report.starts[0].offset, report.starts[0].seq, report.starts[0].unchained) == (2, 0, 2)


# ---------------------------------------------------------------- heads and the witness file


@pytest.fixture
def settings(tmp_path: Path) -> LedgerSettings:
    return keyed(LedgerSettings(run_dir=tmp_path, topic_prefix=LEDGER))  # type: ignore[no-any-return]


def test_heads_are_due_when_the_chain_advanced_and_the_interval_passed(
    settings: LedgerSettings,
) -> None:
    now = [100.0]
    publisher = HeadsPublisher(
        LEDGER, 30.0, "processor-0", stage_sealer(settings, "processor"), [], lambda: now[0]
    )
    head = ChainHead(0, 4, "a" * 64, 9)
    assert publisher.due({0: head}) == [head]
    publisher.publish(Out(), [head])  # type: ignore[arg-type]
    publisher.commit()
    later = ChainHead(0, 5, "b" * 64, 11)
    assert publisher.due({0: head}) == []  # not advanced
    assert publisher.due({0: later}) == []  # advanced, within the interval
    now[0] += 30.0
    assert publisher.due({0: head}) == []
    assert publisher.due({0: later}) == [later]


def test_the_file_witness_keeps_sealed_heads_that_the_audit_reads_back(
    settings: LedgerSettings,
) -> None:
    path = settings.witness_path()
    publisher = HeadsPublisher(
        LEDGER,
        1.0,
        "processor-0",
        stage_sealer(settings, "processor"),
        [FileWitness(path, LEDGER)],
        wall_ms=lambda: 1_000,
    )
    out = Out()
    publisher.publish(out, [ChainHead(0, 4, "a" * 64, 9), ChainHead(2, 0, "b" * 64, 1)])  # type: ignore[arg-type]
    assert [r[0] for r in out.records] == ["heads", "heads"]
    lines = path.read_text().splitlines()
    other = {**json.loads(lines[0]), "ledger": "another"}
    forged = {**json.loads(lines[1]), "seq": 99}
    forged_record = json.loads(lines[1])
    forged_record["record"] = json.loads(lines[0])["record"]  # another head under this seal
    with path.open("a") as f:
        for line in (other, forged_record):
            f.write(json.dumps(line) + "\n")
        f.write("not json\n")
    heads, problems = read_witness_file(path, LEDGER, load_keyring(settings))
    assert [(h.partition, h.offset, h.seq, h.hash) for h in heads] == [
        (0, 9, 4, "a" * 64),
        (2, 1, 0, "b" * 64),
    ]
    assert forged["seq"] == 99  # the readable fields are not what is believed
    assert len(problems) == 2
    assert (
        "line 4 is not authentic" in problems[0] and "line 5 is not a witness line" in problems[1]
    )


def test_a_witness_line_sealed_by_a_key_no_longer_held_is_unverifiable_not_a_finding(
    settings: LedgerSettings, tmp_path: Path
) -> None:
    """Keys lost and made again: the heads witnessed before may be genuine, so the audit
    says NOT VERIFIED (as for the ledger's own records), not that the journal was rewritten."""
    path = settings.witness_path()
    publisher = HeadsPublisher(
        LEDGER, 1.0, "processor-0", stage_sealer(settings, "processor"), [FileWitness(path, LEDGER)]
    )
    publisher.publish(Out(), [ChainHead(0, 4, "a" * 64, 9)])  # type: ignore[arg-type]
    other = keyed(LedgerSettings(run_dir=tmp_path / "new-keys", topic_prefix=LEDGER))
    lost: list[dict[str, object]] = []
    heads, problems = read_witness_file(path, LEDGER, load_keyring(other), lost)
    assert heads == [] and problems == []
    assert [line["offset"] for line in lost] == [1]
    assert "line 1" in str(lost[0]["reason"])
    _, without = read_witness_file(path, LEDGER, load_keyring(other))
    assert len(without) == 1 and "is not authentic" in without[0]


def test_a_witness_that_fails_does_not_stop_the_publisher(
    settings: LedgerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    publisher = HeadsPublisher(
        LEDGER,
        1.0,
        "processor-0",
        stage_sealer(settings, "processor"),
        [FileWitness(blocked / "heads.jsonl", LEDGER)],  # its folder is a file
    )
    out = Out()
    publisher.publish(out, [ChainHead(0, 1, "c" * 64, 3)])  # type: ignore[arg-type]
    assert [r[0] for r in out.records] == ["heads"]  # on Kafka all the same
    assert "could not be handed to the witness" in caplog.text


# ---------------------------------------------------------------- repeats by reference


def journal_like_the_processor(events: list[Event]) -> list[JournalEntry]:
    """Decide ``events`` in order and journal them as the processor does (repeats by reference)."""
    state = None
    first: str | None = None
    drifted: dict[str, str] = {}  # SHA-256 of a drifted intent's bytes -> its ref
    entries: list[JournalEntry] = []
    for n, event in enumerate(events):
        ref = ref_of("intents", 0, n)
        decision = decide(state, event, ref)
        repeat = first if repeats(state, event, decision) else None
        if drifts(state, event, decision):
            repeat = drifted.setdefault(hashlib.sha256(event.to_bytes()).hexdigest(), ref)
            repeat = None if repeat == ref else repeat
        entries.append(
            journal_entry(decision, event, event.to_bytes(), "intents", 0, n, repeat_of=repeat)
        )
        if repeat is None and keeps_intent(event, decision) and first is None:
            first = ref
        if decision.state is not None:
            state = decision.state
    return entries


def test_a_repeated_intent_is_journaled_by_reference_and_replays_the_same() -> None:
    i = intent("refund:big:v1", note="n" * 50_000)
    events: list[Event] = [i] + [i.model_copy(update={"published_at_ms": n}) for n in range(1, 6)]
    entries = journal_like_the_processor(events)
    assert entries[0].repeat_of is None and len(entries[0].input_event) > 50_000
    assert all(e.repeat_of == "intents:0:0" and e.input_event == b"" for e in entries[1:])
    assert entries[3].input_sha256 == hashlib.sha256(events[3].to_bytes()).hexdigest()
    assert sum(len(e.to_bytes()) for e in entries[1:]) < 5 * 2_000
    states, steps = replay_decisions(entries)
    assert [d.outcome for *_, d in steps] == [e.outcome for e in entries]
    assert states["refund:big:v1"].state == S.NOT_ADMITTED


def test_a_repeat_after_a_reauthorisation_replays_as_the_no_op_it_was() -> None:
    op = "refund:reauth:v1"
    first, second = intent(op, approval="ap-1"), intent(op, approval="ap-2")
    refused = admission(first, admitted=False, reason="expired")
    refused_again = admission(second, admitted=False, reason="expired", request=3)
    entries = journal_like_the_processor(
        [first, refused, second, refused_again, second.model_copy(update={"published_at_ms": 9})]
    )
    assert entries[-1].repeat_of == "intents:0:0"  # the intent first journaled with its bytes
    states, steps = replay_decisions(entries)
    assert [d.outcome for *_, d in steps] == [e.outcome for e in entries]
    assert entries[-1].outcome == "NOOP" and states[op].state == S.NEEDS_REAUTHORISATION


def test_an_identical_drifted_intent_is_journaled_by_reference_and_replays_refused() -> None:
    """Re-publishing one large drifted intent (another digest) does not grow the journal:
    the first copy keeps its bytes, the identical ones name it; another drift is kept."""
    op = "refund:drift:v1"
    bound = intent(op)
    drift = intent(op, amount=4999, note="d" * 50_000)
    other = intent(op, amount=4998, note="e" * 50_000)
    entries = journal_like_the_processor([bound, drift, drift, other, drift])
    assert [e.outcome for e in entries] == ["APPLIED", "REFUSED", "REFUSED", "REFUSED", "REFUSED"]
    assert entries[1].repeat_of is None and len(entries[1].input_event) > 50_000
    assert entries[2].repeat_of == entries[4].repeat_of == "intents:0:1"
    assert entries[2].input_event == b"" and len(entries[2].to_bytes()) < 2_000
    assert entries[3].repeat_of is None  # other bytes: kept
    states, steps = replay_decisions(entries)
    assert [d.outcome for *_, d in steps] == [e.outcome for e in entries]
    assert states[op].parameter_digest == bound.parameter_digest


def test_a_drifted_repeat_whose_bytes_do_not_match_is_unreadable() -> None:
    op = "refund:drift-forged:v1"
    drift = intent(op, amount=4999)
    entries = journal_like_the_processor([intent(op), drift, drift])
    forged = entries[2].model_copy(update={"input_sha256": "0" * 64})
    unreadable: list[str] = []
    replay_decisions([*entries[:2], forged], lambda e, exc: unreadable.append(str(exc)))
    assert unreadable and "do not hash to its input_sha256" in unreadable[0]


def test_a_repeat_whose_reference_is_gone_is_unreadable_not_guessed() -> None:
    i = intent("refund:gone:v1")
    entries = journal_like_the_processor([i, i.model_copy(update={"published_at_ms": 1})])
    unreadable: list[str] = []
    replay_decisions(entries[1:], lambda e, exc: unreadable.append(str(exc)))
    assert unreadable and "no earlier entry of the operation keeps" in unreadable[0]


def test_a_clean_stop_publishes_the_last_heads_whatever_the_interval(
    settings: LedgerSettings,
) -> None:
    calls: list[str] = []

    class Producer:
        def begin_transaction(self) -> None:
            calls.append("begin")

        def commit_transaction(self, timeout_s: float) -> None:
            calls.append("commit")

    publisher = HeadsPublisher(
        LEDGER, 3600.0, "processor-0", stage_sealer(settings, "processor"), [], lambda: 5.0
    )
    first, last = ChainHead(0, 1, "a" * 64, 3), ChainHead(0, 2, "b" * 64, 5)
    publisher.publish(Out(), [first])  # type: ignore[arg-type]
    publisher.commit()
    assert publisher.due({0: last}) == []  # within the hour
    out = Out()
    publisher.publish_last(Producer(), lambda: out, {0: last}, 5.0)  # type: ignore[arg-type]
    assert calls == ["begin", "commit"] and [r[0] for r in out.records] == ["heads"]
    assert publisher.published == {0: last}


def test_the_head_is_read_back_from_the_last_authentic_entry(settings: LedgerSettings) -> None:
    """A restore links to the partition's last entry; an earlier release's entry starts afresh."""
    links, values, _ = chain_of(3)
    legacy = entry(5).to_bytes()  # no chain fields: written before the chain
    logs: dict[int, list[_Msg]] = {
        0: [_Msg(0, n, f"refund:c{n}:v1".encode(), v) for n, v in enumerate(values)],
        1: [_Msg(1, 40, b"refund:c5:v1", legacy)],
        2: [],
    }
    tails: list[int | None] = []

    def reader(_s: Any, topic: str, parts: set[int], keep: Any, **kw: Any) -> int:
        assert topic == "journal" and kw["keyring"] is not None
        tails.append(kw["tail"])
        for p in sorted(parts):
            kw["ends_out"][p] = 10_000 if p == 2 else 50
            for msg in logs[p]:
                keep(None, msg)
        return 0

    heads = read_heads(
        settings, {0, 1, 2}, load_keyring(settings), reader=reader, settle=lambda *a, **k: 0.0
    )
    assert heads[0] == ChainHead(0, 2, links[2].digest, 2)
    assert heads[1] == ChainHead.empty(settings.ledger_identity, 1)
    assert heads[2] == ChainHead.empty(settings.ledger_identity, 2)  # widened to its start
    assert tails == [64, 512, 4096, 32768]


def test_the_audit_text_says_where_each_chain_starts() -> None:
    report = AuditReport()
    report.journal_chain = {
        "partitions": [
            {"partition": 0, "starts_at": 3, "seq": 0, "unchained": 3},
            {"partition": 1, "starts_at": None, "seq": None, "unchained": 0},
        ],
        "heads_checked": 4,
        "witness": "heads.jsonl",
    }
    text = "\n".join(audit_lines(report))
    assert "4 witnessed head(s) checked; witness file: heads.jsonl" in text
    assert "journal:0: offset 3 (chain_seq 0), after 3 unchained entries" in text
    assert "journal:1: no chained entry" in text


def test_an_unauthenticated_record_the_chain_links_around_is_no_chain_finding() -> None:
    """Tried as a writer of the journal topic with no processor key: records appended
    between entries are refused by readers (listed as unauthenticated), and the
    processor's next entry links to its own last one, so the chain is whole."""
    links, _, _ = chain_of(4)
    copy = Link(2, links[0].seq, links[0].prev, links[0].digest, None, False)
    junk = Link(3, None, None, "f" * 64, "it does not decode", False)
    shifted = [Link(link.offset + 2, link.seq, link.prev, link.digest) for link in links[2:]]
    tail = Link(6, 9, "a" * 64, "b" * 64, None, False)
    assert kinds(links[:2] + [copy, junk] + shifted + [tail]) == []


def test_a_rewrite_in_place_that_fails_its_seal_is_still_named() -> None:
    links, values, _ = chain_of(5)
    forged = values[2].replace(b"c2", b"c9")
    links[2] = Link(
        2, links[2].seq, links[2].prev, entry_hash(0, b"refund:c2:v1", forged), None, False
    )
    [found] = kinds(links)
    assert found.startswith("rewritten journal:0:2..3:")


def test_a_partition_emptied_to_its_end_is_named_deleted_by_its_witnessed_head() -> None:
    """DeleteRecords up to the end: nothing left to read, the head lies before the log start."""
    links, _, _ = chain_of(6)
    report = verify_chains(LEDGER, [PartitionRead(0, 6, 6, ())], [head_of(links[5], "w")])
    [found] = [f.text() for f in report.findings]
    assert found.startswith("deleted journal:0:..5: w witnessed chain_seq 5 at offset 5")
    assert "(the partition was emptied to its end)" in found


def test_a_log_start_moved_with_nothing_witnessed_is_named_deleted() -> None:
    """The journal is kept forever: a log start above 0 is a deletion, even with no head to
    say how far the chain had reached, and even where the processor started a new chain."""
    [emptied] = [f.text() for f in verify_chains(LEDGER, [PartitionRead(0, 9, 9, ())]).findings]
    assert emptied.startswith("deleted journal:0:..8: the log starts at offset 9;")
    assert "offsets 0..8 were deleted" in emptied and "nothing is left to read" in emptied
    links, _, _ = chain_of(2)
    afresh = [Link(link.offset + 9, link.seq, link.prev, link.digest) for link in links]
    report = verify_chains(LEDGER, [PartitionRead(0, 9, 11, tuple(afresh))])
    [restarted] = [f.text() for f in report.findings]
    assert restarted.startswith("deleted journal:0:..8: the log starts at offset 9;")
    assert "its chain at chain_seq 0 (offset 9)" in restarted
