"""The journal's hash chain on the real broker: repeats by reference, deletions and rewrites named.

The processor links every journal entry into its partition's chain and hands
the heads to the file witness; the auditor checks the chains. An attacker
with broker-admin rights then deletes a range of the journal
(``DeleteRecords``) and rewrites an entry in place (the broker stopped, one
byte of the entry's value changed in the partition's segment file, the
batch's CRC-32C recomputed so the broker serves it as sound): the audit names
both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from consumers.auditor import run_audit
from consumers.reader import read_topic
from ledger.events import JournalEntry
from ledger.settings import LedgerSettings
from ledger.topology import partition_for
from producers.publisher import LedgerPublisher
from testbed import broker
from testbed.harness import Harness
from tests.helpers import intent

pytestmark = pytest.mark.integration


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Poll ``check`` until it holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def journal_of(settings: LedgerSettings, op: str) -> list[JournalEntry]:
    return [
        r.event
        for r in read_topic(settings, "journal")
        if isinstance(r.event, JournalEntry) and r.key == op
    ]


def witnessed(settings: LedgerSettings) -> list[dict[str, object]]:
    path = settings.witness_path()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def fast_heads(ledger_settings: LedgerSettings) -> LedgerSettings:
    """The test's ledger, publishing heads every half second."""
    return ledger_settings.model_copy(update={"heads_interval_s": 0.5})


def test_a_republished_intent_is_journaled_by_reference_and_the_chain_audits_clean(
    fast_heads: LedgerSettings,
) -> None:
    settings = fast_heads
    harness = Harness(settings, create=False)
    pub = LedgerPublisher(settings)
    op = "refund:big:v1"
    big = intent(op, note="n" * 200_000)  # a 200 KB intent
    assert len(big.to_bytes()) > 200_000
    try:
        harness.start("processor")
        pub.publish_intent(big)
        wait_for("the first entry", lambda: len(journal_of(settings, op)) == 1)
        before = sum(len(r.raw) for r in read_topic(settings, "journal"))
        for n in range(50):  # re-published, as a careless or hostile service would
            pub.publish_intent(big.model_copy(update={"published_at_ms": n + 1}))
            if n == 24:  # the processor crashes halfway; its successor goes on with the chain
                wait_for("26 entries", lambda: len(journal_of(settings, op)) == 26)
                harness.kill("processor")
                harness.restart("processor")
        wait_for("51 entries", lambda: len(journal_of(settings, op)) == 51)
        drift = intent(op, amount=4999, note="d" * 200_000)  # another digest: refused
        for _ in range(10):
            pub.publish_intent(drift)
        wait_for("61 entries", lambda: len(journal_of(settings, op)) == 61)
        entries = journal_of(settings, op)
        grown = sum(len(r.raw) for r in read_topic(settings, "journal")) - before
        part = partition_for(op, settings.partitions)
        wait_for(
            "the last head in the witness file",
            lambda: any(
                w["journal_partition"] == part and w["seq"] == entries[-1].chain_seq
                for w in witnessed(settings)
            ),
        )
    finally:
        pub.close()
        harness.stop()

    # Copied three times in all: the first intent, the first repeat after the restart
    # (a restored processor knows no reference yet) and the first drift; the 49 other
    # repeats and the 9 identical drifts by reference.
    limit = 2 * 250_000 + (49 + 9) * 2_000
    assert grown < limit, f"the journal grew by {grown} bytes for 50 repeats and 10 drifts"
    first, restarted = entries[0], entries[26]
    assert [n for n, e in enumerate(entries) if e.input_event] == [0, 26, 51]
    drifted = f"intents:{entries[51].input_partition}:{entries[51].input_offset}"
    assert all(e.outcome == "REFUSED" for e in entries[51:])
    assert all(e.repeat_of == drifted and e.input_event == b"" for e in entries[52:])
    entries = entries[:51]  # the bound intent's entries, as below
    for anchor, repeats in ((first, entries[1:26]), (restarted, entries[27:])):
        ref = f"intents:{anchor.input_partition}:{anchor.input_offset}"
        assert anchor.repeat_of is None and len(anchor.input_event) > 200_000
        assert all(e.repeat_of == ref and e.input_event == b"" for e in repeats)
        assert all(e.outcome == "NOOP" and e.input_sha256 for e in repeats)
    # One partition's chain, continued across the crash from its last committed entry.
    assert [e.chain_seq for e in entries] == list(range(51))

    report = run_audit(settings, read_sinks=False)
    assert report.clean, report.violations
    assert report.checked["journal-chain"] > 51
    assert report.journal_chain["heads_checked"] >= 1
    assert report.journal_chain["witness"] == str(settings.witness_path())


