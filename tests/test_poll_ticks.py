"""The wait between polls (agentwake.delivery.ticks) and a stream route's bounded wait."""

from __future__ import annotations

import anyio
import pytest

from agentwake.delivery.ticks import PollTicks
from agentwake.streams import StreamRoute

pytestmark = pytest.mark.anyio


async def test_a_wait_never_ends_sooner_than_asked_and_at_most_a_tick_later() -> None:
    ticks = PollTicks(tick_s=0.05, share=1.0)
    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticks.sleep, 0.12)
        await anyio.lowlevel.checkpoint()
        # Its timer is set for the first grid point at or after the end asked for: how late the loop
        # itself then runs (a busy machine) is not the grid's doing, so it is not measured.
        [(tick, index)] = ticks._slots
        assert 0.0 <= index * tick - (start + 0.12) < 0.05 + 0.25  # + the task's own start
    waited = anyio.current_time() - start
    assert waited >= 0.12
    assert ticks.waiting == 0


async def test_waits_due_in_the_same_tick_wake_together_on_one_timer() -> None:
    ticks = PollTicks(tick_s=0.2, share=1.0)
    ended: list[float] = []

    async def wait(seconds: float) -> None:
        await ticks.sleep(seconds)
        ended.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        for seconds in (0.3, 0.31, 0.32):
            tg.start_soon(wait, seconds)
        await anyio.lowlevel.checkpoint()
        assert ticks.waiting == 3
        assert len(ticks._slots) <= 2  # one slot, or two if a tick boundary fell in between
    assert len(ended) == 3
    assert max(ended) - min(ended) < 0.2


async def test_a_short_wait_is_rounded_by_a_share_of_itself_only() -> None:
    ticks = PollTicks(tick_s=10.0, share=0.01)
    with anyio.fail_after(5):  # a 10 s tick would be far past this
        await ticks.sleep(0.05)


async def test_a_cancelled_wait_ends_at_once_and_the_others_still_wake() -> None:
    ticks = PollTicks(tick_s=0.05, share=1.0)
    woke = anyio.Event()

    async def other() -> None:
        await ticks.sleep(0.1)
        woke.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        with anyio.move_on_after(0.01) as scope:
            await ticks.sleep(0.1)
        assert scope.cancelled_caught
        with anyio.fail_after(5):
            await woke.wait()


async def test_a_route_wait_says_whether_a_notification_came_or_the_time_ran_out() -> None:
    route = StreamRoute("r1", capacity=10)
    assert await route.wait(0.01) is False

    async def offer() -> None:
        await anyio.lowlevel.checkpoint()
        route.offer("notifications/events/heartbeat", {"cursor": "c1"})

    async with anyio.create_task_group() as tg:
        tg.start_soon(offer)
        with anyio.fail_after(5):
            assert await route.wait(60) is True
    assert await route.wait(0.01) is True  # queued already: no wait at all
    route.close()
