"""Retention on a PostgreSQL store: the prune target (``agentwake.store.retention``).

Several processes share the database, and each service runs a pruner: a pass holds a session-level
advisory lock (``PRUNE_LOCK``, tried, never waited for) on one connection of the pool for its
length, so one process prunes at a time and the others skip their pass. Rows are locked as they are
deleted (``FOR UPDATE SKIP LOCKED``): a row another transaction holds waits for the next pass.
Space: deleted rows are reused by new ones once autovacuum (on by default) has seen them, so the
database stops growing; ``--vacuum`` runs a plain ``VACUUM (ANALYZE)`` of the pruned tables now
(not ``VACUUM FULL``, which would lock them), which gives back to the file system only the
tables' free tail pages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar

import psycopg

from agentwake.store.postgres.base import nul_safe
from agentwake.store.retention import Dialect, Reply, Script

if TYPE_CHECKING:
    from agentwake.store.postgres import PostgresStore

T = TypeVar("T")

# pg_try_advisory_lock key held by the process pruning ("agentwkp" in ASCII).
PRUNE_LOCK: Final = 0x6167656E74776B70
PRUNED_TABLES: Final = ("events", "runs", "tool_calls", "answers", "flow_marks", "gaps", "seen")


class PostgresPruneTarget:
    """A PostgreSQL store as ``agentwake.store.retention`` prunes it, over ``store``'s pool
    (closed with the target when ``owned``)."""

    dialect = Dialect(lock_events=" FOR UPDATE OF e SKIP LOCKED")

    def __init__(self, store: PostgresStore, *, owned: bool) -> None:
        self.store = store
        self.owned = owned
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def run(self, script: Script[T], *, write: bool) -> T:
        try:
            if self._conn is not None:
                async with self._conn.transaction():
                    return await _drive(self._conn, script)
            async with self.store.transaction() as conn:
                return await _drive(conn, script)
        except psycopg.Error as exc:
            raise self.store.store_error(exc) from None

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[bool]:
        try:
            async with self.store.pool.connection() as conn:
                nul_safe(conn)
                row = await (await conn.execute("SELECT pg_try_advisory_lock(%s)", [PRUNE_LOCK])).fetchone()
                if not (row and row[0]):
                    yield False
                    return
                self._conn = conn
                try:
                    yield True
                finally:
                    self._conn = None
                    if not conn.closed:
                        await conn.execute("SELECT pg_advisory_unlock(%s)", [PRUNE_LOCK])
        except psycopg.Error as exc:
            raise self.store.store_error(exc) from None

    async def reclaim(self, pause_s: float) -> int:
        # Autovacuum makes the deleted rows' room reusable on its own schedule.
        return 0

    async def vacuum(self) -> int:
        before = int((await self.storage())["size_bytes"])
        try:
            async with self.store.pool.connection() as conn:  # autocommit: VACUUM runs outside a transaction
                await conn.execute("SET statement_timeout = 0")
                await conn.execute(f"VACUUM (ANALYZE) {', '.join(PRUNED_TABLES)}")
                await conn.execute("RESET statement_timeout")
        except psycopg.Error as exc:
            raise self.store.store_error(exc) from None
        return max(before - int((await self.storage())["size_bytes"]), 0)

    async def storage(self) -> dict[str, Any]:
        return await self.store.storage()

    async def close(self) -> None:
        if self.owned:
            await self.store.close()


async def _drive(conn: psycopg.AsyncConnection[Any], script: Script[T]) -> T:
    try:
        sql, params = next(script)
        while True:
            cur = await conn.execute(sql, list(params))
            rows = await cur.fetchall() if cur.description is not None else []
            sql, params = script.send(Reply(rows, cur.rowcount))
    except StopIteration as done:
        result: T = done.value
        return result


__all__ = ["PRUNE_LOCK", "PostgresPruneTarget"]
