"""A real SMTP server (aiosmtpd) that keeps every message it takes.

Run it as ``python -m testbed.realsys.smtp --port N --store FILE`` (or through
:class:`SmtpServer`): it listens on ``127.0.0.1:N`` and stores each message it
answers ``250`` to in the SQLite file ``FILE`` (its Message-ID, its
``X-Ledger-Operation-Id``, sender, recipients, subject, time). What that file
holds is what the system holds: :class:`MailStore` counts the messages of an
operation (the *effects* of tests and game days).

Options that make it misbehave as real servers do:

* ``--reject-rcpt PATTERN`` -- answer ``550`` to ``RCPT TO`` of a recipient
  matching the shell-style pattern (a permanent refusal);
* ``--tempfail-rcpt PATTERN`` -- answer ``451`` to it (a transient one);
* ``--data-reply CODE`` -- answer every message with ``CODE`` instead of
  ``250``, without keeping it (e.g. ``554``);
* ``--reply-delay-ms N`` -- keep the message, then wait ``N`` ms before the
  ``250`` (a reply that comes too late: the sender cannot know it was taken).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import fnmatch
import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import click
from aiosmtpd.smtp import SMTP, Envelope, Session

from testbed.realsys.served import RealSystemProcess, bind_local, write_port_file

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT,
    operation_id TEXT,
    mail_from TEXT NOT NULL,
    rcpt_tos TEXT NOT NULL,
    subject TEXT,
    received_ms INTEGER NOT NULL
)
"""


class MailStore:
    """The messages an SMTP server of this module took (its SQLite file).

    Args:
        path: the store file (created with its table when missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        with self._connect() as db:
            db.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return sqlite3.connect(self.path, timeout=5.0)

    def add(self, message: dict[str, Any]) -> None:
        """Keep one message (keys as :meth:`messages` returns them)."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO messages (message_id, operation_id, mail_from, rcpt_tos, subject,"
                " received_ms) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    message["message_id"],
                    message["operation_id"],
                    message["mail_from"],
                    json.dumps(message["rcpt_tos"]),
                    message["subject"],
                    message["received_ms"],
                ),
            )

    def messages(self, operation_id: str | None = None) -> list[dict[str, Any]]:
        """The messages taken, oldest first (only an operation's when given).

        Returns:
            ``[{message_id, operation_id, mail_from, rcpt_tos, subject, received_ms}]``.
        """
        query = "SELECT message_id, operation_id, mail_from, rcpt_tos, subject, received_ms"
        query += " FROM messages"
        args: tuple[str, ...] = ()
        if operation_id is not None:
            query, args = query + " WHERE operation_id = ?", (operation_id,)
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY seq", args).fetchall()
        keys = ("message_id", "operation_id", "mail_from", "rcpt_tos", "subject", "received_ms")
        return [
            {**dict(zip(keys, row, strict=True)), "rcpt_tos": json.loads(row[3])} for row in rows
        ]

    def count(self, operation_id: str) -> int:
        """How many messages the server took for an operation (its effects)."""
        with self._connect() as db:
            (n,) = db.execute(
                "SELECT COUNT(*) FROM messages WHERE operation_id = ?", (operation_id,)
            ).fetchone()
        return int(n)


class _Handler:
    """aiosmtpd's handler: refuse recipients as asked, keep each message taken."""

    def __init__(
        self,
        store: MailStore,
        *,
        reject_rcpt: str | None,
        tempfail_rcpt: str | None,
        data_reply: int | None,
        reply_delay_ms: int,
    ) -> None:
        self.store = store
        self.reject_rcpt = reject_rcpt
        self.tempfail_rcpt = tempfail_rcpt
        self.data_reply = data_reply
        self.reply_delay_ms = reply_delay_ms

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.reject_rcpt is not None and fnmatch.fnmatch(address, self.reject_rcpt):
            return f"550 5.1.1 <{address}>: recipient refused"
        if self.tempfail_rcpt is not None and fnmatch.fnmatch(address, self.tempfail_rcpt):
            return f"451 4.3.0 <{address}>: try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.data_reply is not None:
            return f"{self.data_reply} message not taken"
        content = envelope.original_content or b""
        msg = email.message_from_bytes(content, policy=email.policy.default)
        self.store.add(
            {
                "message_id": msg.get("Message-ID"),
                "operation_id": msg.get("X-Ledger-Operation-Id"),
                "mail_from": envelope.mail_from or "",
                "rcpt_tos": list(envelope.rcpt_tos),
                "subject": msg.get("Subject"),
                "received_ms": int(time.time() * 1000),
            }
        )
        if self.reply_delay_ms:
            await asyncio.sleep(self.reply_delay_ms / 1000)
        return "250 OK: queued"


