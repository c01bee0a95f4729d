"""The operator page's lists in the SQLite store (the views are agentwake.store.browse)."""

from __future__ import annotations

from typing import Any

from agentwake.store.browse import (
    SQLITE_RULE,
    EventFilter,
    RunFilter,
    drive_sync,
    event_page,
    run_event,
    run_page,
)
from agentwake.store.sqlite.base import SqliteBase


class Browse(SqliteBase):
    def _drive(self, view: Any) -> Any:
        return drive_sync(
            lambda sql, params: self.conn.execute(sql.replace("%s", "?"), params).fetchall(), view
        )

    def event_page(self, filters: EventFilter, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """One page of events matching ``filters``, newest first, and how many match in all."""
        result: tuple[list[dict[str, Any]], int] = self._drive(
            event_page(filters, offset, limit, rule_sql=SQLITE_RULE)
        )
        return result

    def run_page(self, filters: RunFilter, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """One page of runs matching ``filters``, newest first, and how many match in all."""
        result: tuple[list[dict[str, Any]], int] = self._drive(run_page(filters, offset, limit))
        return result

    def run_event(self, run_id: int) -> int | None:
        """The row of the event a run was for; None: no such run."""
        result: int | None = self._drive(run_event(run_id))
        return result
