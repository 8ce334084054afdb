"""Peer benchmark: Kafka Streams (Java) exactly-once v2 keyed step over ledger intents.

What it measures
----------------
The throughput (input records per second) of a Java Kafka Streams application
(``bench/peers/kstreams/``: ``KeyedStepApp`` + ``KeyedStep``) with
``processing.guarantee=exactly_once_v2`` (KIP-447: one transactional producer
per stream thread) doing the same keyed stateful step as the Quix Streams
peer (``quix_bench.py``), on the same broker and the same input:

* input: the Quix peer's own pre-load (``quix_bench.preload``): ``N`` ledger
  ``Intent`` events over ``--operations`` operation IDs (default ``N // 4``,
  shuffled), key = operation ID, value = ``Intent.to_bytes()`` (the ledger's
  Avro single-object encoding), produced with the ledger's producer settings;
* per record the app decodes the value with Apache Avro (Java) against the
  ledger's own ``schemas/intent.avsc`` (older ``schemas/history/intent.v*``
  resolved by fingerprint), reads and updates the operation's state in a
  persistent RocksDB key-value store (``Stores.persistentKeyValueStore``,
  logged to a changelog topic, no cache): version counter, state name and
  first parameter digest, drift flagged as in the Quix peer;
* it produces exactly one output record per input, key = operation ID, value =
  the same JSON object as the Quix peer ``{"operation_id", "version",
  "state", "parameter_digest", "drift"}``;
* ``commit.interval.ms`` = ``LedgerSettings().commit_interval_ms`` (100 ms by
  default; ``LEDGER_COMMIT_INTERVAL_MS`` changes all three). Everything else is
  Kafka Streams' default (one stream thread, default JVM heap).

Decoding differs in one way from the Quix peer: Java decodes to an Avro
``GenericRecord``, while the Quix peer runs the ledger's Python decoder, which
also validates into a pydantic model. Both read every field of every record.

What the clock includes
-----------------------
The same rules as ``quix_bench.py``. The app runs in a SUBPROCESS
(``java -jar bench/peers/kstreams/target/kstreams-peer.jar ...``). Before the
clock starts, the parent creates fresh uniquely named input and output topics
and the store's changelog topic (compacted, same partitions: Kafka Streams
uses a changelog topic that already exists), pre-loads the ``N`` records
(flushed) and opens its ``read_committed`` reader of the output topic; the
JVM starts, loads the schemas, builds the topology and the ``KafkaStreams``
client and writes ``READY <version>`` to stdout immediately before
``KafkaStreams.start()``.

The clock starts when the parent reads ``READY`` and stops when its reader
has seen ``N`` output records. It EXCLUDES JVM start-up, topic creation and
the pre-load, and INCLUDES the consumer group join and assignment, opening
RocksDB and the (empty) changelog restore, decoding, the store updates,
producing, the transactions (offsets + output + changelog, one per commit
interval) and the time for the last commit markers to make the output visible.
It also includes the JIT's warm-up (the Python peers have none to do).

Then the app is stopped with SIGTERM (``KafkaStreams.close``: the last
transaction is committed), the output topic is drained and checked as in
``quix_bench.py`` (``verified``: exactly ``N`` records, each key's last
version equals its intent count, no drift), and the topics, the group and
the state folder are removed.

Output: one JSON object on stdout (``{"peer": "kafka_streams", ...}``, the
Quix peer's fields); logs go to stderr. ``{"error": ...}`` and status 2 when
``java`` or the jar is missing (``make bench`` builds it with Maven).

Run it with the ledger's virtualenv (it needs confluent-kafka and the ledger,
not Quix)::

    .venv/bin/python bench/peers/kstreams_bench.py --bootstrap 127.0.0.1:19092
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

# The Quix peer's input, reader and clean-up are this peer's too (same folder).
from quix_bench import (
    OutputCounter,
    _settings,
    cleanup_kafka,
    create_topics,
    parse_run_options,
    preload,
    stop_child,
    time_outputs,
)

log = logging.getLogger("kstreams_bench")

#: The Maven project of the app, its jar (runtime jars in ``target/lib/``) and the schemas.
APP_DIR = Path(__file__).resolve().parent / "kstreams"
JAR = APP_DIR / "target" / "kstreams-peer.jar"
SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
#: The app's store; Kafka Streams names its changelog ``<application.id>-<store>-changelog``.
STORE = "keyed-step-state"

#: Longest the parent waits for the JVM to build its app and say READY (seconds).
READY_TIMEOUT_S = 60.0


def java_command() -> list[str] | None:
    """``[java, -jar, JAR]``, or ``None`` when the jar or ``java`` is missing."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists() or not JAR.exists():
        return None
    return [java, "-jar", str(JAR)]


