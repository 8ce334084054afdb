"""The sink-only limit: the reference payment gateway driven directly.

The ledger cannot verify operations faster than its sink performs them, so
its end-to-end figure is reported as a ratio to this limit: the same
gateway, the same requests per operation, from the same number of
processes, and nothing else.

* **Gateway**: started as the end-to-end rig starts it
  (:func:`bench.e2e.start_gateway`: the reference payment gateway with its
  contract ``PAYMENT_GATEWAY``, fault injection on, the same log level and
  clock), in its own run folder; no Kafka.
* **Requests**: for one operation that ends ``OUTCOME_VERIFIED`` the relay
  sends two (counted in the gateway's access log of a rig run): the execute
  ``POST /operations`` (idempotency key: the operation ID; fencing token of
  the first epoch; the parameter digest and its inputs), and, once the
  processor has the receipt, the postcondition query ``GET
  /accounts/{account}``. A fresh dispatch is never read back. This driver
  sends exactly those, in that order, with the relay's client
  (:class:`sinks.client.SinkClient`, the relay's timeout and the sink's
  token), for the benchmark's sample operations
  (:func:`bench.common.sample_intent`); each answer is checked as the relay
  and the processor would (committed; the postcondition judged ``MATCH``).
* **Processes**: as many as the ledger runs relay instances; each sends its
  share of the operations one after another, as one relay does.
* **Clock**: from the moment every process is ready (started, imported,
  connected) and is told to start, to the last process's report of its
  last answer. The processes are ``python -m bench.sinklimit`` children,
  told their share on stdin.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from bench.common import PROJECT_ROOT, median, sample_intent, settings_for
from bench.e2e import start_gateway
from ledger.contracts import (
    PAYMENT_GATEWAY,
    fencing_token_for,
    judge_postcondition,
    postcondition_request,
)
from ledger.settings import LedgerSettings
from sinks.client import SinkClient
from testbed.harness import Harness

#: The requests the relay sends for one operation on its way to OUTCOME_VERIFIED.
REQUESTS_PER_OPERATION = ("POST /operations", "GET /accounts/{account}")

#: First epoch of a fresh operation: the fencing token of its first dispatch.
FIRST_EPOCH = 1


def perform(client: SinkClient, i: int) -> str | None:
    """Send operation ``i``'s requests as the relay does on the happy path.

    Args:
        client: a client of the reference payment gateway.
        i: the benchmark operation (:func:`bench.common.sample_intent`).

    Returns:
        ``None`` when the effect committed and its postcondition matched;
        else what went wrong.
    """
    intent = sample_intent(i)
    op = intent.operation_id
    params: dict[str, Any] = json.loads(intent.params_json)
    result = client.submit(
        op,
        intent.parameter_digest,
        params,
        fencing_token_for(PAYMENT_GATEWAY, FIRST_EPOCH),
        f"{op}#{FIRST_EPOCH}.1",  # the first dispatch's ID, the relay's attempt ID
        use_key=True,
        action=intent.action,
        subject=intent.subject,
        purpose=intent.purpose,
        decision_version=intent.decision_version,
    )
    if result.status != "committed":
        return f"{op}: submit {result.status} {result.detail}"
    ask = postcondition_request(PAYMENT_GATEWAY, params)
    observation = client.postcondition(ask.query, ask.subject)
    status, detail = judge_postcondition(PAYMENT_GATEWAY, params, observation, op)
    return None if status == "MATCH" else f"{op}: postcondition {status} {detail}"


def _worker() -> int:
    """One driving process (``python -m bench.sinklimit``), told what to do on stdin.

    Reads one JSON line (``url``, ``token``, ``timeout_s``, ``numbers``),
    connects, prints ``ready``; on the next line (the start) performs its
    operations in turn and prints one JSON line, ``{"problems": [...]}``.
    The token comes on stdin, never in the arguments.
    """
    job = json.loads(sys.stdin.readline())
    with SinkClient(job["url"], timeout_s=job["timeout_s"], token=job["token"]) as client:
        client.health()  # the connection is open before the clock starts
        print("ready", flush=True)
        sys.stdin.readline()
        problems = [p for i in job["numbers"] if (p := perform(client, i)) is not None]
    print(json.dumps({"problems": problems}), flush=True)
    return 0


def _answer(worker: subprocess.Popen[str]) -> str:
    """The worker's next line; its error output when it ended instead."""
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if not line:
        worker.wait(timeout=10)
        err = worker.stderr.read() if worker.stderr is not None else ""
        raise RuntimeError(f"a sink-only driver exited with {worker.returncode}: {err[-2000:]}")
    return line


def _run(gateway: tuple[str, str], timeout_s: float, numbers: list[int], processes: int) -> float:
    """Perform ``numbers`` from ``processes`` processes; returns the seconds taken."""
    url, token = gateway
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.sinklimit"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=PROJECT_ROOT,
        )
        for _ in range(processes)
    ]
    try:
        for k, w in enumerate(workers):
            assert w.stdin is not None
            share = numbers[k::processes]
            job = {"url": url, "token": token, "timeout_s": timeout_s, "numbers": share}
            w.stdin.write(json.dumps(job) + "\n")
            w.stdin.flush()
        for w in workers:
            _answer(w)  # ready
        started = time.perf_counter()
        for w in workers:
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        problems = [p for w in workers for p in json.loads(_answer(w))["problems"]]
        seconds = time.perf_counter() - started
    finally:
        for w in workers:
            if w.poll() is None:
                try:
                    w.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
    if problems:
        raise RuntimeError(
            f"{len(problems)} operation(s) did not end as the relay's happy path does, "
            f"e.g. {problems[0]}"
        )
    return seconds


def measure(base: LedgerSettings, n: int, runs: int, processes: int = 1) -> dict[str, Any]:
    """The sink-only limit: operations per second the gateway performs directly.

    Args:
        base: settings to derive from (the relay's sink timeout).
        n: operations per run.
        runs: runs (after one unmeasured warm-up run of ``min(100, n)``).
        processes: driving processes (the ledger's relay instances).

    Returns:
        ``ops_per_s`` (median of the runs), ``runs`` (each ``seconds`` and
        ``ops_per_s``), ``operations``, ``processes`` and
        ``requests_per_operation`` (method and route of each request).
    """
    settings = settings_for(base, "sinklimit")
    harness = Harness(settings, create=False)
    try:
        sink = start_gateway(harness)
        gateway = (sink.url, sink.token)
        timeout_s = settings.sink_timeout_s
        _run(gateway, timeout_s, list(range(min(100, n))), processes)  # warm-up
        rows = []
        for k in range(runs):
            first = min(100, n) + k * n
            seconds = _run(gateway, timeout_s, list(range(first, first + n)), processes)
            rows.append({"seconds": seconds, "ops_per_s": n / seconds})
    finally:
        harness.stop()
    return {
        "operations": n,
        "processes": processes,
        "requests_per_operation": list(REQUESTS_PER_OPERATION),
        "runs": rows,
        "ops_per_s": median([r["ops_per_s"] for r in rows]),
    }


if __name__ == "__main__":
    sys.exit(_worker())
