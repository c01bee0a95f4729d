"""The service's own record: each start of `agentwake run`, its heartbeat and its clean stop."""

from __future__ import annotations

from typing import Any

from agentwake.clock import now_iso
from agentwake.store.postgres import views
from agentwake.store.postgres.base import PostgresBase
from agentwake.store.sqlite.service import SERVICE_ROWS_KEPT


class ServiceLog(PostgresBase):
    async def service_started(self, *, pid: int, host: str, version: str | None, heartbeat_s: float) -> int:
        """Record a start of the service (its first heartbeat is now); its row id."""
        now = now_iso()
        async with self.transaction() as conn:
            cur = await conn.execute(
                "INSERT INTO service (pid, host, version, started_at, heartbeat_at, heartbeat_s)"
                " VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                [pid, host, version, now, now, heartbeat_s],
            )
            row = await cur.fetchone()
            assert row is not None
            service_id = int(row[0])
            # The newest rows by id, not ids above a bound: identity values may skip (a rolled back insert).
            await conn.execute(
                "DELETE FROM service WHERE id < (SELECT min(id) FROM"
                " (SELECT id FROM service ORDER BY id DESC LIMIT %s) kept)",
                [SERVICE_ROWS_KEPT],
            )
        return service_id

    async def service_heartbeat(self, service_id: int) -> None:
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE service SET heartbeat_at = %s WHERE id = %s AND stopped_at IS NULL",
                [now_iso(), service_id],
            )

    async def service_stopped(self, service_id: int) -> None:
        """The service stopped cleanly (its last heartbeat is now)."""
        now = now_iso()
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE service SET heartbeat_at = %s, stopped_at = %s, paused = NULL"
                " WHERE id = %s AND stopped_at IS NULL",
                [now, now, service_id],
            )

    async def service_paused(self, reason: str | None) -> None:
        """Why the running service's agent waits (a cost or run limit), or None when it no longer does."""
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE service SET paused = %s WHERE id = (SELECT max(id) FROM service) AND stopped_at IS NULL",
                [reason],
            )

    async def services(self, limit: int = 5) -> list[dict[str, Any]]:
        """The most recent starts of the service, newest first (as recorded; whether one still runs
        is for the reader to judge from its heartbeat and pid)."""
        return await self._read(views.services(limit))
