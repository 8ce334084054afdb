"""The journal's hash chain: each entry of a partition commits to the one before it.

Every ``journal`` partition is a hash chain (the construction of a
tamper-evident log, as in Crosby and Wallach, "Efficient Data Structures for
Tamper-Evident Logging", USENIX Security 2009, and the linked-timestamping
schemes before it). Entry *n* of partition *p* carries ``chain_seq = n`` and
``chain_prev`` = the chain hash of entry *n - 1*; entry 0 carries the
partition's :func:`genesis` hash. An entry's own chain hash is
:func:`entry_hash` over the partition, the record key and the record value
bytes exactly as written (the value holds ``chain_seq`` and ``chain_prev``, so
the hash commits to the whole chain before it). Editing, dropping or
re-ordering any committed entry therefore changes a hash that a later entry,
or a head witnessed outside Kafka, has already fixed.

The canonical encoding hashed is a domain tag and length-prefixed fields
(big-endian lengths), never a concatenation that two inputs could share:

* genesis: ``SHA-256(TAG || "genesis" || u32 len(ledger_id) || ledger_id || u32 partition)``;
* entry: ``SHA-256(TAG || "entry" || u32 partition || u32 len(key) || key ||
  u64 len(value) || value)``.

The ledger's identity in the genesis hash makes one ledger's chain useless
in another. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

#: The domain tag every chain hash starts with (its version: a new
#: construction gets a new tag).
TAG = b"recovery-ledger/journal-chain/v1\x00"

#: Length of a chain hash in hex characters (SHA-256).
HASH_HEX_LEN = 64


def genesis(ledger_id: str, partition: int) -> str:
    """The hash entry 0 of a partition links to.

    Args:
        ledger_id: the ledger's identity (``LEDGER_ID``, by default its topic prefix).
        partition: the journal partition (0 or more).

    Returns:
        64 lowercase hex characters.
    """
    ident = ledger_id.encode("utf-8")
    h = hashlib.sha256(TAG)
    h.update(b"genesis")
    h.update(len(ident).to_bytes(4, "big"))
    h.update(ident)
    h.update(partition.to_bytes(4, "big"))
    return h.hexdigest()


def entry_hash(partition: int, key: bytes, value: bytes) -> str:
    """The chain hash of one journal record as written.

    Args:
        partition: the journal partition it is on.
        key: its key bytes (the operation ID, UTF-8).
        value: its value bytes (the single-object-encoded entry, holding
            ``chain_seq`` and ``chain_prev``).

    Returns:
        64 lowercase hex characters.
    """
    h = hashlib.sha256(TAG)
    h.update(b"entry")
    h.update(partition.to_bytes(4, "big"))
    h.update(len(key).to_bytes(4, "big"))
    h.update(key)
    h.update(len(value).to_bytes(8, "big"))
    h.update(value)
    return h.hexdigest()


@dataclass(frozen=True)
class ChainHead:
    """The last entry of one partition's chain (what the next entry links to).

    Attributes:
        partition: the journal partition.
        seq: ``chain_seq`` of the last entry; ``-1`` while the chain is empty.
        hash: its chain hash; the :func:`genesis` hash while the chain is empty.
        offset: its journal offset; ``-1`` while empty or not yet known (the
            offset of a record is known once the broker acknowledged it).
    """

    partition: int
    seq: int
    hash: str
    offset: int = -1

    @classmethod
    def empty(cls, ledger_id: str, partition: int) -> ChainHead:
        """The head of a partition with no chained entry yet (genesis)."""
        return cls(partition, -1, genesis(ledger_id, partition), -1)

    def next_link(self) -> tuple[int, str]:
        """``(chain_seq, chain_prev)`` of the entry that follows this head."""
        return self.seq + 1, self.hash
