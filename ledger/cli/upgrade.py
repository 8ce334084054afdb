"""``ledger upgrade check``: which in-flight operations a sink's new contract would strand.

Run before a sink release is deployed: it reads the state table, the sink
registry and the release manifest, and checks every in-flight operation of
the sink as the relay would check its next step under the proposed contract
(:mod:`ledger.upgrades`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from consumers import reader
from ledger.cli.common import (
    EXIT_ERROR,
    EXIT_USAGE,
    current_settings,
    echo_json,
    fail,
    reader_ready,
)
from ledger.clock import clock_for
from ledger.contracts import EffectContract
from ledger.errors import LocalFileError
from ledger.upgrades import IN_FLIGHT, stranded_by
from sinks.registry import load_manifest, load_sinks


def _proposal(path: Path, sink: str | None) -> tuple[str, EffectContract, int | None]:
    """Read ``--contract FILE``: a contract, or ``{"sink", "contract_version", "contract"}``."""
    try:
        raw: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        fail(f"cannot read the contract file {path}: {exc}", EXIT_USAGE)
    if not isinstance(raw, dict):
        fail(f"the contract file {path} must hold a JSON object", EXIT_USAGE)
    wrapped = "contract" in raw
    body = raw["contract"] if wrapped else raw
    named = raw.get("sink") if wrapped else None
    version = raw.get("contract_version") if wrapped else None
    if wrapped and set(raw) - {"sink", "contract_version", "contract"}:
        fail(
            f"the contract file {path} may hold only 'sink', 'contract_version' and 'contract'",
            EXIT_USAGE,
        )
    if version is not None and (not isinstance(version, int) or version < 1):
        fail(f"'contract_version' in {path} must be a positive integer", EXIT_USAGE)
    name = sink or named
    if not isinstance(name, str) or not name:
        fail(f"name the sink: --sink NAME, or 'sink' in {path}", EXIT_USAGE)
    try:
        contract = EffectContract.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        at = f" at {where!r}" if where else ""
        fail(f"the contract in {path} is not valid{at}: {first['msg']}", EXIT_USAGE)
    return name, contract, version


@click.group("upgrade")
def upgrade_group() -> None:
    """Check a sink release against the in-flight operations before deploying it."""


@upgrade_group.command("check")
@click.option(
    "--contract",
    "contract_file",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help='The proposed contract (JSON): a contract, or {"sink", "contract_version", "contract"}.',
)
@click.option("--sink", default=None, help="The sink whose contract changes (else the file's).")
@click.option(
    "--manifest",
    "manifest_file",
    default=None,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The release manifest (default: LEDGER_RELEASE_MANIFEST_FILE; none: every change holds).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def upgrade_check_cmd(
    contract_file: Path, sink: str | None, manifest_file: Path | None, as_json: bool
) -> None:
    """List the in-flight operations a proposed contract change would strand.

    The proposed version is the file's 'contract_version', else the sink
    registry's version plus one. Each in-flight operation of the sink is
    checked as the relay would check its next step under the proposed
    contract: the release manifest must let the new version resume its state,
    and the new contract must still give the evidence its step needs
    (readback, or a key still retained; the age counts from admission).
    With --json: {"sink", "current_version", "proposed_version", "manifest",
    "in_flight", "stranded": [{"operation_id", "state", "reason"}]}.
    Exits 0 when nothing would be stranded, 1 when something would, 2 for a
    bad file.
    """
    settings = current_settings()
    name, contract, version = _proposal(contract_file, sink)
    manifest_path = manifest_file or settings.release_manifest_file
    try:
        manifest = load_manifest(manifest_path) if manifest_path is not None else None
        sinks = load_sinks(settings.sinks_path())
    except LocalFileError as exc:
        fail(exc.message, EXIT_USAGE)
    registered = sinks.get(name)
    current = registered.contract_version if registered is not None else 1
    proposed = version or current + 1
    reader_ready(settings)  # reads only; a run folder that cannot authenticate it is said
    if registered is None and not (manifest is not None and name in manifest.sinks):
        known = sorted(set(sinks) | (set(manifest.sinks) if manifest is not None else set()))
        fail(
            f"sink {name!r} is neither in the sink registry ({settings.sinks_path()}) nor in "
            f"the release manifest; known sinks: {', '.join(known) or 'none'}",
            EXIT_USAGE,
        )
    states = list(reader.current_states(settings).values())
    now = clock_for(settings.clock, settings.run_dir).now_ms()
    found = stranded_by(
        states,
        manifest,
        name,
        current_version=current,
        proposed_version=proposed,
        proposed=contract,
        now_ms=now,
    )
    in_flight = sum(1 for st in states if st.sink == name and str(st.state) in IN_FLIGHT)
    if as_json:
        echo_json(
            {
                "sink": name,
                "current_version": current,
                "proposed_version": proposed,
                "manifest": str(manifest_path) if manifest_path else None,
                "in_flight": in_flight,
                "stranded": [
                    {"operation_id": s.operation_id, "state": s.state, "reason": s.reason}
                    for s in found
                ],
            }
        )
    else:
        click.echo(
            f"{name}: contract version {current} -> {proposed}: {len(found)} of {in_flight} "
            "in-flight operation(s) would be stranded"
        )
        for s in found:
            click.echo(f"{s.operation_id}\t{s.state}\t{s.reason}")
    if found:
        raise SystemExit(EXIT_ERROR)


#: The commands of this module.
COMMANDS: tuple[click.Command, ...] = (upgrade_group,)
