"""The testbed's ``ledger`` commands: local broker, reference sinks, demo, game days, missions.

They reach the ``ledger`` command as a plug-in (entry-point group
``ledger.cli``, see :mod:`ledger.cli`): the product never imports the testbed.
They come with the testbed distribution (``kafka-recovery-ledger-testbed``);
where its dependencies are missing, the commands that need them (sinks, demo,
game days, missions) stop at once with the pip command to run.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from ledger.cli.common import EXIT_TIMEOUT, bootstrap_in_force, current_settings, echo_json
from ledger.settings import LedgerSettings
from testbed import broker, cluster
from testbed.broker import running_broker
from testbed.cli_mission import mission_group
from testbed.compaction import force_compaction
from testbed.extras import require_testbed_extra
from testbed.runs import RunLedger, inspect_lines

_BROKER_HELP = """Run the local Kafka 4 broker (KRaft) from Maven jars: one node, or a cluster.

\b
No Docker, no tarball: Java 17+ and Maven are enough. Everything lives in
LEDGER_KAFKA_HOME (default $LEDGER_HOME/.cache/kafka, LEDGER_HOME defaulting
to the current directory):
  libs/             broker jars (fetched once by Maven)
  config/           server.properties, log4j2.properties (rewritten on start)
  data/             topics, offsets, transactions (kept across restarts)
  logs/server.log   the broker's log        logs/broker.out  java stdout/stderr
  broker.pid        PID of the broker `start` launched

\b
Environment:
  LEDGER_KAFKA_HOME   broker folder (above)
  LEDGER_KAFKA_PORT   client port on 127.0.0.1 (default 19092; controller +1)
                      in force: {bootstrap}
  LEDGER_BROKERS      nodes of `start` without --brokers (default 1)
  LEDGER_BROKER_SECURITY  plaintext | sasl_plaintext | sasl_ssl (default plaintext)

\b
A cluster (--brokers 3, --security sasl_ssl) lives in node-<i>/ folders,
security/ (CA, keystores, users.json) and clients/<user>.properties.

