"""Reconciliation of unknown outcomes.

``ledger.reconciliation`` is the processor's work queue of operations held in
UNKNOWN_OUTCOME (a tombstone marks one released). :func:`reconcile_once`
drains it: for every open item whose sink offers readback it reads the effect
back with the operation's current fencing token and records the observation
as a :class:`~ledger.events.Readback`; the processor then releases the
operation on that new evidence. Sinks without readback are observed as
``UNSUPPORTED`` and the operation stays held: only an attributable
disposition (``ledger reconcile dispose``) can release it. Nothing is ever
released by a timer. An operation attempted under an earlier contract
version of its sink than the one registered now is read back only when the
release manifest lets the new version resume ``UNKNOWN_OUTCOME`` from it
(:func:`ledger.upgrades.upgrade_hold`, as the relay decides); otherwise it is
observed ``UNKNOWN`` with the reason naming both versions, and stays held.

A broker that does not answer (down, restarting, failing over) is waited for,
for at least ``LEDGER_TAKEOVER_WAIT_S`` (:mod:`consumers.retry`), before
anything is read; so is every read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Message

from consumers.readback import read_effect
from consumers.reader import current_states
from consumers.retry import KafkaRetry, policy_for
from consumers.sinkpool import PassGuard
from consumers.stage import Record, key_text, read_partition
from ledger.clock import clock_for
from ledger.credentials import Credentials, load_keyring
from ledger.errors import LocalFileError, SinkConfigError
from ledger.events import EffectReceipt, OperationState, Readback
from ledger.fold import current_dispatch_id
from ledger.settings import LedgerSettings
from ledger.states import RecoveryState as S
from ledger.topics import check_topics
from ledger.topology import Topic
from ledger.upgrades import ReleaseManifest, upgrade_hold
from producers.publisher import LedgerPublisher
from sinks.port import open_sink, readback_source
from sinks.registry import load_manifest, load_sinks


def open_items(settings: LedgerSettings, retry: KafkaRetry | None = None) -> list[OperationState]:
    """Operations queued for reconciliation and still in UNKNOWN_OUTCOME, oldest first.

    Args:
        settings: ledger settings.
        retry: how a broker outage is waited out (default: for
            ``takeover_wait_s`` per read).

    Raises:
        LedgerError: a topic could not be read (Kafka did not answer in time).
    """
    queued: dict[str, bool] = {}

    def seen(rec: Record | None, msg: Message) -> None:
        queued[key_text(msg)] = msg.value() is not None

    # A forged tombstone cannot hide an item, nor a forged record add one.
    read_partition(
        settings,
        Topic.RECONCILIATION,
        None,
        seen,
        keyring=load_keyring(settings, missing_ok=True),
        retry=retry,
    )
    states = current_states(settings)
    items = [
        states[op]
        for op, is_open in queued.items()
        if is_open and op in states and states[op].state == S.UNKNOWN_OUTCOME
    ]
    return sorted(items, key=lambda st: (st.observed_at_ms or 0, st.operation_id))


def attempted_versions(
    settings: LedgerSettings, operations: set[str], retry: KafkaRetry | None = None
) -> dict[str, int]:
    """The contract version the latest authentic receipt of each operation names.

    The version a readback of its effect resumes from
    (:func:`ledger.upgrades.attempted_version`); receipts are read in order
    per partition, and an operation's receipts share one partition.

    Args:
        settings: ledger settings.
        operations: the operation IDs wanted.
        retry: how a broker outage is waited out.

    Returns:
        Operation ID -> version, for the operations a versioned receipt names.

    Raises:
        LedgerError: ``ledger.receipts`` could not be read.
    """
    versions: dict[str, int] = {}
    if not operations:
        return versions

    def seen(rec: Record | None, _msg: Message) -> None:
        event = rec.event if rec is not None else None
        if (
            isinstance(event, EffectReceipt)
            and event.operation_id in operations
            and event.contract_version is not None
        ):
            versions[event.operation_id] = event.contract_version

    read_partition(
        settings,
        Topic.RECEIPTS,
        None,
        seen,
        keyring=load_keyring(settings, missing_ok=True),
        retry=retry,
    )
    return versions


def _manifest(settings: LedgerSettings, say: Callable[[str], None]) -> ReleaseManifest | None:
    """The release manifest, or ``None`` (none configured, or unreadable: said)."""
    if settings.release_manifest_file is None:
        return None
    try:
        return load_manifest(settings.release_manifest_file)
    except LocalFileError as exc:
        say(f"release manifest unreadable, every changed contract version holds: {exc.message}")
        return None


def reconcile_once(
    settings: LedgerSettings,
    say: Callable[[str], None] = lambda _: None,
    only: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Read back every open unknown outcome once and record what was observed.

    Reads the sink registry and the clock, then waits for a broker that does
    not answer (for ``takeover_wait_s``) and checks the topics. ``only``
    limits the pass to those operations (the console's "read back now").

    Returns:
        One ``{"operation_id", "sink", "observed", "detail"}`` per item.

    Raises:
        LocalFileError: the sink registry or the clock file is corrupted.
        BrokerError: Kafka did not answer within ``takeover_wait_s``.
        TopicConfigError: a ledger topic is missing or unsafe.
        LedgerError: a topic could not be read.
    """
    sinks = load_sinks(settings.sinks_path())
    now = clock_for(settings.clock, settings.run_dir).now_ms()
    retry = KafkaRetry("reconciler", policy_for(settings, indefinitely=False))
    retry.call(lambda: check_topics(settings), "topic check")
    results: list[dict[str, Any]] = []
    # The reconciler signs its readbacks with its own role key; a host without
    # it stops here (MissingKeyError names the key and the remedy), not mid-run.
    credentials = Credentials(settings, role="reconciler")
    credentials.sealer_for(Topic.READBACKS, None)
    publisher = LedgerPublisher(settings, client_id="reconciler", credentials=credentials)
    guarded: dict[str, PassGuard] = {}
    try:
        items = [
            st for st in open_items(settings, retry) if only is None or st.operation_id in only
        ]
        versions = attempted_versions(settings, {st.operation_id for st in items}, retry)
        manifest = _manifest(settings, say)
        for st in items:
            endpoint = sinks.get(st.sink)
            held = (
                upgrade_hold(
                    manifest,
                    st.sink,
                    from_version=versions.get(st.operation_id, 1),
                    to_version=endpoint.contract_version,
                    contract=endpoint.contract,
                    state="UNKNOWN_OUTCOME",
                )
                if endpoint is not None
                else None
            )
            source = f"{st.sink} readback of {st.operation_id}"
            if endpoint is None:
                status, detail, effect_id = "UNKNOWN", f"sink {st.sink!r} is not registered", None
            elif held is not None:
                status, detail, effect_id = "UNKNOWN", held, None
            else:
                try:
                    client = guarded.get(st.sink) or guarded.setdefault(
                        st.sink,
                        PassGuard(
                            open_sink(
                                endpoint,
                                timeout_s=endpoint.deadline_s(settings.sink_timeout_s),
                                name=st.sink,
                                max_response_bytes=settings.sink_max_response_bytes,
                            ),
                            st.sink,
                            endpoint.deadline_s(settings.sink_timeout_s),
                        ),
                    )
                except SinkConfigError as exc:
                    status, detail, effect_id = "UNKNOWN", exc.message, None
                else:
                    # Each call within the deadline; a sink that gave no answer
                    # within one is asked nothing more in this run (UNKNOWN).
                    status, detail, effect_id = read_effect(
                        client, endpoint.contract, st.operation_id, st.epoch
                    )
                    source = f"{st.sink} {readback_source(client, st.operation_id)}"
                if status == "UNSUPPORTED":
                    detail = f"{st.sink} offers no readback: only a disposition can release it"
            publisher.publish_readback(
                Readback(
                    operation_id=st.operation_id,
                    dispatch_id=current_dispatch_id(st),
                    kind="EFFECT",
                    status=status,  # type: ignore[arg-type]  # pydantic checks the Literal when the model is built
                    source=f"{source} (reconciler)",
                    effect_id=effect_id,
                    observed_at_ms=now,
                    detail=detail,
                    on_resume=True,
                    observer="reconciler",
                    fencing_token=st.epoch,
                )
            )
            say(f"{st.operation_id}: {status} ({detail})")
            results.append(
                {
                    "operation_id": st.operation_id,
                    "sink": st.sink,
                    "observed": status,
                    "detail": detail,
                }
            )
    finally:
        for client in guarded.values():
            client.close()
        publisher.close()
    return results
