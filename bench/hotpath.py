"""The processor's and the auditor's per-record work in one process, without Kafka.

``python -m bench.hotpath`` times, on ``--records`` refund intents encoded
beforehand, what the processor does per input (decode, fold, encode the
journal entry, the state and the admission request) and what the auditor
does per journal entry (decode the entry, decode its input, replay the
fold), each as a ratio to a bare fastavro decode of the same bytes measured
in the same run (medians of ``--runs``). With ``--profile`` it prints
cProfile's heaviest calls (cumulative) of one pass of both instead.

No broker; times are this process's CPU time (the machine is shared). The
ratios say where the per-record time goes; absolute rates are printed for
orientation only.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

import click
from fastavro import schemaless_reader

from bench.common import sample_intent
from ledger.events import decode_event
from ledger.fold import decide
from ledger.fold import intents as intents_module
from ledger.fold.journal import journal_entry, ref_of, replay_decisions
from ledger.serde import HEADER_LEN, registry


def _inputs(n: int) -> list[bytes]:
    return [sample_intent(i).to_bytes() for i in range(n)]


def processor_step(raws: list[bytes]) -> list[bytes]:
    """Decode, fold and encode every input as the processor does (one state per operation).

    Returns:
        The encoded journal entries, in input order.
    """
    journal: list[bytes] = []
    for offset, raw in enumerate(raws):
        event = decode_event(raw)
        ref = ref_of("intents", 0, offset)
        decision = decide(None, event, ref)
        journal.append(journal_entry(decision, event, raw, "intents", 0, offset).to_bytes())
        if decision.state is not None:
            decision.state.to_bytes()
        for output in decision.outputs:
            if output.event is not None:
                output.event.to_bytes()
    return journal


def auditor_step(journal: list[bytes]) -> None:
    """Decode every journal entry and replay the fold over them, as the auditor does."""
    entries = [decode_event(raw) for raw in journal]
    replay_decisions(entries)  # type: ignore[arg-type]


def raw_decode(raws: list[bytes]) -> None:
    """fastavro-decode every value (writer schema by fingerprint), nothing else."""
    reg = registry()
    for value in raws:
        writer = reg.by_fingerprint[value[2:HEADER_LEN]]
        body = io.BytesIO(value[HEADER_LEN:])
        schemaless_reader(body, writer.parsed)


def _forget_digest_checks() -> None:
    """Empty the fold's memo of intent digest checks (if this version has one).

    The auditor replays in another process than the processor's: its checks
    start cold, and so does every timed step here.
    """
    memo = getattr(intents_module, "_digest_problem", None)
    if memo is not None:
        memo.cache_clear()


def _timed(fn: Callable[[], Any]) -> float:
    _forget_digest_checks()
    # CPU time of this process: the work is single-threaded and in-process,
    # and the machine is shared, so wall time would measure the neighbours.
    started = time.process_time()
    fn()
    return time.process_time() - started


@click.command()
@click.option("--records", default=5000, show_default=True, help="Intents per run.")
@click.option("--runs", default=3, show_default=True, help="Repetitions; figures are medians.")
@click.option("--profile", is_flag=True, help="Print cProfile's heaviest calls instead.")
def main(records: int, runs: int, profile: bool) -> None:
    """Per-record cost of the processor and the auditor, as ratios to a bare decode."""
    raws = _inputs(records)
    journal = processor_step(raws)  # also warms every cache up
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(processor_step, raws)
        profiler.runcall(auditor_step, journal)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
        return
    rows: dict[str, list[float]] = {"processor": [], "auditor": [], "raw": [], "raw_journal": []}
    for _ in range(runs):  # interleaved, so drift hits all alike
        rows["raw"].append(_timed(lambda: raw_decode(raws)))
        rows["processor"].append(_timed(lambda: processor_step(raws)))
        rows["raw_journal"].append(_timed(lambda: raw_decode(journal)))
        rows["auditor"].append(_timed(lambda: auditor_step(journal)))
    med = {k: statistics.median(v) for k, v in rows.items()}
    # The auditor's baseline decodes the journal entries only; the inputs
    # inside them are its extra work, as on the broker.
    print(f"records: {records}, runs: {runs} (medians)")
    print(f"raw decode of the intents, records/s:   {records / med['raw']:>10,.0f}")
    print(f"processor step, records/s:              {records / med['processor']:>10,.0f}")
    print(f"raw decode of the journal, entries/s:   {records / med['raw_journal']:>10,.0f}")
    print(f"auditor step, entries/s:                {records / med['auditor']:>10,.0f}")
    print(f"processor step / raw decode:            {med['raw'] / med['processor']:>10.3f}")
    print(f"auditor step / raw decode of journal:   {med['raw_journal'] / med['auditor']:>10.3f}")


if __name__ == "__main__":
    main()
