"""Kafka limits, the bare transactional loop, and the processor stage.

1. **Kafka limit** — raw confluent-kafka: an idempotent producer with
   ``acks=all`` writing ``records`` typical intent records (the ledger's own
   Avro bytes), timed from the first ``produce`` to the end of ``flush``;
   then a plain consumer reading them back, timed from its first fetched
   batch to the last record (that batch not counted), so connection set-up
   is left out.
2. **Python transactional limit** — a bare consume-transform-produce loop:
   ``read_committed`` consumer in a group, one transactional producer, one
   output per input (the input's bytes), offsets sent in the transaction, one
   transaction per ``consume(500, commit_interval)`` batch, as the ledger's
   stages do. Timed from the partition assignment to the last commit.
3. **Processor stage** — the ledger's :class:`consumers.processor.Processor`
   (in this process, in a thread) on the same number of pre-loaded intents:
   each is one transition (decode, pure fold, state + journal + admission
   request written in the transaction). Timed the same way: assignment
   (restore included) to the commit that covers the last input.

Each returns records (or transitions) per second.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.common import create, drop, preload, sample_intent, settings_for
from consumers.processor import Processor
from consumers.stage import Writer
from ledger.kafka import consumer_config, producer_config
from ledger.settings import LedgerSettings


def intents(n: int) -> list[tuple[str, bytes]]:
    """``n`` encoded typical intents as ``(operation ID, bytes)``."""
    out = []
    for i in range(n):
        intent = sample_intent(i)
        out.append((intent.operation_id, intent.to_bytes()))
    return out


def kafka_limit(base: LedgerSettings, records: int, partitions: int = 3) -> dict[str, Any]:
    """Raw produce (acks=all, idempotent) and consume rates, records per second."""
    settings = settings_for(base, "kafka", partitions=partitions)
    create(settings)
    try:
        data = intents(records)
        topic = settings.topic("intents")
        producer = Producer(
            producer_config(settings, **{"queue.buffering.max.messages": 1_000_000})
        )
        producer.produce(topic, key=b"warm-up", value=data[0][1])  # connect first
        assert producer.flush(30) == 0
        started = time.perf_counter()
        for key, value in data:
            while True:
                try:
                    producer.produce(topic, key=key.encode(), value=value)
                    break
                except BufferError:
                    producer.poll(0.01)
        assert producer.flush(120) == 0
        produce_s = time.perf_counter() - started
        consumer = Consumer(
            consumer_config(
                settings, f"{settings.topic_prefix}.raw", extra={"fetch.wait.max.ms": 50}
            )
        )
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        total = timed = 0
        first = 0.0
        while total < records + 1:
            batch = sum(1 for m in consumer.consume(1000, 0.02) if m.error() is None)
            if batch and not first:
                first = time.perf_counter()  # the clock starts at the first batch
            elif batch:
                timed += batch
            total += batch
        consume_s = time.perf_counter() - first
        consumer.close()
        return {
            "records": records,
            "record_bytes": round(sum(len(v) for _, v in data) / records),
            "produce_per_s": records / produce_s,
            "consume_per_s": timed / consume_s,
        }
    finally:
        drop(settings)


def transactional_loop(base: LedgerSettings, records: int, partitions: int = 3) -> dict[str, Any]:
    """The bare consume-transform-produce loop's rate (records per second)."""
    settings = settings_for(base, "txnloop", partitions=partitions)
    create(settings)
    try:
        preload(settings, "intents", intents(records))
        source, target = settings.topic("intents"), settings.topic("state")
        consumer = Consumer(
            consumer_config(
                settings,
                f"{settings.topic_prefix}.loop",
                extra={"partition.assignment.strategy": "range", "fetch.wait.max.ms": 50},
            )
        )
        assigned: list[float] = []
        consumer.subscribe([source], on_assign=lambda c, ps: assigned.append(time.perf_counter()))
        producer = Producer(
            producer_config(
                settings,
                **{
                    "transactional.id": f"{settings.topic_prefix}.loop",
                    "transaction.timeout.ms": settings.transaction_timeout_ms,
                },
            )
        )
        producer.init_transactions(30)
        done = 0
        deadline = time.monotonic() + 300
        while done < records:
            if time.monotonic() > deadline:
                raise RuntimeError(f"bare loop processed {done}/{records} in 300 s")
            msgs = [
                m
                for m in consumer.consume(500, settings.commit_interval_ms / 1000)
                if m.error() is None
            ]
            if not msgs:
                continue
            producer.begin_transaction()
            for m in msgs:
                producer.produce(target, key=m.key(), value=m.value())
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(
                [tp for tp in positions if tp.offset >= 0],
                consumer.consumer_group_metadata(),
                30,
            )
            producer.commit_transaction(30)
            done += len(msgs)
        elapsed = time.perf_counter() - assigned[0]
        consumer.close()
        return {"records": records, "per_s": records / elapsed, "seconds": elapsed}
    finally:
        drop(settings)