def create_changelog(bootstrap: str, app_id: str, partitions: int) -> str:
    """Create the store's compacted changelog topic up front; return its name.

    Kafka Streams would create it during the first rebalance, inside the
    clock; the Quix peer's clock excludes its changelog's creation, so this one
    does too.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    from ledger.kafka import admin_config

    name = f"{app_id}-{STORE}-changelog"
    admin = AdminClient(admin_config(_settings(bootstrap), **{"bootstrap.servers": bootstrap}))
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=1,
        config={"cleanup.policy": "compact"},
    )
    for fut in admin.create_topics([topic]).values():
        fut.result(30)
    return name


def one_run(args: argparse.Namespace, index: int, command: list[str]) -> dict[str, Any]:
    """One timed run on fresh topics; returns its figures (``quix_bench.one_run``'s shape)."""
    tag = f"ksb{uuid.uuid4().hex[:10]}"
    input_topic, output_topic, app_id = f"{tag}-in", f"{tag}-out", f"{tag}-app"
    tmp = Path(tempfile.mkdtemp(prefix="kstreams-bench-"))
    proc: subprocess.Popen[bytes] | None = None
    reader: OutputCounter | None = None
    try:
        create_topics(args.bootstrap, [input_topic, output_topic], args.partitions)
        create_changelog(args.bootstrap, app_id, args.partitions)
        per_key = preload(args.bootstrap, input_topic, args.records, args.operations, index)
        log.info("run %d: pre-loaded %d records over %d keys", index, args.records, len(per_key))
        reader = OutputCounter(args.bootstrap, output_topic, args.partitions)
        proc = subprocess.Popen(
            [
                *command,
                "--bootstrap",
                args.bootstrap,
                "--input",
                input_topic,
                "--output",
                output_topic,
                "--application-id",
                app_id,
                "--state-dir",
                str(tmp / "state"),
                "--commit-interval-ms",
                str(args.commit_interval_ms),
                "--schemas",
                str(SCHEMAS_DIR),
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
        line = proc.stdout.readline() if ready else b""
        if not line.startswith(b"READY"):
            raise RuntimeError(f"app did not become ready (said {line!r}, rc {proc.poll()})")
        args.version = line.decode().split()[-1]
        return time_outputs(proc, reader, args.records, per_key, index)
    finally:
        if proc is not None and proc.poll() is None:
            stop_child(proc)
        if reader is not None:
            reader.close()
        cleanup_kafka(args.bootstrap, tag, app_id)
        shutil.rmtree(tmp, ignore_errors=True)


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line (the Quix peer's options, same defaults)."""
    p = argparse.ArgumentParser(
        description="Kafka Streams exactly-once v2 keyed stateful step over ledger intents "
        "(prints one JSON object on stdout)."
    )
    return parse_run_options(p, argv)


def main(argv: list[str]) -> int:
    """Run ``--runs`` timed runs and print the report (one JSON line); 2 when it cannot run."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    args = parse(argv)
    command = java_command()
    if command is None:
        problem = (
            f"{JAR} or java missing: build it with `make bench` "
            f"(or `cd {APP_DIR} && mvn -q -B package`; needs Java 17+ and Maven)"
        )
        print(json.dumps({"peer": "kafka_streams", "error": problem}))
        print(problem, file=sys.stderr)
        return 2

    from ledger.settings import LedgerSettings

    args.commit_interval_ms = LedgerSettings().commit_interval_ms
    args.version = "unknown"
    runs = [one_run(args, i, command) for i in range(args.runs)]
    report = {
        "peer": "kafka_streams",
        "version": args.version,
        "records": args.records,
        "partitions": args.partitions,
        "operations": args.operations,
        "commit_interval_ms": args.commit_interval_ms,
        "runs": runs,
        "median_records_per_s": round(statistics.median(r["records_per_s"] for r in runs), 1),
        "all_verified": all(r["verified"] for r in runs),
        "notes": (
            "Java Kafka Streams app in a subprocess, processing.guarantee=exactly_once_v2, "
            f"commit.interval.ms={args.commit_interval_ms} (LedgerSettings().commit_interval_ms), "
            "other settings Kafka Streams defaults (1 stream thread), persistent RocksDB store "
            "with changelog topic, no cache. Per record: Avro decode (Java GenericRecord, "
            "schemas/intent.avsc) + one store get/put (version, state, digest) + one JSON output "
            "record (key = operation ID). Same intents and clock rules as the Quix peer: clock "
            "starts at READY (after JVM start, topology and client construction; input, output "
            "and changelog topics created and input pre-loaded before) and stops when a "
            "read_committed reader has seen all records; it includes group join, assignment, "
            "store open/restore, the transactions and the JIT warm-up. verified = output holds "
            "exactly N records and each key's last version equals its intent count."
        ),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
