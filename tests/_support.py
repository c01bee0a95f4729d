"""Test helpers that are not fixtures."""

from __future__ import annotations

import anyio

from agentwake.store import Store, SubscriptionKey


class SteppedSleep:
    """Stands in for anyio.sleep inside a loop: records each delay and waits for the test to release it."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._taken = 0
        self._released = 0
        self._changed = anyio.Event()

    def _poke(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        mine = len(self.delays)
        self._poke()
        while self._released < mine:
            await self._changed.wait()

    async def next(self, limit_s: float = 20) -> float:
        """Wait until the loop asks to sleep; returns the delay it asked for."""
        with anyio.fail_after(limit_s):
            while len(self.delays) <= self._taken:
                await self._changed.wait()
        self._taken += 1
        return self.delays[self._taken - 1]

    def release(self) -> None:
        self._released += 1
        self._poke()


async def set_cursor(store: Store, key: SubscriptionKey, cursor: str) -> None:
    """Persist a cursor as if an earlier run had reached it."""
    await store.register(key)
    await store.ingest(key, [], cursor)
