"""``ledger mission run|compare``: the fee-remediation mission from the command line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ledger.cli.common import setup_logging
from testbed.extras import require_testbed_extra

Options = Callable[..., Any]

#: Environment of a mission re-executed in its client namespace: the options (JSON).
CHILD_ENV = "LEDGER_TESTBED_MISSION"
#: Environment: why the cluster runs without network namespaces (for the report).
NO_NETNS_ENV = "LEDGER_TESTBED_NO_NETNS"


def _mission_options(func: Options) -> Options:
    options = [
        click.option(
            "--cases", type=click.IntRange(min=1), default=300, show_default=True, help="Cases."
        ),
        click.option(
            "--crash-rate",
            type=click.FloatRange(0, 1),
            default=0.05,
            show_default=True,
            help="Per operation: chance that a stage is SIGKILLed at a seam while handling it.",
        ),
        click.option("--seed", type=int, default=7, show_default=True, help="Random seed."),
        click.option(
            "--instances",
            type=click.IntRange(1, 4),
            default=1,
            show_default=True,
            help="Instances of each stage in the same consumer groups (2: partitions move, "
            "zombies wake up).",
        ),
        click.option(
            "--sink-fault-rate",
            type=click.FloatRange(0, 1),
            default=None,
            help="Per operation: chance of a sink fault (reject, unavailable, timeouts, dropped "
            "response). Default: the crash rate.",
        ),
        click.option(
            "--window",
            type=click.IntRange(min=1),
            default=200,
            show_default=True,
            help="Cases in flight at once.",
        ),
        click.option(
            "--broker-restart/--no-broker-restart",
            default=True,
            show_default=True,
            help="Restart the local broker once, part-way through (only a broker started by "
            "'ledger broker start').",
        ),
        click.option(
            "--chaos-every",
            type=click.IntRange(min=0),
            default=500,
            show_default=True,
            help="Every this many cases, SIGKILL a random stage at an arbitrary point (with "
            "several instances, or pause it past its session timeout: a zombie). 0: never.",
        ),
        click.option(
            "--brokers",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Broker nodes of the local cluster to run on (3: a three-node KRaft cluster "
            "started by the mission, as 'ledger broker start --brokers 3').",
        ),
        click.option(
            "--broker-chaos",
            is_flag=True,
            help="With --brokers 3: while the mission runs, SIGKILL the leader of the busiest "
            "partition, SIGKILL the active controller, restart the nodes one by one, restart "
            "the whole cluster and cut one node off the network (each node in its own network "
            "namespace; needs root, else the cut is skipped and the report says why). Each "
            "fault is on the report with its start and end.",
        ),
        click.option(
            "--real-sinks",
            is_flag=True,
            help="Refunds through the postgres adapter to a real PostgreSQL server, "
            "notifications through the smtp adapter to a real SMTP server (both started on "
            "loopback, faults injected on the wire, effects counted by the systems); the "
            "gateway upgrade is left out.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
        click.option(
            "--html",
            "html_path",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Write the HTML page here (run: next to report.json in the mission's run "
            "folder; compare: mission-compare.html, or next to the two runs).",
        ),
        click.option(
            "--keep-broker", is_flag=True, help="Leave the local broker running if this started it."
        ),
        click.option("--verbose", is_flag=True, help="Log what the stages' clients do."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _run(mode: str, kw: dict[str, Any], say: Callable[[str], None]) -> tuple[dict[str, Any], Path]:
    """Run one mission on the configured (or local) broker; returns (report, run folder)."""
    from testbed.mission.plan import MissionOptions
    from testbed.mission.run import Mission
    from testbed.netns import NetworkSpec

    try:
        options = MissionOptions(
            cases=kw["cases"],
            crash_rate=kw["crash_rate"],
            seed=kw["seed"],
            mode=mode,  # type: ignore[arg-type]
            instances=kw["instances"],
            sink_fault_rate=kw["sink_fault_rate"],
            window=kw["window"],
            broker_restart=kw["broker_restart"],
            chaos_every=kw["chaos_every"],
            brokers=kw["brokers"],
            broker_chaos=kw["broker_chaos"],
            real_sinks=kw.get("real_sinks", False),
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    tty = sys.stderr.isatty()
    bar_settings: dict[str, Any] = {
        "length": options.cases,
        "label": f"{mode:>15}",
        "file": sys.stderr if tty else io.StringIO(),  # no bar in logs: lines instead
        "show_pos": True,
        "show_percent": False,
        "item_show_func": lambda status: status,
    }
    network = NetworkSpec.from_env()
    no_network = os.environ.get(NO_NETNS_ENV, "the nodes run without network namespaces")
    with (
        _kafka(options, say, kw["keep_broker"], network) as (settings, cluster),
        click.progressbar(**bar_settings) as bar,
    ):
        last = [0.0]

        def progress(done: int, total: int, status: str) -> None:
            if tty:
                bar.update(max(0, done - bar.pos), status)
            elif time.monotonic() - last[0] >= 10 or done == total:
                # Not a terminal (CI, a log file): a line every ten seconds.
                last[0] = time.monotonic()
                click.echo(f"{mode}: {done}/{total} cases settled · {status}", err=True)

        mission = Mission(
            options,
            settings,
            say=say,
            progress=progress,
            cluster=cluster,
            network=network,
            no_network=no_network,
        )
        # SIGTERM stops the mission like Ctrl-C, between two steps of its loop
        # (never from inside a Kafka client call): its stages and sinks stop too.
        signal.signal(signal.SIGTERM, lambda _sig, _frame: mission.request_stop())
        try:
            report = mission.run()
        finally:
            mission.close()
    return report, mission.settings.run_dir


def _write(report: dict[str, Any], run_dir: Path, html_path: Path | None) -> tuple[Path, Path]:
    from testbed.mission.html import mission_html

    out = run_dir / "report.json"
    out.write_text(json.dumps(report, indent=2))
    html = html_path or run_dir / "report.html"
    html.parent.mkdir(parents=True, exist_ok=True)
    html.write_text(mission_html(report))
    return out, html


@click.group("mission")
def mission_group() -> None:
    """The fee-remediation mission: thousands of cases, crashes everywhere, then an audit."""


@mission_group.command("run")
@click.option(
    "--mode",
    type=click.Choice(["ledger", "checkpoint-only"]),
    default="ledger",
    show_default=True,
    help="ledger, or checkpoint-only: the negative control (the relay trusts its checkpoint "
    "and resubmits without readback or idempotency key).",
)
@_mission_options
def mission_run(mode: str, **kw: Any) -> None:
    """Run the fee-remediation mission against the real ledger, with faults everywhere.

    Each case: an eligibility decision (pure), a signed approval (a human
    reviewer's above 100.00 GBP, the policy engine's below; some expire before
    use, the policy version changes half-way), a refund through the payment
    gateway and, once the refund is verified, a notification through a mail
    sink that has no readback. While it runs, stages are SIGKILLed at every
    named seam, sinks answer with every fault mode, resumers race, the broker
    restarts once, and with --instances 2 instances are killed or paused so
    that partitions move and zombies wake up.

    Ends with a report (cases, final states, duplicate effects counted by the
    sinks, unknown outcomes, stale-resumer rejections, reauthorisations,
    postcondition mismatches, readback latency after resumes, faults injected)
    and the audit of the whole ledger before and after forced compaction. The
    JSON and HTML reports are written to the mission's run folder
    (.ledger/missions/<mode>-seed<S>-<N>c-<I>i/, emptied first). Exits 0 when
    every check of the mode passes; in checkpoint-only mode the checks are
    only that the run completed (its duplicates are what it is for).

    \b
    Examples:
      ledger mission run --cases 4000 --crash-rate 0.05 --seed 7
      ledger mission run --cases 4000 --instances 2 --html mission.html
      ledger mission run --cases 300 --mode checkpoint-only --json > control.json
    """
    require_testbed_extra("ledger mission run")
    _log(kw["verbose"])
    say = _say(kw["as_json"])
    if kw["broker_chaos"] and kw["brokers"] < 3:
        raise click.BadParameter("--broker-chaos needs --brokers 3 (or more)")
    if kw["broker_chaos"]:
        from testbed import netns

        reason = netns.unavailable_reason()
        if reason is None:
            sys.exit(_in_client_namespace(mode, kw, say))
        say(
            f"network namespaces unavailable ({reason}): the cluster runs on 127.0.0.1 and "
            "the network-partition fault is skipped"
        )
        os.environ[NO_NETNS_ENV] = reason
    _mission_run(mode, kw, say)


def _mission_run(mode: str, kw: dict[str, Any], say: Callable[[str], None]) -> None:
    """Run the mission here and print its report; exits 0 when its checks pass."""
    from testbed.mission.report import render_text

    as_json = kw["as_json"]
    report, run_dir = _run(mode, kw, say)
    out, html = _write(report, run_dir, kw["html_path"])
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_text(report))
    click.echo(f"report: {out}\nHTML:   {html}", err=True)
    for line in _inspect(report, run_dir):
        click.echo(line, err=True)
    sys.exit(0 if report["checks"]["passed"] else 1)


def _inspect(report: dict[str, Any], run_dir: Path) -> list[str]:
    """How to look at the mission's ledger afterwards (its prefix, run folder, commands).

    The example operation is the first one the mission left held, else its
    first refund.
    """
    from ledger.cli.common import current_settings
    from testbed.runs import RunLedger, inspect_lines

    settings = current_settings().model_copy(
        update={"topic_prefix": report["mission"]["ledger"], "run_dir": run_dir, "clock": "manual"}
    )
    held = [str(h["operation_id"]) for h in report.get("held_operations") or []]
    return inspect_lines(RunLedger("the mission", settings, held or ["refund:00000:v1"]))


def _in_client_namespace(mode: str, kw: dict[str, Any], say: Callable[[str], None]) -> int:
    """Make the cluster's network, run the mission in its client namespace, tear it down.

    The mission re-executes itself (``python -m testbed.cli_mission``, its
    options in :data:`CHILD_ENV`) behind ``ip netns exec CLIENT``: its stages,
    sinks and clients then live in the client namespace, where the broker
    nodes' addresses are reachable; the nodes are started in their own
    namespaces. SIGTERM and SIGINT are passed on to it. Whatever still runs in
    the namespaces afterwards is stopped, and the namespaces are deleted.

    Returns:
        The child's exit status.
    """
    from ledger.cli.common import current_settings
    from testbed.netns import NETNS_ENV, ClusterNetwork

    port = current_settings().kafka_port
    with ClusterNetwork(port, kw["brokers"]) as net:
        say(
            f"network: {kw['brokers']} node namespaces {net.node(0)}.. on "
            f"{net.node_address(0)}.., clients in {net.client} ({net.client_address})"
        )
        env = dict(os.environ)
        env[NETNS_ENV] = net.to_env()
        env[CHILD_ENV] = json.dumps(
            {"mode": mode, **{k: str(v) if isinstance(v, Path) else v for k, v in kw.items()}}
        )
        child = subprocess.Popen(
            [*net.client_prefix(), sys.executable, "-m", "testbed.cli_mission"], env=env
        )
        forward = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.getsignal(sig) for sig in forward}
        for sig in forward:
            signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        try:
            return child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if child.poll() is None:
                child.kill()
                child.wait()


@contextlib.contextmanager
def _kafka(
    options: Any, say: Callable[[str], None], keep: bool, network: Any
) -> Iterator[tuple[Any, Any]]:
    """``(settings, cluster control or None)`` for the mission's Kafka: one broker or a cluster."""
    from ledger.cli.common import current_settings
    from testbed.broker import running_broker

    if options.brokers == 1:
        with running_broker(current_settings(), say, keep=keep) as settings:
            yield settings, None
        return
    from testbed.mission.cluster import running_cluster

    with running_cluster(current_settings(), options.brokers, network, say, keep=keep) as (
        settings,
        control,
    ):
        yield settings, control


