"""The service's own record: each start of `agentwake run`, its heartbeat and its clean stop."""

from __future__ import annotations

from typing import Any, Final

from agentwake.clock import now_iso
from agentwake.store.shapes import SERVICE_COLUMNS, service_view
from agentwake.store.sqlite.base import SqliteBase

# Starts kept in the store; older rows go when a service starts.
SERVICE_ROWS_KEPT: Final = 20


class ServiceLog(SqliteBase):
    def service_started(self, *, pid: int, host: str, version: str | None, heartbeat_s: float) -> int:
        """Record a start of the service (its first heartbeat is now); its row id."""
        now = now_iso()
        with self.transaction():
            cursor = self.conn.execute(
                "INSERT INTO service (pid, host, version, started_at, heartbeat_at, heartbeat_s)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [pid, host, version, now, now, heartbeat_s],
            )
            service_id = int(cursor.lastrowid or 0)
            self.conn.execute("DELETE FROM service WHERE id <= ?", [service_id - SERVICE_ROWS_KEPT])
        return service_id

    def service_heartbeat(self, service_id: int) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE service SET heartbeat_at = ? WHERE id = ? AND stopped_at IS NULL",
                [now_iso(), service_id],
            )

    def service_stopped(self, service_id: int) -> None:
        """The service stopped cleanly (its last heartbeat is now)."""
        now = now_iso()
        with self.transaction():
            self.conn.execute(
                "UPDATE service SET heartbeat_at = ?, stopped_at = ?, paused = NULL WHERE id = ? AND stopped_at IS NULL",
                [now, now, service_id],
            )

    def service_paused(self, reason: str | None) -> None:
        """Why the running service's agent waits (a cost or run limit), or None when it no longer does."""
        with self.transaction():
            self.conn.execute(
                "UPDATE service SET paused = ? WHERE id = (SELECT max(id) FROM service) AND stopped_at IS NULL",
                [reason],
            )

    def services(self, limit: int = 5) -> list[dict[str, Any]]:
        """The most recent starts of the service, newest first (as recorded; whether one still runs
        is for the reader to judge from its heartbeat and pid)."""
        rows = self.conn.execute(
            f"SELECT {', '.join(SERVICE_COLUMNS)} FROM service ORDER BY id DESC LIMIT ?", [limit]
        ).fetchall()
        return [service_view(r) for r in rows]
