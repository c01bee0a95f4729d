"""`limit_use` in the SQLite store (the view is agentwake.store.limits)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentwake.store.limits import limit_use
from agentwake.store.sqlite.base import SqliteBase


class LimitUse(SqliteBase):
    def limit_use(self, since_hour: str, since_day: str, rate_since: Mapping[str, str]) -> dict[str, Any]:
        """What counts against the limits now (agentwake.store.limits.limit_use)."""
        view = limit_use(since_hour, since_day, rate_since)
        try:
            sql, params = next(view)
            while True:
                rows = self.conn.execute(sql.replace("%s", "?"), params).fetchall()
                sql, params = view.send(rows)
        except StopIteration as done:
            result: dict[str, Any] = done.value
            return result