class _TimedProcessor(Processor):
    """The processor, noting when it got its partitions and when it has done ``target``."""

    target = 0
    assigned_at = 0.0
    done_at = 0.0
    sealed = True

    def writer(self) -> Writer:
        """Sealed outputs, as in production; unsealed only to price the seals."""
        if self.sealed:
            return super().writer()
        assert self.producer is not None
        return Writer(self.producer, self.settings, None)

    def on_assign(self, partitions: set[int]) -> None:
        if not self.assigned_at:
            self.assigned_at = time.perf_counter()
        super().on_assign(partitions)

    def after_commit(self) -> None:
        super().after_commit()
        if self.processed >= self.target and not self.done_at:
            self.done_at = time.perf_counter()
            self.stopping = True


def processor_stage(
    base: LedgerSettings, records: int, partitions: int = 3, *, sealed: bool = True
) -> dict[str, Any]:
    """The processor's transitions per second on ``records`` pre-loaded intents.

    Args:
        base: settings of the broker.
        records: intents to pre-load and process.
        partitions: partitions of the benchmark ledger.
        sealed: seal every output (production); ``False`` writes them unsealed,
            only to measure what the seals cost (``ledger.authn``).
    """
    settings = settings_for(base, "processor", partitions=partitions)
    create(settings)
    try:
        preload(settings, "intents", intents(records))
        stage = _TimedProcessor(settings, instance="bench")
        stage.sealed = sealed
        stage.target = records
        thread = threading.Thread(target=stage.run, kwargs={"stop_after_s": 300}, daemon=True)
        thread.start()
        thread.join(320)
        if not stage.done_at:
            raise RuntimeError(f"processor did {stage.processed}/{records} transitions in 300 s")
        elapsed = stage.done_at - stage.assigned_at
        return {"records": records, "per_s": records / elapsed, "seconds": elapsed}
    finally:
        drop(settings)


def profile_processor(base: LedgerSettings, records: int, top: int = 25) -> dict[str, Any]:
    """Profile one processor-stage run with pyinstrument (statistical, 1 ms).

    Returns:
        ``per_s`` of the profiled run (slower than unprofiled), and ``text``:
        pyinstrument's call tree of the processor thread, trimmed to ``top``
        lines' worth of the heaviest frames.
    """
    from pyinstrument import Profiler

    settings = settings_for(base, "profile", partitions=3)
    create(settings)
    try:
        preload(settings, "intents", intents(records))
        stage = _TimedProcessor(settings, instance="profile")
        stage.target = records
        profiler = Profiler(interval=0.001)

        def run() -> None:
            profiler.start()
            try:
                stage.run(stop_after_s=300)
            finally:
                profiler.stop()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(320)
        elapsed = (stage.done_at or time.perf_counter()) - stage.assigned_at
        text = profiler.output_text(unicode=False, color=False, show_all=False)
        body = [line for line in text.splitlines() if line.strip()]
        start = next((i for i, line in enumerate(body) if "run" in line and "stage.py" in line), 0)
        return {
            "records": records,
            "per_s": records / elapsed,
            "text": "\n".join(body[start : start + top]),
        }
    finally:
        drop(settings)
