"""The kill switch in the PostgreSQL store: pausing and resuming (see agentwake.store.pauses), and what
counts against the limits now (agentwake.store.limits)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentwake.clock import now_iso
from agentwake.store.limits import limit_use
from agentwake.store.pauses import PAUSES_SQL, Pause, PauseScope, pause_of
from agentwake.store.postgres import views
from agentwake.store.postgres.base import PostgresBase

_ONE_SQL = f"SELECT * FROM ({PAUSES_SQL}) AS p WHERE scope = %s AND name = %s"


class Pauses(PostgresBase):
    async def pause(
        self, scope: PauseScope, name: str, *, reason: str | None, by: str, cut_short: bool
    ) -> Pause:
        """Pause ``scope`` ``name`` (again: the reason, who and cut_short are replaced); the pause stored."""
        async with self.transaction() as conn:
            await conn.execute(
                "INSERT INTO pauses (scope, name, reason, paused_by, paused_at, cut_short)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (scope, name) DO UPDATE SET"
                " reason = excluded.reason, paused_by = excluded.paused_by, cut_short = excluded.cut_short",
                [scope, name, reason, by, now_iso(), int(cut_short)],
            )
            row = await (await conn.execute(_ONE_SQL, [scope, name])).fetchone()
        assert row is not None
        return pause_of(row)

    async def resume(self, scope: PauseScope, name: str) -> Pause | None:
        """Lift a pause; the pause lifted, or None when it was not paused."""
        async with self.transaction() as conn:
            row = await (await conn.execute(_ONE_SQL + " FOR UPDATE", [scope, name])).fetchone()
            if row is None:
                return None
            await conn.execute("DELETE FROM pauses WHERE scope = %s AND name = %s", [scope, name])
        return pause_of(row)

    async def pauses(self) -> list[Pause]:
        """Everything paused, oldest first."""
        return await self._read(views.pauses())

    async def limit_use(
        self, since_hour: str, since_day: str, rate_since: Mapping[str, str]
    ) -> dict[str, Any]:
        """What counts against the limits now (agentwake.store.limits.limit_use)."""
        return await self._read(limit_use(since_hour, since_day, rate_since))
