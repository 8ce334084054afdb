"""``ledger history OP``: every record about one operation, in causal order, and five answers.

The history is read by :func:`consumers.history.read_history` and assembled
by the pure :func:`ledger.history.build_history`; this module only prints it
(text, ``--json``) or renders it (``--html``, template ``history.html.j2``).
The operator console renders the same template with :func:`history_page`.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import click

from consumers.history import UnknownOperationError, read_history
from ledger.cli.common import EXIT_UNKNOWN_OPERATION, current_settings, reader_ready
from ledger.history import History, iso_time
from ledger.reports.render import render
from ledger.settings import LedgerSettings


def history_lines(history: History) -> list[str]:
    """The history as text: the five answers, then one line per record.

    Args:
        history: the operation's history.

    Returns:
        Lines without newlines: a header, ``final state: ...``, each question
        and its answer (indented), then ``TIME  TOPIC:PARTITION:OFFSET  KIND
        SUMMARY`` rows in causal order.
    """
    final = history.final_state
    lines = [
        f"history of {history.operation_id}: {len(history.entries)} records, "
        f"{history.unbelieved} not believed (failed authentication or decoding)",
        "final state: "
        + (f"{final.state} (version {final.version}, epoch {final.epoch})" if final else "—"),
    ]
    if history.forked_from:
        lines.append(f"a fork of: {history.forked_from}")
    if history.forks:
        lines.append(f"forked as: {', '.join(history.forks)}")
    if final is not None and final.compensates:
        lines.append(f"compensates: {final.compensates}")
    if history.compensated_by:
        lines.append(f"compensated by: {', '.join(history.compensated_by)}")
    lines += [""]
    for a in history.answers:
        lines.append(a.question)
        lines.append(f"  {a.answer}")
        if a.evidence:
            lines.append(f"  evidence: {', '.join(a.evidence)}")
    lines += ["", "TIME (UTC)\tTOPIC:PARTITION:OFFSET\tKIND\tSUMMARY"]
    for e in history.entries:
        r = e.record
        where = f"{r.topic}:{r.partition}:{r.offset}" + (" (journal copy)" if r.via_journal else "")
        lines.append(f"{iso_time(r.timestamp_ms) or '—'}\t{where}\t{e.kind}\t{e.summary}")
    return lines


def history_page(history: History, ledger: str) -> str:
    """The history as one self-contained HTML page (template ``history.html.j2``).

    Args:
        history: the operation's history.
        ledger: the topic prefix, shown in the title.

    Returns:
        The page (answers at the top, then the records in causal order).
    """
    return render(
        "history.html.j2",
        title=f"History of {history.operation_id}",
        ledger=ledger,
        history=history.to_dict(),
    )


def history_file_name(operation_id: str) -> str:
    """A file name for an operation's history page, safe in a path and a relative URL.

    Args:
        operation_id: the operation.

    Returns:
        ``<id with every character outside [A-Za-z0-9._-] as _>-<8 hex digits
        of its SHA-256>.html`` (the digest keeps distinct IDs apart).
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", operation_id)[:80]
    return f"{safe}-{hashlib.sha256(operation_id.encode()).hexdigest()[:8]}.html"


def write_histories(
    settings: LedgerSettings, operation_ids: Iterable[str], folder: Path
) -> dict[str, str]:
    """Write one history page per operation into ``folder/history/``.

    Args:
        settings: the ledger's settings.
        operation_ids: the operations.
        folder: where the page that links to them is written.

    Returns:
        operation -> the page's path relative to ``folder`` (``history/<name>``),
        for each operation with a history.

    Raises:
        LedgerError: a topic could not be read.
        OSError: a page could not be written.
    """
    (folder / "history").mkdir(parents=True, exist_ok=True)
    links: dict[str, str] = {}
    for op in operation_ids:
        try:
            history = read_history(settings, op)
        except UnknownOperationError:
            continue
        name = f"history/{history_file_name(op)}"
        (folder / name).write_text(history_page(history, settings.topic_prefix), encoding="utf-8")
        links[op] = name
    return links


@click.command("history")
@click.argument("operation_id")
@click.option("--json", "as_json", is_flag=True, help="Print the history as JSON.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE",
    help="Also write the history as a self-contained HTML page to FILE.",
)
def history_cmd(operation_id: str, as_json: bool, html_path: Path | None) -> None:
    """Every record about OPERATION_ID, in causal order, with five answers at the top.

    Reads every ledger topic (the operation's partition of each, and the
    approvals it names), checks every record's seal, and prints: who
    initiated the case, which exact effect was admitted (operation ID,
    parameter digest, approval), what the target system did (receipts,
    readbacks), why the resumer chose its branch (recovery receipts,
    dispositions), and what verified outcome followed; an answer the evidence
    does not give says 'not recorded'. Then one line per record: time (UTC,
    the record's Kafka timestamp), topic:partition:offset, kind and what it
    says. Records that fail authentication or do not decode are listed as
    NOT BELIEVED and never used in the answers.

    --json prints {"operation_id", "final_state", "compensates", "compensated_by",
    "answers": [{"key",
    "question", "answer", "recorded", "evidence"}], "records": [{"topic",
    "partition", "offset", "time_ms", "time", "key", "kind", "summary",
    "believed", "problem", "via_journal", "event"}], "counts": {"records",
    "unbelieved"}, "forked_from", "forks"} (the operation it forks, the
    operations that fork it). Exit status 0; 5 when no record is about the operation;
    1 on any other error (broker, topics, key files).
    """
    settings = current_settings()
    reader_ready(settings)  # reads only: creates no key
    try:
        history = read_history(settings, operation_id, links=True)
    except UnknownOperationError as exc:
        click.echo(f"Error: {exc.message}", err=True)
        sys.exit(EXIT_UNKNOWN_OPERATION)
    if as_json:
        click.echo(json.dumps(history.to_dict(), indent=2))
    else:
        for line in history_lines(history):
            click.echo(line)
    if html_path is not None:
        page = history_page(history, settings.topic_prefix)
        try:
            html_path.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(
                f"cannot write the history page to {html_path}: {exc.strerror or exc}; "
                "choose a writable --html path"
            ) from exc
        click.echo(f"wrote {html_path}", err=as_json)


#: The commands of this module.
COMMANDS: tuple[click.Command, ...] = (history_cmd,)
