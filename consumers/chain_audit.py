"""The auditor's reading of the journal's hash chains and of the witnessed heads.

:class:`ChainCollector` is handed every journal record the auditor reads
(authentic or not: a rewritten record is one whose seal no longer matches)
and keeps its chain fields and chain hash; :func:`check_chains` adds the
partitions' log starts, the heads found on the ``heads`` topic and in the
witness file, and runs the pure :func:`ledger.audit.chain.verify_chains` and
:func:`ledger.audit.witness.evaluate_witness`. The findings are audit
violations under the invariant ``journal-chain``; a chain that cannot be
shown unrewritten (heads published but no witness, or a witness short of
them) makes the audit NOT VERIFIED.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message, TopicPartition

from consumers.heads import read_witness_file, witnessed_head
from ledger.audit.chain import ChainReport, Link, PartitionRead, WitnessedHead, verify_chains
from ledger.audit.report import Findings
from ledger.audit.witness import HeadsRead, evaluate_witness
from ledger.authn import Keyring
from ledger.chain import entry_hash
from ledger.errors import LocalFileError
from ledger.events import Event, JournalEntry, JournalHead
from ledger.kafka import make_consumer
from ledger.settings import LedgerSettings
from ledger.topology import TOPICS

log = logging.getLogger(__name__)

#: The invariant chain findings are reported under.
INVARIANT = "journal-chain"


@dataclass
class ChainCollector:
    """Keeps each journal record's place in its chain, as read.

    Attributes:
        links: partition -> its records in offset order.
    """

    links: dict[int, list[Link]] = field(default_factory=dict)

    def __call__(self, msg: Message, event: Event | None, authentic: bool = True) -> None:
        """Take one journal record.

        ``event`` is its decoded value (``None`` if it has none); ``authentic``
        whether its seal verified.
        """
        p, offset, value = msg.partition() or 0, msg.offset() or 0, msg.value()
        digest = entry_hash(p, msg.key() or b"", value or b"")
        kind, ts = msg.timestamp()
        written_ms = int(ts) if kind != TIMESTAMP_NOT_AVAILABLE else None
        if isinstance(event, JournalEntry):
            link = Link(
                offset, event.chain_seq, event.chain_prev, digest, None, authentic, written_ms
            )
        else:
            what = (
                "a tombstone"
                if value is None
                else "it does not decode"
                if event is None
                else f"a {event.KIND}"
            )
            link = Link(offset, None, None, digest, what, authentic, written_ms)
        self.links.setdefault(p, []).append(link)


#: Seconds, beyond ``LEDGER_HEADS_INTERVAL_S`` and the transaction timeout, that a
#: head handed to the witness may take to reach the heads topic (its transaction
#: aborted with its processor, the partition's next owner assigned and publishing
#: it again), and a chained entry to be named by a head.
HEADS_SETTLE_S = 60.0


def _log_starts(
    settings: LedgerSettings, partitions: set[int], topic: str = "journal"
) -> dict[int, int]:
    """Each partition's log start offset (low watermark) of a topic (short name)."""
    consumer = make_consumer(settings, f"{settings.topic_prefix}.reader")
    try:
        full = settings.topic(topic)
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(full, p), timeout=30)[0])
            for p in partitions
        }
    finally:
        consumer.close()


#: The invariant of records deleted from a topic kept forever (other than the journal's).
KEPT_FOREVER = "kept-forever"


def kept_forever_topics() -> tuple[str, ...]:
    """Audited topics that keep every record forever by deletion policy.

    Never compacted; ``journal`` and ``heads`` are left out (their deletions
    the chain names).

    Nothing of the ledger deletes from them, and DeleteRecords is the only way to
    (the broker refuses it on a compacted topic): a log start above 0 there is
    evidence removed by someone with broker rights, e.g. a revocation cut from
    ``approvals`` with the grants before it written back, or a policy change
    cut from ``policy``.
    """
    return tuple(
        t.name
        for t in TOPICS
        if t.audited and t.cleanup == "delete" and t.name not in ("journal", "heads")
    )


def deleted_ranges(settings: LedgerSettings, ends: dict[str, dict[int, int]]) -> list[str]:
    """``TOPIC:P:..N-1`` evidence lines for every kept-forever partition deleted from.

    That is, whose log start ``N`` is above 0 (``ends``: topic -> partition ->
    end offset, as the audit read them).
    """
    found: list[str] = []
    for topic in kept_forever_topics():
        parts = {p for p, end in ends.get(topic, {}).items() if end > 0}
        for p, start in sorted(_log_starts(settings, parts, topic).items()):
            if start > 0:
                found.append(
                    f"deleted {topic}:{p}:..{start - 1}: the partition starts at offset "
                    f"{start}, but {settings.topic(topic)} keeps every record forever and "
                    "nothing of the ledger deletes from it: records were removed with broker "
                    "rights (DeleteRecords), and what they said (a revocation, a policy, a use "
                    "of an approval) is gone from what the stages read"
                )
    return found


