"""A subscription with nothing new writes at most every QUIET_WRITE_S.

On a thousand idle subscriptions those writes were most of the idle CPU (bench/soak.py). Nothing
new: no event, or only events the process has seen stored (another subscription's), while the
cursor may move; what waits goes with the next write, or when the loop stops. A batch with a new
event, a gap or a refused event is always written; after an error the next batch is too, so the
error shown in `status` clears as soon as delivery works again.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from _support import SteppedSleep
from conftest import demo_stdio

from agentwake.config import SubscriptionConfig
from agentwake.delivery.common import KnownEvents, QuietWrites, subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.mcp import ServerConnection
from agentwake.store import IncomingEvent
from agentwake.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio


def test_quiet_batches_are_written_once_per_interval_and_after_every_error() -> None:
    now = [100.0]
    quiet = QuietWrites(every_s=120, clock=lambda: now[0])
    assert not quiet.skip()  # never written: write
    quiet.wrote()
    now[0] += 119
    assert quiet.skip()
    now[0] += 1
    assert not quiet.skip()
    quiet.wrote()
    quiet.failed()
    assert not quiet.skip()  # an error since: write, so the error clears


async def test_a_quiet_poll_loop_keeps_polling_without_writing_until_something_happens(
    tmp_path: Path,
) -> None:
    sub = SubscriptionConfig(name="tickets", server="demo", event="ticket.created", poll_floor_ms=20)
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_NEXT_POLL_MS="20")) as conn:
            loop = PollLoop(sub, conn, store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(loop.run)
                with anyio.fail_after(20):
                    while loop.polls < 3:  # noqa: ASYNC110 - the loop has no event for a poll
                        await anyio.sleep(0.01)
                first = store.core.subscriptions()[0]["last_activity_at"]
                start = loop.polls
                with anyio.fail_after(20):
                    while loop.polls < start + 10:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                assert store.core.subscriptions()[0]["last_activity_at"] == first  # ten polls, no write
                # A ticket: written at once.
                from agentwake.demo.store import TicketStore

                tickets = TicketStore(tmp_path / "demo.db")
                tickets.create([("support", "P2", "printer", "", "al@example.com")])
                tickets.close()
                with anyio.fail_after(20):
                    while not store.core.event_ids("tickets"):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        assert store.core.subscriptions()[0]["last_activity_at"] != first
        assert await store.cursor(subscription_key(sub).name) is not None
    finally:
        await store.close()


def test_known_events_keep_the_most_recent_ones() -> None:
    known = KnownEvents(kept=2)
    one, two, three = (
        IncomingEvent(f"e{n}", "ticket.created", "2026-12-03T08:00:00Z", {}) for n in (1, 2, 3)
    )
    known.remember("demo", [one, two])
    assert known.all_known("demo", [one, two])
    assert known.all_known("demo", [])
    assert not known.all_known("other", [one])  # per server
    known.remember("demo", [one, three])  # one is used again: two is now the oldest
    assert known.all_known("demo", [one, three])
    assert not known.all_known("demo", [two])


async def test_an_event_another_subscription_stored_only_moves_the_cursor_and_waits_like_a_quiet_write(
    tmp_path: Path,
) -> None:
    first = SubscriptionConfig(name="first", server="demo", event="ticket.created", poll_floor_ms=20)
    second = SubscriptionConfig(name="second", server="demo", event="ticket.created", poll_floor_ms=20)
    store = await SqliteStore.open(tmp_path / "aw.db")
    known = KnownEvents()
    second_sleep = SteppedSleep()
    try:
        async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_NEXT_POLL_MS="20")) as conn:
            first_loop = PollLoop(first, conn, store, known=known)
            second_loop = PollLoop(second, conn, store, known=known, sleep=second_sleep)
            async with anyio.create_task_group() as tg:
                tg.start_soon(second_loop.run)
                await second_sleep.next()  # its first poll is stored; it waits for its next one
                before = await store.cursor("second")
                tg.start_soon(first_loop.run)
                with anyio.fail_after(20):
                    while first_loop.polls < 2:  # noqa: ASYNC110 - the loop has no event for a poll
                        await anyio.sleep(0.01)
                from agentwake.demo.store import TicketStore

                tickets = TicketStore(tmp_path / "demo.db")
                tickets.create([("support", "P2", "printer", "", "al@example.com")])
                tickets.close()
                with anyio.fail_after(20):
                    while not store.core.event_ids("first"):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                second_sleep.release()
                await second_sleep.next()  # it polled the ticket, already stored by "first"
                assert second_loop.polls == 2
                row = next(r for r in store.core.subscriptions() if r["subscription"] == "second")
                assert (await store.cursor("second"), row["duplicates"]) == (before, 0)  # nothing written
                tg.cancel_scope.cancel()
        # Stopping wrote what waited: the cursor past the ticket, and the duplicate counted.
        row = next(r for r in store.core.subscriptions() if r["subscription"] == "second")
        assert await store.cursor("second") not in (None, before)
        assert row["duplicates"] == 1
        assert store.core.event_ids("second") == []
        assert len(store.core.event_ids("first")) == 1
    finally:
        await store.close()
