"""Durable webhook subscriptions: what a server needs to honour no-expiry grants across restarts.

A server that grants ``refreshBefore: null`` must keep the subscription (and its
verification status) through a restart, because the client never refreshes it.
``WebhookStore`` is the small interface the extension needs; ``SqliteWebhookStore``
is a file-backed implementation. The methods are synchronous and the extension
calls them from a worker thread, one call at a time.

The file holds signing secrets, so it is created readable by its owner only (0600).
Its schema is migrated with sqlite-utils ``Migrations`` (set "agentwake-server-webhooks").
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol

import sqlite_utils
from sqlite_utils.migrations import Migrations

from agentwake.server._types import canonical_json, isoformat, parse_timestamp

FILE_MODE: Final = 0o600

# Its own set name: a server may share one SQLite file with agentwake's client store ("agentwake").
migrations = Migrations("agentwake-server-webhooks")


@migrations(name="0001_initial")
def _initial(db: sqlite_utils.Database) -> None:
    # IF NOT EXISTS: a file made before Migrations has the table already (PRAGMA user_version 1,
    # no _sqlite_migrations row); this adopts it as is.
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS webhook_subscriptions (
            id TEXT PRIMARY KEY,
            principal TEXT NOT NULL,
            url TEXT NOT NULL,
            name TEXT NOT NULL,
            arguments TEXT NOT NULL,
            secret TEXT NOT NULL,
            previous_secret TEXT,
            previous_until TEXT,
            expires_at TEXT,
            verified_at TEXT,
            cursor TEXT
        )
        """
    )


@dataclass(frozen=True, slots=True)
class StoredWebhook:
    """One subscription as a store keeps it. ``expires_at`` None is a no-expiry grant."""

    id: str
    principal: str
    url: str
    name: str
    arguments: dict[str, Any]
    secret: str = field(repr=False)
    previous_secret: str | None = field(default=None, repr=False)
    previous_until: datetime | None = None
    expires_at: datetime | None = None
    verified_at: datetime | None = None
    cursor: str | None = None  # the delivery watermark: where delivery resumes after a restart


class WebhookStore(Protocol):
    """Where the extension keeps webhook subscriptions that must survive a restart."""

    def load(self) -> list[StoredWebhook]:
        """Every stored subscription (expired ones included; the extension drops those)."""
        ...

    def save(self, record: StoredWebhook) -> None:
        """Insert or replace the record with this id."""
        ...

    def delete(self, subscription_id: str) -> None:
        """Forget a subscription; a missing id is not an error."""
        ...

    def close(self) -> None: ...


def _time(value: str | None) -> datetime | None:
    return None if value is None else parse_timestamp(value)


class SqliteWebhookStore:
    """A ``WebhookStore`` in one SQLite file (created 0600)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Create it owner-only before SQLite opens it; SQLite gives its journal the same mode.
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, FILE_MODE))
        os.chmod(self.path, FILE_MODE)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        with self._lock:
            migrations.apply(sqlite_utils.Database(self._db))

    def load(self) -> list[StoredWebhook]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, principal, url, name, arguments, secret, previous_secret, previous_until,"
                " expires_at, verified_at, cursor FROM webhook_subscriptions ORDER BY id"
            ).fetchall()
        return [
            StoredWebhook(
                id=row[0],
                principal=row[1],
                url=row[2],
                name=row[3],
                arguments=json.loads(row[4]),
                secret=row[5],
                previous_secret=row[6],
                previous_until=_time(row[7]),
                expires_at=_time(row[8]),
                verified_at=_time(row[9]),
                cursor=row[10],
            )
            for row in rows
        ]

    def save(self, record: StoredWebhook) -> None:
        def stamp(value: datetime | None) -> str | None:
            return None if value is None else isoformat(value)

        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO webhook_subscriptions (id, principal, url, name, arguments, secret,"
                " previous_secret, previous_until, expires_at, verified_at, cursor)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.principal,
                    record.url,
                    record.name,
                    canonical_json(record.arguments),
                    record.secret,
                    record.previous_secret,
                    stamp(record.previous_until),
                    stamp(record.expires_at),
                    stamp(record.verified_at),
                    record.cursor,
                ),
            )

    def delete(self, subscription_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM webhook_subscriptions WHERE id = ?", (subscription_id,))

    def close(self) -> None:
        with self._lock:
            self._db.close()
