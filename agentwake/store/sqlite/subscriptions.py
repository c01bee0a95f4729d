"""Configured subscriptions, their cursors, state and errors."""

from __future__ import annotations

import logging

from agentwake.clock import now_iso
from agentwake.store.records import SubscriptionKey
from agentwake.store.sqlite.base import SqliteBase, redacted

logger = logging.getLogger(__name__)


class Subscriptions(SqliteBase):
    def register(self, key: SubscriptionKey) -> str | None:
        """Record a configured subscription; returns its persisted cursor.

        If the server, event or arguments changed since the cursor was stored, that
        cursor belongs to a different subscription and is dropped.
        """
        now = now_iso()
        with self.transaction():
            row = self.conn.execute(
                "SELECT server, event, arguments, cursor FROM subscriptions WHERE name = ?", [key.name]
            ).fetchone()
            if row is None:
                self.conn.execute(
                    "INSERT INTO subscriptions (name, server, event, arguments, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [key.name, key.server, key.event, key.arguments_json, now, now],
                )
                return None
            if (row[0], row[1], row[2]) != (key.server, key.event, key.arguments_json):
                logger.warning(
                    "subscription %s changed (server, event or arguments): its stored cursor is dropped",
                    key.name,
                )
                self.conn.execute(
                    "UPDATE subscriptions SET server = ?, event = ?, arguments = ?, cursor = NULL,"
                    " cursor_updated_at = NULL, updated_at = ? WHERE name = ?",
                    [key.server, key.event, key.arguments_json, now, key.name],
                )
                return None
            return str(row[3]) if row[3] is not None else None

    def cursor(self, name: str) -> str | None:
        row = self.conn.execute("SELECT cursor FROM subscriptions WHERE name = ?", [name]).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def set_state(self, name: str, *, status: str, mode: str | None = None, error: str | None = None) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE subscriptions SET status = ?, mode = coalesce(?, mode), last_error = ?, updated_at = ?"
                " WHERE name = ?",
                [status, mode, redacted(error), now_iso(), name],
            )

    def record_error(self, name: str, error: str) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE subscriptions SET last_error = ?, updated_at = ? WHERE name = ?",
                [redacted(error), now_iso(), name],
            )

    def count_stream_error(self, name: str, error: str) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE subscriptions SET stream_errors = stream_errors + 1, last_error = ?, updated_at = ?"
                " WHERE name = ?",
                [redacted(error), now_iso(), name],
            )