def _child_main() -> None:
    """Entry point of a mission re-executed in its client namespace (see :data:`CHILD_ENV`)."""
    raw = json.loads(os.environ.pop(CHILD_ENV))
    mode = raw.pop("mode")
    if raw.get("html_path"):
        raw["html_path"] = Path(raw["html_path"])
    _log(raw["verbose"])
    _mission_run(mode, raw, _say(raw["as_json"]))


@mission_group.command("compare")
@click.argument("reports", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_mission_options
def mission_compare(reports: tuple[Path, ...], **kw: Any) -> None:
    """Show missions side by side: the ledger against its checkpoint-only control.

    With REPORTS (JSON files written by 'ledger mission run'), compares them.
    Without, runs the mission twice with the same options and seed - in
    ledger mode, then in checkpoint-only mode - and compares the two.

    Exits 0 when every ledger-mode mission passed its checks and every
    checkpoint-only mission shows the duplicate effects it exists to show.
    """
    require_testbed_extra("ledger mission compare")
    from testbed.mission.html import compare_html
    from testbed.mission.report import compare_text

    as_json = kw["as_json"]
    _log(kw["verbose"])
    say = _say(as_json)
    loaded: list[dict[str, Any]] = []
    if reports:
        for path in reports:
            try:
                loaded.append(json.loads(path.read_text()))
            except ValueError as exc:
                raise click.BadParameter(f"{path}: not a JSON report ({exc})") from exc
        html = kw["html_path"] or Path("mission-compare.html")
    else:
        run_dir = Path(".")
        for mode in ("ledger", "checkpoint-only"):
            report, run_dir = _run(mode, kw, say)
            _write(report, run_dir, None)
            loaded.append(report)
        html = kw["html_path"] or run_dir.parent / f"compare-seed{kw['seed']}-{kw['cases']}c.html"
    for n, report in enumerate(loaded):
        name = str(reports[n]) if reports else f"run {n + 1}"
        if not (
            isinstance(report, dict)
            and isinstance(report.get("mission"), dict)
            and isinstance(report.get("measures"), list)
            and isinstance(report.get("checks"), dict)
            and "mode" in report["mission"]
        ):
            raise click.BadParameter(
                f"{name}: not a mission report (written by 'ledger mission run')"
            )
    html.parent.mkdir(parents=True, exist_ok=True)
    html.write_text(compare_html(loaded))
    if as_json:
        click.echo(json.dumps(loaded, indent=2))
    else:
        click.echo(compare_text(loaded))
    click.echo(f"HTML: {html}", err=True)
    problems = []
    for report in loaded:
        mode = report["mission"]["mode"]
        if mode == "ledger" and not report["checks"]["passed"]:
            problems.append("the ledger mission failed: " + "; ".join(report["checks"]["failures"]))
        if mode == "checkpoint-only":
            dup = next(m for m in report["measures"] if m["name"] == "duplicate effects")
            if dup["count"] == 0:
                problems.append(
                    "the checkpoint-only control showed no duplicate effects at this seed and "
                    "crash rate; raise --crash-rate or --cases"
                )
    for problem in problems:
        click.echo(f"FAIL: {problem}", err=True)
    sys.exit(1 if problems else 0)


def _say(as_json: bool) -> Callable[[str], None]:
    def say(text: str) -> None:
        click.echo(text, err=True)

    return say


def _log(verbose: bool) -> None:
    setup_logging(verbose)


if __name__ == "__main__":
    _child_main()
