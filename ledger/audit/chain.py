"""Checking the journal's hash chains end to end and against the witnessed heads (pure).

The auditor reads every journal partition from its log start (every record,
authentic or not, with its chain fields and :func:`ledger.chain.entry_hash`)
and every head it can find (the ``heads`` topic, the witness file) and hands
them to :func:`verify_chains`, which names every range that is not what the
processor committed:

* ``deleted``: entries that are gone from the front or the middle of a chain:
  the first entry read does not start the chain (its ``chain_seq`` is above
  0: the log start was moved past entries, as ``DeleteRecords`` or a time
  limit does), or a ``chain_seq`` is skipped (entries removed in between,
  e.g. by compaction of a journal whose cleanup policy was changed), or a
  witnessed head lies before the partition's log start, or the log start is
  above 0 at all (the journal is kept forever; a partition emptied to its
  end by ``DeleteRecords`` holds nothing else to tell it by);
* ``truncated``: a witnessed head lies beyond what the partition holds (its
  offset at or past the end read to, or its ``chain_seq`` past the last
  entry: the tail was cut off, or the topic was deleted and made again);
* ``rewritten``: an entry's bytes are not those the chain fixed: its chain
  hash differs from the ``chain_prev`` of the entry after it or from a
  witnessed head at its offset, an entry links to a hash that is not its
  predecessor's, a ``chain_seq`` repeats (an entry inserted or copied), or a
  record inside the chain carries no chain fields or does not decode.

Entries written before the chain existed (no chain fields) are read as they
are: the chain starts at a partition's first chained entry, and
:attr:`ChainReport.starts` says where (and how many unchained entries
precede it). The last entry of a chain is only protected once a head that
names it (or a later one) is witnessed; the heads are published at a bounded
interval (``LEDGER_HEADS_INTERVAL_S``), so that interval is the window in
which a rewrite of the newest entries can go unseen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ledger.chain import genesis

FindingKind = Literal["deleted", "truncated", "rewritten"]


@dataclass(frozen=True)
class Link:
    """One journal record as the auditor read it.

    Attributes:
        offset: its offset.
        seq: its ``chain_seq`` (``None``: no chain fields, or it does not decode).
        prev: its ``chain_prev`` (``None`` likewise).
        digest: :func:`ledger.chain.entry_hash` of its key and value as read.
        problem: why it could not be read as a journal entry (does not
            decode, no value), ``None`` when it could.
        authentic: whether its seal verified (a record that does not decode
            is not known to be authentic). A record that is not authentic
            is only part of the chain where the chain does not link without
            it (:func:`_chain_members`).
        written_ms: its Kafka timestamp (milliseconds since the epoch),
            ``None`` when the broker gives none.
    """

    offset: int
    seq: int | None
    prev: str | None
    digest: str
    problem: str | None = None
    authentic: bool = True
    written_ms: int | None = None


@dataclass(frozen=True)
class PartitionRead:
    """One journal partition read from its log start to its end.

    Attributes:
        partition: the partition.
        start: its log start offset (the low watermark) when read.
        end: the end offset read to (every committed record before it was read).
        links: every record read, in offset order.
    """

    partition: int
    start: int
    end: int
    links: tuple[Link, ...]


@dataclass(frozen=True)
class WitnessedHead:
    """A chain head someone witnessed.

    Attributes:
        partition: the journal partition.
        offset: offset of the entry it names.
        seq: that entry's ``chain_seq``.
        hash: that entry's chain hash.
        source: where it was found (``heads:0:12``, ``witness FILE line 3``).
        published_at_ms: when the processor published it (its
            ``published_at_ms``, wall clock, milliseconds), ``None`` if unknown.
    """

    partition: int
    offset: int
    seq: int
    hash: str
    source: str
    published_at_ms: int | None = None


@dataclass(frozen=True)
class ChainFinding:
    """One range of a journal partition that is not what the processor committed.

    Attributes:
        kind: ``deleted``, ``truncated`` or ``rewritten``.
        partition: the journal partition.
        first_offset: first offset of the range (``None`` when unknown).
        last_offset: last offset of the range (``None`` when unknown).
        evidence: what was found, naming offsets, sequence numbers and sources.
    """

    kind: FindingKind
    partition: int
    first_offset: int | None
    last_offset: int | None
    evidence: str

    def text(self) -> str:
        """One line: ``deleted journal:P:A..B: evidence``."""
        if self.first_offset is None:
            where = f"journal:{self.partition}" + (
                f":..{self.last_offset}" if self.last_offset is not None else ""
            )
        elif self.last_offset is None or self.last_offset == self.first_offset:
            where = f"journal:{self.partition}:{self.first_offset}"
        else:
            where = f"journal:{self.partition}:{self.first_offset}..{self.last_offset}"
        return f"{self.kind} {where}: {self.evidence}"


@dataclass(frozen=True)
class ChainStart:
    """Where a partition's chain starts.

    Attributes:
        partition: the journal partition.
        offset: offset of its first chained entry read (``None``: none read).
        seq: that entry's ``chain_seq``.
        unchained: entries without chain fields read before it (written by
            a release before the chain).
    """

    partition: int
    offset: int | None
    seq: int | None
    unchained: int


@dataclass
class ChainReport:
    """What :func:`verify_chains` found.

    Attributes:
        findings: every range named, by partition then offset.
        starts: partition -> where its chain starts.
        links_checked: chained entries whose link was checked.
        heads_checked: distinct witnessed heads checked.
    """

    findings: list[ChainFinding] = field(default_factory=list)
    starts: dict[int, ChainStart] = field(default_factory=dict)
    links_checked: int = 0
    heads_checked: int = 0


def _chain_members(ledger_id: str, partition: int, links: Sequence[Link]) -> list[Link]:
    """The links that belong to the chain.

    Every authentic one, and each other only where the chain breaks without it.

    Someone who may write the journal topic but holds no processor key can
    append records; readers refuse them (the audit lists them as
    unauthenticated), and the processor links its next entry to its own last
    one, so such an insertion leaves the chain whole and is not a chain
    finding. A rewrite in place also fails its seal, but there the chain does
    not link without it (the next entry names the hash of what was written),
    so it stays, and the walk names it. An unauthenticated record after the
    last authentic entry is left out (it is listed as unauthenticated; a
    witnessed head at its offset still names a rewrite there).
    """
    members: list[Link] = []
    for n, link in enumerate(links):
        if link.authentic:
            members.append(link)
            continue
        after = next((x for x in links[n + 1 :] if x.authentic and x.seq is not None), None)
        if after is None:
            continue
        last = next((x for x in reversed(members) if x.seq is not None), None)
        if last is not None:
            whole = after.seq == (last.seq or 0) + 1 and after.prev == last.digest
        else:
            whole = (after.seq == 0 and after.prev == genesis(ledger_id, partition)) or (
                link.seq is None or after.seq is None or link.seq != after.seq - 1
            )
        if not whole:
            members.append(link)
    return members


def _check_links(ledger_id: str, read: PartitionRead, report: ChainReport) -> None:
    """Walk one partition's links in offset order (see the module docstring)."""
    p = read.partition
    expected_seq: int | None = None
    expected_prev = ""
    last_offset: int | None = None
    unchained = 0
    for link in _chain_members(ledger_id, p, read.links):
        if link.seq is None or link.prev is None:
            if expected_seq is None and link.problem is None:
                unchained += 1  # written before the chain: read as it is
                continue
            why = link.problem or "it carries no chain fields"
            report.findings.append(
                ChainFinding(
                    "rewritten",
                    p,
                    link.offset,
                    link.offset,
                    f"a record inside the chain is not a chained journal entry ({why})",
                )
            )
            continue
        report.links_checked += 1
        if expected_seq is None:
            report.starts[p] = ChainStart(p, link.offset, link.seq, unchained)
            if link.seq > 0:
                report.findings.append(
                    ChainFinding(
                        "deleted",
                        p,
                        None,
                        link.offset - 1 if link.offset > 0 else None,
                        f"chain entries 0..{link.seq - 1} are gone: the first chained entry "
                        f"read (offset {link.offset}) has chain_seq {link.seq}; the log "
                        f"starts at offset {read.start} (DeleteRecords, retention or a "
                        "deleted segment moved it past them)",
                    )
                )
            elif link.prev != genesis(ledger_id, p):
                report.findings.append(
                    ChainFinding(
                        "rewritten",
                        p,
                        link.offset,
                        link.offset,
                        "chain_seq 0 does not link to this ledger's genesis hash of the "
                        "partition (an entry of another ledger or partition, or forged)",
                    )
                )
        elif link.seq > expected_seq:
            report.findings.append(
                ChainFinding(
                    "deleted",
                    p,
                    (last_offset + 1) if last_offset is not None else None,
                    link.offset - 1,
                    f"chain entries {expected_seq}..{link.seq - 1} are missing between "
                    f"offsets {last_offset} and {link.offset}",
                )
            )
        elif link.seq < expected_seq:
            report.findings.append(
                ChainFinding(
                    "rewritten",
                    p,
                    link.offset,
                    link.offset,
                    f"chain_seq {link.seq} repeats (expected {expected_seq} after offset "
                    f"{last_offset}): an entry inserted or copied into the chain",
                )
            )
        elif link.prev != expected_prev:
            report.findings.append(
                ChainFinding(
                    "rewritten",
                    p,
                    last_offset,
                    link.offset,
                    f"the entry at offset {last_offset} (chain_seq {expected_seq - 1}) hashes "
                    f"to {expected_prev[:16]}..., but the entry at offset {link.offset} "
                    f"links to {link.prev[:16]}...: one of them is not what was written",
                )
            )
        expected_seq, expected_prev, last_offset = link.seq + 1, link.digest, link.offset
    if p not in report.starts:
        report.starts[p] = ChainStart(p, None, None, unchained)


