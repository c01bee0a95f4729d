"""Which process drives each subscription's delivery loop, when several share one PostgreSQL store.

One ``LeaseManager`` per ``agentwake run`` process. Every ``lease_s / 3`` it makes ONE
``Store.hold_subscriptions`` call for all configured subscriptions: it renews the leases it
holds and takes the free or lapsed ones (PostgreSQL's row locks decide a race), and publishes
the result. The supervisor runs each loop inside ``driving(name)``: it waits until this process
holds the subscription, yields the fence every cursor write carries, and cancels the loop as soon
as the lease is lost, either because a round no longer returns it, or because no round succeeded
for ``lease_s * 2/3``: a process cut off from the database stops driving before its lease lapses
and another process takes over. The fence covers the rest: a paused former owner's late cursor
write is refused by the store (``FencedOut``). A clean stop releases the leases, so another
process takes over at its next round instead of after the expiry.

A SQLite store serves one process: ``Unshared`` yields no fence at once and runs nothing, so a
large single-process service costs what it did.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final, Protocol

import anyio
import anyio.abc

from agentwake.clock import iso, utc_now
from agentwake.errors import StoreError
from agentwake.store import Store

logger = logging.getLogger(__name__)

# Rounds per lease: a lease outlives two failed rounds.
ROUNDS_PER_LEASE: Final = 3
# Without a successful round for this share of the lease, stop driving: before the lease lapses,
# with a third of it to spare for clock drift and a loop's last write.
STOP_AFTER: Final = 2 / 3
# How long a clean stop waits to give its leases up (a database out of reach: they lapse instead).
RELEASE_TIMEOUT_S: Final = 5.0


def owner_id() -> str:
    """``host:pid:random``: unique per process, readable in ``status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Ownership(Protocol):
    """What the supervisor asks: drive a subscription only while holding it."""

    shared: bool
    # This process, as leases (and status's driven_by, and /metrics on a shared store) name it.
    owner: str

    def driving(self, name: str) -> AbstractAsyncContextManager[int | None]: ...

    def fenced_out(self, name: str, fence: int) -> None: ...

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...

    async def release(self) -> None: ...


class Unshared:
    """One process per store (SQLite): every subscription is this process's, unfenced, for free."""

    shared = False

    def __init__(self) -> None:
        self.owner = owner_id()

    @asynccontextmanager
    async def driving(self, name: str) -> AsyncIterator[int | None]:
        yield None

    def fenced_out(self, name: str, fence: int) -> None:
        return None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def release(self) -> None:
        return None


@dataclass
class _Slot:
    """One subscription as this process holds it: its fence (None: not held) and the loops driving it."""

    fence: int | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)
    scopes: set[anyio.CancelScope] = field(default_factory=set)

    def set(self, fence: int | None) -> None:
        if fence == self.fence:
            return
        # A lost lease, or one held again after another owner had it (a new fence): the loops go.
        for scope in self.scopes:
            scope.cancel()
        self.fence = fence
        changed, self.changed = self.changed, anyio.Event()
        changed.set()


