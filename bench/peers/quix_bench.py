"""Peer benchmark: Quix Streams exactly-once keyed stateful step over ledger intents.

What it measures
----------------
The throughput (input records per second) of a Quix Streams application with
``processing_guarantee="exactly-once"`` that does the equivalent of the ledger
processor's keyed stateful step, on a real Kafka broker:

* input: ``N`` ledger ``Intent`` events, key = operation ID (UTF-8), value =
  the ledger's own Avro single-object encoding (``Intent.to_bytes()``), built
  the way ``tests/helpers.py`` ``intent(...)`` builds them. The records are
  spread over ``--operations`` operation IDs (default ``N // 4``: each
  operation's intent is published four times, in shuffled order) and
  produced with the ledger's partitioner (``murmur2_random``, idempotent
  producer), so keys land where the ledger's ``LedgerPublisher`` puts them;
* per record the app decodes the value with the project's decoder
  (``ledger.events.decode_event``), reads and updates a per-key state in
  Quix's RocksDB state store (backed by a changelog topic): a version counter,
  the last state name and the parameter digest (a different digest for the
  same operation is flagged as drift, as the ledger refuses it);
* it produces exactly one output record per input, key = operation ID, value =
  a small JSON object ``{"operation_id", "version", "state",
  "parameter_digest", "drift"}`` (Quix's ``json`` serializer);
* commit interval = ``LedgerSettings().commit_interval_ms`` (100 ms by
  default, the value the ledger's stages use; ``LEDGER_COMMIT_INTERVAL_MS``
  changes both). Everything else is Quix's default configuration.

What the clock includes
-----------------------
The app runs in a SUBPROCESS (``python quix_bench.py _app ...``). Before the
clock starts, the parent creates fresh uniquely named input and output topics,
pre-loads the ``N`` input records (flushed), and opens its own ``read_committed``
consumer on the output topic; the child imports Quix and the ledger, builds the
``Application`` and the dataframe (which creates Quix's changelog topic) and
then writes ``READY`` to its stdout immediately before ``app.run()``.

The clock starts when the parent reads ``READY`` and stops when the parent's
``read_committed`` consumer has seen ``N`` output records. It therefore
EXCLUDES Python start-up, imports, topic creation (input, output and changelog)
and the pre-load, and INCLUDES the consumer group join and partition
assignment, opening the RocksDB stores and the (empty) changelog recovery,
decoding, state updates, producing, the Kafka transactions (offsets + output +
changelog, committed every ``commit_interval``) and the time for the last
transaction's markers to make the output visible to a ``read_committed``
reader.

After the clock stops the app is stopped with SIGTERM (Quix commits and exits
cleanly), the output topic is drained once more to the end and checked: the
run is reported as ``verified`` only if it holds exactly ``N`` records and the
last version seen for every operation equals the number of intents published
for it (no loss, no duplicates). Then the topics (input, output, changelog)
and the consumer group are deleted, and Quix's state dir (under a temporary
directory) is removed.

Output: one JSON object on stdout; logs go to stderr.

Run it in the peers' virtualenv::

    .venv-peers/bin/python bench/peers/quix_bench.py --bootstrap 127.0.0.1:39092
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger("quix_bench")

#: Longest the parent waits for one run's output (seconds).
RUN_TIMEOUT_S = 120.0
#: Longest the parent waits for the child to build its app and say READY (seconds).
READY_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------- input records


def make_intent(k: int, published_at_ms: int) -> Any:
    """Operation ``k``'s typical refund intent, the one every ledger benchmark uses."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project root
    from bench.common import sample_intent

    return sample_intent(k).model_copy(update={"published_at_ms": published_at_ms})


def _settings(bootstrap: str) -> Any:
    """Ledger settings for the parent's own clients (their properties come from ledger.kafka)."""
    from ledger.settings import LedgerSettings

    return LedgerSettings(bootstrap_servers=bootstrap)