def _check_heads(
    read: PartitionRead | None, partition: int, heads: Iterable[WitnessedHead], report: ChainReport
) -> None:
    """Check one partition's witnessed heads against what was read of it."""
    by_offset = {link.offset: link for link in read.links} if read is not None else {}
    chained = [link for link in by_offset.values() if link.seq is not None]
    last_seq = max((link.seq for link in chained if link.seq is not None), default=-1)
    start = read.start if read is not None else 0
    end = read.end if read is not None else 0
    seen: set[tuple[int, int, str]] = set()
    truncated: WitnessedHead | None = None
    before: WitnessedHead | None = None
    for head in sorted(heads, key=lambda h: (h.offset, h.seq, h.source)):
        if (head.offset, head.seq, head.hash) in seen:
            continue
        seen.add((head.offset, head.seq, head.hash))
        report.heads_checked += 1
        link = by_offset.get(head.offset)
        if link is not None:
            if link.seq != head.seq or link.digest != head.hash:
                report.findings.append(
                    ChainFinding(
                        "rewritten",
                        partition,
                        head.offset,
                        head.offset,
                        f"the entry at offset {head.offset} (chain_seq {link.seq}, hash "
                        f"{link.digest[:16]}...) is not the one witnessed there by "
                        f"{head.source} (chain_seq {head.seq}, hash {head.hash[:16]}...)",
                    )
                )
        elif head.offset < start:  # whatever its chain_seq: the log start moved past it
            if before is None or head.offset > before.offset:
                before = head
        elif head.offset >= end or head.seq > last_seq:
            if truncated is None or head.offset > truncated.offset:
                truncated = head
        else:
            report.findings.append(
                ChainFinding(
                    "rewritten",
                    partition,
                    head.offset,
                    head.offset,
                    f"no journal entry at offset {head.offset}, where {head.source} "
                    f"witnessed chain_seq {head.seq}",
                )
            )
    if before is not None and not any(
        f.kind == "deleted" and f.partition == partition for f in report.findings
    ):
        emptied = " (the partition was emptied to its end)" if start >= end else ""
        report.findings.append(
            ChainFinding(
                "deleted",
                partition,
                None,
                start - 1,
                f"{before.source} witnessed chain_seq {before.seq} at offset "
                f"{before.offset}, before the log start {start}{emptied}: entries up to "
                "there are gone",
            )
        )
    if truncated is not None:
        report.findings.append(
            ChainFinding(
                "truncated",
                partition,
                end,
                truncated.offset,
                f"{truncated.source} witnessed chain_seq {truncated.seq} at offset "
                f"{truncated.offset}, but the partition ends at offset {end} with chain_seq "
                f"{last_seq if last_seq >= 0 else 'none'}: entries were cut off its end "
                "(or the topic was deleted and made again)",
            )
        )


