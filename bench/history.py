"""Recovery bounded by work in flight: restart on top of a long history.

10. **Restart over history** (:func:`restart_over_history`): a rig whose
    ledger already holds ``settled`` settled operations, then ``in_flight``
    operations waiting in EFFECT_PENDING (relay stopped); every stage is
    SIGKILLed and restarted and the clock runs from the restart to the last
    ``OUTCOME_VERIFIED`` (as :func:`bench.e2e.recovery`). Run at 1,000 and at
    100,000 settled operations, the ratio of the two says whether recovery is
    bounded by the work in flight (issue target: at most 1.5). Each stage's
    log says when it was running, when its partitions were assigned and when
    its restore ended (processor: ``restored N state records``; authority:
    ``N approvals and N uses filed``; relay: ``N receipts filed``),
    so the result names the stage whose restore dominates.

    The settled history is synthesized, because running 100,000 operations
    end to end takes about 15 minutes here: a few real operations run first
    (``TEMPLATES``), every record they left in the topics a stage restores
    from at start is read back (``ledger.state``: the processor;
    ``receipts``: the relay; ``approval-uses``: the authority kernel), and
    each synthesized operation gets copies of one template's records with the
    template's operation ID replaced by its own (same length, so the Avro
    encoding stays valid) and sealed again with the rig's own keys (the
    key of each topic's writer role), so every
    restore accepts them as it accepts the stages' own records. Its approval
    (``approvals``, which the authority kernel restores too) is a grant
    signed by the rig's reviewer key and published by the ledger's own
    publisher, as the driver does for real operations. Every state version
    an operation went through is copied; then the topics are compacted (one
    record per key: what a ledger's history holds once its segments have
    rolled, every 10 minutes) unless ``compact`` is off.

11. **Processor restore at 1,000,000 operations** (:func:`processor_restore`):
    one partition of ``ledger.state`` holding ``n`` sealed verified states
    (one record per operation: the compacted form), restored by
    :meth:`consumers.processor.Processor.on_assign` in this process; median of
    ``runs`` restores, in seconds and records per second.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Message, Producer

from bench.common import (
    create,
    drop,
    sample_approval,
    sample_intent,
    sample_operation_id,
    say,
    settings_for,
)
from bench.e2e import Rig, kill_every_stage_and_recover
from bench.replay import verified_state
from consumers.processor import Processor
from consumers.stage import Record, read_partition
from consumers.stages import STAGES
from ledger.authn import AUTH_HEADER, Sealer
from ledger.credentials import stage_sealer
from ledger.kafka import producer_config
from ledger.settings import LedgerSettings
from ledger.topology import TOPIC_BY_NAME
from testbed.compaction import force_compaction

#: Topics a stage restores per operation at start, with the stage that reads them.
RESTORED = {"state": "processor", "receipts": "relay", "approval-uses": "authority"}

#: Real operations run first; the settled history copies their records.
TEMPLATES = 8

#: The log line that ends each stage's restore (after "assigned partitions").
RESTORE_DONE = {
    "processor": re.compile(r"processor restored (\d+) state records"),
    "authority": re.compile(r"authority: (\d+) approvals and (\d+) uses (?:loaded|filed)"),
    "relay": re.compile(r"relay: (\d+) (?:earlier attempts known|receipts filed)"),
}

#: Longest wait (seconds) after the recovery for every stage's restore line.
RESTORE_WAIT_S = 600.0

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")


# ---------------------------------------------------------------- pure parts


def stage_timeline(component: str, lines: list[str], since: float) -> dict[str, Any]:
    """When a restarted stage ran, was assigned and had restored (seconds after ``since``).

    Args:
        component: ``processor``, ``authority`` or ``relay``.
        lines: its log's lines (text format: ``asctime level name: message``,
            local time).
        since: the restart, epoch seconds; earlier lines are ignored.

    Returns:
        ``running_s``, ``assigned_s``, ``restored_s`` (each seconds after the
        restart, ``None`` when the line is missing), ``restore_s``
        (restored - assigned, seconds) and ``records`` (the counts the restore
        line names, summed).
    """
    out: dict[str, Any] = {
        "running_s": None,
        "assigned_s": None,
        "restored_s": None,
        "restore_s": None,
        "records": None,
    }
    done = RESTORE_DONE[component]
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - since
        if at < 0:
            continue
        message = m.group(2)
        if out["running_s"] is None and " running (pid " in message:
            out["running_s"] = at
        elif out["assigned_s"] is None and " assigned partitions [" in message:
            out["assigned_s"] = at
        elif out["restored_s"] is None and (found := done.search(message)):
            out["restored_s"] = at
            out["records"] = sum(int(g) for g in found.groups())
    if out["assigned_s"] is not None and out["restored_s"] is not None:
        out["restore_s"] = out["restored_s"] - out["assigned_s"]
    return out


def dominating(stages: dict[str, dict[str, Any]]) -> str | None:
    """The stage with the longest restore (``restore_s``), or ``None`` if none is known."""
    known = {k: v["restore_s"] for k, v in stages.items() if v.get("restore_s") is not None}
    return max(known, key=lambda k: known[k]) if known else None


def rekey(raw: bytes | None, old: bytes, new: bytes) -> bytes | None:
    """``raw`` with every occurrence of operation ID ``old`` replaced by ``new`` (same length).

    Raises:
        ValueError: the IDs differ in length (the Avro string lengths would lie).
    """
    if len(old) != len(new):
        raise ValueError(f"{old!r} and {new!r} differ in length")
    return None if raw is None else raw.replace(old, new)


# ---------------------------------------------------------------- the history


def _read_all(settings: LedgerSettings, short: str) -> list[tuple[bytes, bytes | None, list[Any]]]:
    """Every committed record of a topic: ``(key, value, headers)``."""
    out: list[tuple[bytes, bytes | None, list[Any]]] = []

    def keep(_: Record | None, msg: Message) -> None:
        out.append((msg.key() or b"", msg.value(), list(msg.headers() or [])))

    read_partition(settings, short, None, keep, decode=False)
    return out


def _templates(
    settings: LedgerSettings, numbers: list[int]
) -> dict[str, dict[int, list[tuple[bytes, bytes | None, list[Any]]]]]:
    """The records each template operation left: topic -> template number -> records."""
    ids = {n: sample_operation_id(n).encode() for n in numbers}
    found: dict[str, dict[int, list[tuple[bytes, bytes | None, list[Any]]]]] = {}
    for short in RESTORED:
        per: dict[int, list[tuple[bytes, bytes | None, list[Any]]]] = {n: [] for n in numbers}
        for key, value, headers in _read_all(settings, short):
            for n, op in ids.items():
                if op in key or (value is not None and op in value):
                    per[n].append((key, value, headers))
                    break
        found[short] = per
    return found


def settle(rig: Rig, settled: int, *, compact: bool = True) -> dict[str, Any]:
    """Give ``rig``'s ledger ``settled`` settled operations (see the module docstring).

    Runs :data:`TEMPLATES` real operations to OUTCOME_VERIFIED, then writes
    re-keyed, resealed copies of their records for ``settled`` more. With
    ``compact`` the restored topics are then compacted
    (:func:`testbed.compaction.force_compaction`): one record per key, as a
    ledger's history is once its segments have rolled (every 10 minutes);
    without, every version is left, as just after the operations ran.

    Returns:
        ``operations`` (synthesized), ``templates`` (topic -> records per
        operation), ``records`` (topic -> records written), ``compacted``,
        ``seconds`` (wall time of the whole fill, compaction included).
    """
    started = time.perf_counter()
    rig.run(TEMPLATES, None)
    numbers = list(range(rig.next_op - TEMPLATES, rig.next_op))
    templates = _templates(rig.settings, numbers)
    new_numbers = rig.allocate(settled)
    # Each topic's records are sealed with the key of the role that writes it.
    sealers = {
        role: stage_sealer(rig.settings, role) for role in ("authority", "processor", "relay")
    }

    def sealer(topic: str) -> Sealer:
        writer = TOPIC_BY_NAME[topic].auth[0]
        return sealers["processor" if writer == "outcome" else writer](topic)

    now_ms = int(time.time() * 1000)
    for k, j in enumerate(new_numbers):  # approvals: signed grants, as the driver publishes
        grant = rig.key.sign(
            sample_approval(sample_intent(j), now_ms), ledger_id=rig.settings.ledger_identity
        )
        rig.publisher.publish_approval(grant, wait=False)
        if k % 5000 == 4999:
            rig.publisher.flush()
    rig.publisher.flush()
    written = {"approvals": settled}
    producer = Producer(
        producer_config(rig.settings, **{"queue.buffering.max.messages": 1_000_000})
    )
    for short, per in templates.items():
        full = rig.settings.topic(short)
        seal = sealer(short)
        count = 0
        for k, j in enumerate(new_numbers):
            t = numbers[k % len(numbers)]
            old, new = sample_operation_id(t).encode(), sample_operation_id(j).encode()
            for key, value, headers in per[t]:
                new_key = rekey(key, old, new) or b""
                new_value = rekey(value, old, new)
                kept = [(h, v) for h, v in headers if h != AUTH_HEADER]
                kept.append((AUTH_HEADER, seal.seal(short, new_key, new_value)))
                while True:
                    try:
                        producer.produce(full, key=new_key, value=new_value, headers=kept)
                        break
                    except BufferError:
                        producer.poll(0.05)
                count += 1
            if k % 2000 == 0:
                producer.poll(0)
        written[short] = count
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} synthesized records were not delivered")
    if compact:
        force_compaction(rig.settings, timeout_s=600, names=["approvals", *RESTORED])
    return {
        "compacted": compact,
        "operations": settled,
        "templates": {
            s: sum(len(r) for r in per.values()) / len(numbers) for s, per in templates.items()
        },
        "records": written,
        "seconds": time.perf_counter() - started,
    }


def _restart_cycle(rig: Rig, in_flight: int) -> dict[str, Any]:
    """Put ``in_flight`` operations in EFFECT_PENDING, SIGKILL every stage, time the recovery."""
    recovery_s, wall = kill_every_stage_and_recover(rig, in_flight, 900)
    logs = rig.settings.run_dir / "logs"

    def timelines() -> dict[str, dict[str, Any]]:
        return {
            component: stage_timeline(component, _lines(logs / f"{component}-0.log"), wall)
            for component in STAGES
        }

    # A stage the operations in flight do not wait for (the authority kernel)
    # may still be restoring: its restore is waited for (not timed as recovery).
    stages = timelines()
    deadline = time.monotonic() + RESTORE_WAIT_S
    while any(t["restored_s"] is None for t in stages.values()) and time.monotonic() < deadline:
        time.sleep(1.0)
        stages = timelines()
    gate = [stages[c]["restored_s"] for c in ("processor", "relay")]
    return {
        "in_flight": in_flight,
        "recovery_s": recovery_s,
        "restored_s": None if None in gate else max(gate),
        "stages": stages,
    }


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def restart_over_history(
    base: LedgerSettings, settled: int, in_flight: int, runs: int, *, compact: bool = True
) -> dict[str, Any]:
    """Recovery of ``in_flight`` operations on top of ``settled`` settled ones, ``runs`` times.

    One rig is filled once; each run adds ``in_flight`` operations that are
    settled for the next run (so the history grows by ``in_flight`` per run:
    ``settled_at_restart`` says how many were settled at each restart).

    Returns:
        ``settled``, ``in_flight``, ``fill`` (:func:`settle`), ``runs`` (each:
        ``recovery_s`` in seconds, ``restored_s``: seconds from the restart
        until the processor and the relay, which the operations in flight
        wait for, had both restored, ``settled_at_restart`` and ``stages``:
        component -> :func:`stage_timeline`), ``recovery_s`` and
        ``restored_s`` (medians, seconds),
        ``restore_s`` (component -> median seconds) and ``dominating`` (the
        stage with the longest median restore).
    """
    rig = Rig(base, f"history{settled}")
    try:
        say(f"history: synthesizing {settled:,} settled operations")
        fill = settle(rig, settled, compact=compact)
        say(f"history: {fill['records']} written in {fill['seconds']:.0f} s")
        rows = []
        for run in range(runs):
            before = rig.next_op
            row = _restart_cycle(rig, in_flight)
            row["settled_at_restart"] = before
            say(f"history: {settled:,} settled, restart {run + 1}: {row['recovery_s']:.1f} s")
            rows.append(row)
        restore = {
            c: statistics.median(
                [
                    r["stages"][c]["restore_s"]
                    for r in rows
                    if r["stages"][c]["restore_s"] is not None
                ]
                or [float("nan")]
            )
            for c in STAGES
        }
        summary = {c: {"restore_s": v} for c, v in restore.items()}
        return {
            "settled": settled,
            "in_flight": in_flight,
            "fill": fill,
            "runs": rows,
            "recovery_s": statistics.median(r["recovery_s"] for r in rows),
            "restored_s": statistics.median(
                [r["restored_s"] for r in rows if r["restored_s"] is not None] or [float("nan")]
            ),
            "restore_s": restore,
            "dominating": dominating(summary),
        }
    finally:
        rig.close()


# ---------------------------------------------------------------- processor at 1M


def _states(n: int) -> Iterator[tuple[bytes, bytes]]:
    """``n`` verified states (key, value), the template's operation ID replaced."""
    template = verified_state(0).to_bytes()
    old = sample_operation_id(0).encode()
    for i in range(n):
        new = sample_operation_id(i).encode()
        yield new, template.replace(old, new)


