"""Timeouts on a coarse grid: those ending in the same tick share one event-loop timer.

asyncio keeps every timer in one heap whose pushes compare ``TimerHandle``s in Python. Ten
thousand subscriptions each arm a timeout per poll (its answer's) or per heartbeat (a stream's
silence) and cancel it soon after: each costs a heap push, and the cancelled ones stay in the
heap until their time. Here a timeout joins the set of its tick (the first of them sets the
loop's timer) and a cancelled one leaves it, at the cost of a set insert and a discard.

A timeout is rounded up to the grid: it never fires sooner than asked, and at most ``tick_s``
(or ``share`` of its delay, for a short one) later. ``for_running_loop()`` is the event loop's
own set of coarse timers; ``agentwake.delivery.ticks.PollTicks`` keeps one of its own.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable
from typing import Any, Final, Protocol

# The grid a timeout's end is rounded up to, at most: a 60 s silence is called at most 0.25 s late.
TICK_S: Final = 0.25
# ... and at most this share of the delay itself: a 100 ms timeout fires at most 1 ms late.
TICK_SHARE: Final = 0.01


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class CoarseTimer:
    """One armed timeout; ``cancel`` takes it out of its tick (it then never fires)."""

    __slots__ = ("args", "callback", "slot", "timers")

    def __init__(
        self,
        timers: CoarseTimers,
        slot: tuple[float, int],
        callback: Callable[..., None],
        args: tuple[Any, ...],
    ) -> None:
        self.timers = timers
        self.slot: tuple[float, int] | None = slot
        self.callback = callback
        self.args = args

    def cancel(self) -> None:
        if self.slot is not None:
            waiting = self.timers._slots.get(self.slot)
            if waiting is not None:
                waiting.discard(self)
            self.slot = None


class CoarseTimers:
    """Coarse timeouts of one event loop (the one running when the first of a tick is armed)."""

    def __init__(self, tick_s: float = TICK_S, share: float = TICK_SHARE) -> None:
        self.tick_s = tick_s
        self.share = share
        self._slots: dict[tuple[float, int], set[CoarseTimer]] = {}

    def call_later(self, delay_s: float, callback: Callable[..., None], *args: Any) -> Cancellable:
        """Call ``callback(*args)`` ``delay_s`` from now, or up to a tick later, unless cancelled first."""
        loop = asyncio.get_running_loop()
        tick = min(self.tick_s, delay_s * self.share)
        if tick <= 0:
            return loop.call_later(max(0.0, delay_s), callback, *args)
        slot = (tick, math.ceil((loop.time() + delay_s) / tick))
        waiting = self._slots.get(slot)
        if waiting is None:
            waiting = self._slots[slot] = set()
            loop.call_at(slot[1] * tick, self._fire, slot)
        timer = CoarseTimer(self, slot, callback, args)
        waiting.add(timer)
        return timer

    @property
    def pending(self) -> int:
        """Timeouts armed and neither fired nor cancelled."""
        return sum(len(waiting) for waiting in self._slots.values())

    def _fire(self, slot: tuple[float, int]) -> None:
        for timer in self._slots.pop(slot, ()):
            timer.slot = None
            timer.callback(*timer.args)


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CoarseTimers] = weakref.WeakKeyDictionary()


def for_running_loop() -> CoarseTimers:
    """The running event loop's coarse timers (made on first use, gone with the loop)."""
    loop = asyncio.get_running_loop()
    timers = _per_loop.get(loop)
    if timers is None:
        timers = _per_loop[loop] = CoarseTimers()
    return timers


__all__ = ["TICK_S", "TICK_SHARE", "Cancellable", "CoarseTimer", "CoarseTimers", "for_running_loop"]
