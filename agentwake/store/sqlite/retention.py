"""Retention on a SQLite store: the prune target (``agentwake.store.retention``) and the store's size.

The target has a connection of its own, run in a thread of its own: the service's store thread
never waits on a prune's reads, and its writes wait for one batch at most (WAL: readers never
block). Space: a store created by this agentwake is in ``auto_vacuum=INCREMENTAL`` mode, and after
a prune the freed pages are given back a few at a time (``PRAGMA incremental_vacuum``); an older
store (``auto_vacuum=NONE``) reuses them for new rows, so it stops growing, but only ``--vacuum``
(``VACUUM``, which also switches it to incremental) makes the file smaller.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio

from agentwake.errors import StoreError
from agentwake.store.retention import Dialect, Reply, Script
from agentwake.store.sqlite.base import SqliteBase, describe_error
from agentwake.store.sqlite.views import file_size, sqlite_storage, wal_path

T = TypeVar("T")

# Pages given back per step of an incremental vacuum (each step a short write of its own).
VACUUM_PAGES: Final = 1000


def run_script(conn: sqlite3.Connection, script: Script[T]) -> T:
    """Drive ``script`` on ``conn`` (``%s`` placeholders become ``?``)."""
    try:
        sql, params = next(script)
        while True:
            cursor = conn.execute(sql.replace("%s", "?"), list(params))
            sql, params = script.send(Reply(cursor.fetchall(), cursor.rowcount))
    except StopIteration as done:
        result: T = done.value
        return result


class SqlitePruneTarget:
    """A SQLite store as ``agentwake.store.retention`` prunes it. ``await SqlitePruneTarget.open(path)``."""

    dialect = Dialect()

    def __init__(self, base: SqliteBase) -> None:
        self.base = base
        self._limiter = anyio.CapacityLimiter(1)

    @classmethod
    async def open(cls, path: Path) -> SqlitePruneTarget:
        conn = await anyio.to_thread.run_sync(lambda: SqliteBase.connect(path, create=False))
        return cls(SqliteBase(conn, path))

    async def _call(self, fn: Callable[[], T]) -> T:
        def guarded() -> T:
            try:
                return fn()
            except sqlite3.Error as exc:
                raise StoreError(describe_error(self.base.path, exc)) from exc

        return await anyio.to_thread.run_sync(guarded, limiter=self._limiter)

    async def run(self, script: Script[T], *, write: bool) -> T:
        def drive() -> T:
            with self.base.transaction() if write else nullcontext():
                return run_script(self.base.conn, script)

        return await self._call(drive)

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[bool]:
        # One writer at a time is SQLite's own rule; two prunes at once only share the work.
        yield True

    def _pragma(self, name: str) -> int:
        return int(self.base.conn.execute(f"PRAGMA {name}").fetchone()[0])

    async def reclaim(self, pause_s: float) -> int:
        """Free pages back to the file system, ``VACUUM_PAGES`` per step (incremental mode only)."""
        conn, path = self.base.conn, self.base.path
        if await self._call(lambda: self._pragma("auto_vacuum")) != 2:
            return 0
        before = file_size(path)
        while await self._call(lambda: self._pragma("freelist_count")) > 0:
            # executescript steps the pragma to its end (execute would free one page).
            await self._call(lambda: conn.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES});"))
            await anyio.sleep(pause_s)
        # The file shrinks when the WAL is copied back; PASSIVE never waits for a reader.
        await self._call(lambda: conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall())
        return max(before - file_size(path), 0)

    async def vacuum(self) -> int:
        """``VACUUM`` (in incremental auto-vacuum mode from then on): the file rewritten without its free
        pages. It holds the write lock while it runs: best with the service stopped."""
        conn, path = self.base.conn, self.base.path
        before = file_size(path) + file_size(wal_path(path))

        def vacuum() -> None:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

        await self._call(vacuum)
        return max(before - file_size(path) - file_size(wal_path(path)), 0)

    async def storage(self) -> dict[str, Any]:
        return await self._call(lambda: sqlite_storage(self.base.conn, self.base.path))

    async def close(self) -> None:
        await self._call(self.base.close)
