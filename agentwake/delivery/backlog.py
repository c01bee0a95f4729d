"""The bound on what one subscription may hold undecided: ``[limits] max_undecided_events``.

A server that floods (or an agent that stopped deciding: the model is down, the service is
paused) would otherwise fill the store without end. Past the bound a subscription is *held
back*: its poll loop stops polling, its push stream is closed, and its webhook deliveries are
answered 503 with ``Retry-After``. The server keeps the events and the stored cursor does not
move, so nothing is lost: once the backlog is down to nine tenths of the bound, delivery goes on
from where it stopped.

Counting is cheap on the quiet path: each loop adds what it stored to an estimate, and the store
is asked (a count that stops at the bound) only when the estimate reaches the bound, and while a
subscription is held, at most once per ``recheck_s``. One subscription may go past the bound by
one batch (a poll page, a stream's queued notifications), never more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import anyio

from agentwake import metrics
from agentwake.logs import event_fields
from agentwake.store import Store

logger = logging.getLogger(__name__)

# How often a held subscription's backlog is counted again, and the Retry-After a webhook sender gets.
RECHECK_S: Final = 1.0
RETRY_AFTER_S: Final = 5
HELD_BACK: Final = "held_back"


def resume_at(limit: int) -> int:
    """The backlog a held subscription must be down to before delivery goes on: nine tenths of the
    bound (at least one below it), so that it does not flap at the bound one page at a time."""
    return limit - max(1, limit // 10)


@dataclass
class _Held:
    count: int
    checked_at: float


@dataclass
class Backlog:
    """Per subscription: an estimate of its undecided events, and whether it is held back."""

    store: Store
    limit: int
    recheck_s: float = RECHECK_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    # How many times the store was asked: on the quiet path, never.
    counted: int = field(default=0, init=False)
    _estimates: dict[str, int] = field(default_factory=dict, init=False)
    _held: dict[str, _Held] = field(default_factory=dict, init=False)

    def stored(self, subscription: str, count: int) -> None:
        """``count`` new events of ``subscription`` were stored."""
        if count:
            self._estimates[subscription] = self._estimates.get(subscription, 0) + count

    def held(self, subscription: str) -> bool:
        return subscription in self._held

    def held_subscriptions(self) -> dict[str, int]:
        """The subscriptions held back now, with the backlog last counted."""
        return {name: held.count for name, held in self._held.items()}

    async def over(self, subscription: str) -> bool:
        """Whether ``subscription`` is held back now (the store is asked only near the bound)."""
        held = self._held.get(subscription)
        if held is not None:
            if self.clock() - held.checked_at < self.recheck_s:
                return True
            return not await self._recheck(subscription, held)
        if self._estimates.get(subscription, 0) < self.limit:
            return False
        count = await self._count(subscription)
        if count < self.limit:
            return False
        await self._hold(subscription, count)
        return True

    async def wait_for_room(self, subscription: str) -> None:
        """Return at once while under the bound; else when the backlog is down to ``resume_at``."""
        held_before = subscription in self._held
        if not await self.over(subscription):
            return
        if held_before:  # the loop restarted (and called itself active) while held: say so again
            await self.store.set_state(subscription, status=HELD_BACK, error=self._reason(subscription))
        while True:
            await self.sleep(self.recheck_s)
            if not await self.over(subscription):
                return

    async def _hold(self, subscription: str, count: int) -> None:
        self._held[subscription] = _Held(count, self.clock())
        reason = self._reason(subscription)
        logger.warning(
            "subscription %s: %s", subscription, reason, extra=event_fields(subscription=subscription)
        )
        metrics.observe_held_back(subscription, True)
        await self.store.set_state(subscription, status=HELD_BACK, error=reason)

    async def _count(self, subscription: str) -> int:
        self.counted += 1
        count = await self.store.undecided(subscription, self.limit)
        self._estimates[subscription] = count
        return count

    def _reason(self, subscription: str) -> str:
        count = self._held[subscription].count
        return (
            f"{count} events wait undecided (limits.max_undecided_events={self.limit}); delivery is held"
            " back until the agent has decided some (the server keeps the rest)"
        )

    async def _recheck(self, subscription: str, held: _Held) -> bool:
        """Count again; True if the subscription is let go."""
        count = await self._count(subscription)
        if count > resume_at(self.limit):
            held.count, held.checked_at = count, self.clock()
            return False
        del self._held[subscription]
        logger.info(
            "subscription %s: %d events wait undecided; delivery goes on",
            subscription,
            count,
            extra=event_fields(subscription=subscription),
        )
        metrics.observe_held_back(subscription, False)
        await self.store.set_state(subscription, status="active")
        return True


__all__ = ["HELD_BACK", "RETRY_AFTER_S", "Backlog", "resume_at"]
