"""The poll loop over real Streamable HTTP on loopback, and against a handshake-only server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import SteppedSleep, set_cursor
from conftest import REPO

from agentwake.config import ServerConfig, SubscriptionConfig
from agentwake.delivery.poll import PollLoop, subscription_key
from agentwake.errors import ConnectError
from agentwake.mcp import ServerConnection
from agentwake.store import Store

pytestmark = pytest.mark.anyio


async def run_until_first_wait(sub: SubscriptionConfig, conn: ServerConnection, store: Store) -> SteppedSleep:
    sleep = SteppedSleep()
    async with anyio.create_task_group() as tg:
        tg.start_soon(PollLoop(sub, conn, store, sleep=sleep, retry_initial_s=0.01).run)
        await sleep.next()
        tg.cancel_scope.cancel()
    return sleep


async def test_backlog_drains_over_streamable_http(demo_http_factory: Any, store: Store) -> None:
    sub = SubscriptionConfig(name="tickets", server="demo", event="ticket.created", max_events=40)
    await set_cursor(store, subscription_key(sub), "0")
    async with demo_http_factory(DEMO_BACKLOG="100") as demo, ServerConnection("demo", demo.config()) as conn:
        await run_until_first_wait(sub, conn, store)
    assert store.core.event_ids() == [f"T-{n:06d}" for n in range(1, 101)]


async def test_headers_reach_the_server(demo_http_factory: Any, store: Store) -> None:
    async with demo_http_factory(DEMO_TOKEN="s3cret") as demo:
        with pytest.raises(ConnectError) as refused:
            async with ServerConnection("demo", demo.config()):
                pass
        assert "refused our credentials" in str(refused.value)
        async with ServerConnection("demo", demo.config(headers={"Authorization": "Bearer s3cret"})) as conn:
            assert {d.name for d in await conn.list_events()} >= {"ticket.created"}


async def test_emit_only_server_restart_gives_truncated_and_a_fresh_cursor(
    demo_http_factory: Any, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    sub = SubscriptionConfig(name="alerts", server="demo", event="alert.fired")
    async with demo_http_factory() as demo:
        async with ServerConnection("demo", demo.config()) as conn:
            await run_until_first_wait(sub, conn, store)
        before = store.core.cursor("alerts")
        await demo.stop()
        await demo.start()  # same port, new process: its ring buffer and cursors are new
        async with ServerConnection("demo", demo.config()) as conn:
            await run_until_first_wait(sub, conn, store)
    after = store.core.cursor("alerts")
    assert before is not None and after is not None and before != after
    [gap] = store.core.gaps("alerts")
    assert gap["cursor_before"] == before and gap["cursor_after"] == after
    # The warning says why, not only that: the server kept no history past the stored cursor.
    assert f"the server kept no history back to cursor {before}" in caplog.text
    assert f"resumed at cursor {after}" in caplog.text


async def test_an_unreachable_http_server_is_one_clear_error() -> None:
    config = ServerConfig(url="http://127.0.0.1:9/mcp", connect_timeout_s=5)
    with pytest.raises(ConnectError) as caught:
        async with ServerConnection("gone", config):
            pass
    assert "server 'gone' at http://127.0.0.1:9/mcp" in str(caught.value)


async def test_a_missing_command_is_one_clear_error() -> None:
    with pytest.raises(ConnectError, match="command not found"):
        async with ServerConnection("x", ServerConfig(command="/nonexistent/agentwake-server")):
            pass


def legacy(**env: str) -> ServerConfig:
    return ServerConfig(command=sys.executable, args=[str(REPO / "tests" / "legacy_server.py")], env=env)


async def test_a_server_that_only_speaks_initialize_is_polled(tmp_path: Path, store: Store) -> None:
    sub = SubscriptionConfig(name="ticks", server="legacy", event="counter.tick")
    await set_cursor(store, subscription_key(sub), "2")
    async with ServerConnection("legacy", legacy(LEGACY_TICKS="6")) as conn:
        assert conn.advertises_events
        assert [d.name for d in await conn.list_events()] == ["counter.tick"]
        await run_until_first_wait(sub, conn, store)
    assert store.core.event_ids() == ["tick-3", "tick-4", "tick-5", "tick-6"]


async def test_internal_errors_are_retried_with_growing_backoff(store: Store) -> None:
    sub = SubscriptionConfig(name="ticks", server="legacy", event="counter.tick")
    await set_cursor(store, subscription_key(sub), "0")
    sleep = SteppedSleep()
    async with ServerConnection("legacy", legacy(LEGACY_FAILURES="3", LEGACY_TICKS="2")) as conn:
        loop = PollLoop(sub, conn, store, sleep=sleep, retry_initial_s=0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run)
            retries = []
            for _ in range(3):
                retries.append(await sleep.next())
                assert "upstream hiccup" in (store.core.subscriptions()[0]["last_error"] or "")
                sleep.release()
            assert await sleep.next() == 1.0  # the ordinary wait after a good poll
            tg.cancel_scope.cancel()
    assert retries[0] < retries[2]
    assert store.core.event_ids() == ["tick-1", "tick-2"]
    assert store.core.subscriptions()[0]["last_error"] is None
