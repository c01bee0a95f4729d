"""A gap's log line says where delivery resumed in words when the server gives a null cursor.

A hand-written push server over stdio (tests/push_server.py) skips ahead after item 2 and says so
with a fresh ``active`` whose ``truncated`` is true and whose cursor is null: the warning must not
print Python's ``None`` as if it were a cursor.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import anyio
import pytest
from _support import SteppedSleep, set_cursor
from conftest import REPO
from test_push_client import Progress, feed, push_server, run_loop

from agentwake.config import ServerConfig, SubscriptionConfig
from agentwake.delivery.common import shown_cursor, subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.delivery.push import PushLoop
from agentwake.mcp import ServerConnection
from agentwake.store import Store

pytestmark = pytest.mark.anyio


async def test_a_gap_with_a_null_cursor_is_said_in_words(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    server = push_server(tmp_path, PUSH_GAP_AT="2", PUSH_NULL_GAP="1")
    async with ServerConnection("push", server) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep(), quiet_write_s=0)
        # The heartbeats after the gap carry the server's position again (102).
        await run_loop(loop, progress, lambda: "102" in progress.cursors)
    [gap] = store.core.gaps("feed")
    assert gap["cursor_before"] == "2"
    assert "the server kept no history back to cursor 2" in caplog.text
    assert "resumed at the server's current position (it gave no cursor)" in caplog.text
    assert "None" not in caplog.text


async def test_a_poll_gap_with_a_null_cursor_is_said_in_words(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The same on the poll path: tests/hostile_server.py answers the first poll from a cursor with
    ``truncated: true``, an event, and a null cursor."""
    caplog.set_level(logging.INFO, logger="agentwake")
    sub = SubscriptionConfig(
        name="hostile", server="hostile", event="h.tick", delivery="poll", poll_floor_ms=10
    )
    await set_cursor(store, subscription_key(sub), "5")
    server = ServerConfig(
        command=sys.executable,
        args=[str(REPO / "tests" / "hostile_server.py")],
        cwd=tmp_path,
        env={"HOSTILE_MODE": "truncated-null-cursor", "HOSTILE_LOG": str(tmp_path / "hostile.log")},
    )
    stored = anyio.Event()  # the event that came with the gap: stored with it, in one transaction
    async with ServerConnection("hostile", server) as conn, anyio.create_task_group() as tg:
        loop = PollLoop(
            sub, conn, store, on_new_events=lambda n: stored.set(), sleep=SteppedSleep(), quiet_write_s=0
        )
        tg.start_soon(loop.run)
        with anyio.fail_after(60):
            await stored.wait()
        tg.cancel_scope.cancel()
    [gap] = store.core.gaps("hostile")  # type: ignore[attr-defined]
    assert gap["cursor_before"] == "5"
    assert "the server kept no history back to cursor 5" in caplog.text
    assert "resumed at the server's current position (it gave no cursor)" in caplog.text
    assert "None" not in caplog.text


def test_a_cursor_is_shown_as_one_and_a_null_one_in_words() -> None:
    assert shown_cursor("c-7") == "cursor c-7"
    assert shown_cursor(None) == "the server's current position (it gave no cursor)"
    assert shown_cursor("x" * 500, 10).startswith("cursor xxxxxxxxx")
