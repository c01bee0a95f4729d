"""The async SQLite store checkpoints its WAL in a thread of its own, so commits do not pay for it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.sqlite import SqliteStore
from agentwake.store.sqlite.checkpointer import WRITER_BACKSTOP_PAGES

pytestmark = pytest.mark.anyio

KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})


def wal_frames(path: Path) -> tuple[int, int]:
    """(frames in the WAL, frames of it in the database file after a checkpoint run from here)."""
    with sqlite3.connect(path) as db:
        _busy, frames, done = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return int(frames), int(done)


async def write_events(store: SqliteStore, batches: int, per_batch: int) -> None:
    """``batches`` ingests of ``per_batch`` events of about 2 kB each: WAL pages to checkpoint."""
    await store.register(KEY)
    body = {"title": "x" * 2000}
    for batch in range(batches):
        events = [
            IncomingEvent(f"T-{batch}-{n}", "ticket.created", "2026-01-01T00:00:00Z", body)
            for n in range(per_batch)
        ]
        await store.ingest(KEY, events, str(batch))


async def test_the_writer_leaves_checkpoints_to_the_checkpointer_thread(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        writer_threshold = store.core.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert writer_threshold == WRITER_BACKSTOP_PAGES
        await write_events(store, 5, 200)
        moved = store.checkpointer.moved
        assert await anyio.to_thread.run_sync(lambda: moved.wait(30)), "no checkpoint within 30 s"
        assert store.checkpointer.checkpoints >= 1
    finally:
        await store.close()
    assert not store.checkpointer._thread.is_alive()


async def test_without_the_thread_the_writer_does_not_checkpoint_below_its_backstop(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        await anyio.to_thread.run_sync(store.checkpointer.stop)
        await write_events(store, 3, 300)
        frames, done = wal_frames(tmp_path / "aw.db")
        # Past SQLite's default of 1,000 pages: no commit checkpointed (and so restarted) the WAL.
        assert 1_000 < frames < WRITER_BACKSTOP_PAGES
    finally:
        await store.close()
    assert done == frames  # the checkpoint wal_frames ran moved them all at once
