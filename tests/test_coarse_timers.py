"""Coarse timeouts (agentwake.coarse_timers): rounded up to a grid, one loop timer per tick."""

from __future__ import annotations

import asyncio

import anyio
import anyio.lowlevel
import pytest

from agentwake import coarse_timers
from agentwake.coarse_timers import CoarseTimers

pytestmark = pytest.mark.anyio


async def test_a_timeout_fires_no_sooner_than_asked_on_the_first_grid_point_after() -> None:
    timers = CoarseTimers(tick_s=0.05, share=1.0)
    fired = anyio.Event()
    loop = asyncio.get_running_loop()
    start = loop.time()
    timers.call_later(0.12, fired.set)
    [(tick, index)] = timers._slots
    # Its loop timer is set for the first grid point at or after the end asked for.
    assert tick == 0.05 and 0.0 <= index * tick - (start + 0.12) < 0.05
    with anyio.fail_after(10):
        await fired.wait()
    assert loop.time() - start >= 0.12
    assert timers.pending == 0 and not timers._slots


async def test_timeouts_due_in_one_tick_share_one_loop_timer_and_a_cancelled_one_never_fires() -> None:
    timers = CoarseTimers(tick_s=0.2, share=1.0)
    loop = asyncio.get_running_loop()
    scheduled = len(loop._scheduled)  # type: ignore[attr-defined]
    fired: list[int] = []
    all_fired = anyio.Event()

    def fire(n: int) -> None:
        fired.append(n)
        if len(fired) == 999:
            all_fired.set()

    armed = [timers.call_later(0.3, fire, n) for n in range(1000)]
    assert len(loop._scheduled) - scheduled <= 2  # type: ignore[attr-defined]  # a tick boundary may fall between
    assert timers.pending == 1000
    armed[500].cancel()
    armed[500].cancel()  # twice: still nothing
    assert timers.pending == 999
    with anyio.fail_after(10):
        await all_fired.wait()
    assert sorted(fired) == [n for n in range(1000) if n != 500]


async def test_a_short_timeout_is_rounded_by_a_share_of_itself_only() -> None:
    timers = CoarseTimers(tick_s=10.0, share=0.01)
    fired = anyio.Event()
    timers.call_later(0.05, fired.set)
    with anyio.fail_after(5):  # a 10 s tick would be far past this
        await fired.wait()


async def test_a_zero_delay_fires_at_once_and_can_be_cancelled() -> None:
    timers = CoarseTimers()
    fired: list[str] = []
    done = anyio.Event()

    def now() -> None:
        fired.append("now")
        done.set()

    timers.call_later(0, fired.append, "never").cancel()
    timers.call_later(0, now)
    with anyio.fail_after(5):
        await done.wait()
    # Both were due in the same pass of the loop: the cancelled one would have run by now.
    assert fired == ["now"]


def test_each_event_loop_has_timers_of_its_own() -> None:
    async def mine() -> CoarseTimers:
        first = coarse_timers.for_running_loop()
        assert coarse_timers.for_running_loop() is first
        return first

    assert anyio.run(mine) is not anyio.run(mine)