@dataclass
class LeaseManager:
    """Leases on the subscriptions ``names()`` lists, renewed every ``lease_s / 3`` (see the module)."""

    store: Store
    names: Callable[[], Sequence[str]]
    lease_s: float = 10.0
    owner: str = field(default_factory=owner_id)
    clock: Callable[[], float] = time.monotonic
    shared: bool = field(default=True, init=False)
    rounds: int = field(default=0, init=False)
    _slots: dict[str, _Slot] = field(default_factory=dict, init=False)
    _last_ok: float | None = field(default=None, init=False)
    _failing: bool = field(default=False, init=False)

    @property
    def interval_s(self) -> float:
        return self.lease_s / ROUNDS_PER_LEASE

    @property
    def stop_after_s(self) -> float:
        return self.lease_s * STOP_AFTER

    def held(self) -> dict[str, int]:
        """What this process holds now: {name: fence}."""
        return {name: slot.fence for name, slot in self._slots.items() if slot.fence is not None}

    def _slot(self, name: str) -> _Slot:
        slot = self._slots.get(name)
        if slot is None:
            slot = self._slots[name] = _Slot()
        return slot

    @asynccontextmanager
    async def driving(self, name: str) -> AsyncIterator[int | None]:
        """Wait until this process holds ``name``; its fence. The body is cancelled when the lease is
        lost, and the block then ends quietly: the caller waits in ``driving`` again."""
        slot = self._slot(name)
        while slot.fence is None:
            await slot.changed.wait()
        scope = anyio.CancelScope()
        slot.scopes.add(scope)
        try:
            with scope:
                yield slot.fence
        finally:
            slot.scopes.discard(scope)

    def fenced_out(self, name: str, fence: int) -> None:
        """The store refused a write under ``fence``: another process holds ``name`` now. Not held
        until a round returns it again (else ``driving`` would hand the stale fence straight back)."""
        slot = self._slot(name)
        if slot.fence == fence:
            slot.set(None)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Renew and take leases every ``interval_s`` until cancelled (which releases nothing: see
        ``release``)."""
        task_status.started()
        while True:
            started = self.clock()
            await self.round()
            next_at = started + self.interval_s
            if self._failing and self._last_ok is not None and self.held():
                # Wake at the stop deadline, whatever the interval: a stop must not wait a round.
                next_at = min(next_at, self._last_ok + self.stop_after_s)
            await anyio.sleep(max(0.0, next_at - self.clock()))

    async def round(self) -> None:
        """One renewal: ONE store call for every subscription; the result published to ``driving``."""
        started = self.clock()
        limit = self.lease_s  # a call that hangs is given up, and tried again next round
        if self._last_ok is not None and self.held():
            limit = min(limit, self._last_ok + self.stop_after_s - started)
        names = list(self.names())
        held: dict[str, int] | None = None
        if not names and not self.held():
            held = {}  # nothing to hold: no call
        elif limit > 0:
            wall = utc_now()
            with anyio.move_on_after(limit):
                try:
                    configured = set(names)
                    dropped = [name for name in self.held() if name not in configured]
                    if dropped:  # no longer configured (a reload): another process may take them now
                        await self.store.release_subscriptions(self.owner, dropped)
                    held = await self.store.hold_subscriptions(
                        self.owner, names, iso(wall + timedelta(seconds=self.lease_s)), iso(wall)
                    )
                except StoreError as exc:
                    if not self._failing:
                        logger.warning("could not renew the subscription leases: %s", exc)
                    self._failing = True
        if held is None:
            if (
                self._last_ok is not None
                and self.clock() - self._last_ok >= self.stop_after_s
                and self.held()
            ):
                self._failing = True
                logger.warning(
                    "no lease renewal for %.1fs: this process stops driving its %d subscription(s) before"
                    " their leases lapse; another process takes them over",
                    self.clock() - self._last_ok,
                    len(self.held()),
                )
                self._publish({})
            return
        if self._failing:
            logger.info("subscription leases renewed again")
        self._failing = False
        self._last_ok = started
        self.rounds += 1
        self._publish(held)

    def _publish(self, held: dict[str, int]) -> None:
        for name in sorted(set(self._slots) | set(held)):
            slot = self._slot(name)
            fence = held.get(name)
            if fence is not None and slot.fence is None:
                logger.info("subscription %s: this process drives it now (fence %d)", name, fence)
            elif fence is None and slot.fence is not None:
                logger.info("subscription %s: its lease is lost; this process stops driving it", name)
            slot.set(fence)

    async def release(self) -> None:
        """A clean stop: give every lease up, so another process takes them over at once."""
        held = self.held()
        for slot in self._slots.values():
            slot.set(None)
        if held:
            logger.info(
                "giving up the leases of %d subscription(s) for another process to take over", len(held)
            )
        with anyio.move_on_after(RELEASE_TIMEOUT_S, shield=True):
            try:
                await self.store.release_subscriptions(self.owner)
            except StoreError as exc:
                logger.warning("could not give up the subscription leases (they lapse instead): %s", exc)


def ownership_for(store: Store, names: Callable[[], Sequence[str]], lease_s: float) -> Ownership:
    """Leases for a store several processes may share (``store.shared``), else ``Unshared``."""
    if getattr(store, "shared", False):
        return LeaseManager(store, names, lease_s)
    return Unshared()


__all__ = ["LeaseManager", "Ownership", "Unshared", "owner_id", "ownership_for"]
