"""Push between our client and our server (the demo on the SDK): real stdio pipes and real HTTP."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import SteppedSleep, set_cursor
from conftest import demo_stdio
from test_push_client import Progress

from agentwake.config import SubscriptionConfig, parse_config
from agentwake.delivery.common import subscription_key
from agentwake.delivery.push import PushLoop
from agentwake.mcp import ServerConnection
from agentwake.store import Store
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor
from examples.demo_server import TicketStore

pytestmark = pytest.mark.anyio


def tickets(**overrides: Any) -> SubscriptionConfig:
    return SubscriptionConfig.model_validate(
        {"name": "tickets", "server": "demo", "event": "ticket.created", "delivery": "push", **overrides}
    )


def add_tickets(db: Path, count: int) -> None:
    upstream = TicketStore(db)
    try:
        upstream.create([("support", "P2", f"late ticket {n}", "", "amy@example.com") for n in range(count)])
    finally:
        upstream.close()


async def test_a_burst_of_10000_tickets_streams_complete_in_order_over_stdio(
    tmp_path: Path, store: Store
) -> None:
    sub = tickets(heartbeat_s=5)
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    server = demo_stdio(tmp_path / "demo.db", DEMO_BACKLOG="10000", DEMO_HEARTBEAT_MS="200")
    async with ServerConnection("demo", server) as conn, anyio.create_task_group() as tg:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        tg.start_soon(loop.run)
        await progress.until(lambda: len(store.core.event_ids("tickets")) >= 10_000, limit_s=60)
        # Then quiet: the heartbeat keeps the stored cursor at the head.
        seen = len(progress.cursors)
        await progress.until(lambda: len(progress.cursors) > seen)
        tg.cancel_scope.cancel()
    assert store.core.event_ids("tickets") == [f"T-{n:06d}" for n in range(1, 10_001)]
    assert store.core.cursor("tickets") == "10000"
    assert loop.streams == 1


async def test_streams_over_http_survive_a_server_restart_and_lose_nothing(
    tmp_path: Path, demo_http_factory: Callable[..., Any]
) -> None:
    async with demo_http_factory(DEMO_BACKLOG="30", DEMO_HEARTBEAT_MS="200") as demo:
        cfg = parse_config(
            {
                "store": {"path": str(tmp_path / "aw.db")},
                "servers": {"demo": {"url": demo.url, "connect_timeout_s": 5}},
                "subscriptions": [
                    {
                        "name": "tickets",
                        "server": "demo",
                        "event": "ticket.created",
                        "delivery": "push",
                        "heartbeat_s": 1,
                    }
                ],
            },
            env={},
        )
        store = await SqliteStore.open(tmp_path / "aw.db")
        try:
            await set_cursor(store, subscription_key(cfg.subscriptions[0]), "0")
            sleep = SteppedSleep()
            supervisor = Supervisor(cfg, store, sleep=sleep, reconnect_initial_s=0.05)

            async def release_every_wait() -> None:
                while True:
                    await sleep.next(limit_s=120)
                    sleep.release()

            async def until(count: int) -> None:
                with anyio.fail_after(60):
                    while len(store.core.event_ids("tickets")) < count:
                        await supervisor.next_stored()

            async with anyio.create_task_group() as tg:
                tg.start_soon(supervisor.run)
                tg.start_soon(release_every_wait)
                await until(30)
                await demo.stop()  # the stream and its connection die with the server
                add_tickets(demo.db, 5)  # upstream goes on meanwhile
                await demo.start()  # same port, same durable upstream
                await until(35)
                tg.cancel_scope.cancel()
            assert store.core.event_ids("tickets") == [f"T-{n:06d}" for n in range(1, 36)]
            [row] = store.core.subscriptions()
            assert (row["mode"], row["duplicates"]) == ("push", 0)
        finally:
            await store.close()


async def test_a_cancelled_stream_over_http_leaves_the_connection_ready_for_the_next(
    tmp_path: Path, store: Store, demo_http_factory: Callable[..., Any]
) -> None:
    sub = tickets()
    async with (
        demo_http_factory(DEMO_HEARTBEAT_MS="100") as demo,
        ServerConnection("demo", demo.config()) as conn,
    ):
        progress = Progress()
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run)
            await progress.until(lambda: len(progress.cursors) >= 2)  # active, then a heartbeat
            tg.cancel_scope.cancel()
        # The same connection opens the next stream at once: the first was let go.
        progress2 = Progress()
        loop2 = PushLoop(sub, conn, store, on_stored=progress2, sleep=SteppedSleep())
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop2.run)
            await progress2.until(lambda: len(progress2.cursors) >= 1)
            tg.cancel_scope.cancel()
    assert (loop.streams, loop2.streams) == (1, 1)
    assert progress2.cursors[0] == progress.cursors[-1]  # the second stream starts where the first stood
