"""A subscription with nothing new writes at most every QUIET_WRITE_S, together with the others.

On a thousand idle subscriptions those writes were most of the idle CPU (bench/soak.py). Nothing
new: no event, or only events the process has seen stored (another subscription's), while the
cursor may move; what waits goes with the next write, or when the loop stops. A batch with a new
event, a gap or a refused event is always written; after an error the next batch is too, so the
error shown in `status` clears as soon as delivery works again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from _stores import backend_fixture, store_fixture  # noqa: F401 - the fixtures backend, store
from _support import SteppedSleep
from conftest import demo_stdio

from agentwake.config import SubscriptionConfig
from agentwake.delivery.common import DeferredWrites, KnownEvents, QuietFlusher, QuietWrites, subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.mcp import ServerConnection
from agentwake.store import HeldBatch, IncomingEvent, IngestResult, Store, SubscriptionKey
from agentwake.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio


def test_a_loop_writes_its_first_batch_after_a_start_and_after_every_error() -> None:
    quiet = QuietWrites()
    assert not quiet.wrote_since_start  # never written: write
    quiet.wrote()
    assert quiet.wrote_since_start
    quiet.failed()
    assert not quiet.wrote_since_start  # an error since: write, so the error clears


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


# ---- the flusher: what quiet loops held back, written together -----------------------------------


def key_of(name: str) -> SubscriptionKey:
    return SubscriptionKey(name, "demo", "ticket.created", {})


def ticket(n: int) -> IncomingEvent:
    return IncomingEvent(f"T-{n}", "ticket.created", "2026-12-03T08:00:00Z", {"n": n})


async def test_held_batches_are_written_in_one_transaction_each_under_its_own_fence(
    store: Store,
) -> None:
    names = ["a", "b", "c"]
    for name in names:
        await store.register(key_of(name))
        await store.ingest(key_of(name), [ticket(1)] if name == "a" else [], "1")
    fences = await store.hold_subscriptions(
        "me", names, "2999-01-01T00:00:00.000Z", "2026-01-01T00:00:00.000Z"
    )
    results = await store.ingest_held(
        [
            HeldBatch(key_of("a"), [], "7", fences["a"]),
            HeldBatch(key_of("b"), [ticket(1)], "8", fences["b"] + 1),  # a fence it no longer holds
            HeldBatch(key_of("c"), [ticket(1)], "9", None),
        ]
    )
    assert results == [IngestResult(0, 0), None, IngestResult(0, 1)]
    assert [await store.cursor(name) for name in names] == ["7", "1", "9"]
    rows = {row["subscription"]: row for row in await store.subscriptions()}
    assert (rows["b"]["duplicates"], rows["c"]["duplicates"]) == (0, 1)
    assert await store.event_ids("a") == ["T-1"]
    assert await store.ingest_held([]) == []
    # Unfenced, and one event new to the store in two batches: the first batch stores it.
    assert await store.ingest_held(
        [HeldBatch(key_of("b"), [ticket(2)], "10"), HeldBatch(key_of("c"), [ticket(2)], "11")]
    ) == [IngestResult(1, 0), IngestResult(0, 1)]
    assert [await store.cursor(name) for name in ("b", "c")] == ["10", "11"]


class CountingStore(SqliteStore):
    """Counts the cursor writes: each loop's own, and the flusher's."""

    ingests = 0
    held: list[int]

    async def ingest(self, *args: Any, **kwargs: Any) -> IngestResult:
        self.ingests += 1
        return await super().ingest(*args, **kwargs)

    async def ingest_held(self, batches: Sequence[HeldBatch]) -> list[IngestResult | None]:
        self.held.append(len(batches))
        return await super().ingest_held(batches)


async def test_quiet_loops_write_nothing_themselves_and_the_flusher_writes_them_all_at_once(
    tmp_path: Path,
) -> None:
    subs = [
        SubscriptionConfig(name=f"s{n}", server="demo", event="ticket.created", poll_floor_ms=20)
        for n in range(3)
    ]
    store = await CountingStore.open(tmp_path / "aw.db")
    store.held = []
    flusher = QuietFlusher(store, every_s=0.5)
    try:
        async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_NEXT_POLL_MS="20")) as conn:
            loops = [PollLoop(sub, conn, store, flusher=flusher) for sub in subs]
            async with anyio.create_task_group() as tg:
                flusher.spawn_in(tg)
                for loop in loops:
                    tg.start_soon(loop.run)
                with anyio.fail_after(20):
                    while not store.held:  # noqa: ASYNC110 - the flusher's timer runs in the group
                        await anyio.sleep(0.01)
                # Each loop wrote its first batch itself; every quiet one after it waited for the flusher.
                assert store.ingests == 3
                assert store.held[0] == 3
                assert all(loop.polls >= 2 for loop in loops)
                tg.cancel_scope.cancel()
    finally:
        await store.close()


class GatedStore(SqliteStore):
    """Its flusher's write waits at a gate: the write of a loop's own comes in meanwhile."""

    gate: anyio.Event
    entered: anyio.Event

    async def ingest_held(self, batches: Sequence[HeldBatch]) -> list[IngestResult | None]:
        self.entered.set()
        await self.gate.wait()
        return await super().ingest_held(batches)


async def test_a_loops_own_write_waits_for_the_flushers_so_its_newer_cursor_is_the_one_kept(
    tmp_path: Path,
) -> None:
    store = await GatedStore.open(tmp_path / "aw.db")
    store.gate, store.entered = anyio.Event(), anyio.Event()
    key = key_of("tickets")
    await store.register(key)
    flusher = QuietFlusher(store, every_s=3600)
    writes = DeferredWrites(KnownEvents(), flusher)
    try:
        async with anyio.create_task_group() as tg:
            flusher.spawn_in(tg)
            writes.quiet.wrote()
            assert writes.can_wait(key, [], "5", gap=False, fence=None)
            tg.start_soon(flusher.flush)
            await store.entered.wait()  # the flusher has "5" and is writing it
            own_write_done = anyio.Event()

            async def own_write() -> None:
                events, held_cursor, held = await writes.take([ticket(1)])
                assert (events, held_cursor, held) == ([ticket(1)], None, 0)  # handed to the flusher
                await store.ingest(key, events, "9")
                own_write_done.set()

            tg.start_soon(own_write)
            with anyio.move_on_after(0.2):
                await own_write_done.wait()
            assert not own_write_done.is_set()  # it waits for the flusher's write
            store.gate.set()
            with anyio.fail_after(10):
                await own_write_done.wait()
        assert await store.cursor("tickets") == "9"
    finally:
        await store.close()


async def test_the_flushers_timer_runs_only_while_something_waits(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "aw.db")
    flusher = QuietFlusher(store, every_s=3600)
    writes = DeferredWrites(KnownEvents(), flusher)
    writes.quiet.wrote()
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                flusher.spawn_in(tg)
                assert writes.can_wait(key_of("tickets"), [], "5", gap=False, fence=None)
                # Written by the loop itself: nothing waits, and the group ends without waiting an hour.
                await writes.take([])
        assert not QuietFlusher(store).can_hold  # never spawned: nothing is held back
    finally:
        await store.close()


def test_known_events_keeps_at_least_the_most_recent_kept_and_forgets_what_is_older() -> None:
    known = KnownEvents(kept=100)

    def events(first: int, count: int) -> list[IncomingEvent]:
        return [IncomingEvent(f"e-{n}", "t", "2026-01-01T00:00:00Z", {}) for n in range(first, first + count)]

    for first in range(0, 1000, 30):  # batches of 30: generations turn over mid-way, many times
        known.remember("s", events(first, 30))
    assert known.all_known("s", events(1020 - 100, 100))  # the 100 most recent, whatever the turns
    assert not known.all_known("s", events(0, 1))  # long forgotten
    assert not known.all_known("other", events(1000, 1))  # known per server
    known.remember("s", events(5000, 250))  # a batch bigger than kept: all of it is known
    assert known.all_known("s", events(5000, 250))
    for _ in range(50):  # overlapping subscriptions remember the same events: they count once
        known.remember("s", events(9000, 10))
    assert known.all_known("s", events(5000 + 250 - 90, 90))
