"""The wait between two polls of quiet subscriptions, woken together on a coarse grid.

Ten thousand poll loops, each waiting its ``nextPollMs`` on a timer of its own, wake the event
loop a few hundred times a second, one loop at a time. ``PollTicks.sleep`` rounds a wait's end
up to a grid of at most TICK_S (and at most TICK_SHARE of the wait, so a short wait is not made
much longer): the loops due in the same tick share one timer and wake in one pass of the event
loop, their polls going out in one write. A wait never ends sooner than asked, and at most
TICK_S (or TICK_SHARE of it) later. Cancelling the waiting task cancels its wait, as any other.
"""

from __future__ import annotations

import asyncio
import math
from typing import Final

# The grid a wait's end is rounded up to, at most: a poll every 30 s goes out up to 0.25 s later.
TICK_S: Final = 0.25
# ... and at most this share of the wait itself: a 100 ms wait ends at most 1 ms later.
TICK_SHARE: Final = 0.01


class PollTicks:
    """Waits that end on a shared grid; one per event loop (the supervisor's)."""

    def __init__(self, tick_s: float = TICK_S, share: float = TICK_SHARE) -> None:
        self.tick_s = tick_s
        self.share = share
        self._slots: dict[tuple[float, int], list[asyncio.Future[None]]] = {}

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or up to a tick longer; always yields to the event loop."""
        loop = asyncio.get_running_loop()
        tick = min(self.tick_s, seconds * self.share)
        waiter: asyncio.Future[None] = loop.create_future()
        if tick <= 0:
            loop.call_later(max(0.0, seconds), _wake, waiter)
            await waiter
            return
        end = loop.time() + seconds
        slot = (tick, math.ceil(end / tick))
        waiters = self._slots.get(slot)
        if waiters is None:
            waiters = self._slots[slot] = []
            loop.call_at(slot[1] * tick, self._ring, slot)
        waiters.append(waiter)
        await waiter

    @property
    def waiting(self) -> int:
        """Waits not yet ended (cancelled ones included until their tick)."""
        return sum(len(waiters) for waiters in self._slots.values())

    def _ring(self, slot: tuple[float, int]) -> None:
        for waiter in self._slots.pop(slot, ()):
            _wake(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # cancelled meanwhile
        waiter.set_result(None)
