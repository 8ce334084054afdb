"""The sink registry from the command line: ``ledger sink register | list | show ...``.

The commands: ``register``, ``list``, ``show``, ``adapters`` and ``openapi``.
A sink is an external system the relay acts on, reached through an adapter
(:mod:`sinks.port`). Its registry entry (``LEDGER_SINKS_FILE``, default
``LEDGER_RUN_DIR/sinks.json``) says which adapter, where the system answers,
the adapter's settings and the effect contract the sink declares. ``ledger
sink openapi`` prints the protocol an ``http`` sink must serve. The testbed
adds ``ledger sink serve`` (a reference sink) to this group.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path
from typing import Any

import click

from ledger.cli.common import EXIT_ERROR, current_settings, echo_json, fail
from ledger.contracts import PAYMENT_GATEWAY, UNSAFE_SINK, EffectContract
from ledger.errors import LedgerError, SinkConfigError
from sinks.conformance import SinkCheck
from sinks.port import adapter_kinds, capabilities_of, open_sink
from sinks.registry import SinkEndpoint, load_sinks, save_sinks

#: Sink names: the registry's keys, named by intents and dispatches.
SINK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

#: Contracts that can be named instead of written out.
NAMED_CONTRACTS = ("payments", "unsafe")


def _json_arg(value: str, what: str) -> Any:
    """A JSON argument given inline or as ``@FILE``."""
    text = value
    if value.startswith("@"):
        try:
            text = Path(value[1:]).read_text()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {value[1:]}: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"{what} is not JSON ({exc}); give JSON or @FILE") from exc


def _contract(value: str) -> Any:

    named = {"payments": PAYMENT_GATEWAY, "unsafe": UNSAFE_SINK}
    if value in named:
        return named[value]
    try:
        return EffectContract.model_validate(_json_arg(value, "the contract"))
    except ValueError as exc:
        raise click.BadParameter(f"not a valid effect contract: {exc}") from exc


def masked_url(url: str) -> str:
    """``url`` with any password in it replaced by ``***`` (a ``${NAME}`` reference stays)."""
    return re.sub(r"(://[^:/@]+:)(?!\$\{)[^@]*@", r"\1***@", url)


def _token_shown(token: str | None) -> str | None:
    if token is None:
        return None
    return token if re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", token) else "***"


def _describe(name: str, endpoint: Any) -> dict[str, Any]:

    try:
        caps: dict[str, bool] | str = vars(capabilities_of(endpoint.adapter)).copy()
    except Exception as exc:  # an adapter that cannot be loaded is reported, not fatal
        caps = f"cannot load adapter {endpoint.adapter!r}: {exc}"
    return {
        "name": name,
        "adapter": endpoint.adapter,
        "url": masked_url(endpoint.url),
        "token": _token_shown(endpoint.token),
        "contract_version": endpoint.contract_version,
        "contract": endpoint.contract.model_dump(),
        "config": endpoint.config,
        "timeout_s": endpoint.timeout_s,
        "adapter_offers": caps,
    }


@click.group("sink")
def sink_group() -> None:
    """Sinks: the external systems the relay acts on, and their adapters.

    \b
      ledger sink adapters                 the adapter kinds there are
      ledger sink register NAME --adapter postgres --url postgresql://... \\
          --contract @payments-contract.json
      ledger sink list                     every registered sink
      ledger sink show NAME [--probe]      one sink, and whether it answers
      ledger sink check NAME               prove its contract, claim by claim

    The registry is LEDGER_SINKS_FILE (default LEDGER_RUN_DIR/sinks.json, mode
    0600). A secret can be named instead of written: ${VAR} in --url or
    --token is read from the environment of the stage that calls the sink, so
    stages that never call it never hold it.
    """


@sink_group.command("adapters")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def sink_adapters(as_json: bool) -> None:
    """List the adapter kinds that can be named, and what each can offer a contract."""
    rows = []
    for kind in adapter_kinds():
        try:
            offers = [k for k, v in vars(capabilities_of(kind)).items() if v]
            rows.append({"adapter": kind, "offers": offers})
        except Exception as exc:
            rows.append({"adapter": kind, "error": str(exc)})
    if as_json:
        echo_json(rows)
        return
    for row in rows:
        said = ", ".join(row.get("offers", [])) or "no idempotency, readback or fencing"
        click.echo(f"{row['adapter']:<22} {row.get('error') or said}")


@sink_group.command("register")
@click.argument("name")
@click.option(
    "--adapter",
    default="http",
    show_default=True,
    help="The adapter kind (see `ledger sink adapters`): http, http-idempotency-key, "
    "postgres, smtp, or an installed entry point's.",
)
@click.option(
    "--url",
    required=True,
    help="Where the system answers, in the adapter's scheme (http://, postgresql://, "
    "smtp://). ${VAR} is read from the calling stage's environment.",
)
@click.option(
    "--contract",
    "contract_text",
    required=True,
    help="The effect contract the sink declares: 'payments', 'unsafe', JSON, or @FILE.",
)
@click.option(
    "--config", "config_text", default=None, help="The adapter's settings: JSON or @FILE."
)
@click.option(
    "--token", default=None, help="Bearer token or credentials; ${VAR} names an env variable."
)
@click.option("--contract-version", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True, max=300),
    default=None,
    help="The overall deadline of every call to this sink, in seconds (default: the "
    "stage's LEDGER_SINK_TIMEOUT_S). An answer past it is ambiguous: give a system that "
    "needs several round trips per effect (SMTP) room enough.",
)
@click.option("--replace", is_flag=True, help="Replace an existing entry of that name.")
def sink_register(
    name: str,
    adapter: str,
    url: str,
    contract_text: str,
    config_text: str | None,
    token: str | None,
    contract_version: int,
    timeout_s: float | None,
    replace: bool,
) -> None:
    """Register sink NAME: its adapter, its address, its settings and its contract.

    The contract may claim no more than the adapter can do (an adapter without
    readback cannot declare `readback: true`); prove the claims against the
    running system with `ledger sink check NAME`.
    """
    if not SINK_NAME.fullmatch(name):
        fail("a sink name is 1 to 64 letters, digits, '.', '_' or '-'", EXIT_ERROR)
    contract = _contract(contract_text)
    config = {} if config_text is None else _json_arg(config_text, "--config")
    if not isinstance(config, dict):
        raise click.BadParameter("--config must be a JSON object")
    try:
        over = capabilities_of(adapter).overclaims(contract)
    except LedgerError as exc:
        fail(exc.message, EXIT_ERROR)
    if over:
        fail(
            f"the {adapter} adapter cannot honour {', '.join(over)}: declare them false in the "
            "contract (the relay would otherwise trust a claim the sink cannot keep)",
            EXIT_ERROR,
        )
    endpoint = SinkEndpoint(
        url=url,
        contract=contract,
        token=token,
        contract_version=contract_version,
        adapter=adapter,
        config=config,
        timeout_s=timeout_s,
    )
    try:  # the adapter checks its settings when opened; it contacts nothing yet
        open_sink(endpoint, timeout_s=1.0, name=name).close()
    except SinkConfigError as exc:
        if "is not set in this process" not in exc.message:
            fail(exc.message, EXIT_ERROR)
    settings = current_settings()
    path = settings.sinks_path()
    registry = load_sinks(path)
    if name in registry and not replace:
        fail(f"sink {name!r} is already registered in {path}; add --replace", EXIT_ERROR)
    registry[name] = endpoint
    save_sinks(path, registry)
    click.echo(f"sink {name} ({adapter}, {masked_url(url)}) registered in {path}")


@sink_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (secrets masked).")
def sink_list(as_json: bool) -> None:
    """List the registered sinks: adapter, address (secrets masked) and contract claims."""
    settings = current_settings()
    sinks = load_sinks(settings.sinks_path())
    rows = [_describe(n, e) for n, e in sorted(sinks.items())]
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo(f"no sinks registered in {settings.sinks_path()}")
        return
    for row in rows:
        claims = [k for k, v in row["contract"].items() if v is True]
        click.echo(
            f"{row['name']:<16} {row['adapter']:<22} {row['url']:<40} "
            f"{', '.join(claims) or '-'} (v{row['contract_version']})"
        )


@sink_group.command("show")
@click.argument("name")
@click.option("--probe", is_flag=True, help="Ask the system whether it answers (health).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (secrets masked).")
def sink_show(name: str, probe: bool, as_json: bool) -> None:
    """Show sink NAME's entry (secrets masked); --probe asks the system whether it answers.

    Exit 1 when the sink is not registered or, with --probe, does not answer.
    """
    settings = current_settings()
    sinks = load_sinks(settings.sinks_path())
    if name not in sinks:
        known = ", ".join(sorted(sinks)) or "none"
        fail(f"sink {name!r} is not registered in {settings.sinks_path()} (registered: {known})", 1)
    row = _describe(name, sinks[name])
    if probe:
        try:
            client = open_sink(
                sinks[name], timeout_s=sinks[name].deadline_s(settings.sink_timeout_s), name=name
            )
            try:
                row["answers"] = client.health()
            finally:
                client.close()
        except LedgerError as exc:
            row["answers"], row["probe_error"] = False, exc.message
    if as_json:
        echo_json(row)
    else:
        for key, value in row.items():
            shown = json.dumps(value) if isinstance(value, dict | list) else value
            click.echo(f"{key + ':':<18} {shown}")
    if probe and not row["answers"]:
        raise click.exceptions.Exit(1)


@sink_group.command("check")
@click.argument("name")
@click.option(
    "--account",
    default="ledger-sink-check",
    show_default=True,
    help="The account the probes credit (each probe is a real effect of --amount-minor).",
)
@click.option("--amount-minor", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--retention-wait",
    "retention_wait_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds the check waits to test the key retention (longer retentions are untested).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def sink_check(
    name: str, account: str, amount_minor: int, retention_wait_s: float, as_json: bool
) -> None:
    """Prove sink NAME's declared contract against its running system, claim by claim.

    The adapter is opened through a fault proxy on loopback, between it and
    the system, and driven through a lost response after the commit, timeouts
    on each side of the commit, a reset, a stale fencing token and the same
    key with other parameters. Each probe is a REAL request with an operation
    ID of its own (sink-check:...): point it at a test account or a staging
    system.

    Exit 0 when every claim holds or is untested (with the reason), 1 when a
    claim fails.
    """
    settings = current_settings()
    sinks = load_sinks(settings.sinks_path())
    if name not in sinks:
        known = ", ".join(sorted(sinks)) or "none"
        fail(f"sink {name!r} is not registered in {settings.sinks_path()} (registered: {known})", 1)
    check = SinkCheck(
        name,
        sinks[name],
        timeout_s=sinks[name].deadline_s(settings.sink_timeout_s),
        account=account,
        amount_minor=amount_minor,
        say=(lambda line: None) if as_json else click.echo,
        retention_wait_s=retention_wait_s,
    )
    try:
        report = check.run_all()
    except LedgerError as exc:
        fail(exc.message, EXIT_ERROR)
    if as_json:
        echo_json(report.as_dict())
    else:
        failed = [r.claim for r in report.results if r.verdict == "fails"]
        click.echo(
            f"sink {name} ({report.adapter}): "
            + ("every claim tested holds" if report.passed else f"FAILS {', '.join(failed)}")
        )
    if not report.passed:
        raise click.exceptions.Exit(1)


@sink_group.command("openapi")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Write the document to FILE instead of standard output.",
)
def sink_openapi(output: Path | None) -> None:
    """Print the OpenAPI 3.1 document of the protocol an ``http`` sink must serve.

    It is what the ledger's http adapter sends and how it reads each answer;
    sinks.toolkit serves it in front of a team's own backend.
    """
    document = files("sinks").joinpath("openapi.json").read_text(encoding="utf-8")
    if output is None:
        click.echo(document, nl=not document.endswith("\n"))
        return
    try:
        output.write_text(document, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc}; choose another --output", EXIT_ERROR)
    click.echo(f"the sink protocol's OpenAPI document written to {output}")


COMMANDS: tuple[click.Command, ...] = (sink_group,)