# --------------------------------------------------------------------------- tampering


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as Kafka's record batches carry it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def rewrite_in_segment(log_dir: Path, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` (same length) in one record batch and fix the batch's CRC.

    Record batch v2: baseOffset int64, batchLength int32, partitionLeaderEpoch
    int32, magic int8, crc uint32 (CRC-32C of everything from the attributes
    to the batch's end), attributes int16 ...
    """
    assert len(old) == len(new)
    [segment] = [p for p in log_dir.glob("*.log") if old in p.read_bytes()]
    data = bytearray(segment.read_bytes())
    at = data.index(old)
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos + 8 : pos + 12], "big")
        end = pos + 12 + length
        if pos <= at < end:
            assert data[pos + 16] == 2, "record batch magic 2"
            data[at : at + len(old)] = new
            data[pos + 17 : pos + 21] = crc32c(bytes(data[pos + 21 : end])).to_bytes(4, "big")
            segment.write_bytes(bytes(data))
            return
        pos = end
    raise AssertionError(f"{old!r} is in no record batch of {segment}")


@pytest.fixture
def own_broker(private_broker: LedgerSettings) -> LedgerSettings:
    """This test process's own broker (``private_broker``): the test stops and starts it."""
    return private_broker


@pytest.fixture
def tampered_ledger(
    private_ledger_settings: LedgerSettings,
) -> Iterator[tuple[LedgerSettings, list[tuple[int, JournalEntry]]]]:
    """Eight intents decided on journal partition 0 of the private broker, their heads
    witnessed; stages stopped."""
    settings = private_ledger_settings.model_copy(update={"heads_interval_s": 0.5})
    ops = [op for op in (f"refund:chain:{n}:v1" for n in range(200)) if partition_for(op, 3) == 0]
    ops = ops[:8]
    harness = Harness(settings, create=False)
    pub = LedgerPublisher(settings)
    try:
        harness.start("processor")
        for n, op in enumerate(ops):
            pub.publish_intent(intent(op, note=f"marker-{n:02d}"))

        def entries() -> list[tuple[int, JournalEntry]]:
            return [
                (r.offset, r.event)
                for r in read_topic(settings, "journal")
                if r.partition == 0 and isinstance(r.event, JournalEntry)
            ]

        wait_for("eight entries on journal:0", lambda: len(entries()) == 8)
        last = entries()[-1][1].chain_seq
        wait_for(
            "the last head in the witness file",
            lambda: any(
                w["journal_partition"] == 0 and w["seq"] == last for w in witnessed(settings)
            ),
        )
        found = entries()
    finally:
        pub.close()
        harness.stop()
    yield settings, found


def test_a_deleted_range_and_a_record_rewritten_in_place_are_named_by_the_audit(
    tampered_ledger: tuple[LedgerSettings, list[tuple[int, JournalEntry]]],
    own_broker: LedgerSettings,
) -> None:
    settings, entries = tampered_ledger
    assert [e.chain_seq for _, e in entries] == list(range(8))
    assert run_audit(settings, read_sinks=False).clean  # sound before the attack
    journal = settings.topic("journal")

    # (a) An administrator deletes the journal's first entries (DeleteRecords).
    deleted_to = entries[2][0]  # entries 0 and 1 go
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(journal, 0, deleted_to)]).values():
        future.result(timeout=30)

    # (b) ... and rewrites entry 4 in place, the broker stopped.
    rewritten_at = entries[4][0]
    broker.stop(own_broker)
    try:
        rewrite_in_segment(
            Path(own_broker.kafka_home) / "data" / f"{journal}-0", b"marker-04", b"marker-4X"
        )
    finally:
        broker.start(own_broker)

    report = run_audit(settings, read_sinks=False)
    chain = [v.evidence for v in report.violations if v.invariant == "journal-chain"]
    assert not report.clean
    assert any(
        e.startswith(f"deleted journal:0:..{deleted_to - 1}:") and "0..1 are gone" in e
        for e in chain
    ), chain
    assert any(e.startswith(f"rewritten journal:0:{rewritten_at}") for e in chain), chain
    assert report.journal_chain["partitions"][0]["seq"] == 2  # where what is left starts


