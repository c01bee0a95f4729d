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

Balance. The processes find each other in the same table: each round also holds the process's
own row (``@owner``), and rows for the servers it cannot reach (``!owner server since``) or has not
reached yet (``?owner server``). ``plan_round``, a pure function of that table, decides the rest:
a process's share is ceil(subscriptions / live processes able to drive any); one over its share
gives the excess back (its loops stopped first, then the leases released: the fence makes the
handover safe, and the taker starts from the stored cursor) but only while another able process
is below its share, which is what keeps it from flapping; one under its share takes free ones, and
a free one nobody else below its share could drive is taken by any able process.

Health. The supervisor says when a server is reached and when it cannot be (``server_reached``,
``server_unreachable``) and when a loop fails (``loop_failed``). A process does not take the
subscriptions of a server it cannot reach, or has not reached yet, while another live process can
drive them; it gives back the ones it holds there after GIVE_BACK_LEASES lease periods of failure
(at once if it never reached the server), and those of a loop failing that long. With nobody
better, it keeps them: a single process behaves as before.

Pinning. ``pinned`` (``[store] drive``: names or globs) makes this process drive exactly the
subscriptions it matches, all it can get, with no share and no give-back: give every process a
``drive`` list to pin them all.

A SQLite store serves one process: ``Unshared`` yields no fence at once and runs nothing, so a
large single-process service costs what it did.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
import random
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Protocol

import anyio
import anyio.abc

from agentwake.clock import iso, utc_now
from agentwake.errors import StoreError
from agentwake.logs import event_fields
from agentwake.store import Store
from agentwake.store.sqlite.owners import ALIVE, UNREACHABLE, UNREACHED, is_process_row

logger = logging.getLogger(__name__)

# Rounds per lease: a lease outlives two failed rounds.
ROUNDS_PER_LEASE: Final = 3
# Without a successful round for this share of the lease, stop driving: before the lease lapses,
# with a third of it to spare for clock drift and a loop's last write.
STOP_AFTER: Final = 2 / 3
# How long a clean stop waits to give its leases up (a database out of reach: they lapse instead).
RELEASE_TIMEOUT_S: Final = 5.0
# A server out of reach (or a loop failing) this many lease periods: its subscriptions go back, for a
# process that can drive them, if there is one.
GIVE_BACK_LEASES: Final = 3
# How long a handed-over subscription's loops may take to stop before its lease is released anyway
# (the fence refuses a late write all the same).
HANDOVER_STOP_S: Final = 5.0


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

    def drives(self, name: str) -> bool: ...

    def server_reached(self, server: str) -> None: ...

    def server_unreachable(self, server: str) -> None: ...

    def loop_failed(self, name: str) -> None: ...

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

    def drives(self, name: str) -> bool:
        return True

    def server_reached(self, server: str) -> None:
        return None

    def server_unreachable(self, server: str) -> None:
        return None

    def loop_failed(self, name: str) -> None:
        return None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def release(self) -> None:
        return None


@dataclass(frozen=True)
class Peer:
    """Another live process, as the lease table shows it: what it holds, the servers it cannot drive."""

    owner: str
    held: frozenset[str] = frozenset()
    cannot: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    """One round's decision: the leases to renew, to take, and to give back (loops stopped first)."""

    keep: frozenset[str]
    take: frozenset[str]
    release: frozenset[str]
    share: int
    peers: tuple[Peer, ...] = ()


def peers_of(rows: Sequence[Mapping[str, object]], now: str, me: str) -> tuple[dict[str, str], list[Peer]]:
    """The lease table read: {subscription: owner} of the live leases, and the other live processes."""
    leases: dict[str, str] = {}
    alive: set[str] = set()
    cannot: dict[str, set[str]] = {}
    for row in rows:
        name, owner, until = str(row["subscription"]), str(row["owner"]), str(row["lease_until"])
        if until <= now:
            continue  # lapsed or released: free, or a process gone
        if not is_process_row(name):
            leases[name] = owner
        elif name[0] == ALIVE:
            alive.add(owner)
        elif " " in name:
            cannot.setdefault(owner, set()).add(name[1:].split(" ")[1])
    held: dict[str, set[str]] = {}
    for name, owner in leases.items():
        held.setdefault(owner, set()).add(name)
    peers = [
        Peer(owner, frozenset(held.get(owner, ())), frozenset(cannot.get(owner, ())))
        for owner in sorted(alive - {me})
    ]
    return leases, peers