def processor_restore(base: LedgerSettings, n: int, runs: int) -> dict[str, Any]:
    """The processor's restore of one ``ledger.state`` partition holding ``n`` operations.

    Fills the partition once (sealed with the deployment key), then restores
    it ``runs`` times with a fresh :class:`~consumers.processor.Processor`.
    The restore read (:func:`consumers.stage.read_partition`) gives up only
    when it stops moving, so a partition of any size is restored; the time
    grows with ``n``.

    Returns:
        ``operations``, ``fill_s``, ``runs`` (seconds each), ``seconds``
        (median) and ``records_per_s`` (``n`` / median).
    """
    settings = settings_for(base, f"restore{n}", partitions=1)
    create(settings)
    try:
        started = time.perf_counter()
        seal = stage_sealer(settings, "processor")("state")
        producer = Producer(
            producer_config(settings, **{"queue.buffering.max.messages": 1_000_000})
        )
        full = settings.topic("state")
        for k, (key, value) in enumerate(_states(n)):
            headers: list[tuple[str, str | bytes | None]] = [
                (AUTH_HEADER, seal.seal("state", key, value))
            ]
            while True:
                try:
                    producer.produce(full, key=key, value=value, headers=headers, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
            if k % 10_000 == 0:
                producer.poll(0)
        if producer.flush(600):
            raise RuntimeError("state records were not delivered")
        fill_s = time.perf_counter() - started
        seconds = []
        for _ in range(runs):
            processor = Processor(settings)
            t0 = time.perf_counter()
            processor.on_assign({0})
            seconds.append(time.perf_counter() - t0)
            restored = len(processor.states.committed)
            processor.close()
            if restored != n:
                raise RuntimeError(f"restored {restored} of {n} operations")
        median = statistics.median(seconds)
        return {
            "operations": n,
            "fill_s": fill_s,
            "runs": seconds,
            "seconds": median,
            "records_per_s": n / median,
        }
    finally:
        drop(settings)
