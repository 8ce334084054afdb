"""Noticing a consumer that silently stopped fetching a partition.

After broker instability (a leader killed, the whole cluster restarted) a
librdkafka consumer can keep a partition assigned and fetch nothing from it,
with no error, for as long as it lives: its lag grows while the stage looks
idle and healthy, and only a new consumer reads on (librdkafka#2363,
#2830; quix-streams#1124 reports the same silent stall). A stage's
consumer is the only reader of its partitions, so such a stall stops the
ledger: in the three-broker chaos mission no operation changed state for
five minutes after a full-cluster restart while every stage was idle.

:class:`FetchWatch` is the pure part of the check: given each assigned
partition's position and last stable offset, sampled now and then, it names
the partitions that stayed behind with an unmoved position for
``stall_s`` seconds. The stage then confirms with a fresh reader that a
record is really there (a transaction marker can sit between a position and
the end without anything to deliver) before it replaces its consumer.
"""

from __future__ import annotations

#: A partition: ``(topic, partition)``.
Key = tuple[str, int]


class FetchWatch:
    """Which partitions stayed behind, position unmoved, for ``stall_s`` seconds.

    Only time the stage spent idle counts: it samples when a poll returned
    nothing, and a gap of more than ``max_gap_s`` since the previous sample
    (the loop was busy handling records, which a partition's position does
    not show while another partition's batch is handled) starts every wait
    afresh.

    Args:
        stall_s: seconds a partition may stay behind its end with the same
            position before it is named.
        max_gap_s: longest gap between two samples that still counts as
            waiting (default: no limit).

    No clock of its own: every call is given ``now`` (monotonic seconds).
    """

    def __init__(self, stall_s: float, max_gap_s: float = float("inf")) -> None:
        self.stall_s = stall_s
        self.max_gap_s = max_gap_s
        #: partition -> (position, since when it has been behind at it).
        self._behind: dict[Key, tuple[int, float]] = {}
        self._last_sample: float | None = None

    def observe(self, positions: dict[Key, int], ends: dict[Key, int], now: float) -> list[Key]:
        """Record one sample; return the partitions stalled for ``stall_s`` seconds.

        Args:
            positions: partition -> next offset the consumer will deliver
                (negative when unknown: such a partition is not judged).
            ends: partition -> last stable offset (``read_committed`` end).
            now: monotonic seconds.

        Returns:
            The stalled partitions, sorted. A partition caught up, moved or
            unknown starts afresh.
        """
        if self._last_sample is not None and now - self._last_sample > self.max_gap_s:
            self._behind = {}  # busy meanwhile: that time says nothing about fetching
        self._last_sample = now
        behind: dict[Key, tuple[int, float]] = {}
        for key, end in ends.items():
            at = positions.get(key, -1)
            if at < 0 or at >= end:
                continue
            before = self._behind.get(key)
            since = before[1] if before is not None and before[0] == at else now
            behind[key] = (at, since)
        self._behind = behind
        return sorted(k for k, (_, since) in behind.items() if now - since >= self.stall_s)

    def forgive(self, key: Key, now: float) -> None:
        """Start ``key``'s wait afresh (a fresh reader found nothing to deliver there)."""
        if key in self._behind:
            self._behind[key] = (self._behind[key][0], now)

    def reset(self) -> None:
        """Forget every partition (a new consumer, a new assignment)."""
        self._behind = {}
        self._last_sample = None