def _check_log_start(read: PartitionRead, report: ChainReport) -> None:
    """Name the front of a partition whose log start was moved, when nothing named it yet.

    The journal is kept forever (``retention.ms`` -1, never compacted), so a
    log start above 0 means records were deleted, whatever is left after
    it: nothing (the partition emptied to its end), entries written before
    the chain, or a chain the processor started afresh at ``chain_seq`` 0
    once the entries it would have linked to were gone.
    """
    p = read.partition
    if read.start <= 0 or any(
        f.kind == "deleted" and f.partition == p and f.first_offset is None for f in report.findings
    ):
        return
    start = report.starts.get(p)
    if read.start >= read.end:
        left = "nothing is left to read (the partition was emptied to its end)"
    elif start is not None and start.offset is not None:
        left = (
            f"what is left starts at offset {read.start}"
            + (f" with {start.unchained} unchained entries" if start.unchained else "")
            + f", and its chain at chain_seq {start.seq} (offset {start.offset})"
        )
    else:
        left = f"what is left (offsets {read.start}..{read.end - 1}) holds no chained entry"
    report.findings.append(
        ChainFinding(
            "deleted",
            p,
            None,
            read.start - 1,
            f"the log starts at offset {read.start}; the journal is kept forever, so offsets "
            f"0..{read.start - 1} were deleted (DeleteRecords, or a retention set on the "
            f"topic); {left}; no witnessed head names what was there (pass the witness file, "
            "--witness FILE, to know how far the chain had reached)",
        )
    )


