"""``python -m bench``: run the benchmarks and write ``results.json`` and ``REPORT.md``.

Every figure is the median of ``--runs`` repetitions (default 3) and every
ledger figure is a ratio to a baseline measured in the same run on the same
broker. ``make bench`` starts (or reuses) the local broker first.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from bench import e2e, history, outcomes, replay, report, scaleout, sinklimit, throughput
from bench.common import BENCH_DIR, median, say
from ledger.settings import LedgerSettings

#: The checkout: the folder that holds ``pyproject.toml``.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


SECTIONS = (
    "kafka",
    "txnloop",
    "processor",
    "auth",
    "e2e",
    "recovery",
    "history",
    "memory",
    "scale",
    "peers",
    "profile",
    "outcomes",
)


#: The Kafka Streams peer's jar (``make bench`` builds it with Maven).
KSTREAMS_JAR = BENCH_DIR / "peers" / "kstreams" / "target" / "kstreams-peer.jar"


def _peers(bootstrap: str, python: Path, runs: int) -> dict[str, Any]:
    """Run the peer benchmarks; each prints one JSON object.

    Quix Streams and DBOS run in their own virtualenv (``python``); the Kafka
    Streams driver needs only the ledger and the jar, so it runs here.
    """
    out: dict[str, Any] = {}
    for name, script, interpreter, needs in (
        ("quixstreams", "quix_bench.py", python, python),
        ("dbos", "dbos_bench.py", python, python),
        ("kafka_streams", "kstreams_bench.py", Path(sys.executable), KSTREAMS_JAR),
    ):
        if not needs.exists():
            how = "builds it with Maven" if needs == KSTREAMS_JAR else "creates it"
            out[name] = {"error": f"{needs} missing (make bench {how})"}
            continue
        say(f"peer {name} ...")
        started = time.monotonic()
        proc = subprocess.run(
            [
                str(interpreter),
                str(BENCH_DIR / "peers" / script),
                "--bootstrap",
                bootstrap,
                "--runs",
                str(runs),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=PROJECT_ROOT,
        )
        if proc.returncode != 0:
            out[name] = {"error": proc.stderr.strip().splitlines()[-5:]}
            continue
        out[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        out[name]["wall_s"] = time.monotonic() - started
    return out


@click.command()
@click.option("--runs", default=3, show_default=True, help="Repetitions; figures are medians.")
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(SECTIONS),
    help="Run only these sections (repeatable); the others keep their previous results.",
)
@click.option("--records", default=20_000, show_default=True, help="Records per throughput run.")
@click.option("--burst", default=300, show_default=True, help="Operations per end-to-end burst.")
@click.option(
    "--scale-burst", default=200, show_default=True, help="Operations per scale-out burst."
)
@click.option(
    "--in-flight", default=1000, show_default=True, help="Operations in flight at the kill."
)
@click.option(
    "--memory-ops", default=100_000, show_default=True, help="Operations in state (memory)."
)
@click.option(
    "--history-settled",
    default=100_000,
    show_default=True,
    help="Settled operations under the long-history restart (history).",
)
@click.option(
    "--restore-ops",
    default=1_000_000,
    show_default=True,
    help="Operations in one ledger.state partition for the processor restore (history).",
)
@click.option(
    "--outcome-settled",
    default=1_000_000,
    show_default=True,
    help="Settled operations under the large outcome wait (outcomes; the small one is 1,000).",
)
@click.option(
    "--peers-python",
    type=click.Path(path_type=Path),
    default=PROJECT_ROOT / ".venv-peers" / "bin" / "python",
    show_default=True,
    help="Python of the virtualenv holding Quix Streams and DBOS (Kafka Streams runs in Java).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=BENCH_DIR / "results.json",
    show_default=True,
    help="Results file; REPORT.md and plots/ are written beside it.",
)
def main(
    runs: int,
    only: tuple[str, ...],
    records: int,
    burst: int,
    scale_burst: int,
    in_flight: int,
    memory_ops: int,
    history_settled: int,
    restore_ops: int,
    outcome_settled: int,
    peers_python: Path,
    out: Path,
) -> None:
    """Measure the ledger against the bare Kafka limit and against peers (bench/REPORT.md)."""
    base = LedgerSettings()
    sections = set(only or SECTIONS)
    results: dict[str, Any] = {}
    if only and out.exists():
        results = json.loads(out.read_text())
    results["meta"] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": runs,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "bootstrap": base.bootstrap_servers,
        "commit_interval_ms": base.commit_interval_ms,
    }
    started = time.monotonic()
    # A broker that has just started runs its first minute or so with a cold
    # JVM (seen here: the bare loop at 27,000 records/s on a fresh broker,
    # 70,000 on a warm one); one unmeasured round of load first.
    if sections - {"scale"}:  # the scale section warms its own cluster up
        say("warming the broker up (not measured)")
        throughput.transactional_loop(base, records)
        throughput.processor_stage(base, records)
        throughput.kafka_limit(base, records)
    if "kafka" in sections:
        say(f"Kafka limit: raw produce/consume of {records} records x {runs}")
        rows = [throughput.kafka_limit(base, records) for _ in range(runs)]
        results["kafka"] = {
            "runs": rows,
            "produce_per_s": median([r["produce_per_s"] for r in rows]),
            "consume_per_s": median([r["consume_per_s"] for r in rows]),
            "record_bytes": rows[0]["record_bytes"],
        }
    if "txnloop" in sections or "processor" in sections:
        say(f"bare transactional loop and processor stage: {records} records x {runs}")
        loops, stages = [], []
        for _ in range(runs):  # interleaved, so drift hits both alike
            loops.append(throughput.transactional_loop(base, records))
            stages.append(throughput.processor_stage(base, records))
        results["txnloop"] = {"runs": loops, "per_s": median([r["per_s"] for r in loops])}
        results["processor"] = {"runs": stages, "per_s": median([r["per_s"] for r in stages])}
    if "auth" in sections:
        say(f"what record seals cost the processor: {records} records x {runs}, sealed or not")
        sealed, unsealed = [], []
        for _ in range(runs):  # interleaved, so drift hits both alike
            sealed.append(throughput.processor_stage(base, records, sealed=True))
            unsealed.append(throughput.processor_stage(base, records, sealed=False))
        results["auth"] = {
            "sealed_per_s": median([r["per_s"] for r in sealed]),
            "unsealed_per_s": median([r["per_s"] for r in unsealed]),
            "runs": {"sealed": sealed, "unsealed": unsealed},
        }
    if "e2e" in sections:
        say(f"end to end: bursts of {burst}, then paced at 0.5x and 0.9x")
        results["e2e"] = e2e.throughput_and_latency(base, burst, paced_s=10, runs=runs)
        relays = results["e2e"]["relay_instances"]
        say(f"sink-only limit: the gateway driven directly, {burst} operations x {runs}")
        results["e2e"]["sink_limit"] = sinklimit.measure(base, burst, runs, processes=relays)
    if "recovery" in sections:
        say(f"recovery of {in_flight} in-flight operations x {runs} (and auditor replay)")
        rows = []
        for _ in range(runs):
            rows.append(e2e.recovery(base, in_flight, after=_replay))
        results["recovery"] = {
            "runs": rows,
            "ratio": median([r["ratio"] for r in rows]),
            "recovery_s": median([r["recovery_s"] for r in rows]),
            "fresh_s": median([r["fresh_s"] for r in rows]),
        }
        replays = [r["replay"] for r in rows]
        results["replay"] = {
            "runs": replays,
            "auditor_per_s": median([r["auditor_per_s"] for r in replays]),
            "raw_per_s": median([r["raw_per_s"] for r in replays]),
            "ratio": median([r["ratio"] for r in replays]),
        }
    if "history" in sections:
        results["history"] = _history(base, in_flight, history_settled, restore_ops, runs)
    if "memory" in sections:
        say(f"processor memory with {memory_ops} operations in state x {runs}")
        rows = [replay.memory(base, memory_ops) for _ in range(runs)]
        results["memory"] = {
            "runs": rows,
            "bytes_per_operation": median([r["bytes_per_operation"] for r in rows]),
        }
    if "scale" in sections:
        say(f"scale: partitions x instances on three brokers, bursts of {scale_burst} x {runs}")
        results["scale"] = scaleout.scale(base, scale_burst, runs)
    if "peers" in sections:
        say("the lost-response crash against the ledger (200 operations, every 10th)")
        results["lost_response"] = e2e.lost_response(base, 200)
        results["peers"] = _peers(base.bootstrap_servers, peers_python, runs)
    if "outcomes" in sections:
        results["outcomes"] = outcomes.compare(base, (1000, outcome_settled), runs)
    if "profile" in sections:
        say("profiling the processor stage (pyinstrument)")
        results["profile"] = throughput.profile_processor(base, records)
    results["meta"]["wall_s"] = round(time.monotonic() - started, 1)
    results["ratios"] = report.ratios(results)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    path = report.write(results, out.parent)
    say(f"results: {out}")
    say(f"report:  {path}")
    for line in report.headlines(results):
        print(line)


def _history(
    base: LedgerSettings, in_flight: int, settled: int, restore_ops: int, runs: int
) -> dict[str, Any]:
    """Restart over 1,000 and over ``settled`` settled operations; processor restore at scale."""
    say(f"history: restart with {in_flight} in flight over 1,000 and {settled:,} settled x {runs}")
    small = history.restart_over_history(base, 1000, in_flight, runs)
    large = history.restart_over_history(base, settled, in_flight, runs)
    restores = max(3, runs)
    say(f"history: processor restore of {restore_ops:,} operations in one partition x {restores}")
    restore = history.processor_restore(base, restore_ops, restores)
    return {
        "small": small,
        "large": large,
        "ratio": large["recovery_s"] / small["recovery_s"],
        "processor_restore": restore,
    }


def _replay(settings: LedgerSettings) -> dict[str, Any]:
    raw = replay.raw_decode(settings)
    audit = replay.auditor_replay(settings)
    auditor_per_s = raw["events"] / audit["seconds"]
    return {
        "events": raw["events"],
        "raw_per_s": raw["per_s"],
        "auditor_per_s": auditor_per_s,
        "ratio": auditor_per_s / raw["per_s"],
        "violations": audit["violations"],
    }


if __name__ == "__main__":
    sys.exit(main())