def plan_round(
    me: str,
    names: Sequence[str],
    rows: Sequence[Mapping[str, object]],
    now: str,
    *,
    held: Collection[str],
    server_of: Callable[[str], str | None] = lambda name: None,
    unwanted: Collection[str] = (),
    avoid: Collection[str] = (),
    long_free: Collection[str] = (),
    pinned: Sequence[str] | None = None,
    rng: random.Random | None = None,
) -> Plan:
    """Which of ``names`` this process (``me``, holding ``held``) renews, takes and gives back, from
    the lease table's ``rows`` at ``now``.

    share = ceil(len(names) / the live processes able to drive any of them). Over it, give back the
    excess, but only as much as able processes below their share lack (no flapping). Under it,
    take free ones up to it; beyond it, a free one that no able process below its share could take
    (or that stayed free for ``long_free``). ``unwanted`` (a server out of reach too long, a loop
    failing) goes back, and ``avoid`` (a server not reached) is not taken, while another live
    process can drive them. ``pinned``: exactly the matching names, all of them, no share.
    """
    rng = rng or random.Random()
    listed = sorted(set(names))
    leases, peers = peers_of(rows, now, me)
    mine = {name for name in held if name in set(listed)}
    free = [name for name in listed if name not in mine and leases.get(name, me) == me]
    if pinned is not None:
        allowed = {name for name in listed if any(fnmatch.fnmatchcase(name, pattern) for pattern in pinned)}
        return Plan(
            frozenset(mine & allowed), frozenset(set(free) & allowed), frozenset(mine - allowed), len(allowed)
        )

    def can(peer: Peer, name: str) -> bool:
        return server_of(name) not in peer.cannot

    counts = {peer.owner: len(peer.held & set(listed)) for peer in peers}
    able = [peer for peer in peers if any(can(peer, name) for name in listed)]
    me_able = any(name not in avoid for name in listed)
    share = math.ceil(len(listed) / max(1, len(able) + me_able)) if listed else 0

    def others_can(name: str, below_share: bool = False) -> bool:
        return any(can(peer, name) and (not below_share or counts[peer.owner] < share) for peer in able)

    give = {name for name in mine if name in unwanted and others_can(name)}
    keep = mine - give
    release = set(give)
    excess = len(keep) - share
    if excess > 0:
        lacking = sum(share - counts[peer.owner] for peer in able if counts[peer.owner] < share)
        candidates = sorted(name for name in keep if others_can(name, below_share=True))
        rng.shuffle(candidates)
        handed = set(candidates[: min(excess, lacking)])
        keep -= handed
        release |= handed
    takeable = [name for name in free if name not in avoid or not others_can(name)]
    rng.shuffle(takeable)
    room = max(0, share - len(keep))
    take = set(takeable[:room])
    take |= {
        name
        for name in takeable[room:]
        if not others_can(name, below_share=True) or (name in long_free and name not in avoid)
    }
    return Plan(frozenset(keep), frozenset(take), frozenset(release), share, tuple(peers))


