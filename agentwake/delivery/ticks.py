"""The wait between two polls of quiet subscriptions, woken together on a coarse grid.

Ten thousand poll loops, each waiting its ``nextPollMs`` on a timer of its own, wake the event
loop a few hundred times a second, one loop at a time. ``PollTicks.sleep`` waits on a coarse
timer (``agentwake.coarse_timers``): its end is rounded up to a grid of at most TICK_S (and at
most TICK_SHARE of the wait, so a short wait is not made much longer), and the loops due in the
same tick share one timer and wake in one pass of the event loop, their polls going out in one
write. A wait never ends sooner than asked, and at most TICK_S (or TICK_SHARE of it) later.
Cancelling the waiting task cancels its wait, as any other.
"""

from __future__ import annotations

import asyncio

from agentwake.coarse_timers import TICK_S, TICK_SHARE, CoarseTimer, CoarseTimers


class PollTicks:
    """Waits that end on a shared grid; one per event loop (the supervisor's)."""

    def __init__(self, tick_s: float = TICK_S, share: float = TICK_SHARE) -> None:
        self.timers = CoarseTimers(tick_s, share)

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or up to a tick longer; always yields to the event loop."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.timers.call_later(seconds, _wake, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    @property
    def waiting(self) -> int:
        """Waits not yet ended."""
        return self.timers.pending

    @property
    def _slots(self) -> dict[tuple[float, int], set[CoarseTimer]]:
        return self.timers._slots


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # cancelled meanwhile
        waiter.set_result(None)