def verify_chains(
    ledger_id: str, partitions: Sequence[PartitionRead], heads: Iterable[WitnessedHead] = ()
) -> ChainReport:
    """Check every journal partition's chain end to end and against witnessed heads.

    Args:
        ledger_id: the ledger's identity (its genesis hashes depend on it).
        partitions: every journal partition as read (see :class:`PartitionRead`).
        heads: every head witnessed (heads topic, witness files), any order,
            duplicates allowed.

    Returns:
        The :class:`ChainReport`: findings by partition then offset (none
        for an intact journal), where each chain starts, and counts checked.
    """
    report = ChainReport()
    by_partition: dict[int, list[WitnessedHead]] = {}
    for head in heads:
        by_partition.setdefault(head.partition, []).append(head)
    reads = {r.partition: r for r in partitions}
    for p in sorted(set(reads) | set(by_partition)):
        found_before = len(report.findings)
        read = reads.get(p)
        if read is not None:
            _check_links(ledger_id, read, report)
        _check_heads(read, p, by_partition.get(p, ()), report)
        if read is not None:
            _check_log_start(read, report)
        report.findings[found_before:] = sorted(
            report.findings[found_before:],
            key=lambda f: (f.first_offset if f.first_offset is not None else -1, f.kind),
        )
    return report