def preload(bootstrap: str, topic: str, records: int, operations: int, seed: int) -> dict[str, int]:
    """Produce ``records`` intents over ``operations`` operation IDs; return intents per key."""
    from confluent_kafka import Producer

    from ledger.kafka import producer_config

    rng = random.Random(seed)
    order = [i % operations for i in range(records)]
    rng.shuffle(order)
    now_ms = int(time.time() * 1000)
    encoded: dict[int, tuple[bytes, bytes]] = {}
    per_key: dict[str, int] = {}
    producer = Producer(producer_config(_settings(bootstrap), **{"bootstrap.servers": bootstrap}))
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    for k in order:
        if k not in encoded:
            ev = make_intent(k, now_ms)
            encoded[k] = (ev.operation_id.encode(), ev.to_bytes())
        key, value = encoded[k]
        per_key[key.decode()] = per_key.get(key.decode(), 0) + 1
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"pre-load failed: {remaining} undelivered, errors {failures[:3]}")
    return per_key


# ----------------------------------------------------------------------------- the Quix app (child)


def run_app(args: argparse.Namespace) -> int:
    """Child process: build the Quix app, say READY on stdout, run until SIGTERM."""
    from quixstreams import Application

    from ledger.events import Intent, decode_event
    from ledger.settings import LedgerSettings

    commit_interval_s = LedgerSettings().commit_interval_ms / 1000.0
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=commit_interval_s,
        state_dir=args.state_dir,
        loglevel="WARNING",
    )
    source = app.topic(args.input, key_deserializer="str", value_deserializer="bytes")
    sink = app.topic(args.output, key_serializer="str", value_serializer="json")

    def step(value: bytes, key: str, _ts: int, _headers: Any, state: Any) -> dict[str, Any]:
        event = decode_event(value)
        if not isinstance(event, Intent):
            raise TypeError(f"expected an Intent, got {type(event).__name__}")
        version = int(state.get("version", 0)) + 1
        digest = state.get("digest")
        drift = digest is not None and digest != event.parameter_digest
        if digest is None:
            state.set("digest", event.parameter_digest)
        current = state.get("state") or "NOT_ADMITTED"
        state.set("version", version)
        state.set("state", current)
        return {
            "operation_id": key,
            "version": version,
            "state": current,
            "parameter_digest": event.parameter_digest,
            "drift": drift,
        }

    sdf = app.dataframe(source)
    sdf = sdf.apply(step, stateful=True, metadata=True)
    sdf.to_topic(sink)

    sys.stdout.write("READY\n")
    sys.stdout.flush()
    app.run()
    return 0


# ----------------------------------------------------------------------------- one run (parent)


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from ledger.kafka import admin_config

    admin = AdminClient(admin_config(_settings(bootstrap), **{"bootstrap.servers": bootstrap}))
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names]
    )
    for fut in futures.values():
        fut.result(30)


def cleanup_kafka(bootstrap: str, tag: str, group: str) -> None:
    """Delete every topic whose name holds ``tag`` (input, output, changelog) and the group."""
    from confluent_kafka.admin import AdminClient

    from ledger.kafka import admin_config

    admin = AdminClient(admin_config(_settings(bootstrap), **{"bootstrap.servers": bootstrap}))
    names = [t for t in admin.list_topics(timeout=10).topics if tag in t]
    if names:
        for name, fut in admin.delete_topics(names, operation_timeout=30).items():
            try:
                fut.result(30)
            except Exception as exc:  # cleanup reports, never fails the run
                log.warning("could not delete topic %s: %s", name, exc)
    try:
        for fut in admin.delete_consumer_groups([group], request_timeout=10).values():
            fut.result(10)
    except Exception as exc:
        log.warning("could not delete group %s: %s", group, exc)
    log.info("deleted topics %s and group %s", names, group)


