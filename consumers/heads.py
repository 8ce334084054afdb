"""Signed heads of the journal's chains: published to ``heads`` and handed to witnesses.

The processor publishes, for each journal partition it owns, the head of the
partition's hash chain (partition, offset, ``chain_seq``, chain hash; see
:mod:`ledger.chain`) as a :class:`~ledger.events.JournalHead` on the
``heads`` topic, sealed with the key it seals its other records with, at
most every ``LEDGER_HEADS_INTERVAL_S`` seconds (default 30) and only once
the chain has advanced since the head last published. The same sealed
record goes to every :class:`Witness` outside Kafka: someone with broker
rights can delete or rewrite the journal *and* the heads topic, but not the
operator's copy of the heads. :class:`FileWitness` appends one JSON line per
head to ``LEDGER_WITNESS_FILE``; another witness (an HTTP timestamping or
transparency-log service) implements the same one-method interface.

A witness line (JSON, one object a line)::

    {"ledger": "ledger", "journal_partition": 0, "offset": 41, "seq": 40,
     "chain_hash": "9f2c...", "published_at_ms": 1765000000000,
     "writer": "processor-0", "key": "journal:0", "record": "<base64 value>",
     "seal": "<ledger-auth header value>"}

``record`` and ``seal`` are the head record exactly as sealed, so the line
is checked like any record of the ledger (:func:`read_witness_file`); the
other fields are for people.

A witness that fails (a full disk, a path not writable) never stops the
processor: the failure is logged with its remedy, and the next head is
handed to it again.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Producer

from consumers.runtime.clients import bounded_call
from consumers.runtime.txn import commit_alone
from consumers.runtime.writer import Writer
from ledger.audit.chain import WitnessedHead
from ledger.authn import (
    AUTH_HEADER,
    TIMESTAMP_LOG_APPEND_TIME,
    Keyring,
    Sealer,
    Timestamp,
    unverifiable,
)
from ledger.chain import ChainHead
from ledger.events import JournalHead, decode_event

log = logging.getLogger(__name__)

#: The topic heads are written to (short name).
HEADS_TOPIC = "heads"


@dataclass(frozen=True)
class SignedHead:
    """One head as sealed: what a witness keeps.

    Attributes:
        head: the head record.
        key: its record key (``journal:{partition}``).
        value: its encoded value.
        seal: its ``ledger-auth`` header value.
    """

    head: JournalHead
    key: str
    value: bytes
    seal: bytes


class Witness(Protocol):
    """Someone outside Kafka who keeps the heads (a file, an HTTP service ...)."""

    #: What the witness is, for logs (``file /path``, ``https://...``).
    name: str

    def witness(self, heads: Sequence[SignedHead]) -> None:
        """Keep ``heads`` durably before returning.

        Raises:
            OSError: the witness could not keep them (the caller logs it).
        """
        ...


def witness_line(ledger_id: str, signed: SignedHead) -> dict[str, Any]:
    """The JSON object a file witness keeps for one head (see the module docstring)."""
    h = signed.head
    return {
        "ledger": ledger_id,
        "journal_partition": h.journal_partition,
        "offset": h.offset,
        "seq": h.seq,
        "chain_hash": h.chain_hash,
        "published_at_ms": h.published_at_ms,
        "writer": h.writer,
        "key": signed.key,
        "record": base64.b64encode(signed.value).decode("ascii"),
        "seal": signed.seal.decode("ascii", errors="replace"),
    }


class FileWitness:
    """An append-only JSON-lines file of heads that the operator keeps.

    Args:
        path: the file (created with its folder; appended to, never rewritten).
        ledger_id: the ledger's identity, written in each line (one file may
            witness several ledgers).
    """

    def __init__(self, path: Path, ledger_id: str) -> None:
        self.path = path
        self.ledger_id = ledger_id
        self.name = f"file {path}"

    def witness(self, heads: Sequence[SignedHead]) -> None:
        """Append one line per head, flushed to disk (``fsync``) before returning.

        Raises:
            OSError: the folder cannot be made or the file not written.
        """
        if not heads:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(
            json.dumps(witness_line(self.ledger_id, h), sort_keys=True) + "\n" for h in heads
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, text.encode("utf-8"))  # one write: lines of two writers do not mix
            os.fsync(fd)
        finally:
            os.close(fd)


class HeadsPublisher:
    """Decides when the heads are due and publishes them (see the module docstring).

    Args:
        ledger_id: the ledger's identity.
        interval_s: the least time between two publications (seconds).
        writer: who publishes (``processor-{instance}``).
        sealer: ``topic -> key`` the stage seals with (the head's seal is
            the one its record carries on ``heads``).
        witnesses: every witness outside Kafka.
        monotonic: the clock the interval is measured on (seconds).
        wall_ms: the wall clock of ``published_at_ms`` (milliseconds).
    """

    def __init__(
        self,
        ledger_id: str,
        interval_s: float,
        writer: str,
        sealer: Callable[[str], Sealer],
        witnesses: Sequence[Witness],
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.ledger_id = ledger_id
        self.interval_s = interval_s
        self.writer = writer
        self.sealer = sealer
        self.witnesses = list(witnesses)
        self.monotonic = monotonic
        self.wall_ms = wall_ms
        #: partition -> head last published (committed to ``heads``).
        self.published: dict[int, ChainHead] = {}
        self._pending: dict[int, ChainHead] = {}
        self._last_at: float | None = None
        #: witness name -> its last failure (logged once until it recovers).
        self.failing: dict[str, str] = {}

    def due(self, heads: Mapping[int, ChainHead], *, now: bool = False) -> list[ChainHead]:
        """The heads to publish now: those that advanced, once the interval has passed.

        Args:
            heads: partition -> committed head (offset known).
            now: whatever the interval (a clean stop publishes its last heads).

        Returns:
            The heads that differ from the last published ones, by
            partition; empty while the interval since the last publication
            has not passed.
        """
        recent = self._last_at is not None and self.monotonic() - self._last_at < self.interval_s
        if recent and not now:
            return []
        return [h for p, h in sorted(heads.items()) if self.published.get(p) != h]

    def publish(self, out: Writer, heads: Sequence[ChainHead]) -> None:
        """Write ``heads`` into the open transaction and hand them to every witness.

        A head names entries already committed, so a witness may keep it
        before the transaction that writes it to ``heads`` commits: it is
        true either way.
        """
        if not heads:
            return
        now_ms = self.wall_ms()
        signed: list[SignedHead] = []
        for h in heads:
            record = JournalHead(
                journal_partition=h.partition,
                offset=h.offset,
                seq=h.seq,
                chain_hash=h.hash,
                published_at_ms=now_ms,
                writer=self.writer,
            )
            key = f"journal:{h.partition}"
            value = record.to_bytes()
            seal = self.sealer(HEADS_TOPIC).seal(HEADS_TOPIC, key.encode("utf-8"), value)
            out.write_raw(HEADS_TOPIC, key, value)
            signed.append(SignedHead(record, key, value, seal))
            self._pending[h.partition] = h
        self._last_at = self.monotonic()
        for witness in self.witnesses:
            self._hand(witness, signed)

    def _hand(self, witness: Witness, signed: Sequence[SignedHead]) -> None:
        try:
            witness.witness(signed)
        except OSError as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if self.failing.get(witness.name) != problem:
                log.error(
                    "processor: the journal heads could not be handed to the witness %s (%s); "
                    "they are on the heads topic, and the next heads are handed to it again. "
                    "Make the witness writable (LEDGER_WITNESS_FILE names the file)",
                    witness.name,
                    problem,
                )
            self.failing[witness.name] = problem
        else:
            if self.failing.pop(witness.name, None) is not None:
                log.info("processor: the witness %s keeps the heads again", witness.name)

    def publish_last(
        self,
        producer: Producer,
        writer: Callable[[], Writer],
        heads: Mapping[int, ChainHead],
        timeout_s: float,
    ) -> None:
        """On a clean stop: publish the heads not yet published, in a transaction of their own.

        Bounded by ``timeout_s`` (a broker that does not answer does not
        hold the stop); a failure is logged, and the next owner publishes
        the partitions' heads once their chains advance.

        Args:
            producer: the stage's transactional producer (no transaction open).
            writer: a writer into the producer's open transaction.
            heads: partition -> committed head.
            timeout_s: the most the publication may take (seconds).
        """
        due = self.due(heads, now=True)
        if not due:
            return

        def run() -> None:
            commit_alone(producer, lambda: self.publish(writer(), due), timeout_s)
            self.commit()

        bounded_call(run, timeout_s, f"{self.writer}: publishing the last journal heads")

    def commit(self) -> None:
        """The transaction that wrote the heads committed."""
        self.published.update(self._pending)
        self._pending.clear()

    def abort(self) -> None:
        """The transaction aborted: those heads are published again."""
        self._pending.clear()
        self._last_at = None

    def forget(self, partitions: set[int]) -> None:
        """Revoked partitions: their next owner publishes their heads."""
        for p in partitions:
            self.published.pop(p, None)
            self._pending.pop(p, None)


def witnessed_head(head: JournalHead, source: str) -> WitnessedHead:
    """The verifier's view of a head record, found at ``source``."""
    return WitnessedHead(
        head.journal_partition,
        head.offset,
        head.seq,
        head.chain_hash,
        source,
        head.published_at_ms,
    )


