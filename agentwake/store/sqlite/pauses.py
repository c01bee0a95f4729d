"""The kill switch in the SQLite store: pausing and resuming (see agentwake.store.pauses)."""

from __future__ import annotations

from agentwake.clock import now_iso
from agentwake.store.pauses import PAUSES_SQL, Pause, PauseScope, pause_of
from agentwake.store.sqlite.base import SqliteBase


class Pauses(SqliteBase):
    def pause(self, scope: PauseScope, name: str, *, reason: str | None, by: str, cut_short: bool) -> Pause:
        """Pause ``scope`` ``name`` (again: the reason, who and cut_short are replaced); the pause stored."""
        now = now_iso()
        with self.transaction():
            self.conn.execute(
                "INSERT INTO pauses (scope, name, reason, paused_by, paused_at, cut_short) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (scope, name) DO UPDATE SET reason = excluded.reason,"
                " paused_by = excluded.paused_by, cut_short = excluded.cut_short",
                [scope, name, reason, by, now, int(cut_short)],
            )
            row = self.conn.execute(
                f"SELECT * FROM ({PAUSES_SQL}) WHERE scope = ? AND name = ?", [scope, name]
            ).fetchone()
        return pause_of(row)

    def resume(self, scope: PauseScope, name: str) -> Pause | None:
        """Lift a pause; the pause lifted, or None when it was not paused."""
        with self.transaction():
            row = self.conn.execute(
                f"SELECT * FROM ({PAUSES_SQL}) WHERE scope = ? AND name = ?", [scope, name]
            ).fetchone()
            if row is None:
                return None
            self.conn.execute("DELETE FROM pauses WHERE scope = ? AND name = ?", [scope, name])
        return pause_of(row)

    def pauses(self) -> list[Pause]:
        """Everything paused, oldest first."""
        return [pause_of(row) for row in self.conn.execute(PAUSES_SQL).fetchall()]
