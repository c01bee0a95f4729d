"""WAL checkpoints in a thread of their own, so that a commit never pays for one.

SQLite checkpoints a WAL store from the connection whose commit takes the WAL past
``wal_autocheckpoint`` pages (1,000 by default): that commit then also copies the WAL into the
database file and syncs it, several milliseconds that every write waiting behind it waits too
(the group commit's tail, bench/webhook_ingest.py). The async store's writer instead gets a
high threshold, a backstop only, and this thread runs a PASSIVE checkpoint (it takes no write lock,
so commits go on meanwhile) on its own connection every CHECKPOINT_INTERVAL_S.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_S: Final = 0.25
# The writer still checkpoints by itself past this many WAL pages (about 40 MB), should this thread
# fall behind; the WAL stays bounded either way.
WRITER_BACKSTOP_PAGES: Final = 10_000
_BUSY_TIMEOUT_MS: Final = 1_000


class Checkpointer:
    """A daemon thread checkpointing the WAL of ``path``; ``start()``, then ``stop()`` before closing."""

    def __init__(self, path: Path, interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self.checkpoints = 0  # checkpoints that moved pages into the database file
        self.moved = threading.Event()  # set after each such checkpoint
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"agentwake-checkpoint {path.name}", daemon=True
        )

    def start(self, writer: sqlite3.Connection) -> None:
        writer.execute(f"PRAGMA wal_autocheckpoint={WRITER_BACKSTOP_PAGES}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000)
        except sqlite3.Error as exc:
            logger.warning("store %s: no background checkpoints (%s); the writer checkpoints", self.path, exc)
            return
        try:
            backfilled = 0
            while not self._stop.wait(self.interval_s):
                try:
                    _busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # locked by a VACUUM or a migration: the next round
                    logger.debug("store %s: checkpoint skipped: %s", self.path, exc)
                    continue
                if done > 0 and done != backfilled:
                    self.checkpoints += 1
                    self.moved.set()
                backfilled = done if frames > 0 else 0
        finally:
            conn.close()
