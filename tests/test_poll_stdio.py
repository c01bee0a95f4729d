"""The poll loop against the demo server over a real stdio subprocess."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from _support import SteppedSleep, set_cursor
from conftest import REPO, demo_stdio

from agentwake.config import ServerConfig, SubscriptionConfig
from agentwake.delivery.poll import PollLoop, subscription_key
from agentwake.errors import SubscriptionEnded
from agentwake.mcp import ServerConnection
from agentwake.store import Store
from agentwake.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio


def tickets(**overrides: object) -> SubscriptionConfig:
    return SubscriptionConfig.model_validate(
        {"name": "tickets", "server": "demo", "event": "ticket.created", **overrides}
    )


async def test_backlog_is_drained_through_has_more_without_waiting(tmp_path: Path, store: Store) -> None:
    sub = tickets(max_events=100)
    await set_cursor(store, subscription_key(sub), "0")
    sleep = SteppedSleep()
    async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_BACKLOG="250")) as conn:
        loop = PollLoop(sub, conn, store, sleep=sleep)
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run)
            first_wait = await sleep.next()
            tg.cancel_scope.cancel()
    assert loop.polls == 3  # 100 + 100 + 50, back to back
    assert first_wait == 1.0
    assert store.core.event_ids() == [f"T-{n:06d}" for n in range(1, 251)]
    assert store.core.cursor("tickets") == "250"


@pytest.mark.parametrize(
    ("next_poll_ms", "floor_ms", "expected_s"), [(2500, 1000, 2.5), (300, 1000, 1.0), (1000, 4000, 4.0)]
)
async def test_wait_between_polls_is_next_poll_ms_but_never_below_the_floor(
    tmp_path: Path, store: Store, next_poll_ms: int, floor_ms: int, expected_s: float
) -> None:
    sub = tickets(poll_floor_ms=floor_ms)
    sleep = SteppedSleep()
    demo = demo_stdio(tmp_path / "demo.db", DEMO_NEXT_POLL_MS=str(next_poll_ms))
    async with ServerConnection("demo", demo) as conn, anyio.create_task_group() as tg:
        tg.start_soon(PollLoop(sub, conn, store, sleep=sleep).run)
        assert await sleep.next() == expected_s
        sleep.release()
        assert await sleep.next() == expected_s
        tg.cancel_scope.cancel()


async def test_first_poll_bootstraps_with_a_null_cursor_and_replays_nothing(
    tmp_path: Path, store: Store
) -> None:
    sleep = SteppedSleep()
    async with (
        ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_BACKLOG="40")) as conn,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(PollLoop(tickets(), conn, store, sleep=sleep).run)
        await sleep.next()
        tg.cancel_scope.cancel()
    assert store.core.event_ids() == []
    assert store.core.cursor("tickets") == "40"


async def test_restart_resumes_from_the_persisted_cursor_losing_and_repeating_nothing(tmp_path: Path) -> None:
    sub = tickets(max_events=50)
    demo = demo_stdio(tmp_path / "demo.db", DEMO_BACKLOG="120")
    db_path = tmp_path / "agentwake.db"

    first = await SqliteStore.open(db_path)
    await set_cursor(first, subscription_key(sub), "0")
    sleep = SteppedSleep()
    async with ServerConnection("demo", demo) as conn:
        async with anyio.create_task_group() as tg:
            tg.start_soon(PollLoop(sub, conn, first, sleep=sleep).run)
            await sleep.next()
            tg.cancel_scope.cancel()
        for n in range(30):  # upstream activity while agentwake is down
            await conn.client.call_tool(
                "create_ticket", {"queue": "ops", "priority": "P3", "title": f"later {n}"}
            )
    await first.close()

    second = await SqliteStore.open(db_path)
    sleep = SteppedSleep()
    async with ServerConnection("demo", demo) as conn, anyio.create_task_group() as tg:
        tg.start_soon(PollLoop(sub, conn, second, sleep=sleep).run)
        await sleep.next()
        tg.cancel_scope.cancel()
    ids = second.core.event_ids()
    await second.close()
    assert ids == [f"T-{n:06d}" for n in range(1, 151)]


async def test_a_stale_cursor_is_recorded_as_a_gap(tmp_path: Path, store: Store) -> None:
    sub = tickets()
    await set_cursor(store, subscription_key(sub), "999999")
    sleep = SteppedSleep()
    async with (
        ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_BACKLOG="5")) as conn,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(PollLoop(sub, conn, store, sleep=sleep).run)
        await sleep.next()
        tg.cancel_scope.cancel()
    [status] = store.core.subscriptions()
    assert status["gaps"] == 1
    assert status["cursor"] == "5"
    [gap] = store.core.gaps("tickets")
    assert (gap["cursor_before"], gap["cursor_after"]) == ("999999", "5")


async def test_max_age_floor_on_resume_skips_old_events_and_records_the_gap(
    tmp_path: Path, store: Store
) -> None:
    sub = tickets(max_age_ms=1)
    await set_cursor(store, subscription_key(sub), "0")
    sleep = SteppedSleep()
    async with (
        ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_BACKLOG="10")) as conn,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(PollLoop(sub, conn, store, sleep=sleep).run)
        await sleep.next()
        tg.cancel_scope.cancel()
    assert store.core.event_ids() == []
    assert store.core.subscriptions()[0]["gaps"] == 1


async def test_a_type_without_replay_never_persists_a_cursor(tmp_path: Path, store: Store) -> None:
    sub = SubscriptionConfig(name="load", server="demo", event="system.load", poll_floor_ms=1)
    sleep = SteppedSleep()
    demo = demo_stdio(tmp_path / "demo.db", DEMO_LOAD_INTERVAL="0.05", DEMO_NEXT_POLL_MS="1")
    async with ServerConnection("demo", demo) as conn, anyio.create_task_group() as tg:
        tg.start_soon(PollLoop(sub, conn, store, sleep=sleep).run)
        with anyio.fail_after(20):
            while not store.core.event_ids():
                await sleep.next()
                sleep.release()
        tg.cancel_scope.cancel()
    [status] = store.core.subscriptions()
    assert status["cursor"] is None
    assert status["events_received"] >= 1


async def test_the_same_event_id_seen_by_two_subscriptions_is_stored_once(
    tmp_path: Path, store: Store
) -> None:
    first, second = tickets(name="a"), tickets(name="b")
    for sub in (first, second):
        await set_cursor(store, subscription_key(sub), "0")
    async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_BACKLOG="7")) as conn:
        for sub in (first, second):
            sleep = SteppedSleep()
            async with anyio.create_task_group() as tg:
                tg.start_soon(PollLoop(sub, conn, store, sleep=sleep).run)
                await sleep.next()
                tg.cancel_scope.cancel()
    assert len(store.core.event_ids()) == 7
    by_name = {row["subscription"]: row for row in store.core.subscriptions()}
    assert (by_name["a"]["events_received"], by_name["a"]["duplicates"]) == (7, 0)
    assert (by_name["b"]["events_received"], by_name["b"]["duplicates"]) == (0, 7)


async def test_an_unknown_event_ends_the_subscription_with_not_found(tmp_path: Path, store: Store) -> None:
    sub = tickets(event="ticket.deleted")
    async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db")) as conn:
        with pytest.raises(SubscriptionEnded) as caught:
            await PollLoop(sub, conn, store, sleep=SteppedSleep()).run()
    assert caught.value.code == -32011
    assert "ticket.deleted" in str(caught.value)


def feed_server(**env: str) -> ServerConfig:
    return ServerConfig(command=sys.executable, args=["tests/feed_server.py"], env=env, cwd=REPO)


async def test_an_error_on_the_poll_sent_ahead_comes_after_the_batch_before_it_is_stored(
    tmp_path: Path, store: Store
) -> None:
    # Polls after hasMore go out while the previous batch commits; the revocation
    # answering the poll at cursor 6 must not cost the batch that ended at 6.
    sub = SubscriptionConfig(name="feed", server="feed", event="feed.item", max_events=3)
    key = subscription_key(sub)
    await store.register(key)
    await set_cursor(store, key, "0")
    async with ServerConnection("feed", feed_server(FEED_ITEMS="20", FEED_REVOKE_AT="6")) as conn:
        with pytest.raises(SubscriptionEnded) as caught:
            await PollLoop(sub, conn, store, sleep=SteppedSleep()).run()
    assert caught.value.code == -32012
    assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 7)]
    assert store.core.subscriptions()[0]["cursor"] == "6"


async def test_a_pipelined_drain_stores_every_batch_in_order_with_its_cursor(
    tmp_path: Path, store: Store
) -> None:
    sub = SubscriptionConfig(name="feed", server="feed", event="feed.item", max_events=4)
    key = subscription_key(sub)
    await store.register(key)
    await set_cursor(store, key, "0")
    sleep = SteppedSleep()
    async with (
        ServerConnection("feed", feed_server(FEED_ITEMS="50")) as conn,
        anyio.create_task_group() as tg,
    ):
        loop = PollLoop(sub, conn, store, sleep=sleep)
        tg.start_soon(loop.run)
        await sleep.next()
        tg.cancel_scope.cancel()
    assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 51)]
    assert store.core.subscriptions()[0]["cursor"] == "50"
    assert loop.polls == 13