\b
Clients use LEDGER_BOOTSTRAP_SERVERS or KAFKA_BOOTSTRAP_SERVERS (default
127.0.0.1:$LEDGER_KAFKA_PORT; in force: {bootstrap}).
A Kafka already answering on that port is reused, whoever started it.
With Docker instead: `docker compose up -d` and
KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092 (the port docker-compose.yml publishes).
"""


def _echo_status(st: broker.BrokerStatus) -> None:
    click.echo(st.message)
    click.echo(f"  bootstrap : {st.bootstrap}")
    click.echo(f"  pid       : {st.pid if st.pid is not None else '-'}")
    click.echo(f"  log       : {st.log_file}")
    click.echo(f"  stdout    : {st.stdout_file}")
    click.echo(f"  data      : {st.data_dir}")


# --------------------------------------------------------------------------- broker


@click.group("broker", help=_BROKER_HELP.format(bootstrap=bootstrap_in_force()))
def broker_group() -> None:
    """Run the local Kafka broker (see the group help)."""


@broker_group.command("fetch")
def broker_fetch() -> None:
    """Download the broker's jars into LEDGER_KAFKA_HOME/libs (only if missing).

    Runs `mvn dependency:copy-dependencies` on kafka/pom.xml (about 60 MB the
    first time; Maven's output goes to LEDGER_KAFKA_HOME/logs/mvn.log). Does
    nothing when the jars are there and kafka/pom.xml did not change.
    """
    libs = broker.fetch_jars(current_settings())
    jars = sum(1 for _ in libs.glob("*.jar"))
    click.echo(f"{jars} jars in {libs}")


def _cluster_or_none(settings: LedgerSettings) -> cluster.Cluster | None:
    """The cluster recorded in kafka_home, unless the single-node broker runs there."""
    if broker.status_pid(settings) is not None:
        return None
    return cluster.Cluster.recorded(settings)


def _echo_cluster(st: cluster.ClusterStatus) -> None:
    click.echo(st.message)
    click.echo(f"  bootstrap : {st.bootstrap}")
    click.echo(f"  security  : {st.security}")
    ctl = st.controller if st.controller is not None else "unknown"
    click.echo(f"  controller: node {ctl} (active KRaft controller)")
    for node in st.nodes:
        reg = {True: "registered", False: "NOT registered", None: "cluster silent"}[node.registered]
        click.echo(
            f"  node {node.node_id}    : pid {node.pid if node.alive else '-'} "
            f"{'alive' if node.alive else 'down'}, {reg}, client {node.host}:{node.client_port}, "
            f"controller {node.host}:{node.controller_port}, log {node.log_file}"
        )
    if st.client_files:
        folder = next(iter(st.client_files.values())).parent
        click.echo(f"  clients   : {folder}/<user>.properties for {', '.join(st.client_files)}")
        click.echo(
            f"              e.g. LEDGER_KAFKA_CONFIG_FILE={st.client_files['admin']} "
            "ledger topics create"
        )


@broker_group.command("start")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=None,
    help="Seconds to wait until the broker answers (default 90; a cluster 180).",
)
@click.option(
    "--brokers",
    type=click.IntRange(1, cluster.MAX_BROKERS),
    default=None,
    help="Nodes (each broker and KRaft controller); default LEDGER_BROKERS (1).",
)
@click.option(
    "--security",
    type=click.Choice(cluster.SECURITY_MODES),
    default=None,
    help="plaintext, or SCRAM users + StandardAuthorizer (sasl_plaintext), with TLS "
    "(sasl_ssl); default LEDGER_BROKER_SECURITY (plaintext).",
)
def broker_start(wait_s: float | None, brokers: int | None, security: str | None) -> None:
    """Start the broker (or cluster) in the background, or reuse the one running.

    Fetches the jars if needed, writes the configs, formats the storage once,
    launches java detached (it keeps running after this command exits) and
    waits until the broker answers. If a broker we started is running, or any
    Kafka answers on LEDGER_KAFKA_PORT, it is reused. Stop it with
    `ledger broker stop`.

    With --brokers N (N>1) or --security other than plaintext it starts an
    N-node KRaft cluster in LEDGER_KAFKA_HOME/node-<i>/ (node i: client port
    LEDGER_KAFKA_PORT+i-1, controller port LEDGER_KAFKA_PORT+N+i-1); a secured
    one writes a client properties file per user to LEDGER_KAFKA_HOME/clients/
    (use one as LEDGER_KAFKA_CONFIG_FILE).
    """
    settings = current_settings()
    n = settings.brokers if brokers is None else brokers
    mode = settings.broker_security if security is None else security
    warning = broker.ephemeral_port_warning(settings.kafka_port, broker.ephemeral_range())
    if warning:
        click.echo(warning, err=True)
    if n == 1 and mode == "plaintext":
        running = _cluster_or_none(settings)
        if running is not None and any(running.node_pid(x.node_id) for x in running.spec.nodes):
            raise click.ClickException(
                f"a {running.spec.brokers}-node {running.spec.security} cluster runs in "
                f"{running.spec.kafka_home}; stop it first (ledger broker stop) or pass "
                f"--brokers {running.spec.brokers} --security {running.spec.security}"
            )
        _echo_status(
            broker.start(
                settings,
                wait_s=90 if wait_s is None else wait_s,
                say=lambda text: click.echo(text, err=True),
            )
        )
        return
    spec = cluster.ClusterSpec.from_settings(settings, n, mode)
    st = cluster.Cluster(spec, settings).start(wait_s=180 if wait_s is None else wait_s)
    _echo_cluster(st)


@broker_group.command("stop")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=30,
    show_default=True,
    help="Seconds to wait after SIGTERM before SIGKILL.",
)
def broker_stop(timeout_s: float) -> None:
    """Stop the broker or cluster `ledger broker start` launched (by recorded PIDs).

    A broker someone else runs on the port is never touched. Without a
    recorded broker this does nothing and says so.
    """
    settings = current_settings()
    recorded = cluster.Cluster.recorded(settings)
    if recorded is not None:
        click.echo(recorded.stop(timeout_s=max(timeout_s, 60)))
    if recorded is None or broker.status_pid(settings) is not None:
        click.echo(broker.stop(settings, timeout_s=timeout_s))


@broker_group.command("restart")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=None,
    help="Seconds to wait until the broker answers again (default 90; a cluster 180).",
)
def broker_restart(wait_s: float | None) -> None:
    """Stop and start our broker (or every node of our cluster) on the same data.

    Topics, records, committed offsets and transactions survive; clients see
    the broker vanish for a few seconds.
    """
    settings = current_settings()
    running = _cluster_or_none(settings)
    if running is not None:
        _echo_cluster(running.full_restart(wait_s=180 if wait_s is None else wait_s))
        return
    _echo_status(broker.restart(settings, wait_s=90 if wait_s is None else wait_s))


@broker_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def broker_status(as_json: bool) -> None:
    """Say whether the broker (or each cluster node) runs: PID, ports, log paths.

    Exit status: 0 when the broker answers on LEDGER_KAFKA_PORT (a cluster:
    every node alive and registered), 3 when not.

    \b
    --json, one broker: {"kind": "broker", "running", "pid", "owned", "started",
      "bootstrap", "kafka_home", "log_file", "stdout_file", "data_dir", "message"}
    --json, a cluster: {"kind": "cluster", "running", "bootstrap", "security",
      "controller", "nodes": [{"node_id", "pid", "alive", "registered", ...}],
      "kafka_home", "client_files", "started", "message"}
    """
    settings = current_settings()
    running = _cluster_or_none(settings)
    if running is not None:
        cst = running.status()
        if as_json:
            echo_json({"kind": "cluster", **dataclasses.asdict(cst)})
        else:
            _echo_cluster(cst)
        if not cst.running:
            raise click.exceptions.Exit(EXIT_TIMEOUT)
        return
    st = broker.status(settings)
    if as_json:
        echo_json({"kind": "broker", **dataclasses.asdict(st)})
    else:
        _echo_status(st)
    if not st.running:
        raise click.exceptions.Exit(EXIT_TIMEOUT)


# --------------------------------------------------------------------------- topics


@click.group("topics")
def topics_group() -> None:
    """The testbed's topic command (joins ``ledger topics``): ``compact``."""


@topics_group.command("compact")
@click.argument("names", nargs=-1)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=60,
    show_default=True,
    help="Seconds to wait for the log cleaner.",
)
def topics_compact(names: tuple[str, ...], timeout_s: float) -> None:
    """Make the broker compact the compacted topics now (or only NAMES).

    Temporarily sets segment.ms=100, min.cleanable.dirty.ratio=0.001,
    delete.retention.ms=100 on them, appends a `__compaction__` tombstone per
    non-empty partition so the active segment rolls (readers skip that key),
    waits until no key repeats below it, then restores the configs. Takes a
    second or two on the local broker. Run it while writers are quiet.
    """
    for res in force_compaction(current_settings(), timeout_s=timeout_s, names=names or None):
        click.echo(
            f"{res.topic:<40} {res.records_before:>7} -> {res.records_after:<7} "
            f"records  ({res.elapsed_s:.1f} s)"
        )


