"""Peer benchmark: DBOS Transact (SQLite system database) refunds through the reference gateway.

The DBOS application
--------------------
One workflow, ``refund_workflow(operation_id, account, amount_minor)``, whose
single step ``refund(operation_id, account, amount_minor)`` calls the project's
reference payment gateway (``testbed.sinks.gateway``, started with
``testbed.sinks.process.SinkProcess`` and the gateway's contract
``ledger.contracts.PAYMENT_GATEWAY``: idempotent, readback, fencing) through
``sinks.client.SinkClient.submit``. The workflow returns what the step returns.
DBOS keeps its system database in SQLite (``sqlite:///...`` in a temporary
directory); every DBOS process is a subprocess of this script
(``dbos_bench.py _worker ...``), so it can be SIGKILLed. The workflow ID of each
operation is its operation ID (``SetWorkflowID``), which is what a DBOS user
does to make starting the same operation twice idempotent.

Operations are started the way the DBOS docs show for running many workflows
concurrently: enqueued on a DBOS queue (``DBOS.register_queue`` with
``worker_concurrency=--concurrency``, default 8) and awaited with their
handles. DBOS queues are polled: the queue's ``polling_interval_sec`` defaults
to 1 s, which would cap the rate at ``concurrency`` per second, so this
benchmark sets it to ``--poll-s`` (default 0.01 s), as a user tuning for
throughput would.

a. Throughput
-------------
For each run (fresh SQLite database, fresh gateway store): the worker
launches DBOS, registers the queue, pushes one warm-up workflow through it and
waits for it (so the queue's worker thread runs and the connections are
open), then the clock starts; it enqueues ``--operations`` refunds from the
main thread and waits for every handle's result in order
(``get_result(polling_interval_sec=0.1)``); the clock stops when the last
result is in. The clock therefore excludes Python start-up, DBOS launch and
migrations, and the gateway's start; it includes every enqueue, dequeue, step,
gateway HTTP round trip and DBOS's durable writes, and may end up to 0.1 s
late (the waiter's polling interval). After each run the gateway's own effect
counts are checked (one effect per operation).

Why not poll faster: with SQLite, DBOS opens every system-database
transaction as ``BEGIN IMMEDIATE`` (write lock), polls included, so a waiter
polling every 10 ms halved the throughput here; DBOS's default (1 s) would make
the end of the clock late by up to 1 s. DBOS's own ``created_at`` /
``updated_at`` timestamps are not usable as the clock: on SQLite they have a
resolution of one second.

b. Lost response after the effect committed (the article's case)
-----------------------------------------------------------------
``--crash-operations`` refunds (default 200); for every ``--crash-every``-th
operation (default 10th) the step, on its FIRST attempt only, SIGKILLs its own
process right after ``submit`` returned ``committed``: the gateway holds the
effect, DBOS has not recorded the step's output. (A marker file per operation,
written just before the kill, keeps later attempts from killing again.) The
supervisor (this script's parent process) restarts the DBOS worker on the
same SQLite database after every death; at launch DBOS recovers the pending
workflows, and the worker re-enqueues every operation (idempotent by workflow
ID) and waits for all of them. When a worker exits 0, every workflow has
completed; the supervisor then asks the gateway how many effects it holds per
operation (``SinkClient.effects()``) and counts operations with more than one
effect and the total extra effects. Two variants:

* ``no_key``: the step submits WITHOUT an idempotency key and with a fresh
  attempt ID, as a checkpoint-and-retry user writes it;
* ``workflow_id_key``: the step submits with the idempotency key = the DBOS
  workflow ID (equal to the operation ID, which ``SinkClient`` sends as the
  ``Idempotency-Key`` header; the step checks ``DBOS.workflow_id`` equals it),
  and the gateway dedupes.

The crash experiment runs with ``--crash-concurrency`` (default 1, one workflow
in flight) so each SIGKILL interrupts exactly the chosen operation; with more
concurrency, siblings in flight at the kill can add duplicates of their own.

Output: one JSON object on stdout; logs go to stderr.

Run it in the peers' virtualenv::

    .venv-peers/bin/python bench/peers/dbos_bench.py --bootstrap 127.0.0.1:39092

(``--bootstrap`` is accepted for a uniform command line with the other peer;
DBOS with SQLite does not use Kafka.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
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

log = logging.getLogger("dbos_bench")

QUEUE = "refunds"
APP_NAME = "peer-refunds"
#: How often a waiting handle polls the system database (seconds). Each poll is
#: an IMMEDIATE (write-locking) SQLite transaction, so polling much faster slows
#: the workflows down; the end of the clock is late by at most this much.
WAIT_POLL_S = 0.1
#: Longest one worker process may run (seconds) before the supervisor gives up.
WORKER_TIMEOUT_S = 120.0

#: The report's notes (filled in by main()).
NOTES = (
    "DBOS Transact with a SQLite system database (temp dir, fresh per run); one workflow per "
    "refund, workflow ID = operation ID, one step calling the reference payment gateway "
    "(testbed.sinks.gateway, PAYMENT_GATEWAY contract, fresh store per run) via SinkClient.submit. "
    "Throughput: operations enqueued on a DBOS queue (worker_concurrency={C}, "
    "polling_interval_sec={P}) and awaited in order via handles (get_result polling every 0.1 "
    "s: with SQLite every DBOS transaction, polls included, is BEGIN IMMEDIATE, so faster "
    "polling slows the workflows); clock from the first enqueue to the last result (may end up "
    "to 0.1 s late), after DBOS launch and one warm-up workflow (Python start-up, migrations "
    "and gateway start excluded). Lost response: the step SIGKILLs its process right after the "
    "gateway committed, on the first attempt of every {K}th operation; the supervisor "
    "relaunches the worker on the same SQLite DB (DBOS recovers PENDING workflows at launch) "
    "until all complete, then counts effects per operation at the gateway. no_key: submit "
    "without Idempotency-Key (fresh attempt ID per try); workflow_id_key: Idempotency-Key = "
    "workflow ID (= operation ID). Lost-response runs use worker_concurrency={CC}, so each kill"
    " interrupts only the chosen operation. --bootstrap is unused (no Kafka in DBOS with "
    "SQLite)."
)


def op_id(i: int) -> str:
    return f"refund:cust-{i}:v1"


def op_params(i: int) -> tuple[str, int]:
    """(account, amount_minor) of operation ``i``."""
    return f"acct-{i}", 100 + (i * 37) % 9900


# ============================================================================= the DBOS worker


def worker(args: argparse.Namespace) -> int:
    """One DBOS process: launch, (re)enqueue the operations, wait for all of them."""
    from dbos import DBOS, DBOSConfig, SetWorkflowID

    from ledger.identity import parameter_digest
    from sinks.client import SinkClient

    client = SinkClient(args.url, timeout_s=10.0, token=os.environ["LEDGER_SINK_TOKEN"])
    crash_ops = (
        {op_id(i) for i in range(args.operations) if (i + 1) % args.crash_every == 0}
        if args.crash_every > 0
        else set()
    )
    markers = Path(args.marker_dir) if args.marker_dir else None

    @DBOS.step()
    def refund(operation_id: str, account: str, amount_minor: int) -> dict[str, Any]:
        params = {"account": account, "amount_minor": amount_minor, "currency": "GBP"}
        digest = parameter_digest(
            action="refund",
            params=params,
            subject=account,
            purpose="fee-remediation",
            decision_version=1,
            sink="payments",
        )
        use_key = args.variant == "workflow_id_key"
        if use_key and DBOS.workflow_id != operation_id:
            raise RuntimeError(f"workflow ID {DBOS.workflow_id} is not {operation_id}")
        attempt_id = uuid.uuid4().hex
        # The gateway requires a key: "no key" sends a fresh one per attempt,
        # which deduplicates nothing, as no key would.
        result = client.submit(
            operation_id=operation_id,
            parameter_digest=digest,
            params=params,
            fencing_token=None,
            attempt_id=attempt_id,
            use_key=True,
            idempotency_key=operation_id if use_key else attempt_id,
            action="refund",
            subject=account,
            purpose="fee-remediation",
            decision_version=1,
        )
        if result.status != "committed":
            raise RuntimeError(f"gateway answered {result.status}: {result.detail}")
        if markers is not None and operation_id in crash_ops:
            marker = markers / operation_id.replace(":", "_")
            if not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)  # the response is lost with the process
        return {"effect_id": result.effect_id, "replayed": result.replayed}

    @DBOS.workflow()
    def refund_workflow(operation_id: str, account: str, amount_minor: int) -> dict[str, Any]:
        return refund(operation_id, account, amount_minor)

    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": f"sqlite:///{args.db}",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    queue = DBOS.register_queue(
        QUEUE, worker_concurrency=args.concurrency, polling_interval_sec=args.poll_s
    )

    def enqueue(i: int) -> Any:
        account, amount = op_params(i)
        with SetWorkflowID(op_id(i)):
            return queue.enqueue(refund_workflow, op_id(i), account, amount)

    if args.kind == "throughput":
        with SetWorkflowID("refund:warmup:v1"):
            queue.enqueue(refund_workflow, "refund:warmup:v1", "acct-warmup", 1).get_result(
                polling_interval_sec=0.01
            )
        t0 = time.perf_counter()
        handles = [enqueue(i) for i in range(args.operations)]
        enqueued_s = time.perf_counter() - t0
        for h in handles:
            h.get_result(polling_interval_sec=WAIT_POLL_S)
        seconds = time.perf_counter() - t0
        log.info(
            "worker: enqueued %d in %.3f s; all results in at %.3f s",
            len(handles),
            enqueued_s,
            seconds,
        )
        sys.stdout.write(json.dumps({"seconds": seconds, "enqueue_s": enqueued_s}) + "\n")
    else:
        handles = [enqueue(i) for i in range(args.operations)]
        for h in handles:
            h.get_result(polling_interval_sec=WAIT_POLL_S)
        sys.stdout.write(json.dumps({"completed": len(handles)}) + "\n")
    sys.stdout.flush()
    client.close()
    DBOS.destroy()
    return 0


# ============================================================================= the supervisor


class Gateway:
    """The reference payment gateway in a child process with its own store."""

    def __init__(self, run_dir: Path) -> None:
        from ledger.contracts import PAYMENT_GATEWAY
        from testbed.sinks.process import SinkProcess

        # DBOS has no fencing token to send: the gateway offers none here.
        contract = PAYMENT_GATEWAY.model_copy(update={"fencing": False})
        self.sink = SinkProcess("payments", contract, run_dir, clock="system", log_level="warning")

    def __enter__(self) -> Gateway:
        self.sink.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sink.stop()

    def effects(self) -> dict[str, int]:
        with self.sink.client() as client:
            return client.effects()


def spawn_worker(
    args: argparse.Namespace,
    kind: str,
    tmp: Path,
    url: str,
    *,
    operations: int,
    concurrency: int,
    variant: str = "no_key",
    crash_every: int = 0,
    token: str,
) -> subprocess.CompletedProcess[bytes]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "_worker",
        kind,
        "--db",
        str(tmp / "dbos.sqlite"),
        "--url",
        url,
        "--operations",
        str(operations),
        "--concurrency",
        str(concurrency),
        "--poll-s",
        str(args.poll_s),
        "--variant",
        variant,
        "--crash-every",
        str(crash_every),
        "--marker-dir",
        str(tmp / "markers"),
    ]
    env = {**os.environ, "LEDGER_SINK_TOKEN": token}  # not in the arguments
    return subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        timeout=WORKER_TIMEOUT_S,
        check=False,
        env=env,
    )


def throughput_run(args: argparse.Namespace, index: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dbos-bench-"))
    try:
        (tmp / "markers").mkdir()
        with Gateway(tmp / "gateway") as gw:
            done = spawn_worker(
                args,
                "throughput",
                tmp,
                gw.sink.url,
                operations=args.operations,
                concurrency=args.concurrency,
                token=gw.sink.token,
            )
            if done.returncode != 0:
                raise RuntimeError(f"throughput worker exited with {done.returncode}")
            timing = json.loads(done.stdout.decode().strip().splitlines()[-1])
            seconds = timing["seconds"]
            effects = gw.effects()
        ops = [op_id(i) for i in range(args.operations)]
        one_each = all(effects.get(op) == 1 for op in ops)
        log.info(
            "throughput run %d: %d ops in %.3f s (%.1f ops/s), one effect each: %s",
            index,
            args.operations,
            seconds,
            args.operations / seconds,
            one_each,
        )
        return {
            "seconds": round(seconds, 4),
            "ops_per_s": round(args.operations / seconds, 1),
            "enqueue_s": round(timing["enqueue_s"], 4),
            "one_effect_per_operation": one_each,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def lost_response(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dbos-crash-"))
    try:
        (tmp / "markers").mkdir()
        crashes = 0
        launches = 0
        expected = args.crash_operations // args.crash_every
        t0 = time.perf_counter()
        with Gateway(tmp / "gateway") as gw:
            while True:
                launches += 1
                if launches > expected + 5:
                    raise RuntimeError(f"{variant}: still not done after {launches - 1} launches")
                done = spawn_worker(
                    args,
                    "crash",
                    tmp,
                    gw.sink.url,
                    operations=args.crash_operations,
                    concurrency=args.crash_concurrency,
                    variant=variant,
                    crash_every=args.crash_every,
                    token=gw.sink.token,
                )
                if done.returncode == -signal.SIGKILL:
                    crashes += 1
                    continue
                if done.returncode != 0:
                    raise RuntimeError(f"{variant}: worker exited with {done.returncode}")
                break
            effects = gw.effects()
        seconds = time.perf_counter() - t0
        ops = [op_id(i) for i in range(args.crash_operations)]
        missing = sum(1 for op in ops if effects.get(op, 0) == 0)
        duplicate_ops = sum(1 for op in ops if effects.get(op, 0) > 1)
        extra = sum(effects.get(op, 0) - 1 for op in ops if effects.get(op, 0) > 1)
        log.info(
            "lost-response %s: %d crashes, %d launches, %.1f s; duplicate ops %d, extra "
            "effects %d, missing %d",
            variant,
            crashes,
            launches,
            seconds,
            duplicate_ops,
            extra,
            missing,
        )
        return {
            "crashes": crashes,
            "launches": launches,
            "duplicate_ops": duplicate_ops,
            "extra_effects": extra,
            "missing_effects": missing,
            "seconds": round(seconds, 2),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ============================================================================= CLI


def parse(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["_worker"]:
        p = argparse.ArgumentParser(prog="dbos_bench.py _worker")
        p.add_argument("kind", choices=["throughput", "crash"])
        p.add_argument("--db", required=True)
        p.add_argument("--url", required=True)
        p.add_argument("--operations", type=int, required=True)
        p.add_argument("--concurrency", type=int, required=True)
        p.add_argument("--poll-s", type=float, required=True)
        p.add_argument("--variant", choices=["no_key", "workflow_id_key"], default="no_key")
        p.add_argument("--crash-every", type=int, default=0)
        p.add_argument("--marker-dir", default="")
        ns = p.parse_args(argv[1:])
        ns.mode = "worker"
        return ns
    p = argparse.ArgumentParser(
        description="DBOS Transact (SQLite) refunds through the reference payment gateway: "
        "throughput and lost-response crash duplicates (prints one JSON object on stdout)."
    )
    p.add_argument("--bootstrap", default=None, help="accepted for symmetry; unused by DBOS")
    p.add_argument("--operations", type=int, default=500, help="operations per throughput run")
    p.add_argument("--runs", type=int, default=3, help="throughput runs")
    p.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="queue worker_concurrency for the throughput runs",
    )
    p.add_argument("--poll-s", type=float, default=0.01, help="queue polling_interval_sec")
    p.add_argument(
        "--crash-operations", type=int, default=200, help="operations of each lost-response variant"
    )
    p.add_argument("--crash-every", type=int, default=10, help="crash every k-th operation")
    p.add_argument(
        "--crash-concurrency",
        type=int,
        default=1,
        help="queue worker_concurrency for the lost-response runs",
    )
    ns = p.parse_args(argv)
    ns.mode = "bench"
    return ns


def main(argv: list[str]) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse(argv)
    if args.mode == "worker":
        return worker(args)

    from importlib.metadata import version

    runs = [throughput_run(args, i) for i in range(args.runs)]
    variants = {v: lost_response(args, v) for v in ("no_key", "workflow_id_key")}
    crashes = variants["no_key"]["crashes"]
    report = {
        "peer": "dbos",
        "version": version("dbos"),
        "throughput": {
            "operations": args.operations,
            "concurrency": args.concurrency,
            "queue_polling_interval_s": args.poll_s,
            "runs": runs,
            "median_ops_per_s": round(statistics.median(r["ops_per_s"] for r in runs), 1),
        },
        "lost_response": {
            "operations": args.crash_operations,
            "crash_every": args.crash_every,
            "crashes": crashes,
            "concurrency": args.crash_concurrency,
            "variants": variants,
        },
        "notes": NOTES.format(
            C=args.concurrency, P=args.poll_s, K=args.crash_every, CC=args.crash_concurrency
        ),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
