"""[limits] max_undecided_events: past it a subscription is held back, and nothing is lost.

A poll loop stops polling, a push stream is closed (what it brought is stored) and opened again
from the stored cursor, and a webhook delivery is answered 503 with Retry-After, until the agent
has decided enough; then delivery goes on from where it stopped. Real servers over real stdio
pipes (tests/feed_server.py, tests/push_server.py, tests/hostile_server.py), the real receiver
over TLS on loopback, real SQLite files. "The agent" here is the test finishing pending events.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import set_cursor
from _webhook_support import TLS, event, make_tls, running_hook
from conftest import REPO

from agentwake import metrics
from agentwake.config import ServerConfig, SubscriptionConfig, parse_config
from agentwake.delivery.backlog import HELD_BACK, Backlog, resume_at
from agentwake.delivery.common import subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.delivery.push import PushLoop
from agentwake.mcp import ServerConnection
from agentwake.store import IncomingEvent, Store
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio

RECHECK_S = 0.01


async def until(predicate: Callable[[], bool], what: str, within: float = 30.0) -> None:
    try:
        with anyio.fail_after(within):
            while True:
                if predicate():
                    return
                await anyio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {within:g}s: {what}") from None


def count(store: Store, subscription: str, *states: str) -> int:
    sql, args = "SELECT count(*) FROM events WHERE subscription = ?", [subscription]
    if states:
        sql += f" AND state IN ({', '.join('?' for _ in states)})"
        args += list(states)
    return int(store.core.conn.execute(sql, args).fetchone()[0])  # type: ignore[attr-defined]


def row(store: Store, subscription: str) -> dict[str, Any]:
    rows = store.core.subscriptions()  # type: ignore[attr-defined]
    return next(r for r in rows if r["subscription"] == subscription)


async def decide_all(store: Store, subscription: str) -> int:
    """What an agent does, all at once: every pending event of ``subscription`` is done."""
    ids = [
        r[0]
        for r in store.core.conn.execute(  # type: ignore[attr-defined]
            "SELECT id FROM events WHERE subscription = ? AND state = 'pending'", [subscription]
        ).fetchall()
    ]
    if ids:
        await store.finish(ids, "done")
    return len(ids)


@asynccontextmanager
async def an_agent_deciding(store: Store, subscription: str) -> AsyncIterator[None]:
    """A stand-in agent that keeps deciding what waits, every few milliseconds."""

    async def keep_deciding() -> None:
        while True:
            await decide_all(store, subscription)
            await anyio.sleep(0.005)

    async with anyio.create_task_group() as tg:
        tg.start_soon(keep_deciding)
        yield
        tg.cancel_scope.cancel()


# ---- the bound itself ------------------------------------------------------------------------------


async def test_the_store_is_counted_only_near_the_bound_and_a_held_subscription_resumes_at_nine_tenths(
    store: Store,
) -> None:
    key = subscription_key(SubscriptionConfig(name="s", server="x", event="e"))
    await store.register(key)
    backlog = Backlog(store, 20, recheck_s=0)

    def batch(start: int, n: int) -> list[IncomingEvent]:
        return [
            IncomingEvent(f"e-{i}", "e", "2026-01-01T00:00:00Z", {}, None) for i in range(start, start + n)
        ]

    # 19 events: under the bound, and the store is never asked.
    await store.ingest(key, batch(0, 19), "19")
    backlog.stored("s", 19)
    assert not await backlog.over("s")
    assert backlog.counted == 0
    # One more: at the bound, counted, held back, and the status says so.
    await store.ingest(key, batch(19, 1), "20")
    backlog.stored("s", 1)
    assert await backlog.over("s")
    assert backlog.counted == 1
    assert row(store, "s")["status"] == HELD_BACK
    assert "max_undecided_events=20" in row(store, "s")["last_error"]
    assert metrics.SUBSCRIPTION_HELD_BACK.labels("s")._value.get() == 1
    # Decided down to 19: still held (it resumes at 18, nine tenths, so it does not flap).
    ids = [r["id"] for r in store.core.inbox(100)]  # type: ignore[attr-defined]
    await store.finish(ids[:1], "done")
    assert resume_at(20) == 18
    assert await backlog.over("s")
    await store.finish(ids[1:2], "done")
    assert not await backlog.over("s")
    assert row(store, "s")["status"] == "active"
    assert metrics.SUBSCRIPTION_HELD_BACK.labels("s")._value.get() == 0
    # Events being handled (claimed, not yet decided) count too.
    assert await store.undecided("s", 100) == 18
    assert await store.undecided("s", 5) == 5, "the count stops at its bound"


# ---- poll ------------------------------------------------------------------------------------------------


def feed_server(items: int) -> ServerConfig:
    return ServerConfig(
        command=sys.executable,
        args=["tests/feed_server.py"],
        env={"FEED_ITEMS": str(items), "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )


async def test_a_poll_subscription_past_its_bound_stops_polling_and_goes_on_without_loss_when_decided(
    store: Store,
) -> None:
    items, limit = 2000, 250
    sub = SubscriptionConfig(name="feed", server="feed", event="feed.item", max_events=100, poll_floor_ms=1)
    await set_cursor(store, subscription_key(sub), "0")
    backlog = Backlog(store, limit, recheck_s=RECHECK_S)
    async with ServerConnection("feed", feed_server(items)) as conn, anyio.create_task_group() as tg:
        loop = PollLoop(sub, conn, store, backlog=backlog, quiet_write_s=0)
        tg.start_soon(loop.run)
        await until(lambda: backlog.held("feed"), "the subscription was held back")
        # Once it counts again, the loop has stored the page it had in hand and waits for room.
        counted = backlog.counted
        await until(lambda: backlog.counted > counted, "a count while held back")
        held_at = count(store, "feed")
        # At the bound, past it by a page (or two: the next page is fetched while one commits).
        assert limit <= held_at <= limit + 2 * sub.max_events, held_at
        polls, counted = loop.polls, backlog.counted
        await until(lambda: backlog.counted >= counted + 5, "five more counts while held back")
        assert loop.polls == polls, "it polled while held back"
        assert count(store, "feed") == held_at
        assert row(store, "feed")["status"] == HELD_BACK
        async with an_agent_deciding(store, "feed"):
            await until(lambda: count(store, "feed") == items, f"all {items} events stored")
            await until(lambda: not backlog.held("feed"), "the subscription was let go")
        tg.cancel_scope.cancel()
    ids = store.core.event_ids("feed")  # type: ignore[attr-defined]
    assert ids == [f"item-{n}" for n in range(1, items + 1)], "each event once, in order"
    assert store.core.gaps("feed") == [], "holding back skipped nothing"  # type: ignore[attr-defined]
    assert row(store, "feed")["status"] == "active"


# ---- push ------------------------------------------------------------------------------------------------


def push_server(tmp_path: Path, items: int) -> ServerConfig:
    return ServerConfig(
        command=sys.executable,
        args=["tests/push_server.py"],
        env={"PUSH_LOG": str(tmp_path / "push.log"), "PUSH_ITEMS": str(items), "PUSH_HEARTBEAT_MS": "50"},
        cwd=REPO,
        protocol="legacy",
    )


def push_log(tmp_path: Path) -> list[str]:
    path = tmp_path / "push.log"
    return path.read_text().splitlines() if path.exists() else []


async def test_a_push_stream_past_its_bound_is_closed_and_reopened_from_its_cursor_without_loss(
    tmp_path: Path, store: Store
) -> None:
    items, limit = 3000, 200
    sub = SubscriptionConfig.model_validate(
        {"name": "feed", "server": "push", "event": "feed.item", "delivery": "push", "heartbeat_s": 5}
    )
    await set_cursor(store, subscription_key(sub), "0")
    backlog = Backlog(store, limit, recheck_s=RECHECK_S)
    async with (
        ServerConnection("push", push_server(tmp_path, items)) as conn,
        anyio.create_task_group() as tg,
    ):
        loop = PushLoop(sub, conn, store, backlog=backlog, quiet_write_s=0)
        tg.start_soon(loop.run)
        await until(lambda: backlog.held("feed"), "the subscription was held back")
        await until(
            lambda: any(line.startswith("cancel") for line in push_log(tmp_path)), "the stream closed"
        )
        counted = backlog.counted
        await until(lambda: backlog.counted > counted, "a count while held back")
        held_at = count(store, "feed")
        assert limit <= held_at < items, held_at
        streams, counted = loop.streams, backlog.counted
        await until(lambda: backlog.counted >= counted + 5, "five more counts while held back")
        assert loop.streams == streams, "a stream was opened while held back"
        assert count(store, "feed") == held_at
        assert row(store, "feed")["status"] == HELD_BACK
        async with an_agent_deciding(store, "feed"):
            await until(lambda: count(store, "feed") == items, f"all {items} events stored")
        tg.cancel_scope.cancel()
    ids = store.core.event_ids("feed")  # type: ignore[attr-defined]
    assert len(ids) == len(set(ids)) == items
    assert store.core.gaps("feed") == [], "holding back skipped nothing"  # type: ignore[attr-defined]
    opens = [line for line in push_log(tmp_path) if line.startswith("open")]
    assert len(opens) >= 2
    # Each reopening starts at a cursor that was stored, never before or past it.
    reopened_at = [int(line.split()[1]) for line in opens[1:]]
    assert all(0 < c < items for c in reopened_at), opens


# ---- webhook ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLS:
    return make_tls(tmp_path_factory.mktemp("tls"))


async def test_a_webhook_delivery_past_the_bound_is_answered_503_with_retry_after_and_taken_later(
    tls: TLS, store: Store
) -> None:
    async with running_hook(tls, store) as hook:
        backlog = Backlog(store, 3, recheck_s=0)
        hook.receiver.backlog = backlog
        name = "tickets"
        for n in range(1, 4):
            assert (await hook.deliver(event(f"evt_{n}", cursor=f"c{n}"))).status == 204
        refused = await hook.deliver(event("evt_4", cursor="c4"))
        assert refused.status == 503
        assert int(refused.headers["Retry-After"]) > 0
        assert count(store, name) == 3
        assert store.core.cursor(name) == "c3", "the refused delivery's cursor was not taken"  # type: ignore[attr-defined]
        assert row(store, name)["status"] == HELD_BACK
        await decide_all(store, name)
        # The sender tries again, as the spec's retry does: now it is taken.
        assert (await hook.deliver(event("evt_4", cursor="c4"))).status == 204
        assert store.core.event_ids(name) == ["evt_1", "evt_2", "evt_3", "evt_4"]  # type: ignore[attr-defined]
        assert row(store, name)["status"] == "active"


# ---- the flooding server of the issue, through the supervisor ------------------------------------------


async def test_a_flooding_poll_server_fills_no_more_than_its_bound(tmp_path: Path) -> None:
    """tests/hostile_server.py in "flood" mode answers every poll with 100 events and hasMore;
    with nobody deciding, the store holds the bound (and a page or two), not a flood."""
    limit = 500
    config = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "limits": {"max_undecided_events": limit},
            "servers": {
                "hostile": {
                    "command": sys.executable,
                    "args": [str(REPO / "tests" / "hostile_server.py")],
                    "cwd": str(tmp_path),
                    "env": {"HOSTILE_MODE": "flood", "HOSTILE_LOG": str(tmp_path / "hostile.log")},
                }
            },
            "subscriptions": [
                {
                    "name": "hostile",
                    "server": "hostile",
                    "event": "h.tick",
                    "delivery": "poll",
                    "poll_floor_ms": 1,
                }
            ],
        },
        env={},
    )
    store = await SqliteStore.open(config.store.path)
    try:
        supervisor = Supervisor(config, store, worker=None, pool=None)
        supervisor.backlog.recheck_s = RECHECK_S
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            await until(lambda: supervisor.backlog.held("hostile"), "the flood was held back")
            counted = supervisor.backlog.counted
            await until(lambda: supervisor.backlog.counted >= counted + 20, "twenty counts while held back")
            stored = count(store, "hostile")
            assert limit <= stored <= limit + 200, stored
            assert row(store, "hostile")["status"] == HELD_BACK
            tg.cancel_scope.cancel()
    finally:
        await store.close()
