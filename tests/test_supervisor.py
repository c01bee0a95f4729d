"""The supervisor: servers and subscriptions fail alone, and events reach the processing stage."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest
from _support import SteppedSleep, set_cursor
from conftest import REPO, demo_stdio

from agentwake.config import AgentwakeConfig, ServerConfig, parse_config
from agentwake.delivery.common import subscription_key
from agentwake.store import InboxEvent, Store
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor
from agentwake.worker import Worker

pytestmark = pytest.mark.anyio


async def test_a_bad_subscription_and_a_dead_server_do_not_stop_the_good_one(
    tmp_path: Path, store: Store
) -> None:
    config = AgentwakeConfig.model_validate(
        {
            "servers": {
                "demo": demo_stdio(tmp_path / "demo.db", DEMO_RATE="20").model_dump(),
                "gone": ServerConfig(command="/nonexistent/server").model_dump(),
            },
            "subscriptions": [
                {"name": "good", "server": "demo", "event": "ticket.created", "poll_floor_ms": 50},
                {"name": "typo", "server": "demo", "event": "ticket.craeted"},
                {"name": "orphan", "server": "gone", "event": "x"},
            ],
        }
    )
    seen: list[InboxEvent] = []
    enough = anyio.Event()

    def process(event: InboxEvent, rule: str | None) -> None:
        seen.append(event)
        if len(seen) >= 3:
            enough.set()

    supervisor = Supervisor(
        config,
        store,
        worker=Worker(config, store, on_log=process),
        reconnect_initial_s=0.05,
        reconnect_max_s=0.2,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.run)
        with anyio.fail_after(30):
            await enough.wait()
        tg.cancel_scope.cancel()

    assert {e.subscription for e in seen} == {"good"}
    status = {row["subscription"]: row for row in store.core.subscriptions()}
    assert status["typo"]["status"] == "invalid"
    assert "no event 'ticket.craeted'" in status["typo"]["last_error"]
    assert "command not found" in (status["orphan"]["last_error"] or "")
    assert status["good"]["status"] == "active" and status["good"]["events_received"] >= 3
    counts = store.core.state_counts()
    assert counts["pending"] + counts["processing"] + counts["done"] == status["good"]["events_received"]


async def test_a_server_that_dies_mid_drain_is_reconnected_and_nothing_is_lost_or_repeated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "servers": {
                "feed": {
                    "command": sys.executable,
                    "args": ["tests/feed_server.py"],
                    "cwd": str(REPO),
                    "env": {
                        "FEED_ITEMS": "30",
                        "FEED_CRASH_AT": "10",
                        "FEED_CRASH_MARKER": str(tmp_path / "crashed"),
                    },
                }
            },
            "subscriptions": [{"name": "feed", "server": "feed", "event": "feed.item", "max_events": 5}],
        },
        env={},
    )
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        key = subscription_key(cfg.subscriptions[0])
        await set_cursor(store, key, "0")
        sleep = SteppedSleep()
        supervisor = Supervisor(cfg, store, sleep=sleep, reconnect_initial_s=0.01, reconnect_max_s=0.02)
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            # The first sleep is the reconnect after the crash; the next is the quiet poll after the drain.
            with anyio.fail_after(30):
                while len(store.core.event_ids("feed")) < 30:
                    await sleep.next()
                    sleep.release()
            tg.cancel_scope.cancel()
        assert (tmp_path / "crashed").exists()
        assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 31)]
        [row] = store.core.subscriptions()
        assert row["duplicates"] == 0
        assert "server 'feed': connection closed: exited with code 3; reconnecting" in caplog.text
    finally:
        await store.close()


async def test_an_unexpected_failure_costs_one_subscription_a_restart_not_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug a peer finds in a loop (here: the first run of one subscription's loop raises) is contained."""
    from agentwake.delivery.poll import PollLoop

    cfg = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "servers": {
                name: {
                    "command": sys.executable,
                    "args": ["tests/feed_server.py"],
                    "cwd": str(REPO),
                    "env": {"FEED_ITEMS": "20"},
                }
                for name in ("one", "two")
            },
            "subscriptions": [
                {
                    "name": "hurt",
                    "server": "one",
                    "event": "feed.item",
                    "delivery": "poll",
                    "poll_floor_ms": 50,
                },
                {
                    "name": "fine",
                    "server": "two",
                    "event": "feed.item",
                    "delivery": "poll",
                    "poll_floor_ms": 50,
                },
            ],
        },
        env={},
    )
    original = PollLoop.run
    failed_once = anyio.Event()

    async def run_or_fail(self: PollLoop, **kwargs: object) -> None:
        if self.subscription.name == "hurt" and not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("a peer found a bug")
        await original(self, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PollLoop, "run", run_or_fail)
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        for sub in cfg.subscriptions:
            await set_cursor(store, subscription_key(sub), "0")
        supervisor = Supervisor(cfg, store, reconnect_initial_s=0.01, reconnect_max_s=0.02)
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            with anyio.fail_after(30):
                while len(store.core.event_ids("hurt")) < 20 or len(store.core.event_ids("fine")) < 20:
                    await supervisor.next_stored()
            tg.cancel_scope.cancel()
    finally:
        await store.close()
    assert failed_once.is_set()
    failures = [r for r in caplog.records if "subscription hurt failed; restarting it" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
