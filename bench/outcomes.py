"""The time to learn one outcome, at 1,000 and at 1,000,000 settled operations (issue 28).

A service waits for its operation's outcome on ``ledger.outcomes``
(:mod:`producers.outcomes`): it watches the operation's partition from where
it ends, publishes, and reads until the processor's answer. The topic holds
one signed outcome per settled operation (``settled`` of them, spread over
every partition, as the processor leaves them); each run then times one
wait: :meth:`~producers.outcomes.OutcomeReader.watch`, the answer written as
the processor writes it (signed with the outcome key, on the operation's
partition), and :meth:`~producers.outcomes.OutcomeWatch.wait` until it is
read. The processor's own decision time does not depend on this topic (it
never reads it), so what is timed is the part that could grow with history.

::

    python -m bench.outcomes --settled 1000 --settled 1000000 --runs 5

prints one JSON object: per history size the median seconds of a wait and
the records it read, and the ratio of the largest to the smallest
(issue target: at most 1.5). Filling 1,000,000 records takes a few minutes.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import click
from confluent_kafka import Producer

from bench.common import create, drop, say, settings_for
from ledger.authn import seal_headers
from ledger.credentials import outcome_key, provision_keys
from ledger.events import Outcome
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from ledger.topology import partition_for
from producers.outcomes import OutcomeReader

#: The digest every synthesized outcome carries (the waiter checks only its own).
DIGEST = "v2:" + "0" * 64


def _settled(op: str, n: int, at_ms: int) -> Outcome:
    return Outcome(
        outcome_id=f"processor:receipts:0:{n}",
        operation_id=op,
        kind="VERIFIED",
        state="OUTCOME_VERIFIED",
        state_version=5,
        reason="effect committed and postcondition verified",
        parameter_digest=DIGEST,
        effect_id=f"pay-{n}",
        postcondition="payments GET /accounts/acct-1: VERIFIED",
        at_ms=at_ms,
    )


def _fill(settings: LedgerSettings, settled: int) -> float:
    """Write ``settled`` signed outcomes (a day old); returns the seconds it took."""
    started = time.perf_counter()
    signer = outcome_key(settings)
    producer = Producer(producer_config(settings, **{"queue.buffering.max.messages": 1_000_000}))
    full = settings.topic("outcomes")
    day_ago_ms = int(time.time() * 1000) - 86_400_000
    for n in range(settled):
        op = f"refund:settled-{n:07d}:v1"
        key, value = op.encode(), _settled(op, n, day_ago_ms).to_bytes()
        headers = seal_headers(signer, "outcomes", key, value)
        while True:
            try:
                producer.produce(full, key=key, value=value, headers=headers, timestamp=day_ago_ms)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 10_000 == 0:
            producer.poll(0)
    if producer.flush(900):
        raise RuntimeError("outcome records were not delivered")
    return time.perf_counter() - started


def outcome_wait(base: LedgerSettings, settled: int, runs: int) -> dict[str, Any]:
    """Time ``runs`` outcome waits on a ledger whose ``outcomes`` hold ``settled`` operations.

    Args:
        base: the broker's settings.
        settled: settled operations' outcomes written first.
        runs: waits timed.

    Returns:
        ``settled``, ``fill_s``, ``runs`` (seconds each), ``seconds``
        (median), ``records_read`` (per wait).
    """
    settings = settings_for(base, f"outcome{settled}")
    create(settings)
    provision_keys(settings)
    try:
        fill_s = _fill(settings, settled)
        signer = outcome_key(settings)
        reader = OutcomeReader(settings)
        producer = Producer(producer_config(settings))
        seconds: list[float] = []
        reads: list[int] = []
        for run in range(runs):
            op = f"refund:waited-{run}:v1"
            answer = _settled(op, run, int(time.time() * 1000)).model_copy(
                update={"outcome_id": f"processor:intents:0:{run}"}
            )
            key, value = op.encode(), answer.to_bytes()
            t0 = time.perf_counter()
            with reader.watch(op) as watch:
                producer.produce(
                    settings.topic("outcomes"),
                    key=key,
                    value=value,
                    headers=seal_headers(signer, "outcomes", key, value),
                    partition=partition_for(op, settings.partitions),
                )
                producer.flush(30)
                waited = watch.wait(30.0, answer_to=(0, run), parameter_digest=DIGEST)
            seconds.append(time.perf_counter() - t0)
            if not waited.final:
                raise RuntimeError(f"run {run}: the answer was not read within 30 s")
            reads.append(waited.records_read)
        return {
            "settled": settled,
            "fill_s": fill_s,
            "runs": seconds,
            "seconds": statistics.median(seconds),
            "records_read": reads,
        }
    finally:
        drop(settings)


def compare(base: LedgerSettings, sizes: tuple[int, ...], runs: int) -> dict[str, Any]:
    """:func:`outcome_wait` at each history size, and the ratio of the largest to the smallest."""
    rows = []
    for size in sorted(sizes):
        say(f"outcomes: one wait over {size:,} settled operations x {runs}")
        rows.append(outcome_wait(base, size, runs))
    return {"sizes": rows, "ratio": rows[-1]["seconds"] / rows[0]["seconds"]}


@click.command()
@click.option(
    "--settled",
    "sizes",
    type=click.IntRange(min=0),
    multiple=True,
    default=(1000, 1_000_000),
    show_default=True,
    help="Settled operations in the history (repeatable).",
)
@click.option("--runs", default=5, show_default=True, help="Waits timed per size.")
def main(sizes: tuple[int, ...], runs: int) -> None:
    """Time one outcome wait at each history size (LEDGER_* / KAFKA_BOOTSTRAP_SERVERS)."""
    print(json.dumps(compare(LedgerSettings(), sizes, runs), indent=2))


if __name__ == "__main__":
    main()
