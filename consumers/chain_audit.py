"""The auditor's reading of the journal's hash chains and of the witnessed heads.

:class:`ChainCollector` is handed every journal record the auditor reads
(authentic or not: a rewritten record is one whose seal no longer matches)
and keeps its chain fields and chain hash; :func:`check_chains` adds the
partitions' log starts, the heads found on the ``heads`` topic and in the
witness file, and runs the pure :func:`ledger.audit.chain.verify_chains`.
The findings are audit violations under the invariant ``journal-chain``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Message, TopicPartition

from consumers.heads import read_witness_file, witnessed_head
from ledger.audit.chain import ChainReport, Link, PartitionRead, WitnessedHead, verify_chains
from ledger.audit.report import Findings
from ledger.authn import Keyring
from ledger.chain import entry_hash
from ledger.errors import LocalFileError
from ledger.events import Event, JournalEntry, JournalHead
from ledger.kafka import consumer_config
from ledger.settings import LedgerSettings

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
        """One journal record (``event``: its decoded value, ``None`` if it has none;
        ``authentic``: whether its seal verified)."""
        p, offset, value = msg.partition() or 0, msg.offset() or 0, msg.value()
        digest = entry_hash(p, msg.key() or b"", value or b"")
        if isinstance(event, JournalEntry):
            link = Link(offset, event.chain_seq, event.chain_prev, digest, None, authentic)
        else:
            what = (
                "a tombstone"
                if value is None
                else "it does not decode"
                if event is None
                else f"a {event.KIND}"
            )
            link = Link(offset, None, None, digest, what, authentic)
        self.links.setdefault(p, []).append(link)


def _log_starts(settings: LedgerSettings, partitions: set[int]) -> dict[int, int]:
    """Each journal partition's log start offset (low watermark)."""
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}.reader"))
    try:
        full = settings.topic("journal")
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(full, p), timeout=30)[0])
            for p in partitions
        }
    finally:
        consumer.close()


def check_chains(
    settings: LedgerSettings,
    keyring: Keyring,
    collector: ChainCollector,
    ends: dict[int, int],
    head_records: list[Event],
    witness: Sequence[Path],
) -> tuple[ChainReport, Findings, dict[str, object]]:
    """Verify every journal chain against what was read and witnessed.

    Args:
        settings: the ledger's settings.
        keyring: checks the witness file's seals.
        collector: the journal records read (every partition, from its start).
        ends: partition -> end offset the journal was read to.
        head_records: the authentic records of the ``heads`` topic.
        witness: the witness files to read (none: only the heads topic).

    Returns:
        ``(report, findings, summary)``: the chain report, its findings as
        ``journal-chain`` violations (witness lines that cannot be used
        included), and a JSON-ready summary for the audit report
        (``{"partitions": [{"partition", "starts_at", "seq", "unchained"}],
        "heads_checked": int, "witness": the files, comma-separated, or None,
        "unverifiable_witness_lines": [lines sealed by keys not known here]}``:
        the auditor lists those among its unverifiable records).

    Raises:
        LocalFileError: the witness file cannot be read.
    """
    starts = _log_starts(settings, set(ends))
    reads = [
        PartitionRead(p, starts.get(p, 0), end, tuple(collector.links.get(p, ())))
        for p, end in sorted(ends.items())
    ]
    heads: list[WitnessedHead] = [
        witnessed_head(h, f"the heads topic ({h.writer} at {h.published_at_ms} ms)")
        for h in head_records
        if isinstance(h, JournalHead)
    ]
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
        heads += found
        problems += bad
    report = verify_chains(settings.ledger_identity, reads, heads)
    findings = Findings(INVARIANT)
    findings.check(report.links_checked + report.heads_checked)
    for f in report.findings:
        findings.violation(None, f.text())
    for problem in problems:
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
    }
    if report.findings:
        log.error("auditor: %d journal chain finding(s)", len(report.findings))
    return report, findings, summary