def serve(port: int, port_file: Path | None, handler: _Handler) -> None:
    """Serve SMTP on ``127.0.0.1:port`` until SIGTERM or SIGINT.

    The port is listening before ``port_file`` is written.

    Raises:
        OSError: if the port cannot be bound.
    """
    sock = bind_local(port)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(
        loop.create_server(lambda: SMTP(handler, hostname="realsys.invalid"), sock=sock)
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, loop.stop)
    if port_file is not None:
        write_port_file(port_file, sock.getsockname()[1])
    try:
        loop.run_forever()
    finally:
        server.close()
        loop.run_until_complete(server.wait_closed())
        loop.close()


class SmtpServer(RealSystemProcess):
    """This module's server in a child process, with its store.

    Args:
        run_dir: where its store, port file and log go (``NAME.sqlite`` ...).
        name: a name for its files (default ``smtp``).
        reject_rcpt, tempfail_rcpt, data_reply, reply_delay_ms: as the
            module's options (``None``/0: off).
    """

    def __init__(
        self,
        run_dir: Path,
        name: str = "smtp",
        *,
        reject_rcpt: str | None = None,
        tempfail_rcpt: str | None = None,
        data_reply: int | None = None,
        reply_delay_ms: int = 0,
    ) -> None:
        self.store_path = run_dir / f"{name}.sqlite"
        args = ["--store", str(self.store_path), "--reply-delay-ms", str(reply_delay_ms)]
        if reject_rcpt is not None:
            args += ["--reject-rcpt", reject_rcpt]
        if tempfail_rcpt is not None:
            args += ["--tempfail-rcpt", tempfail_rcpt]
        if data_reply is not None:
            args += ["--data-reply", str(data_reply)]
        super().__init__("testbed.realsys.smtp", name, run_dir, args)
        self.store = MailStore(self.store_path)

    @property
    def url(self) -> str:
        """The sink URL, ``smtp://127.0.0.1:PORT``."""
        return f"smtp://127.0.0.1:{self.port}"


@click.command(context_settings={"show_default": True})
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="Port; 0 = a free one.")
@click.option("--port-file", type=click.Path(path_type=Path), help="Write the bound port here.")
@click.option("--store", type=click.Path(path_type=Path), required=True, help="SQLite file.")
@click.option("--reject-rcpt", help="Answer 550 to recipients matching this pattern.")
@click.option("--tempfail-rcpt", help="Answer 451 to recipients matching this pattern.")
@click.option("--data-reply", type=click.IntRange(200, 599), help="Answer messages with this.")
@click.option("--reply-delay-ms", type=click.IntRange(0), default=0, help="Delay the 250 (ms).")
def main(
    port: int,
    port_file: Path | None,
    store: Path,
    reject_rcpt: str | None,
    tempfail_rcpt: str | None,
    data_reply: int | None,
    reply_delay_ms: int,
) -> None:
    """Serve SMTP on 127.0.0.1, keeping every message taken in STORE."""
    handler = _Handler(
        MailStore(store),
        reject_rcpt=reject_rcpt,
        tempfail_rcpt=tempfail_rcpt,
        data_reply=data_reply,
        reply_delay_ms=reply_delay_ms,
    )
    serve(port, port_file, handler)


if __name__ == "__main__":
    main()
