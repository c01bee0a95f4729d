"""The demo help desk's durable upstream: tickets, comments and alert acknowledgements in SQLite."""

from __future__ import annotations

import random
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentwake.server import isoformat

QUEUES = ("support", "billing", "ops")
PRIORITIES = ("P1", "P2", "P3", "P4")
SERVICES = ("api", "db", "web", "queue")
TITLES = (
    "Cannot log in after password reset",
    "Invoice shows the wrong amount",
    "Disk almost full on build runner",
    "Export to CSV times out",
    "Webhook deliveries delayed",
    "Refund not received",
)


class TicketStore:
    """The durable upstream: tickets with stable ids and a monotonically growing sequence."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(
            """
            CREATE TABLE IF NOT EXISTS tickets (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT UNIQUE,
                queue TEXT NOT NULL,
                priority TEXT NOT NULL,
                title TEXT NOT NULL,
                body TEXT NOT NULL,
                reporter TEXT NOT NULL,
                status TEXT NOT NULL DEFAULT 'open',
                created_at TEXT NOT NULL
            );
            CREATE INDEX IF NOT EXISTS tickets_created ON tickets(created_at);
            CREATE TABLE IF NOT EXISTS comments (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                ticket_id TEXT NOT NULL,
                body TEXT NOT NULL,
                created_at TEXT NOT NULL
            );
            CREATE TABLE IF NOT EXISTS alert_acks (
                alert_id TEXT PRIMARY KEY,
                note TEXT,
                acked_at TEXT NOT NULL
            );
            """
        )

    def create(
        self, rows: list[tuple[str, str, str, str, str]], *, created_at: datetime | None = None
    ) -> list[str]:
        """Insert tickets (queue, priority, title, body, reporter) in one transaction; returns ids."""
        stamp = isoformat(created_at or datetime.now(UTC))
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            start = self._db.execute("SELECT coalesce(max(seq), 0) FROM tickets").fetchone()[0]
            self._db.executemany(
                "INSERT INTO tickets (id, queue, priority, title, body, reporter, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(f"T-{start + i + 1:06d}", *row, stamp) for i, row in enumerate(rows)],
            )
            self._db.execute("COMMIT")
        return [f"T-{start + i + 1:06d}" for i in range(len(rows))]

    def head(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT coalesce(max(seq), 0) FROM tickets").fetchone()[0])

    def after(
        self, seq: int, head: int, limit: int, queue: str | None, priority: str | None, not_before: str | None
    ) -> tuple[list[tuple[Any, ...]], bool]:
        """Matching tickets in (seq, head], at most ``limit``; the flag says rows before the floor were skipped."""
        where: list[str] = ["seq > ?", "seq <= ?"]
        args: list[Any] = [seq, head]
        if queue:
            where.append("queue = ?")
            args.append(queue)
        if priority:
            where.append("priority = ?")
            args.append(priority)
        skipped = False
        with self._lock:
            if not_before is not None:
                skipped = (
                    self._db.execute(
                        f"SELECT 1 FROM tickets WHERE {' AND '.join(where)} AND created_at < ? LIMIT 1",
                        [*args, not_before],
                    ).fetchone()
                    is not None
                )
                where.append("created_at >= ?")
                args.append(not_before)
            rows = self._db.execute(
                "SELECT seq, id, queue, priority, title, reporter, created_at FROM tickets"
                f" WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
                [*args, limit],
            ).fetchall()
        return rows, skipped

    def get(self, ticket_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, queue, priority, title, body, reporter, status, created_at FROM tickets WHERE id = ?",
                (ticket_id,),
            ).fetchone()
            if row is None:
                return None
            comments = self._db.execute(
                "SELECT body, created_at FROM comments WHERE ticket_id = ? ORDER BY id", (ticket_id,)
            ).fetchall()
        keys = ("id", "queue", "priority", "title", "body", "reporter", "status", "created_at")
        ticket = dict(zip(keys, row, strict=True))
        ticket["comments"] = [{"body": b, "created_at": c} for b, c in comments]
        return ticket

    def list(self, queue: str | None, status: str | None, limit: int) -> list[dict[str, Any]]:
        where: list[str] = ["1=1"]
        args: list[Any] = []
        if queue:
            where.append("queue = ?")
            args.append(queue)
        if status:
            where.append("status = ?")
            args.append(status)
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, queue, priority, title, status FROM tickets WHERE {' AND '.join(where)}"
                " ORDER BY seq DESC LIMIT ?",
                [*args, limit],
            ).fetchall()
        return [dict(zip(("id", "queue", "priority", "title", "status"), r, strict=True)) for r in rows]

    def comment(self, ticket_id: str, body: str) -> int:
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO comments (ticket_id, body, created_at) VALUES (?, ?, ?)",
                (ticket_id, body, isoformat(datetime.now(UTC))),
            )
            return int(cur.lastrowid or 0)

    def set_status(self, ticket_id: str, status: str) -> bool:
        with self._lock:
            cur = self._db.execute("UPDATE tickets SET status = ? WHERE id = ?", (status, ticket_id))
            return cur.rowcount > 0

    def ack(self, alert_id: str, note: str | None) -> bool:
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO alert_acks (alert_id, note, acked_at) VALUES (?, ?, ?)",
                (alert_id, note, isoformat(datetime.now(UTC))),
            )
            return cur.rowcount > 0

    def acked(self, alert_id: str) -> bool:
        with self._lock:
            return (
                self._db.execute("SELECT 1 FROM alert_acks WHERE alert_id = ?", (alert_id,)).fetchone()
                is not None
            )

    def close(self) -> None:
        self._db.close()


# The first ticket of an empty store: support, from a person, so a fresh `make run` always wakes the
# agent on T-000001 (the README's example id).
FIRST_TICKET: tuple[str, str, str, str, str] = (
    "support",
    "P3",
    "Cannot log in after password reset",
    "Customer reports: cannot log in after password reset.",
    "user1@example.com",
)


def random_ticket(rng: random.Random) -> tuple[str, str, str, str, str]:
    title = rng.choice(TITLES)
    return (
        rng.choice(QUEUES),
        rng.choice(PRIORITIES),
        title,
        f"Customer reports: {title.lower()}.",
        # Some tickets come from automation, so policies have bots to ignore.
        "monitoring-bot@example.com" if rng.random() < 0.15 else f"user{rng.randint(1, 999)}@example.com",
    )
