"""Configured subscriptions, their cursors, state and errors."""

from __future__ import annotations

import logging

from agentwake.clock import now_iso
from agentwake.store.records import SubscriptionKey
from agentwake.store.rows import warn_cursor_dropped, with_recent_error
from agentwake.store.sqlite.base import SqliteBase, redacted
from agentwake.store.sqlite.owners import check_fence

logger = logging.getLogger(__name__)


class Subscriptions(SqliteBase):
    def register(self, key: SubscriptionKey, *, fence: int | None = None) -> str | None:
        """Record a configured subscription; returns its persisted cursor.

        If the server, event or arguments changed since the cursor was stored, that
        cursor belongs to a different subscription and is dropped.
        With a ``fence``, nothing is written unless it is the subscription's (FencedOut).
        """
        now = now_iso()
        with self.transaction():
            check_fence(self.conn, key.name, fence)
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
                warn_cursor_dropped(logger, key)
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

    def _remember_error(self, name: str, error: str, at: str) -> None:
        """Append to the subscription's recent errors (inside the caller's transaction); the oldest go."""
        row = self.conn.execute("SELECT recent_errors FROM subscriptions WHERE name = ?", [name]).fetchone()
        if row is None:
            return
        self.conn.execute(
            "UPDATE subscriptions SET recent_errors = ? WHERE name = ?",
            [with_recent_error(row[0], error, at), name],
        )

    def set_state(self, name: str, *, status: str, mode: str | None = None, error: str | None = None) -> None:
        now = now_iso()
        stored = redacted(error)
        with self.transaction():
            self.conn.execute(
                "UPDATE subscriptions SET status = ?, mode = coalesce(?, mode), last_error = ?, updated_at = ?"
                " WHERE name = ?",
                [status, mode, stored, now, name],
            )
            if stored is not None:
                self._remember_error(name, stored, now)

    def record_error(self, name: str, error: str) -> None:
        now = now_iso()
        stored = redacted(error)
        assert stored is not None
        with self.transaction():
            self.conn.execute(
                "UPDATE subscriptions SET last_error = ?, updated_at = ? WHERE name = ?", [stored, now, name]
            )
            self._remember_error(name, stored, now)

    def count_stream_error(self, name: str, error: str) -> None:
        now = now_iso()
        stored = redacted(error)
        assert stored is not None
        with self.transaction():
            self.conn.execute(
                "UPDATE subscriptions SET stream_errors = stream_errors + 1, last_error = ?, updated_at = ?"
                " WHERE name = ?",
                [stored, now, name],
            )
            self._remember_error(name, stored, now)
