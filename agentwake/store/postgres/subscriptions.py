"""Configured subscriptions, their cursors, state and errors."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from agentwake.clock import now_iso
from agentwake.store.postgres.base import PostgresBase
from agentwake.store.postgres.owners import check_fence
from agentwake.store.records import SubscriptionKey
from agentwake.store.rows import warn_cursor_dropped, with_recent_error
from agentwake.store.sqlite.base import redacted

logger = logging.getLogger(__name__)


class Subscriptions(PostgresBase):
    async def register(self, key: SubscriptionKey, *, fence: int | None = None) -> str | None:
        """Record a configured subscription; returns its persisted cursor.

        If the server, event or arguments changed since the cursor was stored, that
        cursor belongs to a different subscription and is dropped.
        With a ``fence``, nothing is written unless it is the subscription's (FencedOut).
        """
        now = now_iso()
        async with self.transaction() as conn:
            await check_fence(conn, key.name, fence)
            # A service starting twice at once: the second waits here and finds the first's row.
            inserted = await conn.execute(
                "INSERT INTO subscriptions (name, server, event, arguments, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                [key.name, key.server, key.event, key.arguments_json, now, now],
            )
            if inserted.rowcount == 1:
                return None
            cur = await conn.execute(
                "SELECT server, event, arguments, cursor FROM subscriptions WHERE name = %s FOR UPDATE",
                [key.name],
            )
            row = await cur.fetchone()
            assert row is not None
            if (row[0], row[1], row[2]) != (key.server, key.event, key.arguments_json):
                warn_cursor_dropped(logger, key)
                await conn.execute(
                    "UPDATE subscriptions SET server = %s, event = %s, arguments = %s, cursor = NULL,"
                    " cursor_updated_at = NULL, updated_at = %s WHERE name = %s",
                    [key.server, key.event, key.arguments_json, now, key.name],
                )
                return None
            return str(row[3]) if row[3] is not None else None

    async def cursor(self, name: str) -> str | None:
        async with self.transaction() as conn:
            cur = await conn.execute("SELECT cursor FROM subscriptions WHERE name = %s", [name])
            row = await cur.fetchone()
        return None if row is None or row[0] is None else str(row[0])

    @staticmethod
    async def _remember_error(conn: psycopg.AsyncConnection[Any], name: str, error: str, at: str) -> None:
        """Append to the subscription's recent errors (inside the caller's transaction); the oldest go."""
        cur = await conn.execute("SELECT recent_errors FROM subscriptions WHERE name = %s FOR UPDATE", [name])
        row = await cur.fetchone()
        if row is None:
            return
        await conn.execute(
            "UPDATE subscriptions SET recent_errors = %s WHERE name = %s",
            [with_recent_error(row[0], error, at), name],
        )

    async def set_state(
        self, name: str, *, status: str, mode: str | None = None, error: str | None = None
    ) -> None:
        now = now_iso()
        stored = redacted(error)
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE subscriptions SET status = %s, mode = coalesce(%s, mode), last_error = %s,"
                " updated_at = %s WHERE name = %s",
                [status, mode, stored, now, name],
            )
            if stored is not None:
                await self._remember_error(conn, name, stored, now)

    async def record_error(self, name: str, error: str) -> None:
        now = now_iso()
        stored = redacted(error)
        assert stored is not None
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE subscriptions SET last_error = %s, updated_at = %s WHERE name = %s",
                [stored, now, name],
            )
            await self._remember_error(conn, name, stored, now)

    async def count_stream_error(self, name: str, error: str) -> None:
        now = now_iso()
        stored = redacted(error)
        assert stored is not None
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE subscriptions SET stream_errors = stream_errors + 1, last_error = %s,"
                " updated_at = %s WHERE name = %s",
                [stored, now, name],
            )
            await self._remember_error(conn, name, stored, now)