def _line_time(record: object) -> Timestamp:
    """The time a witness line's seal is judged at: its head's publication time.

    A line has no broker time. A key rotated since (``ledger keys rotate
    processor``) verifies it if the head it holds was published by the old
    key's not-after time, which its signed ``published_at_ms`` says. That time
    is the sealer's own word, so the holder of a retired key could backdate a
    head; but a line is believed on the operator's custody of the file as much
    as on its seal, and such a forger must also write the operator's file.
    """
    if isinstance(record, JournalHead):
        return (TIMESTAMP_LOG_APPEND_TIME, record.published_at_ms)
    return None


def read_witness_file(
    path: Path,
    ledger_id: str,
    keyring: Keyring,
    unverifiable_lines: list[dict[str, object]] | None = None,
) -> tuple[list[WitnessedHead], list[str]]:
    """The heads a witness file holds for one ledger, each line's seal checked.

    Lines of other ledgers are skipped. A line that is not JSON, does not
    decode to a head, or whose seal does not verify is not used; it is
    returned as a problem, naming the line.

    Args:
        path: the witness file.
        ledger_id: the ledger audited.
        keyring: checks the seals (as for the ``heads`` topic).
        unverifiable_lines: when given, a line sealed by a key these keys do
            not know is added here (``{"topic": "witness", "partition":
            None, "offset": line number, "reason": str}``, like the audit's
            unverifiable records) instead of to the problems: it may be a
            genuine head sealed by a key lost since, which makes the audit
            NOT VERIFIED rather than a finding against the journal.

    Returns:
        ``(heads, problems)``.

    Raises:
        OSError: the file cannot be read.
    """
    heads: list[WitnessedHead] = []
    problems: list[str] = []
    with path.open(encoding="utf-8") as lines:
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"witness {path} line {n}"
            try:
                data = json.loads(line)
                if data.get("ledger") != ledger_id:
                    continue
                key = str(data["key"]).encode("utf-8")
                value = base64.b64decode(data["record"], validate=True)
                seal = str(data["seal"]).encode("ascii")
            except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
                problems.append(f"{where} is not a witness line: {type(exc).__name__}: {exc}")
                continue
            try:
                record = decode_event(value)
            except Exception as exc:  # reported with its line, never fatal
                problems.append(f"{where} does not decode: {type(exc).__name__}: {exc}")
                continue
            problem = keyring.check(
                HEADS_TOPIC, key, value, [(AUTH_HEADER, seal)], record, timestamp=_line_time(record)
            )
            if problem is not None and unverifiable_lines is not None and unverifiable(problem):
                unverifiable_lines.append(
                    {
                        "topic": "witness",
                        "partition": None,
                        "offset": n,
                        "reason": f"{where}: {problem}",
                    }
                )
                continue
            if problem is not None:
                problems.append(f"{where} is not authentic: {problem}")
                continue
            if not isinstance(record, JournalHead):
                problems.append(f"{where} holds a {record.KIND}, not a head")
                continue
            heads.append(witnessed_head(record, where))
    return heads, problems
