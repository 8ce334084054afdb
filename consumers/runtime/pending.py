"""A committed-plus-pending map: what a stage knows, and what its open transaction would change.

A stage that writes in Kafka transactions keeps two kinds of in-memory
state: what its committed transactions made true, and what the open
transaction decided (true only if it commits). A read inside the
transaction must see both (the open transaction's changes laid over the
committed entries); a commit makes the changes committed; an abort drops
them, and the committed entries are as before. :class:`PendingMap` keeps the
two apart so that no stage hand-rolls the pair (the write-ahead view of
Kafka Streams' transactional state stores, and quixstreams' state
transactions, keep their pending writes the same way).

A change is either a put (a new value for a key) or a drop (the key is
removed on commit). A put may stage a value of another type than the
committed one (for example a decoded state and its encoded bytes); the
``merge`` given at construction turns it into the committed value on commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
S = TypeVar("S")
V = TypeVar("V")


class _Dropped:
    """Marks a key the open transaction removes."""


_DROPPED = _Dropped()


class PendingMap(Generic[K, S, V]):
    """Committed entries (``K -> V``) and the open transaction's changes (``K -> S`` or drop).

    Attributes:
        committed: the entries committed transactions made true. A stage
            fills it directly when it restores (nothing is open then) and
            forgets entries of revoked partitions with :meth:`forget`.

    Args:
        merge: turns a staged value into its committed value on commit
            (``merge(key, staged)``).
    """

    def __init__(self, merge: Callable[[K, S], V]) -> None:
        self.committed: dict[K, V] = {}
        self._merge = merge
        self._changes: dict[K, S | _Dropped] = {}

    def put(self, key: K, value: S) -> None:
        """Stage a new value for ``key`` (committed by :meth:`commit`)."""
        self._changes[key] = value

    def drop(self, key: K) -> None:
        """Stage the removal of ``key`` (removed by :meth:`commit`)."""
        self._changes[key] = _DROPPED

    def staged(self, key: K) -> S | None:
        """The value the open transaction put for ``key``, or ``None`` (none put, or dropped)."""
        change = self._changes.get(key)
        return None if isinstance(change, _Dropped) else change

    def is_dropped(self, key: K) -> bool:
        """Whether the open transaction removes ``key``."""
        return isinstance(self._changes.get(key), _Dropped)

    def staged_keys(self) -> list[K]:
        """Keys the open transaction put a value for, in the order first staged."""
        return [k for k, change in self._changes.items() if not isinstance(change, _Dropped)]

    def get(self, key: K) -> S | V | None:
        """The value as the open transaction sees it: staged over committed (``None``: absent)."""
        change = self._changes.get(key, None)
        if change is None:
            return self.committed.get(key)
        return None if isinstance(change, _Dropped) else change

    def __contains__(self, key: K) -> bool:
        """Whether ``key`` is present as the open transaction sees it."""
        if key in self._changes:
            return not isinstance(self._changes[key], _Dropped)
        return key in self.committed

    def commit(self) -> dict[K, S]:
        """Make the staged changes committed; the open transaction is empty again.

        Returns:
            The values that were put (key -> staged value, in staging order),
            for a stage that updates something else from them.
        """
        put: dict[K, S] = {}
        for key, change in self._changes.items():
            if isinstance(change, _Dropped):
                self.committed.pop(key, None)
            else:
                put[key] = change
                self.committed[key] = self._merge(key, change)
        self._changes.clear()
        return put

    def abort(self) -> None:
        """Drop the staged changes; the committed entries stay as they were."""
        self._changes.clear()

    def forget(self, key: K) -> None:
        """Remove ``key`` entirely: committed and staged (its partition was revoked)."""
        self.committed.pop(key, None)
        self._changes.pop(key, None)


def kept(_: object, value: V) -> V:
    """The ``merge`` of a map whose staged values are committed as they are."""
    return value
