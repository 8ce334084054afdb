"""The processor's side of the journal's hash chain (:mod:`ledger.chain`).

The processor is the journal's only writer, and the one processor that owns
a partition writes all of its entries. :class:`JournalChain` keeps, for each
journal partition it owns, the head of the partition's chain (the last
entry's ``chain_seq`` and chain hash), links every new entry to it, and
advances the head with the transaction: an entry written in a transaction
that aborts never happened, so its link is dropped with it
(:meth:`JournalChain.abort`) and the next entry takes its place in the chain.

On assignment (a start, a takeover, a restore after a fatal error) the head
is read back from Kafka: the partition's last committed, authentic journal
entry (:func:`read_heads`), once the previous owner's last transaction has
ended. There is no fork: a processor that lost the partition (a zombie) is
fenced by the transactions, whose consumer offsets the group coordinator
checks against its generation (KIP-447), so its entries never commit and
the new owner continues from the last entry that did. The chain of a
partition whose last entry was written before this release (no chain
fields), or of an empty partition, starts afresh from the partition's
genesis hash (``chain_seq`` 0); the audit says at which offset
(:mod:`ledger.audit.chain`).

It also remembers, per operation, the ref of the intent whose bytes the
journal keeps (committed with the transaction too), so that a re-published
identical intent is journaled by reference to it
(:func:`ledger.fold.repeats`). An operation restored from ``ledger.state``
has none yet: its first repeat after a restore is journaled with its bytes
and becomes the reference.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaError, Message

from consumers.retry import KafkaRetry
from consumers.stage import Record, Writer, await_settled, read_partition
from ledger.authn import Keyring
from ledger.chain import ChainHead, entry_hash
from ledger.events import JournalEntry, decode_event
from ledger.settings import LedgerSettings
from ledger.topology import Topic

log = logging.getLogger(__name__)

#: Offsets read back from a partition's end at first to find its last entry
#: (widened while none is found: aborted transactions leave markers and
#: records a ``read_committed`` reader skips).
TAIL_FIRST = 64


def read_heads(
    settings: LedgerSettings,
    partitions: set[int],
    keyring: Keyring,
    retry: KafkaRetry | None = None,
    *,
    reader: Callable[..., int] = read_partition,
    settle: Callable[..., float] = await_settled,
) -> dict[int, ChainHead]:
    """The head of each journal partition's chain, from its last committed entry.

    Reads each partition's tail (``read_committed``, after waiting out open
    transactions), widening it until an authentic journal entry is found or
    the whole partition was read. A record whose seal is missing or wrong is
    passed over (the processor never links to what it did not write; the
    audit names it).

    Args:
        settings: ledger settings.
        partitions: journal partitions.
        keyring: checks the seals.
        retry: how retriable errors are ridden out (the stage's).
        reader: reads a topic's partitions (:func:`~consumers.stage.read_partition`).
        settle: waits out open transactions (:func:`~consumers.stage.await_settled`).

    Returns:
        Partition -> its head: the last authentic entry's ``chain_seq``,
        chain hash and offset, or :meth:`ChainHead.empty` when that entry
        carries no chain fields (written before the chain) or there is none.

    Raises:
        LedgerError: the journal could not be read (as
            :func:`~consumers.stage.read_partition`).
    """
    heads: dict[int, ChainHead] = {}
    settle(settings, Topic.JOURNAL, partitions, retry=retry)
    todo, tail = set(partitions), TAIL_FIRST
    while todo:
        last: dict[int, Message] = {}
        ends: dict[int, int] = {}

        def keep(_: Record | None, msg: Message, last: dict[int, Message] = last) -> None:
            last[msg.partition() or 0] = msg  # in offset order: the last one stays

        reader(
            settings,
            Topic.JOURNAL,
            todo,
            keep,
            decode=False,
            keyring=keyring,
            on_refused=lambda msg, why: log.error(
                "processor: journal:%s:%s passed over for the chain head: %s",
                msg.partition(),
                msg.offset(),
                why,
            ),
            retry=retry,
            ends_out=ends,
            tail=tail,
        )
        for p in sorted(todo):
            msg = last.get(p)
            if msg is not None:
                heads[p] = _head_of(settings.ledger_identity, p, msg)
            elif ends.get(p, 0) <= tail:
                heads[p] = ChainHead.empty(settings.ledger_identity, p)
        todo = {p for p in todo if p not in heads}
        tail *= 8
    return heads


def _head_of(ledger_id: str, partition: int, msg: Message) -> ChainHead:
    """The chain head a journal record gives (empty when it is not chained)."""
    value = msg.value() or b""
    try:
        entry = decode_event(value)
    except Exception as exc:  # an authentic record that does not decode: reported, not linked
        log.error(
            "processor: journal:%s:%s does not decode (%s); the chain starts afresh",
            partition,
            msg.offset(),
            exc,
        )
        return ChainHead.empty(ledger_id, partition)
    if not isinstance(entry, JournalEntry) or entry.chain_seq is None:
        return ChainHead.empty(ledger_id, partition)
    digest = entry_hash(partition, msg.key() or b"", value)
    return ChainHead(partition, entry.chain_seq, digest, msg.offset() or 0)


class JournalChain:
    """Heads of the journal partitions one processor owns, advanced with its transactions.

    Args:
        ledger_id: the ledger's identity (its genesis hashes).
        read: ``partitions -> heads`` read back from Kafka on assignment
            (:func:`read_heads` in a stage; tests pass their own).
    """

    def __init__(self, ledger_id: str, read: Callable[[set[int]], dict[int, ChainHead]]) -> None:
        self.ledger_id = ledger_id
        self.read = read
        #: partition -> head of the committed chain.
        self.committed: dict[int, ChainHead] = {}
        #: partition -> head including the open transaction's entries.
        self.pending: dict[int, ChainHead] = {}
        #: (partition, chain hash) -> offset, from delivery reports not yet matched.
        self._offsets: dict[tuple[int, str], int] = {}
        #: operation -> ref of its intent whose bytes the journal keeps (committed).
        self.refs: dict[str, str] = {}
        self._pending_refs: dict[str, str] = {}
        #: (operation, SHA-256 of the bytes) -> ref of a drifted intent journaled
        #: with its bytes (committed), for identical drifts journaled by reference.
        self.drift_refs: dict[tuple[str, str], str] = {}
        self._pending_drift_refs: dict[tuple[str, str], str] = {}

    def restore(self, partitions: set[int]) -> None:
        """Read the heads of newly assigned partitions back from Kafka."""
        if not partitions:
            return
        heads = self.read(partitions)
        for p in partitions:
            self.committed[p] = heads.get(p) or ChainHead.empty(self.ledger_id, p)
            self.pending.pop(p, None)
        log.info(
            "processor: journal chain heads %s",
            {p: (h.seq, h.offset) for p, h in sorted(self.committed.items()) if p in partitions},
        )

    def forget(self, partitions: set[int], operations: Iterable[str]) -> None:
        """Drop the heads of revoked partitions and the refs of their operations."""
        for p in partitions:
            self.committed.pop(p, None)
            self.pending.pop(p, None)
        gone = set(operations)
        for op in gone:
            self.refs.pop(op, None)
            self._pending_refs.pop(op, None)
        for refs in (self.drift_refs, self._pending_drift_refs):
            for op_sha in [k for k in refs if k[0] in gone]:
                del refs[op_sha]

    def write(self, out: Writer, partition: int, key: str, entry: JournalEntry) -> JournalEntry:
        """Link ``entry`` into its partition's chain and write it into the open transaction.

        Args:
            out: the transaction's writer.
            partition: the journal partition (the operation's, as its input's).
            key: the record key (operation ID).
            entry: the entry, chain fields unset.

        Returns:
            The entry as written (with ``chain_seq`` and ``chain_prev``).
        """
        head = self.pending.get(partition) or self.committed.get(partition)
        if head is None:  # not restored (a test driving handle directly): from genesis
            head = self.committed[partition] = ChainHead.empty(self.ledger_id, partition)
        seq, prev = head.next_link()
        linked = entry.model_copy(update={"chain_seq": seq, "chain_prev": prev})
        value = linked.to_bytes()
        digest = entry_hash(partition, key.encode("utf-8"), value)
        self.pending[partition] = ChainHead(partition, seq, digest)
        out.write_raw(Topic.JOURNAL, key, value, on_delivery=self._delivered, partition=partition)
        if out.observe is not None:
            out.observe(Topic.JOURNAL, linked)
        return linked

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        """A delivery report: learn the offset of an entry that may be a head."""
        if err is not None:
            return  # the transaction fails and aborts; its links are dropped
        p, value = msg.partition() or 0, msg.value() or b""
        digest = entry_hash(p, msg.key() or b"", value)
        head = self.committed.get(p)
        if head is not None and head.hash == digest:
            self.committed[p] = ChainHead(p, head.seq, digest, msg.offset() or 0)
        else:
            self._offsets[(p, digest)] = msg.offset() or 0

    def repeat_ref(self, operation_id: str) -> str | None:
        """The ref of the operation's intent whose bytes the journal keeps, if known."""
        return self._pending_refs.get(operation_id) or self.refs.get(operation_id)

    def keep_ref(self, operation_id: str, ref: str) -> None:
        """The open transaction journals this intent of the operation with its bytes."""
        self._pending_refs.setdefault(operation_id, ref)

    def drift_ref(self, operation_id: str, sha256: str) -> str | None:
        """The ref of a drifted intent of the operation with these very bytes, if journaled.

        Args:
            operation_id: the operation.
            sha256: hex SHA-256 of the intent's bytes as read.
        """
        key = (operation_id, sha256)
        return self._pending_drift_refs.get(key) or self.drift_refs.get(key)

    def keep_drift(self, operation_id: str, sha256: str, ref: str) -> None:
        """The open transaction journals this drifted intent with its bytes (``sha256``)."""
        self._pending_drift_refs.setdefault((operation_id, sha256), ref)

    def commit(self) -> None:
        """The transaction committed: its links and refs become the committed chain."""
        for p, head in self.pending.items():
            offset = self._offsets.get((p, head.hash), -1)
            self.committed[p] = ChainHead(p, head.seq, head.hash, offset)
        self.pending.clear()
        self._offsets.clear()
        for op, ref in self._pending_refs.items():
            self.refs.setdefault(op, ref)
        self._pending_refs.clear()
        for op_sha, ref in self._pending_drift_refs.items():
            self.drift_refs.setdefault(op_sha, ref)
        self._pending_drift_refs.clear()

    def abort(self) -> None:
        """The transaction aborted: its links and refs never happened."""
        self.pending.clear()
        self._offsets.clear()
        self._pending_refs.clear()
        self._pending_drift_refs.clear()

    def heads(self) -> dict[int, ChainHead]:
        """Committed heads whose offset is known (the ones that can be published)."""
        return {p: h for p, h in self.committed.items() if h.offset >= 0 and h.seq >= 0}


__all__ = ["TAIL_FIRST", "JournalChain", "read_heads"]
