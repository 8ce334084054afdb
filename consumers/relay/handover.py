"""Handover: where an earlier owner's work ends on the partitions this relay took over.

A verification below that point may have been in flight when the earlier
owner died (``after_commit_before_verification``): it is performed again as
a resume, so that the processor writes the resume's recovery receipt.
Executions need no such rule: their ``ATTEMPTED`` markers say exactly which
ones may have left.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

from ledger.events import Dispatch

log = logging.getLogger("consumers.relay")


class Handover:
    """The partitions of ``dispatches`` this process has held, and where it took them over.

    Args:
        topic: the full name of the ``dispatches`` topic.

    Attributes:
        ever_held: partitions this process has owned at some point.
        below: ``partition -> end offset when this process took it over from
            an earlier owner`` (crashed, stopped or rebalanced away).
    """

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.ever_held: set[int] = set()
        self.below: dict[int, int] = {}

    def assigned(self, partitions: set[int], consumer: Consumer | None) -> None:
        """Note partitions assigned now; ask where an earlier owner stopped on new ones."""
        new = partitions - self.ever_held
        self.ever_held |= partitions
        self._note(new, consumer)

    def _note(self, partitions: set[int], consumer: Consumer | None) -> None:
        """Remember where an earlier owner's work ends on partitions taken over from it.

        A partition the relay's group had committed an offset for had an
        owner before this process: dispatches below its end offset at the
        takeover were that owner's to perform. A failure to ask is logged and
        the partition treated as not taken over (its verifications then write
        no recovery receipt; nothing else changes).
        """
        if not partitions or consumer is None:
            return
        try:
            asked = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            committed = consumer.committed(asked, timeout=10)
            for tp in committed:
                if tp.offset < 0:
                    continue  # the group never owned it: a first start, not a resume
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(self.topic, tp.partition), timeout=10, cached=False
                )
                if high > tp.offset:
                    self.below[tp.partition] = high
        except KafkaException as exc:
            log.warning("relay: could not read where the previous owner stopped: %s", exc)
        if self.below:
            log.info("relay: took over dispatches below %s", self.below)

    def resumed(self, d: Dispatch, partition: int, offset: int) -> Dispatch:
        """A verification taken over from an earlier relay is performed as a resume.

        Performing it again is safe (it only reads), and the readback says
        ``on_resume``.
        """
        if d.kind == "VERIFY" and not d.on_resume and offset < self.below.get(partition, -1):
            return d.model_copy(update={"on_resume": True})
        return d

    def revoked(self, partitions: set[int]) -> None:
        """Forget where revoked partitions were taken over."""
        for partition in partitions:
            self.below.pop(partition, None)
