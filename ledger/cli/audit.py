"""``ledger audit``: check the ledger's invariants end to end and print the verdict.

:func:`audit_lines` writes the auditor's report as text; ``--html`` adds a
page with a plot (:func:`ledger.reports.audit_html`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from consumers import auditor
from ledger.cli.common import (
    current_settings,
    reader_ready,
)
from ledger.cli.history import write_histories
from ledger.history import iso_time
from ledger.reports import audit_html


def audit_lines(report: Any) -> list[str]:
    """An audit report as text.

    An audit report as text: verdict with its coverage, when it ran, facts split
    by coverage, violations, open items with their history commands, refused
    records and the offsets read.

    Args:
        report: a :class:`ledger.audit.AuditReport`.

    Returns:
        Lines without newlines.
    """
    data = report.to_dict()
    cov = data["coverage"]
    lines = [
        f"{report.verdict}: {len(report.violations)} violation(s) in {cov['facts']} facts checked",
        f"ran at {iso_time(report.started_at_ms) or '—'} (wall clock, UTC)"
        + (f", took {report.took_s:.1f} s" if report.took_s is not None else ""),
        f"{report.operations} operations, {report.journal_entries} journal entries replayed",
        f"facts checked: {cov['ledger_facts']} in the ledger's records, "
        + (
            f"{cov['sink_facts']} against sink readback"
            if cov["sink_readback"] and cov["sink_facts"]
            else "none against sink readback (no registered sink with readback answered for "
            "an operation of this ledger)"
            if cov["sink_readback"]
            else "none against sink readback (--no-sinks: sinks not read back)"
        ),
    ]
    for unread in report.sink_unread:
        lines.append(
            f"not read back at {unread['sink']}: {unread['operations']} operation(s) "
            f"({unread['reason']}); their facts were checked against the ledger only"
        )
    for v in report.violations:
        lines.append(f"  {v.invariant}\t{v.operation_id or '-'}\t{v.evidence}")
    for why in report.unverified:
        lines.append(f"not verified: {why}")
    items = report.open_items
    lines.append(
        f"{len(items)} open item(s)"
        + (" (age on the wall clock since the latest state record):" if items else "")
    )
    for i in items:
        age = f"{i.age_s:.0f}" if i.age_s is not None else "?"
        lines.append(
            f"  {i.operation_id}\t{i.state}\t{i.sink}\tage {age} s\t{i.reason}\t"
            f"({i.history_command})"
        )
    unauthentic = report.unauthenticated_records
    lines.append(
        f"{len(unauthentic)} unauthenticated record(s), refused by every reader"
        + (":" if unauthentic else "")
    )
    for r in unauthentic[:50]:
        lines.append(f"  {r['topic']}:{r['partition']}:{r['offset']}\t{r['reason']}")
    if len(unauthentic) > 50:
        lines.append(f"  ... and {len(unauthentic) - 50} more (--json lists them all)")
    for r in report.replayed_records:
        lines.append(f"replayed: {r['topic']}:{r['partition']}:{r['offset']}\t{r['reason']}")
    chain = data.get("journal_chain") or {}
    if chain:
        lines.append(
            f"journal chain: {chain['heads_checked']} witnessed head(s) checked; witness file: "
            f"{chain['witness'] or 'none'}; each partition's chain starts at:"
        )
        for c in chain["partitions"]:
            lines.append(
                f"  journal:{c['partition']}: "
                + (
                    f"offset {c['starts_at']} (chain_seq {c['seq']})"
                    if c["starts_at"] is not None
                    else "no chained entry"
                )
                + (f", after {c['unchained']} unchained entries" if c["unchained"] else "")
            )
    lines.append("offsets covered (topic: partition:end offset, read from the beginning):")
    for topic, parts in data["offsets"].items():
        lines.append(f"  {topic}: " + " ".join(f"{p}:{end}" for p, end in parts.items()))
    return lines


@click.command("audit")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-sinks", is_flag=True, help="Do not ask sinks how many effects they hold.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write the report as a self-contained HTML page (inline plots) to FILE.",
)
@click.option(
    "--histories",
    is_flag=True,
    help="With --html: also write the history of every open item to history/*.html next to "
    "FILE, and link each open item to it (one read of the ledger per item).",
)
@click.option(
    "--witness",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    multiple=True,
    metavar="FILE",
    help="Check the journal's hash chains against the heads witnessed in FILE (JSON lines "
    "the processor appends; repeat it for the files of several processor hosts; default: "
    "LEDGER_WITNESS_FILE when it exists). Required once heads were published: without it "
    "the verdict is NOT VERIFIED.",
)
def audit_cmd(
    as_json: bool,
    no_sinks: bool,
    html_path: Path | None,
    histories: bool,
    witness: tuple[Path, ...],
) -> None:
    """Replay the whole ledger with the processor's own fold and check its invariants.

    Exits 0 when the verdict is CLEAN, 1 otherwise; each violation names the
    operation and the evidence. Every record's seal is checked too: records
    no trusted writer produced are listed (they were refused; an admission
    or effect resting on one is a violation). The verdict says what it
    covers: 'ledger and sink readback' when at least one fact was checked
    against a sink's readback, 'ledger only; no sink readback' when none
    was (no registered sink with readback answered), or 'ledger only, sink
    readback off' with --no-sinks; the facts checked are split the same way. The
    report says when it ran (wall clock, UTC), the end offset it read to on
    every topic partition, and lists every open item (held unknown outcomes,
    reauthorisation pending, abandoned: operation, state, sink, age, reason,
    and the 'ledger history OP' command that shows it). An operation stranded
    short of where it should rest (LEDGER_STRANDED_*_S) is an open item and
    makes the verdict STRANDED, exit 1; an operation whose outcome is unknown
    (held in UNKNOWN_OUTCOME, or committed and contradicted by its sink's
    postcondition) makes it OPEN, exit 1; reauthorisation pending and
    abandoned ones are listed and leave it CLEAN. With --html
    FILE the report is also written as one self-contained HTML page and
    'wrote FILE' is said on stderr when --json keeps stdout for the JSON;
    --histories also writes the history of every open item next to it
    (history/*.html) and links each item to it.

    Every journal partition is a hash chain: the audit checks each one end
    to end and against the heads the processor published (the heads topic,
    and the witness file, --witness FILE or LEDGER_WITNESS_FILE), and names
    every deleted, truncated or rewritten range, and heads deleted from the
    heads topic that the witness still holds, as a 'journal-chain'
    violation. Once heads were published the witness is required: without
    it, or with one holding fewer or older heads than the heads topic, the
    verdict is NOT VERIFIED (exit 1), naming what is missing.
    """
    if histories and html_path is None:
        raise click.UsageError("--histories needs --html FILE (the pages are linked from it)")
    settings = current_settings()
    reader_ready(settings)  # reads only: creates no key
    report = auditor.run_audit(settings, read_sinks=not no_sinks, witness=witness or None)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in audit_lines(report):
            click.echo(line)
    if html_path is not None:
        data = {**report.to_dict(), "ledger": settings.topic_prefix}
        try:
            if histories:
                links = write_histories(
                    settings, [i.operation_id for i in report.open_items], html_path.parent
                )
                for item in data["open_items"]:
                    item["history_href"] = links.get(item["operation_id"])
            html_path.write_text(audit_html(data), encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(
                f"cannot write the HTML report to {html_path}: {exc.strerror or exc}; "
                "choose a writable --html path"
            ) from exc
        click.echo(f"wrote {html_path}", err=as_json)
    sys.exit(0 if report.settled else 1)


#: The audit command, in the order ``ledger --help`` lists it.
COMMANDS: tuple[click.Command, ...] = (audit_cmd,)