@dataclass
class _Slot:
    """One subscription as this process holds it: its fence (None: not held) and the loops driving it."""

    fence: int | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)
    scopes: set[anyio.CancelScope] = field(default_factory=set)
    emptied: anyio.Event = field(default_factory=anyio.Event)

    def leave(self, scope: anyio.CancelScope) -> None:
        self.scopes.discard(scope)
        if not self.scopes:
            emptied, self.emptied = self.emptied, anyio.Event()
            emptied.set()

    async def stopped(self) -> None:
        """Return once no loop runs inside ``driving`` for this subscription."""
        while self.scopes:
            await self.emptied.wait()

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
    # {subscription: its server}, for the health reports below (a name not in it: always reachable).
    servers: Callable[[], Mapping[str, str]] = dict
    # [store] drive: the names (or globs) this process drives, all of them; None: its share of all.
    pinned: Sequence[str] | None = None
    shared: bool = field(default=True, init=False)
    rounds: int = field(default=0, init=False)
    # The last round's plan: share and the other live processes (for tests, logs and benches).
    plan: Plan | None = field(default=None, init=False)
    _slots: dict[str, _Slot] = field(default_factory=dict, init=False)
    _last_ok: float | None = field(default=None, init=False)
    _failing: bool = field(default=False, init=False)
    # Health, as the supervisor reports it: servers ever reached; those out of reach, since when
    # (wall time for status, clock for the bound); loops failing (first, last failure); names given
    # back for a failing loop, not taken again before a time while another process can drive them.
    _reached: set[str] = field(default_factory=set, init=False)
    _down: dict[str, tuple[str, float]] = field(default_factory=dict, init=False)
    _loop_failures: dict[str, tuple[float, float]] = field(default_factory=dict, init=False)
    _avoid_until: dict[str, float] = field(default_factory=dict, init=False)
    # Rounds in a row each name was seen free; the process rows held last round.
    _free_rounds: dict[str, int] = field(default_factory=dict, init=False)
    _marks: set[str] = field(default_factory=set, init=False)

    @property
    def interval_s(self) -> float:
        return self.lease_s / ROUNDS_PER_LEASE

    @property
    def stop_after_s(self) -> float:
        return self.lease_s * STOP_AFTER

    @property
    def give_back_s(self) -> float:
        return self.lease_s * GIVE_BACK_LEASES

    # ---- health, as the supervisor reports it -------------------------------------------------

    def drives(self, name: str) -> bool:
        """Whether this process holds ``name`` now (so its errors are this process's to record)."""
        return self._slot(name).fence is not None

    def server_reached(self, server: str) -> None:
        """A connection to ``server`` is open: this process can drive its subscriptions."""
        if self._down.pop(server, None) is not None:
            logger.info("server %s reached again: this process takes its share of its subscriptions", server)
        self._reached.add(server)

    def server_unreachable(self, server: str) -> None:
        """A connection to ``server`` failed; its subscriptions go back after ``give_back_s`` of this
        (at once if it was never reached) while another live process can drive them."""
        self._down.setdefault(server, (iso(utc_now()), self.clock()))

    def loop_failed(self, name: str) -> None:
        """``name``'s loop failed; one failing for ``give_back_s`` goes back (see the module)."""
        now = self.clock()
        first, last = self._loop_failures.get(name, (now, now))
        if now - last > self.give_back_s * 2:
            first = now  # a new run of failures
        self._loop_failures[name] = (first, now)

    def _health(
        self, names: Sequence[str], server_of: Mapping[str, str]
    ) -> tuple[set[str], set[str], set[str]]:
        """The names to give back, those not to take, and this process's rows about its servers."""
        now = self.clock()
        servers = {server_of[name] for name in names if name in server_of}
        cannot = {server for server in servers if server in self._down or server not in self._reached}
        gone = {
            server
            for server in cannot
            if server not in self._reached or now - self._down[server][1] >= self.give_back_s
        }
        unwanted = {name for name in names if server_of.get(name) in gone}
        for name, (first, last) in list(self._loop_failures.items()):
            if now - last > self.give_back_s * 2:
                del self._loop_failures[name]
            elif now - first >= self.give_back_s:
                unwanted.add(name)
        avoid = {name for name in names if server_of.get(name) in cannot}
        for name, until in list(self._avoid_until.items()):
            if until > now:
                avoid.add(name)
            else:
                del self._avoid_until[name]
        marks = {
            f"{UNREACHABLE}{self.owner} {server} {self._down[server][0]}"
            if server in self._down
            else f"{UNREACHED}{self.owner} {server}"
            for server in cannot
        }
        return unwanted, avoid, marks

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
            slot.leave(scope)

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
                    held = await self._hold(names, wall)
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

    async def _hold(self, names: list[str], wall: datetime) -> dict[str, int]:
        """The round's store calls: read the table, plan, hand back (loops stopped first), hold."""
        now = iso(wall)
        configured = set(names)
        held = self.held()
        server_of = dict(self.servers())
        unwanted, avoid, marks = self._health(names, server_of)
        rows = await self.store.subscription_owners(processes=True)
        leases, _ = peers_of(rows, now, self.owner)
        for name in names:
            self._free_rounds[name] = self._free_rounds.get(name, 0) + 1 if name not in leases else 0
        long_free = {name for name in names if self._free_rounds.get(name, 0) > ROUNDS_PER_LEASE}
        plan = plan_round(
            self.owner,
            names,
            rows,
            now,
            held=held,
            server_of=server_of.get,
            unwanted=unwanted,
            avoid=avoid,
            long_free=long_free,
            pinned=self.pinned,
        )
        self.plan = plan
        # No longer configured (a reload), handed over, or a row about a server no longer true.
        dropped = {name for name in held if name not in configured} | set(plan.release)
        if plan.release:
            self._hand_over(plan, unwanted)
            with anyio.move_on_after(HANDOVER_STOP_S):
                for name in sorted(plan.release):
                    await self._slot(name).stopped()
        if self.pinned is None:
            marks.add(f"{ALIVE}{self.owner}")  # pinned: not counted in anyone's share
        stale = self._marks - marks
        if dropped or stale:
            await self.store.release_subscriptions(self.owner, sorted(dropped | stale))
        self._marks = marks
        return {
            name: fence
            for name, fence in (
                await self.store.hold_subscriptions(
                    self.owner,
                    sorted(plan.keep | plan.take | marks),
                    iso(wall + timedelta(seconds=self.lease_s)),
                    now,
                )
            ).items()
            if not is_process_row(name)
        }

    def _hand_over(self, plan: Plan, unwanted: set[str]) -> None:
        """Stop the loops of what this process gives back, saying why."""
        failing = plan.release & unwanted
        if failing:
            logger.warning(
                "this process cannot drive %d subscription(s) (server out of reach, or the loop keeps"
                " failing): giving them back for another process to take: %s",
                len(failing),
                ", ".join(sorted(failing)),
            )
            for name in failing:
                self._avoid_until[name] = self.clock() + self.give_back_s
                self._loop_failures.pop(name, None)
        balanced = plan.release - unwanted
        if balanced:
            logger.info(
                "over this process's share (%d of %d live processes): handing %d subscription(s) over: %s",
                plan.share,
                len(plan.peers) + 1,
                len(balanced),
                ", ".join(sorted(balanced)),
            )
        for name in plan.release:
            self._slot(name).set(None)

    def _publish(self, held: dict[str, int]) -> None:
        for name in sorted(set(self._slots) | set(held)):
            slot = self._slot(name)
            fence = held.get(name)
            if fence is not None and slot.fence is None:
                logger.info(
                    "subscription %s: this process drives it now (fence %d)",
                    name,
                    fence,
                    extra=event_fields(subscription=name),
                )
            elif fence is None and slot.fence is not None:
                logger.info(
                    "subscription %s: its lease is lost; this process stops driving it",
                    name,
                    extra=event_fields(subscription=name),
                )
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


def ownership_for(
    store: Store,
    names: Callable[[], Sequence[str]],
    lease_s: float,
    *,
    servers: Callable[[], Mapping[str, str]] = dict,
    pinned: Sequence[str] | None = None,
) -> Ownership:
    """Leases for a store several processes may share (``store.shared``), else ``Unshared``."""
    if getattr(store, "shared", False):
        return LeaseManager(store, names, lease_s, servers=servers, pinned=pinned)
    return Unshared()


__all__ = ["LeaseManager", "Ownership", "Peer", "Plan", "Unshared", "owner_id", "ownership_for", "plan_round"]
