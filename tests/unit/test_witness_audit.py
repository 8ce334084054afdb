"""The audit under a broker-admin attacker: heads not witnessed, the heads topic wiped,
and a genuine record copied to another partition (the pure decisions and the verdict)."""

from __future__ import annotations

from ledger.audit import AuditReport, Provenance, audit
from ledger.audit.chain import Link, PartitionRead, WitnessedHead
from ledger.audit.witness import HeadsRead, WitnessReport, evaluate_witness
from ledger.cli.audit import audit_lines
from ledger.topology import misplaced, partition_for

NOW_MS = 1_800_000_000_000
GRACE_S = 100.0
LONG_AGO_MS = NOW_MS - 3_600_000  # an hour before the audit
JUST_NOW_MS = NOW_MS - 5_000  # five seconds before it
FILE = "witness/journal-heads.jsonl"


def chain(partition: int, count: int, written_ms: int = LONG_AGO_MS) -> PartitionRead:
    """``count`` chained entries at offsets 0.. (hashes made up: only sequences matter here)."""
    links = tuple(
        Link(n, n, f"{n - 1:064x}", f"{n:064x}", written_ms=written_ms) for n in range(count)
    )
    return PartitionRead(partition, 0, count, links)


def head(partition: int, seq: int, where: str, published_ms: int = LONG_AGO_MS) -> WitnessedHead:
    return WitnessedHead(partition, seq, seq, f"{seq:064x}", where, published_ms)


def topic_of(*heads: WitnessedHead, start: int = 0) -> HeadsRead:
    return HeadsRead(start, start + len(heads), heads)


def judge(
    reads: list[PartitionRead],
    on_topic: HeadsRead,
    witnessed: list[WitnessedHead],
    files: list[str],
) -> WitnessReport:
    return evaluate_witness(
        reads, on_topic, witnessed, files, interval_s=30.0, grace_s=GRACE_S, now_ms=NOW_MS
    )


# ------------------------------------------------------- 1. witness missing or short


def test_heads_published_and_no_witness_given_is_not_verified_naming_the_remedy() -> None:
    found = judge([chain(0, 5)], topic_of(head(0, 2, "topic"), head(0, 4, "topic")), [], [])
    assert found.violations == []
    [why] = found.unverified
    assert why.startswith(
        "no witness given: pass --witness FILE (the processor's LEDGER_WITNESS_FILE)"
    )
    assert "heads up to chain_seq 4 at journal:0:4 were published" in why
    looked = evaluate_witness(
        [chain(0, 5)],
        topic_of(head(0, 4, "topic")),
        [],
        [],
        interval_s=30.0,
        grace_s=GRACE_S,
        now_ms=NOW_MS,
        absent=FILE,
    )
    assert looked.unverified[0].startswith(
        "no witness given: pass --witness FILE (the processor's LEDGER_WITNESS_FILE; "
        f"{FILE} is not on this host); heads up to chain_seq 4"
    )


def test_a_witness_holding_older_heads_than_the_topic_is_not_verified() -> None:
    reads = [chain(0, 5), chain(1, 3)]
    on_topic = topic_of(head(0, 4, "topic"), head(1, 2, "topic"))
    found = judge(reads, on_topic, [head(0, 2, FILE), head(1, 2, FILE)], [FILE])
    assert found.violations == []
    assert found.unverified == [
        f"heads up to chain_seq 4 at journal:0 were published; the witness {FILE} holds up "
        "to chain_seq 2: pass the witness file of every processor host that owned journal:0 "
        "(--witness FILE, repeated), or a current copy"
    ]
    # Another host's file holds nothing of journal:1.
    other = judge(reads, on_topic, [head(0, 4, FILE)], [FILE])
    assert [w for w in other.unverified if "journal:1" in w] == [
        f"heads up to chain_seq 2 at journal:1 were published; the witness {FILE} holds none "
        "of journal:1: pass the witness file of every processor host that owned journal:1 "
        "(--witness FILE, repeated), or a current copy"
    ]


def test_a_witness_holding_every_published_head_leaves_nothing_to_say() -> None:
    on_topic = topic_of(head(0, 2, "topic"), head(0, 4, "topic"))
    found = judge([chain(0, 5)], on_topic, [head(0, 2, FILE), head(0, 4, FILE)], [FILE])
    assert found == WitnessReport()


def test_a_ledger_whose_chains_never_started_needs_no_witness() -> None:
    unchained = PartitionRead(
        0, 0, 2, (Link(0, None, None, "a" * 64), Link(1, None, None, "b" * 64))
    )
    assert judge([unchained, PartitionRead(1, 0, 0, ())], topic_of(), [], []) == WitnessReport()


# ------------------------------------------------------------ 2. the heads topic wiped


def test_a_witness_holding_heads_the_topic_no_longer_has_is_a_violation() -> None:
    witnessed = [head(0, 2, f"witness {FILE} line 1"), head(0, 4, f"witness {FILE} line 2")]
    found = judge([chain(0, 5)], topic_of(), witnessed, [FILE])  # made again, empty
    [violation] = found.violations
    assert violation.startswith(
        f"heads of journal:0 deleted from the heads topic: witness {FILE} line 2 holds "
        "chain_seq 4 at journal:0:4"
    )
    assert "holds no head of journal:0" in violation and "deleted and made again" in violation
    # Only part of them gone: the topic holds up to chain_seq 2.
    [partly] = judge([chain(0, 5)], topic_of(head(0, 2, "topic")), witnessed, [FILE]).violations
    assert "holds heads of journal:0 only up to chain_seq 2" in partly


