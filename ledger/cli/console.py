"""``ledger console``: serve the operator console (:mod:`ledger.console`).

The pages, their data and their safeguards live in :mod:`ledger.console`;
this module parses the options, checks the topics and starts the server
(the ``[console]`` extra: Starlette and uvicorn).
"""

from __future__ import annotations

import click

from ledger import topics
from ledger.cli.common import current_settings
from ledger.console import (
    DECISIONS,
    ConsoleData,
    LedgerData,
    StageHealth,
    allowed_hosts,
    create_app,
    is_loopback,
    operation_age_s,
    serve,
)
from ledger.extras import require_extra

__all__ = [
    "DECISIONS",
    "ConsoleData",
    "LedgerData",
    "StageHealth",
    "allowed_hosts",
    "console_cmd",
    "create_app",
    "operation_age_s",
]


def _metrics_option(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name.strip() or not url.startswith(("http://", "https://")):
            raise click.BadParameter(
                f"takes NAME=URL, e.g. processor-0=http://127.0.0.1:9100 (not {value!r})"
            )
        out[name.strip()] = url
    return out


@click.command("console")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8088, show_default=True, help="TCP port."
)
@click.option(
    "--metrics",
    multiple=True,
    callback=_metrics_option,
    metavar="NAME=URL",
    help="A stage's metrics server (its /healthz and /readyz), e.g. "
    "processor-0=http://127.0.0.1:9100; repeatable. Stages whose status file names "
    "their metrics port are found without it.",
)
@click.option(
    "--wait-s",
    type=click.FloatRange(min=0),
    default=15.0,
    show_default=True,
    help="How long a disposition waits for the processor's decision (seconds).",
)
def console_cmd(host: str, port: int, metrics: dict[str, str], wait_s: float) -> None:
    """Serve the operator console.

    Serve the operator console: operations, timelines, the unknown-outcome queue
    with dispositions, the latest audit and stage health.

    It binds to the loopback interface by default. Anyone who can reach it can
    dispose unknown outcomes with the operator keys of this host
    (LEDGER_RUN_DIR/operators/): bind elsewhere only behind an authenticating proxy.
    """
    require_extra("console", "ledger console")
    settings = current_settings()
    topics.check_topics(settings)
    if not is_loopback(host):
        click.echo(
            f"warning: serving on {host}, not loopback: whoever reaches it can dispose with "
            "this host's operator keys",
            err=True,
        )
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"ledger console for {settings.topic_prefix!r} at http://{shown}:{port}/", err=True)
    serve(LedgerData(settings, metrics, wait_s), host=host, port=port, title=settings.topic_prefix)


#: This module's commands, in the order ``ledger --help`` lists them.
COMMANDS: tuple[click.Command, ...] = (console_cmd,)