def check_chains(
    settings: LedgerSettings,
    keyring: Keyring,
    collector: ChainCollector,
    ends: dict[int, int],
    head_records: list[Event],
    witness: Sequence[Path],
    *,
    heads_end: int = 0,
    now_ms: int | None = None,
) -> tuple[ChainReport, Findings, dict[str, object]]:
    """Verify every journal chain against what was read and witnessed.

    Args:
        settings: the ledger's settings.
        keyring: checks the witness file's seals.
        collector: the journal records read (every partition, from its start).
        ends: partition -> end offset the journal was read to.
        head_records: the authentic records of the ``heads`` topic.
        witness: the witness files to read (none: only the heads topic, and
            the audit is not verified once heads were published).
        heads_end: the end offset the ``heads`` topic was read to.
        now_ms: the audit's start (wall clock, milliseconds; default now).

    Returns:
        ``(report, findings, summary)``: the chain report, its findings as
        ``journal-chain`` violations (witness lines that cannot be used, and
        heads deleted from the heads topic, included), and a JSON-ready
        summary for the audit report (``{"partitions": [{"partition",
        "starts_at", "seq", "unchained"}], "heads_checked": int, "witness":
        the files, comma-separated, or None, "unverifiable_witness_lines":
        [lines sealed by keys not known here], "unverified": [why the chains
        cannot be shown unrewritten: no witness, a witness short of the heads
        topic, a chain with no head anywhere]}``: the auditor lists the
        lines among its unverifiable records, and either list makes the
        audit NOT VERIFIED (:mod:`ledger.audit.witness`).

    Raises:
        LocalFileError: the witness file cannot be read.
    """
    starts = _log_starts(settings, set(ends))
    reads = [
        PartitionRead(p, starts.get(p, 0), end, tuple(collector.links.get(p, ())))
        for p, end in sorted(ends.items())
    ]
    on_topic: list[WitnessedHead] = [
        witnessed_head(h, f"the heads topic ({h.writer} at {h.published_at_ms} ms)")
        for h in head_records
        if isinstance(h, JournalHead)
    ]
    witnessed: list[WitnessedHead] = []
    problems: list[str] = []
    unverifiable_lines: list[dict[str, object]] = []
    for path in witness:
        try:
            found, bad = read_witness_file(
                path, settings.ledger_identity, keyring, unverifiable_lines
            )
        except OSError as exc:
            raise LocalFileError(
                f"cannot read the witness file {path}: {exc.strerror or exc}; name a readable "
                "copy with --witness FILE (or LEDGER_WITNESS_FILE)"
            ) from exc
        witnessed += found
        problems += bad
    report = verify_chains(settings.ledger_identity, reads, on_topic + witnessed)
    heads_start = _log_starts(settings, {0}, "heads").get(0, 0) if heads_end > 0 else 0
    kept = evaluate_witness(
        reads,
        HeadsRead(heads_start, heads_end, tuple(on_topic)),
        witnessed,
        [str(p) for p in witness],
        interval_s=settings.heads_interval_s,
        grace_s=settings.heads_interval_s + settings.transaction_timeout_ms / 1000 + HEADS_SETTLE_S,
        now_ms=int(time.time() * 1000) if now_ms is None else now_ms,
        absent=None
        if witness or settings.witness_path().exists()
        else str(settings.witness_path()),
    )
    findings = Findings(INVARIANT)
    findings.check(report.links_checked + report.heads_checked)
    for f in report.findings:
        findings.violation(None, f.text())
    for problem in problems + kept.violations:
        findings.violation(None, problem)
    summary: dict[str, object] = {
        "partitions": [
            {
                "partition": s.partition,
                "starts_at": s.offset,
                "seq": s.seq,
                "unchained": s.unchained,
            }
            for _, s in sorted(report.starts.items())
        ],
        "heads_checked": report.heads_checked,
        "witness": ", ".join(str(p) for p in witness) or None,
        "unverifiable_witness_lines": unverifiable_lines,
        "unverified": kept.unverified,
    }
    if report.findings or kept.violations:
        log.error(
            "auditor: %d journal chain finding(s)", len(report.findings) + len(kept.violations)
        )
    return report, findings, summary