def test_a_head_just_handed_to_the_witness_may_not_be_on_the_topic_yet() -> None:
    """The witness keeps a head before the transaction that writes it to the topic commits."""
    witnessed = [head(0, 2, FILE), head(0, 4, FILE, published_ms=JUST_NOW_MS)]
    on_topic = topic_of(head(0, 2, "topic"))
    assert judge([chain(0, 5)], on_topic, witnessed, [FILE]) == WitnessReport()


def test_a_topic_made_again_and_written_to_misses_the_heads_before_it() -> None:
    witnessed = [head(0, n, f"witness {FILE} line {n}") for n in (1, 3, 5, 7)]
    on_topic = topic_of(head(0, 7, "topic"))  # the processor published on into the new topic
    [violation] = judge([chain(0, 8)], on_topic, witnessed, [FILE]).violations
    assert "the witness holds 3 heads of it (chain_seq 1 to 5" in violation
    assert "before the first the heads topic holds (chain_seq 7" in violation
    # One head alone before the topic's first may be one a stopped processor never committed.
    assert judge([chain(0, 8)], on_topic, witnessed[2:], [FILE]) == WitnessReport()


def test_records_deleted_from_the_heads_topic_are_a_violation() -> None:
    on_topic = topic_of(head(0, 4, "topic"), start=3)
    [violation] = judge([chain(0, 5)], on_topic, [head(0, 4, FILE)], [FILE]).violations
    assert violation.startswith("deleted heads:0:0..2: the heads topic starts at offset 3;")
    emptied = judge([chain(0, 5)], HeadsRead(6, 6, ()), [head(0, 4, FILE)], [FILE])
    assert "holds nothing (emptied to its end)" in emptied.violations[0]


def test_a_chain_with_no_head_anywhere_long_after_it_advanced_is_not_verified() -> None:
    [why] = judge([chain(0, 5)], topic_of(), [], []).unverified
    assert why.startswith("journal:0's chain reached chain_seq 4 (journal:0:4, written at ")
    assert "no head of it is on the heads topic, although the processor publishes" in why
    assert "the heads topic may have been deleted and made again" in why
    assert why.endswith("pass --witness FILE (the processor's LEDGER_WITNESS_FILE)")
    [given] = judge([chain(0, 5)], topic_of(), [], [FILE]).unverified
    assert f"no head of it is on the heads topic or in the witness {FILE}" in given
    # A chain that advanced within the grace may not have its head yet.
    assert judge([chain(0, 5, written_ms=JUST_NOW_MS)], topic_of(), [], []) == WitnessReport()


# ------------------------------------------------------------------------ the verdict


def test_unverified_heads_make_the_audit_not_verified_and_not_clean() -> None:
    report = AuditReport()
    report.unverified = ["no witness given: pass --witness FILE", "second reason"]
    assert not report.clean
    assert report.verdict == (
        "NOT VERIFIED: no witness given: pass --witness FILE (and 1 more) "
        "(ledger only, sink readback off)"
    )
    lines = audit_lines(report)
    assert "not verified: second reason" in lines
    assert report.to_dict()["unverified"] == report.unverified
    report.add("journal-chain", None, "deleted journal:0:..3: ...")
    assert report.verdict.startswith("1 VIOLATION")


# ---------------------------------------------- 4. a genuine record on another partition


def test_a_genuine_journal_entry_copied_to_another_partition_is_a_violation() -> None:
    op = "refund:c1:v1"
    home = partition_for(op, 3)
    other = (home + 1) % 3
    reason = misplaced("journal", op.encode(), other, 3)
    assert reason is not None
    provenance = Provenance(
        unauthenticated={("journal", other, 7): reason},
        undecodable={},
        uses={},
        grants={},
        records=1,
        misplaced={("journal", other, 7): (op, reason)},
    )
    report = audit([], {}, {}, {}, provenance=provenance)
    [violation] = [v for v in report.violations if v.invariant == "authenticity"]
    assert violation.operation_id == op
    assert violation.evidence.startswith(f"journal:{other}:7 holds an authentic journal record")
    assert f"its key belongs on partition {home} of 3" in violation.evidence
    assert not report.clean


def test_a_copy_of_an_input_stays_a_refused_record() -> None:
    """A service could publish its intent again: a copy elsewhere is refused, not a violation."""
    op = "refund:c1:v1"
    other = (partition_for(op, 3) + 1) % 3
    reason = misplaced("intents", op.encode(), other, 3)
    assert reason is not None
    provenance = Provenance(
        unauthenticated={("intents", other, 2): reason},
        undecodable={},
        uses={},
        grants={},
        records=1,
        misplaced={("intents", other, 2): (op, reason)},
    )
    report = audit([], {}, {}, {}, provenance=provenance)
    assert [v for v in report.violations if v.invariant == "authenticity"] == []
