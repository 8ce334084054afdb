"""Configuration shared by every ledger process.

One settings class, read from the environment with the prefix ``LEDGER_``
(for example ``LEDGER_TOPIC_PREFIX=ledger``). ``KAFKA_BOOTSTRAP_SERVERS`` is
honoured as well, because test harnesses and Docker users set it.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ledger.delivery import RelayMode

#: Which clock the stages read: ``system`` (wall clock) or ``manual`` (the ledger
#: clock file in ``run_dir``, moved only by ``ledger clock advance``; testbeds only).
ClockKind = Literal["system", "manual"]

log = logging.getLogger(__name__)

#: ``LEDGER_*`` variables read outside :class:`LedgerSettings` (so not misspelt).
OTHER_VARIABLES: frozenset[str] = frozenset(
    {
        "LEDGER_HOME",
        "LEDGER_SINK_TOKEN",
        "LEDGER_SCENARIOS_DIR",
        "LEDGER_REQUIRE_BROWSER",
        "LEDGER_CONSOLE_SCREENSHOT",
    }
)

#: Prefixes of variable families another module reads and checks itself:
#: librdkafka pass-through properties (:mod:`ledger.kafka`), the testbed's
#: switches, the MCP gateway's sink names.
OTHER_PREFIXES: tuple[str, ...] = ("LEDGER_KAFKA_", "LEDGER_TESTBED_", "LEDGER_MCP_")

#: Variables already warned about in this process (each is named once).
_warned: set[str] = set()


def ledger_home() -> Path:
    """The folder run-time files live under: ``$LEDGER_HOME``, else the current directory.

    Never the installed package: a wheel in site-packages must not write there.
    """
    return Path(os.environ.get("LEDGER_HOME") or ".").absolute()


class LedgerSettings(BaseSettings):
    """Settings of one ledger process (stage, CLI, demo or test).

    Attributes:
        bootstrap_servers: Kafka bootstrap list, ``host:port[,host:port]``
            (``LEDGER_BOOTSTRAP_SERVERS`` or ``KAFKA_BOOTSTRAP_SERVERS``; when
            neither is set, the local broker: ``127.0.0.1:{kafka_port}``).
        topic_prefix: prefix of every ledger topic (``{prefix}.intents`` ...);
            tests and demo cases use their own prefix for isolation.
        id: the ledger's identity, covered by every record's seal and
            every review grant's signature, so nothing authentic in one
            ledger is accepted by another (``LEDGER_ID``; default: the topic
            prefix). Set it only to keep a ledger's identity when its topics
            move to another prefix.
        partitions: partition count of every operation-keyed topic (all are
            co-partitioned, so they share it).
        replication_factor: replicas of every ledger topic
            (``LEDGER_REPLICATION_FACTOR``). ``None`` (the default): derived
            from the cluster when topics are created or checked, 3 when it
            has three or more brokers, else 1 (see
            :func:`ledger.topics.replication_for`). A value set always wins.
        min_insync_replicas: the topics' ``min.insync.replicas``
            (``LEDGER_MIN_INSYNC_REPLICAS``): how many replicas must hold a
            record before an ``acks=all`` write succeeds. ``None`` (the
            default): 2 when the replication factor is 3 or more, else 1.
            Must stay below the replication factor when that is above 1.
        run_dir: folder for run-time files: the ledger clock, stage status
            files, sink registry and databases (default
            ``{LEDGER_HOME or the current directory}/.ledger``).
        kafka_home: folder where the local broker's jars, config, data and logs
            live (default ``{LEDGER_HOME or the current directory}/.cache/kafka``).
        kafka_port: broker listener port on 127.0.0.1 (controller uses +1).
        brokers: nodes of the local broker ``ledger broker start`` runs when
            ``--brokers`` is not given (``LEDGER_BROKERS``, default 1; 3 for a
            replicated cluster; see ``testbed.cluster``).
        broker_security: security of that local broker when ``--security`` is
            not given (``LEDGER_BROKER_SECURITY``): ``plaintext`` (default),
            ``sasl_plaintext`` or ``sasl_ssl``.
        clock: ``system`` (wall clock; the default) or ``manual`` (the ledger
            clock in ``run_dir/clock``, which starts at 0 and moves only by
            ``ledger clock advance``: for testbeds and tests only; a stage
            refuses it unless ``testbed`` is true).
        clock_max_skew_s: how far (seconds, default 300) a stage's clock
            reading may stray from its other sources of time before it is
            refused (``LEDGER_CLOCK_MAX_SKEW_S``): the time it last decided
            with, moved on by its monotonic clock, and the Kafka timestamp of
            the record it read last. A refused reading is never the new time:
            the stage decides with the expected time, publishes a
            ``CLOCK_REFUSED`` operating event and counts
            ``ledger_clock_readings_refused_total``. The manual clock may
            move up to ten years ahead at once (``ledger clock advance``);
            any reading past year 3000 is refused (see
            :func:`ledger.clock.judge_reading`).
        testbed: this process runs in a testbed (demo, game day, mission,
            tests), where a stage may run on the manual clock (default false;
            ``python -m testbed.stage`` sets it).
        instance: a stage's instance name when ``--instance`` is not given
            (``LEDGER_INSTANCE``); unset, the trailing ordinal of the host
            name (``relay-2`` -> ``2``), else ``0``.
        commit_interval_ms: longest time a stage waits for input before it
            turns to its idle work (milliseconds); a batch is processed and
            committed as soon as the records already fetched are taken (see
            :meth:`consumers.runtime.loop.StageLoop.next_batch`), not after the interval.
        transaction_timeout_ms: broker-side transaction timeout (milliseconds);
            an abandoned transaction is aborted after it.
        takeover_wait_s: longest time a stage given partitions waits for the
            previous owner's last transaction to end (and for the broker, if
            it is unreachable) before it gives up with an error (seconds).
        stop_timeout_s: longest time a stage told to stop (SIGTERM, SIGINT)
            takes to leave its group and close its clients (seconds); past it
            the process exits anyway, as after a crash (a librdkafka close can
            wait on an unreachable broker without end).
        sink_timeout_s: the overall deadline of every call to a sink by the
            relay, the reconciler, the auditor and the console (seconds, from
            the call's start to the last byte of its answer; not per read): a
            submit that exceeds it is an ambiguous outcome, a readback
            observes nothing. A sink that exceeds it is not asked again in the
            relay's current pass: its other dispatches wait (parked) for their
            next try, and dispatches to other sinks go on meanwhile.
        sink_max_response_bytes: the most bytes of one answer from a sink
            that are read (default 1 MiB); a longer answer is no answer (a
            submit is ambiguous), and the rest of it is not read.
        sink_retry_attempts: tries in all of a request the relay could not
            deliver (connection refused, sink not registered) before it holds
            the operation for a person (default 6).
        sink_retry_backoff_s: wait after the first such failure (seconds);
            each later wait doubles, up to ``sink_retry_max_backoff_s``.
        sink_retry_max_backoff_s: longest wait between two tries (seconds).
        policy_version: policy version in force until a ``PolicyChange`` is
            published on ``{prefix}.policy`` (1 or more).
        relay_mode: ``ledger`` (read back before any second attempt) or
            ``checkpoint-only`` (the negative control: trust the checkpoint,
            retry with a fresh attempt identity).
        relay_inline_verify: read the postcondition back right after an
            effect commits, where the sink's contract offers a postcondition
            query, and record its verdict (``MATCH``/``MISMATCH``) in the
            committed receipt itself: the processor then verifies without a
            ``VERIFY`` dispatch (one relay -> processor -> relay round trip
            less). A readback that does not answer leaves the receipt
            without it, and the ``VERIFY`` follows as before (default true;
            false: always verify by a ``VERIFY`` dispatch).
        sinks_file: JSON file naming each sink's URL and effect contract
            (default ``run_dir/sinks.json``).
        release_manifest_file: the release manifest (JSON, see
            :mod:`ledger.upgrades`) that says which in-flight operations may
            resume under a changed sink contract version (default none: every
            change of version holds the operations it meets).
        trusted_keys_file: reviewer keys the authority kernel trusts to sign
            approvals (default ``run_dir/trusted_keys.json``).
        require_signed_approvals: refuse approvals without a valid signature
            by a trusted key (default true).
        keys_dir: folder of the stage roles' keys (ledger.rolekeys)
            and the authority kernel's key pair (default ``run_dir/keys``;
            see :mod:`ledger.credentials`).
        outcome_public_key_file: the public half of the processor's outcome
            key, the only key a service needs to read what became of its
            operations (``ledger keys export --outcome-public > FILE`` on a
            stage host writes it; default ``keys_dir/outcome.pub``). A
            service host never creates it.
        require_authenticated_records: readers refuse records whose seal
            (the ``ledger-auth`` header) is missing or wrong, with an
            ``UNAUTHENTICATED`` operating event (default true). Set it false
            only to read a ledger written before records were sealed: the
            auditor still reports every unauthenticated record.
        kafka_debug: librdkafka ``debug`` contexts for every client (e.g.
            ``eos,cgrp``); empty for none. Client logs go to the
            ``ledger.kafka.client`` logger.
        kafka_config_file: a Java-style properties file (``key=value`` lines,
            ``#``/``!`` comments) of librdkafka client properties for every
            Kafka client of the process: security, SASL, TLS, timeouts
            (``LEDGER_KAFKA_CONFIG_FILE``; see :mod:`ledger.kafka` for the
            order in which it, ``LEDGER_KAFKA_<PROPERTY>`` variables and the
            ledger's own properties are merged). ``None``: no file.
        metrics_port: the port of a stage's HTTP endpoint for Prometheus
            (``LEDGER_METRICS_PORT``): ``/metrics``, ``/healthz`` and
            ``/readyz`` (see :mod:`consumers.metrics`). ``None`` (the
            default): no endpoint. It is per process: several stages on one
            host each need their own (set it in each process's environment,
            e.g. 9464, 9465, 9466); ``0`` takes any free port and logs it.
        metrics_host: the address that endpoint listens on
            (``LEDGER_METRICS_HOST``, default ``0.0.0.0``: every interface, as
            a scraper in another container or pod needs; ``127.0.0.1`` keeps
            it on the host).
        health_stall_s: ``/healthz`` answers 503 once the stage's loop has not
            gone round for this many seconds (default 120), unless it is
            waiting for Kafka or restoring state, which it says instead.
        heads_interval_s: how often at most (seconds, default 30) the
            processor publishes the head of each journal partition it owns
            (partition, offset, chain sequence, chain hash) to the ``heads``
            topic and hands it to the witnesses, once the chain has advanced
            since the last one (``LEDGER_HEADS_INTERVAL_S``; see
            :mod:`consumers.heads`). It bounds how long the newest journal
            entries are protected by nothing but Kafka's own word.
        witness_file: the file witness of the journal's heads: an
            append-only JSON-lines file the operator keeps outside Kafka,
            one sealed head a line (``LEDGER_WITNESS_FILE``; default
            ``run_dir/witness/journal-heads.jsonl``). The processor appends
            to it; ``ledger audit`` checks each journal chain against it
            (``--witness FILE`` names another copy).
        log_format: ``text`` (the default: ``time level logger: message``)
            or ``json`` (one JSON object a line with operation ID, stage,
            instance and trace ID; ``LEDGER_LOG_FORMAT``, see :mod:`ledger.logs`).
        stranded_in_flight_s: seconds an operation may stay ADMITTED or
            EFFECT_PENDING before it is stranded (default 300; see
            :mod:`ledger.stranded`).
        stranded_committed_s: seconds an operation may stay EFFECT_COMMITTED
            at a sink that can verify before it is stranded (default 300).
        stranded_not_admitted_s: seconds an operation may stay NOT_ADMITTED
            before it is stranded (default 300).
        stranded_held_s: seconds a reader may hold an operation behind a
            record it refused before it is stranded (default 60).
        stranded_intents_s: seconds a published intent may stay unconsumed
            by the processor's group before it is stranded (default 120).
    """

    model_config = SettingsConfigDict(env_prefix="LEDGER_", extra="ignore")

    bootstrap_servers: str = Field(
        default_factory=lambda: os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
    )
    topic_prefix: str = "ledger"
    id: str | None = Field(default=None, min_length=1, max_length=249)
    partitions: int = 3
    replication_factor: int | None = Field(default=None, ge=1)
    min_insync_replicas: int | None = Field(default=None, ge=1)
    run_dir: Path = Field(default_factory=lambda: ledger_home() / ".ledger")
    kafka_home: Path = Field(default_factory=lambda: ledger_home() / ".cache" / "kafka")
    kafka_port: int = 19092
    brokers: int = Field(default=1, ge=1)
    broker_security: Literal["plaintext", "sasl_plaintext", "sasl_ssl"] = "plaintext"
    clock: ClockKind = "system"
    clock_max_skew_s: float = Field(default=300.0, gt=0)
    testbed: bool = False
    instance: str | None = None
    commit_interval_ms: int = 100
    transaction_timeout_ms: int = 15000
    takeover_wait_s: float = 180.0
    stop_timeout_s: float = Field(default=30.0, gt=0)
    sink_timeout_s: float = Field(default=2.0, gt=0)
    sink_max_response_bytes: int = Field(default=1 << 20, ge=1024)
    sink_retry_attempts: int = Field(default=6, ge=1)
    sink_retry_backoff_s: float = Field(default=0.5, ge=0)
    sink_retry_max_backoff_s: float = Field(default=30.0, ge=0)
    policy_version: int = Field(default=1, ge=1)
    relay_mode: RelayMode = "ledger"
    relay_inline_verify: bool = True
    sinks_file: Path | None = None
    release_manifest_file: Path | None = None
    trusted_keys_file: Path | None = None
    require_signed_approvals: bool = True
    keys_dir: Path | None = None
    outcome_public_key_file: Path | None = None
    require_authenticated_records: bool = True
    kafka_debug: str = ""
    kafka_config_file: Path | None = None
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    health_stall_s: float = Field(default=120.0, gt=0)
    heads_interval_s: float = Field(default=30.0, gt=0)
    witness_file: Path | None = None
    log_format: Literal["text", "json"] = "text"
    stranded_in_flight_s: float = Field(default=300.0, ge=0)
    stranded_committed_s: float = Field(default=300.0, ge=0)
    stranded_not_admitted_s: float = Field(default=300.0, ge=0)
    stranded_held_s: float = Field(default=60.0, ge=0)
    stranded_intents_s: float = Field(default=120.0, ge=0)

    @model_validator(mode="after")
    def _local_broker_by_default(self) -> LedgerSettings:
        """With no bootstrap list given, clients go to the local broker's port."""
        if not self.bootstrap_servers:
            self.bootstrap_servers = f"127.0.0.1:{self.kafka_port}"
        warn_unknown_variables(os.environ)
        return self

    def trusted_keys_path(self) -> Path:
        """Where trusted reviewer keys live (``trusted_keys_file`` or ``run_dir/...``)."""
        return self.trusted_keys_file or self.run_dir / "trusted_keys.json"

    def outcome_public_path(self) -> Path:
        """Where the outcome key's public half is.

        ``outcome_public_key_file`` or ``keys_dir/outcome.pub``.
        """
        return self.outcome_public_key_file or (self.keys_dir or self.run_dir / "keys") / (
            "outcome.pub"
        )

    def witness_path(self) -> Path:
        """Where the file witness of the journal's heads is.

        ``witness_file`` or ``run_dir/witness/journal-heads.jsonl``.
        """
        return self.witness_file or self.run_dir / "witness" / "journal-heads.jsonl"

    def sinks_path(self) -> Path:
        """Where the sink registry lives (``sinks_file`` or ``run_dir/sinks.json``)."""
        return self.sinks_file or self.run_dir / "sinks.json"

    @property
    def ledger_identity(self) -> str:
        """The ledger's identity: ``id`` (``LEDGER_ID``), else the topic prefix."""
        return self.id or self.topic_prefix

    def topic(self, name: str) -> str:
        """Full topic name for a short name, e.g. ``intents`` -> ``ledger.intents``."""
        return f"{self.topic_prefix}.{name}"


#: What a setting left unset (``None``) stands for, when no path can say it.
_UNSET_MEANS: dict[str, str] = {
    "replication_factor": "from the cluster: 3 with three or more brokers, else 1",
    "min_insync_replicas": "2 when the replication factor is 3 or more, else 1",
    "instance": "per stage: --instance, else the host name's trailing ordinal, else 0",
    "kafka_config_file": "none: no client properties file",
    "id": "the topic prefix",
}


def resolved(
    settings: LedgerSettings, environ: Mapping[str, str] | None = None
) -> list[tuple[str, object, str]]:
    """Every setting with the value in force and where it came from (``ledger config``).

    Paths left unset are shown as the path in force (``sinks_file`` as
    ``run_dir/sinks.json`` ...); other unset values as what they stand for.

    Args:
        settings: the settings in force.
        environ: the environment they were read from (default ``os.environ``).

    Returns:
        ``(variable, value, source)`` per setting, in declaration order:
        ``variable`` like ``LEDGER_SINKS_FILE``; ``source`` the variable that
        set it, or ``default`` (with how the default is derived).
    """
    env = os.environ if environ is None else environ
    derived_paths: dict[str, tuple[Path, str]] = {
        "sinks_file": (settings.sinks_path(), "default: LEDGER_RUN_DIR/sinks.json"),
        "trusted_keys_file": (
            settings.trusted_keys_path(),
            "default: LEDGER_RUN_DIR/trusted_keys.json",
        ),
        "keys_dir": (
            settings.keys_dir or settings.run_dir / "keys",
            "default: LEDGER_RUN_DIR/keys",
        ),
        "outcome_public_key_file": (
            settings.outcome_public_path(),
            "default: LEDGER_KEYS_DIR/outcome.pub",
        ),
        "witness_file": (
            settings.witness_path(),
            "default: LEDGER_RUN_DIR/witness/journal-heads.jsonl",
        ),
    }
    out: list[tuple[str, object, str]] = []
    for name, value in settings.model_dump().items():
        variable = f"LEDGER_{name.upper()}"
        source = variable if variable in env else "default"
        shown: object = value
        if name == "bootstrap_servers" and variable not in env:
            source = (
                "KAFKA_BOOTSTRAP_SERVERS"
                if env.get("KAFKA_BOOTSTRAP_SERVERS")
                else "default: 127.0.0.1:LEDGER_KAFKA_PORT"
            )
        elif name in ("run_dir", "kafka_home") and variable not in env:
            source = "default: under LEDGER_HOME (else the current directory)"
        elif value is None and name in derived_paths:
            shown, source = derived_paths[name]
        elif value is None and name in _UNSET_MEANS:
            shown, source = None, f"default: {_UNSET_MEANS[name]}"
        out.append((variable, shown, source))
    return out


def known_variables() -> frozenset[str]:
    """Every ``LEDGER_*`` name the ledger reads by its exact name (settings and others)."""
    fields = {f"LEDGER_{name.upper()}" for name in LedgerSettings.model_fields}
    return frozenset(fields | OTHER_VARIABLES)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``LEDGER_*`` variables that no part of the ledger reads: most likely misspelt.

    A misspelt setting is otherwise silently ignored and its default applies
    (``LEDGER_TOPIC_PREFX=prod`` runs against ``ledger.*``). Families another
    module checks (:data:`OTHER_PREFIXES`) are left to it: librdkafka names a
    pass-through ``LEDGER_KAFKA_*`` property it does not know.

    Args:
        environ: the process environment (or any mapping of it).

    Returns:
        ``(variable, closest known name or None)`` per unknown variable, sorted
        by name; the closest name by :func:`difflib.get_close_matches`.
    """
    known = known_variables()
    suffixes = sorted(k[len("LEDGER_") :] for k in known)
    out: list[tuple[str, str | None]] = []
    for name in sorted(environ):
        if not name.startswith("LEDGER_") or name in known or name.startswith(OTHER_PREFIXES):
            continue
        # Compared without the shared ``LEDGER_`` so that it does not make
        # every name look close to every other.
        close = difflib.get_close_matches(name[len("LEDGER_") :], suffixes, n=1, cutoff=0.6)
        out.append((name, f"LEDGER_{close[0]}" if close else None))
    return out


def warn_unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """Log a warning for each unknown ``LEDGER_*`` variable, once per process.

    A warning, not an error: a variable meant for a newer release must not
    stop an older process.

    Args:
        environ: the process environment.

    Returns:
        The warnings given by this call (already-named variables are skipped).
    """
    given: list[str] = []
    for name, closest in unknown_variables(environ):
        if name in _warned:
            continue
        _warned.add(name)
        hint = f"did you mean {closest}?" if closest else "see `ledger config` for the settings"
        message = f"{name} is not a ledger setting and is ignored; {hint}"
        log.warning("%s", message)
        given.append(message)
    return given
