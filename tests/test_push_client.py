"""The push loop against a hand-written events/stream server over a real stdio pipe (tests/push_server.py)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import SteppedSleep, set_cursor
from conftest import REPO

from agentwake import mcp_streams
from agentwake.config import ServerConfig, SubscriptionConfig, parse_config
from agentwake.delivery.common import subscription_key
from agentwake.delivery.push import PushLoop
from agentwake.delivery.select import choose_mode
from agentwake.errors import ConfigError, SubscriptionEnded
from agentwake.mcp import ServerConnection
from agentwake.store import Store
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio


def push_server(tmp_path: Path, **env: str) -> ServerConfig:
    return ServerConfig(
        command=sys.executable,
        args=["tests/push_server.py"],
        env={"PUSH_LOG": str(tmp_path / "push.log"), "PUSH_MARKER": str(tmp_path / "marker"), **env},
        cwd=REPO,
        protocol="legacy",
    )


def feed(name: str = "feed", **overrides: Any) -> SubscriptionConfig:
    return SubscriptionConfig.model_validate(
        {
            "name": name,
            "server": "push",
            "event": "feed.item",
            "delivery": "push",
            "heartbeat_s": 5,
            **overrides,
        }
    )


class Progress:
    """The cursors the loop stored, and a way to wait for one."""

    def __init__(self) -> None:
        self.cursors: list[str | None] = []
        self._changed = anyio.Event()

    def __call__(self, cursor: str | None) -> None:
        self.cursors.append(cursor)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def until(self, done: Callable[[], bool], limit_s: float = 20) -> None:
        with anyio.fail_after(limit_s):
            while not done():
                await self._changed.wait()


async def run_loop(loop: PushLoop, progress: Progress, done: Callable[[], bool]) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run)
        await progress.until(done)
        tg.cancel_scope.cancel()


def log_lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "push.log"
    return path.read_text().splitlines() if path.exists() else []


async def test_events_arrive_in_order_and_heartbeats_advance_the_cursor(tmp_path: Path, store: Store) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path, PUSH_SKIPPED="10")) as conn:
        # Every heartbeat written at once (by default a cursor-only move waits up to QUIET_WRITE_S).
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep(), quiet_write_s=0)
        # Item 5 is the last event; the heartbeat then says 15 were checked.
        await run_loop(loop, progress, lambda: "15" in progress.cursors)
    assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 6)]
    assert store.core.cursor("feed") == "15"
    assert progress.cursors.index("5") < progress.cursors.index("15")  # never backwards
    [row] = store.core.subscriptions()
    assert (row["mode"], row["events_received"], row["gaps"]) == ("push", 5, 0)


async def test_a_heartbeat_cursor_waits_like_a_quiet_write_and_is_saved_when_the_loop_stops(
    tmp_path: Path, store: Store
) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path, PUSH_SKIPPED="10")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run)
            # Reported as a batch that kept the stored cursor "5": the heartbeat's "15" waits.
            await progress.until(lambda: "5" in progress.cursors and loop._writes.cursor == "15")
            assert store.core.cursor("feed") == "5"  # each event was written at once
            tg.cancel_scope.cancel()
    assert store.core.cursor("feed") == "15"
    assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 6)]


async def test_a_subscription_without_arguments_sends_an_empty_object(tmp_path: Path, store: Store) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    # This server refuses an events/stream that has no arguments object.
    async with ServerConnection("push", push_server(tmp_path, PUSH_STRICT="1")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        await run_loop(loop, progress, lambda: len(store.core.event_ids("feed")) == 5)
    assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 6)]


async def test_a_silent_stream_is_declared_dead_and_reopened_from_the_stored_cursor(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    sub = feed(heartbeat_s=0.2)  # dead after 0.4 s of silence; the server beats every 0.1 s
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    sleep = SteppedSleep()
    async with ServerConnection("push", push_server(tmp_path, PUSH_SILENT_AT="3")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=sleep)
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run)
            await sleep.next()  # the reconnect wait after the dead stream
            sleep.release()
            await progress.until(lambda: len(store.core.event_ids("feed")) == 5)
            tg.cancel_scope.cancel()
    assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 6)]
    opens = [line for line in log_lines(tmp_path) if line.startswith("open")]
    assert opens == ["open 0", "open 3"]
    assert any(line.startswith("cancel") for line in log_lines(tmp_path))  # the dead stream was cancelled
    assert "no event or heartbeat for 0.4s (" in caplog.text
    assert "the stream is dead, reconnecting from cursor 3" in caplog.text


async def test_a_mid_stream_gap_is_recorded(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path, PUSH_GAP_AT="2")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        await run_loop(loop, progress, lambda: "102" in progress.cursors)
    assert store.core.event_ids("feed") == ["item-1", "item-2"]
    [gap] = store.core.gaps("feed")
    assert (gap["cursor_before"], gap["cursor_after"]) == ("2", "102")
    assert store.core.subscriptions()[0]["gaps"] == 1
    # The warning says why: the server kept no history back to the stored cursor.
    assert "the server kept no history back to cursor 2" in caplog.text
    assert "resumed at cursor 102" in caplog.text


async def test_an_error_notification_is_counted_and_the_stream_goes_on(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path, PUSH_ERROR_AT="2")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        await run_loop(loop, progress, lambda: len(store.core.event_ids("feed")) == 5)
    assert loop.errors == 1 and loop.streams == 1
    assert "server reported an error on the stream: UpstreamError (-32603)" in caplog.text


async def test_terminated_ends_the_subscription_with_the_reason(tmp_path: Path, store: Store) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    async with ServerConnection("push", push_server(tmp_path, PUSH_TERMINATE_AT="3")) as conn:
        with pytest.raises(SubscriptionEnded) as ended, anyio.fail_after(20):
            await PushLoop(sub, conn, store, sleep=SteppedSleep()).run()
    assert ended.value.code == -32012 and "revoked" in str(ended.value)
    assert store.core.event_ids("feed") == ["item-1", "item-2", "item-3"]  # what came before it is kept
    assert store.core.cursor("feed") == "3"


async def test_a_burst_of_10000_events_arrives_complete_and_in_order(tmp_path: Path, store: Store) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path, PUSH_ITEMS="10000")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        await run_loop(loop, progress, lambda: "10000" in progress.cursors)
    ids = store.core.event_ids("feed")
    assert ids == [f"item-{n}" for n in range(1, 10001)]
    assert loop.streams == 1  # nothing was lost, so no reconnect was needed


async def test_several_streams_on_one_connection_are_routed_to_their_subscriptions(
    tmp_path: Path, store: Store
) -> None:
    subs = [feed(f"feed-{p}", arguments={"prefix": p}) for p in ("a", "b", "c")]
    for sub in subs:
        await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path)) as conn, anyio.create_task_group() as tg:
        for sub in subs:
            tg.start_soon(PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep()).run)
        await progress.until(lambda: all(len(store.core.event_ids(s.name)) == 5 for s in subs))
        tg.cancel_scope.cancel()
    for sub, prefix in zip(subs, "abc", strict=True):
        assert store.core.event_ids(sub.name) == [f"{prefix}-{n}" for n in range(1, 6)]
        assert store.core.cursor(sub.name) == "5"


async def test_cancelling_the_loop_cancels_the_stream_on_the_server(tmp_path: Path, store: Store) -> None:
    sub = feed()
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path)) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        await run_loop(loop, progress, lambda: bool(progress.cursors))
        # The server reads stdin in order: once it answers a later request, it has seen the cancel.
        await conn.list_events()
    lines = log_lines(tmp_path)
    assert lines[0] == "open None"
    assert lines[1].startswith("cancel agentwake-stream-")


async def test_the_supervisor_reconnects_a_crashed_server_and_one_terminated_subscription_ends_alone(
    tmp_path: Path,
) -> None:
    crash = push_server(tmp_path, PUSH_ITEMS="20", PUSH_CRASH_AT="7")
    revoked = push_server(tmp_path / "b", PUSH_TERMINATE_AT="2")
    (tmp_path / "b").mkdir()
    cfg = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "servers": {
                "crashy": crash.model_dump(mode="json", exclude_defaults=True),
                "revoking": revoked.model_dump(mode="json", exclude_defaults=True),
            },
            "subscriptions": [
                {"name": "crashy", "server": "crashy", "event": "feed.item", "delivery": "push"},
                {"name": "revoked", "server": "revoking", "event": "feed.item", "delivery": "push"},
            ],
        },
        env={},
    )
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        for sub in cfg.subscriptions:
            await set_cursor(store, subscription_key(sub), "0")
        sleep = SteppedSleep()
        supervisor = Supervisor(cfg, store, sleep=sleep, reconnect_initial_s=0.01)

        async def release_every_wait() -> None:
            while True:
                await sleep.next(limit_s=60)
                sleep.release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            tg.start_soon(release_every_wait)
            with anyio.fail_after(30):
                # The supervisor says when a commit stored new events.
                while len(store.core.event_ids("crashy")) < 20:
                    await supervisor.next_stored()
                await supervisor.wait_ended("revoked")
            tg.cancel_scope.cancel()
        assert store.core.event_ids("crashy") == [f"item-{n}" for n in range(1, 21)]
        rows = {r["subscription"]: r for r in store.core.subscriptions()}
        assert rows["crashy"]["duplicates"] == 0
        assert rows["revoked"]["status"] == "ended" and "revoked" in rows["revoked"]["last_error"]
        assert store.core.event_ids("revoked") == ["item-1", "item-2"]
    finally:
        await store.close()


async def test_lost_notifications_are_detected_and_recovered_from_the_stored_cursor(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small route buffer makes the receive path overrun the loop during a burst.
    monkeypatch.setattr(mcp_streams, "STREAM_BUFFER", 64)
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    sleep = SteppedSleep()
    async with ServerConnection("push", push_server(tmp_path, PUSH_ITEMS="3000")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=sleep, retry_initial_s=0.01)

        async def release_every_wait() -> None:
            while True:
                await sleep.next(limit_s=60)
                sleep.release()

        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run)
            tg.start_soon(release_every_wait)
            await progress.until(lambda: "3000" in progress.cursors, limit_s=60)
            tg.cancel_scope.cancel()
    assert loop.streams > 1  # it noticed the loss and reopened the stream
    assert store.core.event_ids("feed") == [f"item-{n}" for n in range(1, 3001)]  # every one, once


async def test_error_notifications_are_counted_in_the_store(tmp_path: Path, store: Store) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()
    async with ServerConnection("push", push_server(tmp_path, PUSH_ERROR_AT="2")) as conn:
        loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
        await run_loop(loop, progress, lambda: len(store.core.event_ids("feed")) == 5)
    assert store.core.subscriptions()[0]["stream_errors"] == 1


def test_forcing_push_on_a_type_that_does_not_offer_it_is_a_clear_error() -> None:
    sub = feed(name="ticks")
    with pytest.raises(ConfigError, match=r"does not offer 'push' delivery \(it offers poll\)"):
        choose_mode(sub, ["poll"])
    assert choose_mode(feed(delivery="auto"), ["poll", "push"]) == "push"
    assert choose_mode(feed(delivery="auto"), ["poll"]) == "poll"


async def test_catching_up_after_a_few_events_is_not_worth_an_info_line(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="agentwake.delivery.push")
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    progress = Progress()

    class CaughtUp(logging.Handler):
        """The line comes at the first heartbeat with no event since the one before; wake the wait."""

        def emit(self, record: logging.LogRecord) -> None:
            if "stream caught up" in record.getMessage():
                progress("caught up")

    handler = CaughtUp()
    logging.getLogger("agentwake.delivery.push").addHandler(handler)
    try:
        async with ServerConnection("push", push_server(tmp_path, PUSH_SKIPPED="10")) as conn:
            loop = PushLoop(sub, conn, store, on_stored=progress, sleep=SteppedSleep())
            await run_loop(loop, progress, lambda: "caught up" in progress.cursors)
    finally:
        logging.getLogger("agentwake.delivery.push").removeHandler(handler)
    caught_up = [r for r in caplog.records if "stream caught up" in r.getMessage()]
    assert caught_up, "the catch-up is still logged, at DEBUG"
    assert all(r.levelno == logging.DEBUG for r in caught_up)