def test_the_audit_wants_the_witness_and_names_partitions_emptied_to_their_end(
    tampered_ledger: tuple[LedgerSettings, list[tuple[int, JournalEntry]]], tmp_path: Path
) -> None:
    settings, entries = tampered_ledger
    last = entries[-1][1].chain_seq
    assert run_audit(settings, read_sinks=False).clean  # with LEDGER_WITNESS_FILE

    # Heads were published: without the witness, or with a copy short of them, the
    # audit cannot show the journal unrewritten: NOT VERIFIED, naming what is missing.
    bare = run_audit(settings, read_sinks=False, witness=[])
    assert bare.violations == [] and not bare.clean
    assert bare.verdict.startswith(
        "NOT VERIFIED: no witness given: pass --witness FILE (the processor's "
        "LEDGER_WITNESS_FILE); heads up to chain_seq "
    ), bare.verdict
    older = [w for w in witnessed(settings) if int(str(w["seq"])) < (last or 0)]
    short = tmp_path / "an-old-copy.jsonl"
    short.write_text("".join(json.dumps(w) + "\n" for w in older))
    stale = run_audit(settings, read_sinks=False, witness=[short])
    top = max((int(str(w["seq"])) for w in older), default=None)
    holds = f"up to chain_seq {top}" if top is not None else "none of journal:0"
    assert stale.violations == [] and stale.unverified == [
        f"heads up to chain_seq {last} at journal:0 were published; the witness {short} "
        f"holds {holds}: pass the witness file of every processor host that owned journal:0 "
        "(--witness FILE, repeated), or a current copy"
    ]

    # An administrator empties journal:0 and the heads topic to their ends: the audit
    # reads through them (no wait for records that are gone) and names both.
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    emptied = [
        TopicPartition(settings.topic("journal"), 0, -1),
        TopicPartition(settings.topic("heads"), 0, -1),
    ]
    starts = {
        tp.topic: future.result(timeout=30).low_watermark
        for tp, future in admin.delete_records(emptied).items()
    }
    journal_start, heads_start = starts[settings.topic("journal")], starts[settings.topic("heads")]
    assert journal_start > entries[-1][0] and heads_start > 0

    report = run_audit(settings, read_sinks=False)
    chain = [v.evidence for v in report.violations if v.invariant == "journal-chain"]
    assert any(
        e.startswith(f"deleted journal:0:..{journal_start - 1}: ")
        and f"witnessed chain_seq {last} at offset {entries[-1][0]}" in e
        and "(the partition was emptied to its end)" in e
        for e in chain
    ), chain
    assert any(
        e.startswith(f"deleted heads:0:0..{heads_start - 1}: ") and "emptied to its end" in e
        for e in chain
    ), chain
    # With no witness at all, the log start alone names the deleted range.
    blind = run_audit(settings, read_sinks=False, witness=[])
    assert any(
        v.evidence.startswith(f"deleted journal:0:..{journal_start - 1}: the log starts at ")
        and "nothing is left to read" in v.evidence
        for v in blind.violations
    ), blind.violations
