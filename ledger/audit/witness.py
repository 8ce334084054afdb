"""Whether the journal's heads are kept outside Kafka, and still on the heads topic (pure).

:mod:`ledger.audit.chain` checks every chain against the heads it is given.
What a head in Kafka alone cannot show is that the journal and the
``heads`` topic were not rewritten *together* by someone with broker
rights: only the copy the operator keeps outside Kafka (the witness file,
``LEDGER_WITNESS_FILE``) can. :func:`evaluate_witness` compares the three
sources (the chains as read, the heads topic, the witness files) and says
what follows, in the audit's two verdicts for it:

* **violations** (evidence was removed): the heads topic's log start is
  above 0 (it is kept forever, ``retention.ms`` -1, so only
  ``DeleteRecords`` or a retention an administrator set moves it); the
  witness holds a head of a partition past every head the topic holds of it
  (the topic deleted and made again, or emptied), or two or more heads
  before the topic's first head of it (made again, then written to). A head
  is handed to the witness just before the transaction that writes it to
  the topic commits, so only heads published longer ago than ``grace_s``
  count, and a single missing head before the topic's first may be one
  whose transaction a stopped processor never committed;
* **not verified** (the evidence that would show a rewrite is not at hand,
  which is never counted as its absence; the audit's ``NOT VERIFIED``):
  heads were published but no witness was given; the witness holds fewer
  or older heads of a partition than the topic (an old copy, another host's
  file, a witness that could not be written); or a chain advanced longer
  ago than ``grace_s`` and no head of it is anywhere, although the
  processor publishes one at most ``LEDGER_HEADS_INTERVAL_S`` after a
  chain advances (the heads topic deleted and made again, with no witness
  to show it).

Pure: the clock is ``now_ms``, passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ledger.audit.chain import PartitionRead, WitnessedHead


@dataclass(frozen=True)
class HeadsRead:
    """The ``heads`` topic (one partition) as the auditor read it.

    Attributes:
        start: its log start offset when read.
        end: the end offset read to.
        heads: the authentic heads on it, any order.
    """

    start: int
    end: int
    heads: tuple[WitnessedHead, ...]


@dataclass
class WitnessReport:
    """What :func:`evaluate_witness` found.

    Attributes:
        violations: evidence removed (one sentence each, naming the
            partition, the chain sequence and the source).
        unverified: why the chains cannot be shown unrewritten (one
            sentence each, naming what is missing and the remedy).
    """

    violations: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)


def _when(ms: int | None) -> str:
    if ms is None:
        return "at an unknown time"
    return "at " + datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _top(heads: Iterable[WitnessedHead]) -> WitnessedHead | None:
    return max(heads, key=lambda h: (h.seq, h.offset), default=None)


def _by_partition(heads: Iterable[WitnessedHead]) -> dict[int, list[WitnessedHead]]:
    out: dict[int, list[WitnessedHead]] = {}
    for h in heads:
        out.setdefault(h.partition, []).append(h)
    return out


def _heads_deleted(
    p: int,
    on_topic: list[WitnessedHead],
    held: list[WitnessedHead],
    settled_ms: int,
) -> str | None:
    """The violation when the witness holds heads of ``p`` the topic lost, else ``None``."""
    settled = [h for h in held if h.published_at_ms is None or h.published_at_ms <= settled_ms]
    top = _top(on_topic)
    ahead = [h for h in settled if top is None or h.seq > top.seq]
    if ahead:
        w = _top(ahead)
        assert w is not None
        has = (
            f"holds heads of journal:{p} only up to chain_seq {top.seq}"
            if top is not None
            else f"holds no head of journal:{p}"
        )
        return (
            f"heads of journal:{p} deleted from the heads topic: {w.source} holds chain_seq "
            f"{w.seq} at journal:{p}:{w.offset}, published {_when(w.published_at_ms)}, but "
            f"the heads topic {has}. The processor writes every head it hands the witness "
            "to the heads topic too, which is kept forever: the topic was deleted and made "
            "again, or its records deleted (a broker administrator's act). The witness file "
            "is the record that stands"
        )
    if top is None:
        return None
    first = min(on_topic, key=lambda h: (h.seq, h.offset))
    there = {(h.seq, h.hash) for h in on_topic}
    before = sorted(
        {
            (h.seq, h.offset): h
            for h in settled
            if h.seq < first.seq and (h.seq, h.hash) not in there
        }.items()
    )
    if len(before) < 2:
        return None  # one alone may be a head whose transaction was never committed
    low, high = before[0][1], before[-1][1]
    return (
        f"heads of journal:{p} deleted from the heads topic: the witness holds {len(before)} "
        f"heads of it (chain_seq {low.seq} to {high.seq}, {low.source} to {high.source}) "
        f"published before the first the heads topic holds (chain_seq {first.seq}, "
        f"{first.source}): the topic was deleted and made again (a broker administrator's "
        "act), and the processor published on into the new one. The witness file is the "
        "record that stands"
    )


def _unheaded(read: PartitionRead | None, settled_ms: int) -> tuple[int, int, int | None] | None:
    """The newest chained entry of a partition written before ``settled_ms``.

    ``(chain_seq, offset, written_ms)`` of the newest chained entry of a partition that
    was written before ``settled_ms``, or ``None``.
    """
    if read is None:
        return None
    old = [
        link
        for link in read.links
        if link.seq is not None and link.written_ms is not None and link.written_ms <= settled_ms
    ]
    newest = max(old, key=lambda link: link.seq or 0, default=None)
    if newest is None or newest.seq is None:
        return None
    return newest.seq, newest.offset, newest.written_ms


def evaluate_witness(
    partitions: Sequence[PartitionRead],
    topic: HeadsRead,
    witnessed: Sequence[WitnessedHead],
    files: Sequence[str],
    *,
    interval_s: float,
    grace_s: float,
    now_ms: int,
    absent: str | None = None,
) -> WitnessReport:
    """Say whether the chains' heads are witnessed outside Kafka and still on the heads topic.

    Args:
        partitions: every journal partition as read (links carry the
            Kafka timestamp they were written at, ``written_ms``).
        topic: the heads topic as read.
        witnessed: the authentic heads of the witness files, any order.
        files: the witness files given, as named to the operator (empty:
            no witness was given).
        interval_s: ``LEDGER_HEADS_INTERVAL_S``, the longest time (seconds)
            between a chain advancing and its head being published.
        grace_s: how long (seconds) after it was handed to the witness a
            head may still be missing from the topic (its transaction
            committing, or published again by the partition's next owner),
            and after which a chained entry must be named by a head
            somewhere; at least ``interval_s``.
        now_ms: the audit's start (wall clock, milliseconds since the epoch).
        absent: the witness file looked for and not found (said when no
            witness was given), ``None`` when none was looked for.

    Returns:
        The :class:`WitnessReport`: violations and reasons the audit is not
        verified, by partition (the heads topic's own log start first).
    """
    report = WitnessReport()
    settled_ms = now_ms - int(grace_s * 1000)
    if topic.start > 0:
        emptied = " and holds nothing (emptied to its end)" if topic.start >= topic.end else ""
        report.violations.append(
            f"deleted heads:0:0..{topic.start - 1}: the heads topic starts at offset "
            f"{topic.start}{emptied}; it is kept forever (retention.ms -1), so its first "
            f"{topic.start} record(s) were deleted (DeleteRecords, or a retention set on it: a "
            "broker administrator's act on the evidence of the journal's heads)"
        )
    on_topic = _by_partition(topic.heads)
    held = _by_partition(witnessed)
    reads = {r.partition: r for r in partitions}
    where = ", ".join(files)
    published: list[str] = []
    for p in sorted(set(reads) | set(on_topic) | set(held)):
        top, wtop = _top(on_topic.get(p, ())), _top(held.get(p, ()))
        if files:
            deleted = _heads_deleted(p, on_topic.get(p, []), held.get(p, []), settled_ms)
            if deleted is not None:
                report.violations.append(deleted)
        if top is not None and not files:
            published.append(f"chain_seq {top.seq} at journal:{p}:{top.offset}")
        elif top is not None and (wtop is None or wtop.seq < top.seq):
            holds = f"up to chain_seq {wtop.seq}" if wtop is not None else f"none of journal:{p}"
            report.unverified.append(
                f"heads up to chain_seq {top.seq} at journal:{p} were published; the witness "
                f"{where} holds {holds}: pass the witness file of every processor host that "
                f"owned journal:{p} (--witness FILE, repeated), or a current copy"
            )
        if top is None and wtop is None:
            unheaded = _unheaded(reads.get(p), settled_ms)
            if unheaded is not None:
                seq, offset, written_ms = unheaded
                nowhere = "on the heads topic" + (f" or in the witness {where}" if files else "")
                remedy = (
                    f"pass the witness file of the processor host that owned journal:{p} "
                    "(--witness FILE)"
                    if files
                    else "pass --witness FILE (the processor's LEDGER_WITNESS_FILE"
                    + (f"; {absent} is not on this host" if absent else "")
                    + ")"
                )
                report.unverified.append(
                    f"journal:{p}'s chain reached chain_seq {seq} (journal:{p}:{offset}, "
                    f"written {_when(written_ms)}), but no head of it is {nowhere}, although "
                    f"the processor publishes one at most {interval_s:g} s "
                    "(LEDGER_HEADS_INTERVAL_S) after a chain advances: the heads topic may "
                    "have been deleted and made again, or the processor stopped before it "
                    f"published; {remedy}"
                )
    if published:
        report.unverified.insert(
            0,
            "no witness given: pass --witness FILE (the processor's LEDGER_WITNESS_FILE"
            + (f"; {absent} is not on this host" if absent else "")
            + f"); heads up to {', '.join(published)} were published, and only their copy kept "
            "outside Kafka shows that the heads topic and the journal were not rewritten "
            "together",
        )
    return report