@click.group("sink")
def sink_group() -> None:
    """Reference sinks (the payment gateway and the unsafe sink): `ledger sink serve`."""


@sink_group.command("serve")
@click.argument("name")
@click.option(
    "--contract",
    default="payments",
    show_default=True,
    help="'payments' (idempotent, readback, postcondition, fencing), 'unsafe' (none of "
    "these), or a JSON effect contract.",
)
@click.option("--port", type=int, default=0, show_default=True, help="0 picks a free port.")
@click.option(
    "--contract-version",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="The contract's version in the registry (a release that changes the contract raises "
    "it; the release manifest says which in-flight operations may resume under it).",
)
def sink_serve(name: str, contract: str, port: int, contract_version: int) -> None:
    """Run reference sink NAME in the foreground and register it for the relay.

    Its SQLite database and log live under LEDGER_RUN_DIR/sinks/; the relay
    finds it through the sink registry (LEDGER_SINKS_FILE, default
    LEDGER_RUN_DIR/sinks.json), which also holds the random bearer token the
    sink requires. Fault injection is off. Stop it with Ctrl-C.
    """
    require_testbed_extra("ledger sink serve")
    from ledger.contracts import PAYMENT_GATEWAY, UNSAFE_SINK, EffectContract
    from sinks.registry import SinkEndpoint, load_sinks, save_sinks
    from testbed.sinks.process import SinkProcess

    named = {"payments": PAYMENT_GATEWAY, "unsafe": UNSAFE_SINK}
    try:
        chosen = named.get(contract) or EffectContract.model_validate_json(contract)
    except ValueError as exc:
        raise click.BadParameter(f"not a known contract or contract JSON: {exc}") from exc
    settings = current_settings()
    clock = "manual" if settings.clock == "manual" else "system"
    sink = SinkProcess(name, chosen, settings.run_dir, clock=clock, port=port)  # type: ignore[arg-type]
    sink.start()
    registry = load_sinks(settings.sinks_path())
    registry[name] = SinkEndpoint(
        url=sink.url, contract=chosen, token=sink.token, contract_version=contract_version
    )
    save_sinks(settings.sinks_path(), registry)
    click.echo(
        f"sink {name} at {sink.url} (log {sink.log_path}); registered in {settings.sinks_path()}"
    )

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM (a plain `kill`) stops the sink as Ctrl-C does

    signal.signal(signal.SIGTERM, _terminate)
    try:
        while sink.is_running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        sink.stop()


#: What a finished run says of the broker its ledgers live on.
LEDGERS_OUTLIVE_THE_BROKER = (
    "the records outlive the broker: if it is stopped, `ledger broker start` "
    "(same LEDGER_KAFKA_PORT) brings them back"
)


def _say_ledgers(say: Callable[[str], None], ledgers: list[RunLedger]) -> None:
    """Say, for each ledger of a finished run, its topic prefix, run folder and how to
    inspect it (:func:`testbed.harness.inspect_lines`)."""
    for run in ledgers:
        for line in inspect_lines(run):
            say(line)
    if ledgers:
        say(f"({LEDGERS_OUTLIVE_THE_BROKER})")