class OutputCounter:
    """A ``read_committed`` reader of the whole output topic (assigned, no group)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from ledger.kafka import consumer_config

        self.consumer = Consumer(
            consumer_config(
                _settings(bootstrap),
                f"quix-bench-reader-{uuid.uuid4().hex[:8]}",
                extra={"bootstrap.servers": bootstrap, "fetch.wait.max.ms": 10},
            )
        )
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self.topic = topic
        self.partitions = partitions
        self.count = 0
        #: perf_counter() when the first output record was read, if any.
        self.first_at: float | None = None
        self.last_version: dict[str, int] = {}
        self.drift = 0

    def poll(self, timeout_s: float) -> None:
        from confluent_kafka import KafkaError

        for msg in self.consumer.consume(num_messages=5000, timeout=timeout_s):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"output reader error: {err}")
            if self.first_at is None:
                self.first_at = time.perf_counter()
            self.count += 1
            body = json.loads(msg.value())
            self.last_version[body["operation_id"]] = body["version"]
            self.drift += bool(body["drift"])

    def drain(self, timeout_s: float = 30.0) -> None:
        """Read until the position of every partition reaches its high watermark.

        Called after the app has exited, so every transaction is settled; a
        ``read_committed`` position passes the commit markers, so position >=
        high watermark means everything committed has been read.
        """
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        high = {
            tp.partition: self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            for tp in tps
        }
        deadline = time.monotonic() + timeout_s
        while True:
            behind = [
                tp
                for tp in self.consumer.position(tps)
                if high[tp.partition] > 0 and tp.offset < high[tp.partition]
            ]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"output reader still behind the end after {timeout_s} s: {behind}"
                )
            self.poll(0.1)

    def close(self) -> None:
        self.consumer.close()


def stop_child(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("app did not stop within %.0f s; killing it", timeout_s)
            proc.kill()
    return proc.wait()


def time_outputs(
    proc: subprocess.Popen[bytes],
    reader: OutputCounter,
    records: int,
    per_key: dict[str, int],
    index: int,
) -> dict[str, Any]:
    """Time a ready app until ``records`` outputs are read, then stop it and check them.

    The clock starts when the app said it is ready and stops at the last
    output read (the Kafka Streams peer times its app the same way).

    Args:
        proc: the app, already ready.
        reader: counts the app's outputs.
        records: inputs pre-loaded (one output each is expected).
        per_key: key -> inputs pre-loaded for it (its expected last version).
        index: the run's number, for the log.

    Returns:
        ``seconds``, ``records_per_s``, ``first_output_s`` (seconds from the
        start of the clock), ``output_records`` and ``verified`` (exactly
        ``records`` outputs, each key's last version right, no drift).

    Raises:
        RuntimeError: the app exited, or not every output came within
            :data:`RUN_TIMEOUT_S` seconds.
    """
    t0 = time.perf_counter()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while reader.count < records:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited with status {proc.returncode} mid-run")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {reader.count}/{records} outputs after {RUN_TIMEOUT_S} s")
        reader.poll(0.05)
    seconds = time.perf_counter() - t0
    rc = stop_child(proc)
    reader.drain()
    wrong = sum(1 for k, n in per_key.items() if reader.last_version.get(k) != n)
    verified = reader.count == records and wrong == 0 and reader.drift == 0
    log.info(
        "run %d: %.3f s, %.0f records/s; output %d records, %d keys with wrong version, "
        "app exit %s",
        index,
        seconds,
        records / seconds,
        reader.count,
        wrong,
        rc,
    )
    return {
        "seconds": round(seconds, 4),
        "records_per_s": round(records / seconds, 1),
        "first_output_s": round((reader.first_at or t0) - t0, 4),
        "output_records": reader.count,
        "verified": verified,
    }


def one_run(args: argparse.Namespace, index: int) -> dict[str, Any]:
    tag = f"qxb{uuid.uuid4().hex[:10]}"
    input_topic, output_topic, group = f"{tag}-in", f"{tag}-out", f"{tag}-group"
    tmp = Path(tempfile.mkdtemp(prefix="quix-bench-"))
    proc: subprocess.Popen[bytes] | None = None
    reader: OutputCounter | None = None
    try:
        create_topics(args.bootstrap, [input_topic, output_topic], args.partitions)
        per_key = preload(args.bootstrap, input_topic, args.records, args.operations, index)
        log.info(
            "run %d: pre-loaded %d records over %d keys into %s",
            index,
            args.records,
            len(per_key),
            input_topic,
        )
        reader = OutputCounter(args.bootstrap, output_topic, args.partitions)
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "_app",
            "--bootstrap",
            args.bootstrap,
            "--input",
            input_topic,
            "--output",
            output_topic,
            "--group",
            group,
            "--state-dir",
            str(tmp / "state"),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
        if line.strip() != b"READY":
            raise RuntimeError(f"app did not become ready (said {line!r}, rc {proc.poll()})")
        return time_outputs(proc, reader, args.records, per_key, index)
    finally:
        if proc is not None and proc.poll() is None:
            stop_child(proc)
        if reader is not None:
            reader.close()
        cleanup_kafka(args.bootstrap, tag, group)
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- CLI


def parse_run_options(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Add the options every peer benchmark shares to ``p`` and parse ``argv``.

    ``--bootstrap``, ``--records`` (input records per run), ``--partitions``,
    ``--runs`` and ``--operations`` (distinct keys; default ``records // 4``).
    """
    p.add_argument(
        "--bootstrap", default=os.environ.get("LEDGER_BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    )
    p.add_argument("--records", type=int, default=20000, help="input records per run")
    p.add_argument("--partitions", type=int, default=3, help="partitions of input and output")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--operations",
        type=int,
        default=None,
        help="distinct operation IDs (keys); default records // 4",
    )
    ns = p.parse_args(argv)
    ns.operations = ns.operations or max(1, ns.records // 4)
    return ns


def parse(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["_app"]:
        p = argparse.ArgumentParser(prog="quix_bench.py _app")
        p.add_argument("--bootstrap", required=True)
        p.add_argument("--input", required=True)
        p.add_argument("--output", required=True)
        p.add_argument("--group", required=True)
        p.add_argument("--state-dir", required=True)
        ns = p.parse_args(argv[1:])
        ns.mode = "app"
        return ns
    p = argparse.ArgumentParser(
        description="Quix Streams exactly-once keyed stateful step over ledger intents "
        "(prints one JSON object on stdout)."
    )
    ns = parse_run_options(p, argv)
    ns.mode = "bench"
    return ns


def main(argv: list[str]) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    args = parse(argv)
    if args.mode == "app":
        return run_app(args)

    import quixstreams

    from ledger.settings import LedgerSettings

    commit_interval_ms = LedgerSettings().commit_interval_ms
    runs = [one_run(args, i) for i in range(args.runs)]
    report = {
        "peer": "quixstreams",
        "version": quixstreams.__version__,
        "records": args.records,
        "partitions": args.partitions,
        "operations": args.operations,
        "commit_interval_ms": commit_interval_ms,
        "runs": runs,
        "median_records_per_s": round(statistics.median(r["records_per_s"] for r in runs), 1),
        "all_verified": all(r["verified"] for r in runs),
        "notes": (
            "Quix app in a subprocess, processing_guarantee=exactly-once, commit_interval="
            f"{commit_interval_ms / 1000} s (LedgerSettings().commit_interval_ms), other settings "
            "Quix defaults, RocksDB state with changelog topic. Per record: decode_event "
            "(ledger Avro) + per-key state get/set (version, state, digest) + one JSON output "
            "record (key = operation ID). Clock starts when the child says READY (after imports, "
            "Application/dataframe construction and creation of input, output and changelog "
            "topics; input pre-loaded before) and stops when a read_committed reader of the output "
            f"topic has seen all records: it includes consumer group join, partition assignment, "
            "state store open/recovery and the transactional commits. Keys: "
            f"{args.operations} operation IDs, intents produced with murmur2_random. verified = "
            "output holds exactly N records and each key's last version equals its intent count."
        ),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
