"""A store that fails for a while (a PostgreSQL lock timeout behind a frozen peer, a database
restarting) costs the worker a retry, not the service: it says so once, and claims again.

The store here is a real SQLite file whose claims fail the first times they are made (the fault is
injected; the errors are the StoreError a real lock timeout becomes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_work_queue import add_events

from agentwake.config import parse_config
from agentwake.errors import StoreError
from agentwake.store import InboxEvent
from agentwake.store.sqlite import SqliteStore
from agentwake.worker import Worker

pytestmark = pytest.mark.anyio


class FlakyClaims(SqliteStore):
    """Claims fail ``failures`` times (as a lock timeout does), then work."""

    failures = 2
    failed: anyio.Event

    async def claim(self, *args: Any, **kwargs: Any) -> Sequence[InboxEvent]:  # type: ignore[override]
        if self.failures:
            self.failures -= 1
            self.failed.set()
            raise StoreError(
                "canceling statement due to lock timeout (lock_timeout=3333ms); nothing was written"
            )
        return await super().claim(*args, **kwargs)


async def test_claims_that_fail_on_the_store_are_retried_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentwake.worker")
    cfg = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "servers": {"a": {"command": "true"}},
            "subscriptions": [{"name": "sub-a", "server": "a", "event": "x.happened", "agent": False}],
        },
        env={},
    )
    store = await FlakyClaims.open(cfg.store.path)
    store.failed = anyio.Event()
    try:
        await add_events(store, cfg, "a", 3)
        worker = Worker(cfg, store)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            with anyio.fail_after(60):
                while store.failures:  # each failure is followed by a wake, not a 5 s idle
                    await store.failed.wait()
                    store.failed = anyio.Event()
                    worker.wake(1)
                worker.wake(1)
                while True:
                    if not (await store.state_counts())["pending"]:
                        break
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    finally:
        await store.close()
    warnings = [r for r in caplog.records if r.getMessage().startswith("could not claim events")]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING, [r.getMessage() for r in warnings]
    assert "lock timeout" in warnings[0].getMessage()
    assert any(r.getMessage() == "claiming events works again" for r in caplog.records)
