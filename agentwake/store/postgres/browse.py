"""The operator page's lists in the PostgreSQL store (the views are agentwake.store.browse)."""

from __future__ import annotations

from typing import Any

from agentwake.store.browse import POSTGRES_RULE, EventFilter, RunFilter, event_page, run_event, run_page
from agentwake.store.postgres.base import PostgresBase


class Browse(PostgresBase):
    async def event_page(
        self, filters: EventFilter, offset: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """One page of events matching ``filters``, newest first, and how many match in all."""
        return await self._read(event_page(filters, offset, limit, rule_sql=POSTGRES_RULE))

    async def run_page(self, filters: RunFilter, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """One page of runs matching ``filters``, newest first, and how many match in all."""
        return await self._read(run_page(filters, offset, limit))

    async def run_event(self, run_id: int) -> int | None:
        """The row of the event a run was for; None: no such run."""
        return await self._read(run_event(run_id))