@click.command("demo")
@click.option("--verbose", is_flag=True, help="Show each journaled transition as it happens.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON report.")
@click.option(
    "--keep-broker",
    is_flag=True,
    help="Leave the local broker running afterwards if the demo started it.",
)
def demo_cmd(verbose: bool, as_json: bool, keep_broker: bool) -> None:
    """Run the article's four interruption cases through real processes on Kafka.

    Starts (or reuses) the local broker, then for each case creates its own
    topics, starts a reference sink and the processor, authority kernel and
    relay as separate processes, kills one of them with SIGKILL at the named
    seam, restarts it, and reads back what happened: effects from the sink,
    phases from ledger.state, claim decisions from the journal. Prints the
    report as JSON and exits 0 only if every value matches the expected one;
    the last line says OK or FAILED. Each case runs on its own ledger (topic
    prefix and run folder): the demo ends by naming each and the commands
    that inspect it (export LEDGER_TOPIC_PREFIX=... LEDGER_RUN_DIR=...
    LEDGER_CLOCK=manual; ledger state; ledger history OP; ledger audit).
    """
    require_testbed_extra("ledger demo")
    from testbed.demo import EXPECTED, run_demo

    def say(text: str) -> None:
        if not as_json:
            click.echo(text, err=True)

    ledgers: list[RunLedger] = []
    with running_broker(current_settings(), say, keep=keep_broker) as settings:
        t0 = time.monotonic()
        report = run_demo(settings, say, verbose=verbose, ledgers=ledgers)
        say(f"demo finished in {time.monotonic() - t0:.1f} s")
    click.echo(json.dumps(report, indent=2))
    mismatches = [
        f"{case}.{key}: expected {value!r}, observed {report.get(case, {}).get(key)!r}"
        for case, fields in EXPECTED.items()
        for key, value in fields.items()
        if report.get(case, {}).get(key) != value
    ]
    _say_ledgers(say, ledgers)
    for line in mismatches:
        click.echo(f"MISMATCH {line}", err=True)
    checked = sum(len(fields) for fields in EXPECTED.values())
    if mismatches:
        click.echo(
            f"FAILED: {len(mismatches)} of {checked} values differ from the expected report "
            "(MISMATCH lines above)",
            err=True,
        )
        sys.exit(1)
    say(f"OK: all {checked} values of the {len(EXPECTED)} cases match the expected report")


@click.group("gameday")
def gameday_group() -> None:
    """Game days: scenario files (shared/SCENARIOS.md format) run on the real ledger."""


@gameday_group.command("run")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON reports.")
def gameday_run(files: tuple[Path, ...], as_json: bool) -> None:
    """Run scenario FILES (JSON or YAML) one after another.

    Each scenario gets its own topics, run folder and ledger clock, its
    declared reference sinks and the real stage processes; faults are real
    SIGKILLs at the named seams. Format 3 adds wait (wall-clock seconds pass,
    so transaction and session timeouts fire), offsets_reset (a downed
    component's group offsets set to earliest or latest, or deleted),
    topic_config (a topic's Kafka configs changed) and skew (one component's
    ledger clock shifted). Starts (or reuses) the local broker. Exits 0
    when every expectation of every file holds, 1 otherwise, 2 for a
    malformed file (the message names the bad key or value). Ends by naming
    each scenario's topic prefix and run folder and the commands that
    inspect its ledger (ledger state, ledger history OP, ledger audit).
    """
    require_testbed_extra("ledger gameday run")
    from testbed.gameday import run_files
    from testbed.scenario import ScenarioError, load

    malformed = 0
    for path in files:  # every file is checked before anything runs
        try:
            load(path)
        except ScenarioError as exc:
            malformed += 1
            click.echo(f"error: {exc.message}", err=True)
    if malformed:
        click.echo(
            f"error: no scenario was run: {malformed} of {len(files)} file(s) malformed "
            "(fix them or leave them out)",
            err=True,
        )
        sys.exit(2)

    def say(text: str) -> None:
        if not as_json:
            click.echo(text, err=True)

    ledgers: list[RunLedger] = []
    with running_broker(current_settings(), say) as settings:
        reports = run_files(list(files), settings, say, ledgers=ledgers)
    _say_ledgers(say, ledgers)
    if as_json:
        click.echo(json.dumps(reports if len(reports) > 1 else reports[0], indent=2))
    else:
        for report in reports:
            click.echo(f"{'PASS' if report['passed'] else 'FAIL'}  {report['name']}")
    sys.exit(0 if all(r["passed"] for r in reports) else 1)


#: The commands this plug-in adds to ``ledger`` (entry point ``ledger.cli: testbed``).
COMMANDS: tuple[click.Command, ...] = (
    broker_group,
    topics_group,
    sink_group,
    demo_cmd,
    gameday_group,
    mission_group,
)
