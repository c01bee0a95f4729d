"""What the delivery loops share: the subscription key, their retry pacing and progress cadence."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from operator import attrgetter
from typing import Final

import anyio

from agentwake.config import SubscriptionConfig
from agentwake.errors import StoreError
from agentwake.logs import event_fields
from agentwake.store import HeldBatch, IncomingEvent, Store, SubscriptionKey
from agentwake.text import peer

# A failed request or a dropped stream is tried again after backoff_s(failures, RETRY_INITIAL_S, RETRY_MAX_S).
RETRY_INITIAL_S: Final = 0.5
RETRY_MAX_S: Final = 30.0
# A server's cursor in a log line, at most (it is stored and sent back whole).
CURSOR_SHOWN: Final = 120
# A cursor longer than this is not one: the page is malformed.
MAX_CURSOR_CHARS: Final = 4096
# A long backlog is reported every this many events.
PROGRESS_EVERY: Final = 10_000
# What quiet subscriptions held back (see DeferredWrites) is written together this often.
QUIET_WRITE_S: Final = 120.0
# Events a process remembers as stored (see KnownEvents), and how many a loop may hold back.
KNOWN_EVENTS_KEPT: Final = 4096
HELD_EVENTS_MAX: Final = 256
# How long a stopping loop may take to write what it held back.
SAVE_ON_EXIT_S: Final = 5.0

Sleep = Callable[[float], Awaitable[None]]
logger = logging.getLogger(__name__)


def subscription_key(sub: SubscriptionConfig) -> SubscriptionKey:
    return SubscriptionKey(sub.name, sub.server, sub.event, dict(sub.arguments))


def shown_cursor(cursor: object, limit: int = CURSOR_SHOWN) -> str:
    """A position for a log line: "cursor <value>", or, for a null one, words (never Python's None)."""
    if cursor is None:
        return "the server's current position (it gave no cursor)"
    return f"cursor {peer(cursor, limit)}"


# A subscription whose requests keep failing is shown as stalled after this many failures in a row.
STALLED_AFTER_FAILURES: Final = 3
# A repeated warning (a gap per poll, a refused event per page) is logged at most this often.
SUMMARY_INTERVAL_S: Final = 60.0


@dataclass(slots=True)
class Summary:
    """A warning a peer can make us repeat: logged the first time, then counted and summarised
    at most once per SUMMARY_INTERVAL_S, so a server cannot flood the log."""

    interval_s: float = SUMMARY_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    _last: float | None = field(default=None, init=False)
    _since: int = field(default=0, init=False)

    def note(self, log: logging.Logger, message: str) -> None:
        now = self.clock()
        if self._last is None or now - self._last >= self.interval_s:
            more = f" ({self._since} more like it since the last report)" if self._since else ""
            log.warning("%s%s", message, more)
            self._last, self._since = now, 0
        else:
            self._since += 1


@dataclass(slots=True)
class QuietWrites:
    """Whether a loop has written since it started or last failed.

    Until it has, every batch is written, quiet or not: the first write says the subscription is
    active, and after an error shown in ``status`` it clears the error as soon as delivery works.
    """

    _written: bool = False

    @property
    def wrote_since_start(self) -> bool:
        return self._written

    def wrote(self) -> None:
        self._written = True

    def failed(self) -> None:
        """An error was recorded: the next batch is written, whatever it holds."""
        self._written = False


class KnownEvents:
    """The events this process has seen committed to its store: at least the KNOWN_EVENTS_KEPT most
    recent (at most twice as many).

    Subscriptions that overlap all receive an event the inbox stores once. For the others, a
    batch made only of known events moves nothing but their cursor, so its write can wait like a
    quiet batch's: after a crash, replaying from the older stored cursor delivers only duplicates.
    One per store (a process may run several), shared by its loops. Two generations of sets: the
    young one takes what is remembered and, once ``kept`` large, becomes the old one (the one before
    it is forgotten), so remembering a drain's thousands of events a second costs a set insert each.
    """

    def __init__(self, kept: int = KNOWN_EVENTS_KEPT) -> None:
        self.kept = kept
        # Event ids by (server, event name): a batch is one type's, so its ids go in at C speed.
        self._young: dict[tuple[str, str], set[str]] = {}
        self._old: dict[tuple[str, str], set[str]] = {}
        self._young_count = 0

    def all_known(self, server: str, events: Sequence[IncomingEvent]) -> bool:
        young, old = self._young, self._old
        for event in events:
            key = (server, event.name)
            event_id = event.event_id
            if event_id not in young.get(key, ()) and event_id not in old.get(key, ()):
                return False
        return True

    def remember(self, server: str, events: Sequence[IncomingEvent]) -> None:
        """Call only after the store committed ``events`` (stored now, or found stored)."""
        young = self._young
        for name, same_type in groupby(events, key=_event_name):
            ids = young.get((server, name))
            if ids is None:
                ids = young[(server, name)] = set()
            before = len(ids)
            ids.update(map(_event_id, same_type))
            self._young_count += len(ids) - before  # distinct ids: overlapping loops remember the same
        if self._young_count >= self.kept:
            self._old, self._young, self._young_count = young, {}, 0


_event_name = attrgetter("name")
_event_id = attrgetter("event_id")


class QuietFlusher:
    """Writes what the delivery loops of one store held back (``DeferredWrites``), all of them in
    one transaction, ``every_s`` after the first of them began to wait.

    What a quiet loop holds says "still active" and moves its cursor over what it had already.
    Written by each loop on its own timer, a thousand quiet subscriptions cost a thread hop and a
    transaction each per period; written here, one transaction between them. One per store (the
    supervisor's); a loop without one runs its own (``alongside``). Its timer is a task that runs
    only while something waits, so it never keeps a finished task group open.
    """

    def __init__(self, store: Store, every_s: float = QUIET_WRITE_S) -> None:
        self.store = store
        self.every_s = every_s
        self._held: dict[int, DeferredWrites] = {}
        self._spawn: Callable[..., object] | None = None
        self._timer: anyio.CancelScope | None = None

    def spawn_in(self, tg: anyio.abc.TaskGroup) -> None:
        """Run the timer in ``tg``; until then (and with ``every_s`` 0) nothing is held back."""
        self._spawn = tg.start_soon

    @property
    def can_hold(self) -> bool:
        return self._spawn is not None and self.every_s > 0

    def hold(self, writes: DeferredWrites) -> None:
        self._held[id(writes)] = writes
        if self._timer is None and self._spawn is not None:
            self._timer = anyio.CancelScope()
            self._spawn(self._flush_after, self._timer, name="quiet-writes")

    def forget(self, writes: DeferredWrites) -> None:
        self._held.pop(id(writes), None)
        if not self._held and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _flush_after(self, timer: anyio.CancelScope) -> None:
        with timer:
            await anyio.sleep(self.every_s)
        if self._timer is timer:  # not cancelled: nothing that waited was written meanwhile
            self._timer = None
            await self.flush()

    async def alongside(self, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` (a loop's, without the supervisor's flusher) with this flusher's timer
        beside it; what ``body`` raises comes out as itself, not in an exception group."""
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            self.spawn_in(tg)
            try:
                await body()
            except Exception as exc:  # re-raised outside the task group, unwrapped
                failure = exc
            finally:
                self._spawn = None
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure

    async def flush(self) -> None:
        """Write what waits now. A loop that writes meanwhile waits for this first (``settled``), so
        its newer cursor is never overwritten by this older one."""
        waiting = [writes for writes in self._held.values() if writes.waiting]
        self._held.clear()
        if not waiting:
            return
        done = anyio.Event()
        batches = [writes.hand_over(done) for writes in waiting]
        try:
            results = await self.store.ingest_held(batches)
        except StoreError as exc:
            # Nothing is lost: from the older stored cursors the servers deliver only duplicates.
            logger.warning(
                "%d quiet subscription(s): their held-back cursors were not saved: %s", len(batches), exc
            )
            return
        finally:
            done.set()
        for writes, batch, result in zip(waiting, batches, results, strict=True):
            if result is not None:  # None: fenced out; the loop is being stopped
                writes.quiet.wrote()
                writes.known.remember(batch.key.server, batch.events)


@dataclass(slots=True)
class DeferredWrites:
    """Which batches a loop writes at once, and what it holds back for a later write.

    A batch with a new event, a gap or a refused event is written at once. One that brings
    nothing new (no event, or only events ``known`` to be stored) says only "still active"
    and moves the cursor, over events filtered out or stored already: once the loop has written
    since it started (or since an error), such a batch is held back, and the ``flusher`` writes
    what waits, its cursor and known events (counted as duplicates), every ``every_s``; a write
    of the loop's own takes it along first. Losing what waits loses nothing: from the older
    stored cursor the server delivers only duplicates again. A loop that ends saves it (``save``).
    """

    known: KnownEvents
    flusher: QuietFlusher
    quiet: QuietWrites = field(default_factory=QuietWrites)
    events: list[IncomingEvent] = field(default_factory=list)
    cursor: str | None = None
    waiting: bool = False
    key: SubscriptionKey | None = None
    fence: int | None = None
    # The flusher's write that holds this loop's last batches, until it commits.
    in_flight: anyio.Event | None = None

    def can_wait(
        self,
        key: SubscriptionKey,
        events: Sequence[IncomingEvent],
        cursor: str | None,
        *,
        gap: bool,
        fence: int | None,
    ) -> bool:
        """True: this batch is held back (``gap``: it made a gap or refused an event; never held)."""
        if gap or not self.flusher.can_hold or not self.quiet.wrote_since_start:
            return False
        if events and (
            len(self.events) + len(events) > HELD_EVENTS_MAX or not self.known.all_known(key.server, events)
        ):
            return False
        self.events.extend(events)
        if cursor is not None:
            self.cursor = cursor
        self.key, self.fence = key, fence
        self.waiting = True
        self.flusher.hold(self)
        return True

    def hand_over(self, done: anyio.Event) -> HeldBatch:
        """To the flusher: what waits, as one batch; forgotten here, and ``settled`` waits for ``done``."""
        assert self.key is not None
        batch = HeldBatch(self.key, self.events, self.cursor, self.fence)
        self.reset()
        self.in_flight = done
        return batch

    async def settled(self) -> None:
        """Return once the flusher's write of this loop's earlier batches (if any) is over."""
        if self.in_flight is not None:
            await self.in_flight.wait()
            self.in_flight = None

    async def take(self, events: Sequence[IncomingEvent]) -> tuple[list[IncomingEvent], str | None, int]:
        """Before a write of the loop's own, which takes along what waits: the flusher's write of it
        (if under way) over first, then the events to write (those held back, then ``events``), the
        cursor held back, and how many events were held. Nothing waits afterwards."""
        await self.settled()
        held, cursor = self.events, self.cursor
        self.reset()
        return ([*held, *events] if held else list(events)), cursor, len(held)

    def written(self, server: str, events: Sequence[IncomingEvent]) -> None:
        """The store committed ``events`` (those held back included) and the batch's cursor."""
        self.quiet.wrote()
        self.known.remember(server, events)

    def reset(self) -> None:
        """Forget what waits: a loop that starts again reads from the stored cursor."""
        self.events = []
        self.cursor = None
        self.waiting = False
        self.flusher.forget(self)

    async def save(
        self, store: Store, key: SubscriptionKey, logger: logging.Logger, *, fence: int | None
    ) -> None:
        """Write what waits, on the way out, even while cancelled (bounded by SAVE_ON_EXIT_S); under
        the loop's ``fence``, so a process that lost the subscription writes nothing. A write of the
        flusher's still under way ends first, so the loop started next reads the newest cursor."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(SAVE_ON_EXIT_S):
            if not self.waiting:
                await self.settled()
                return
            events, cursor, _ = await self.take(())
            try:
                await store.ingest(key, events, cursor, fence=fence)
                self.known.remember(key.server, events)
            except StoreError as exc:
                logger.debug(
                    "subscription %s: the cursor held back was not saved: %s",
                    key.name,
                    exc,
                    extra=event_fields(subscription=key.name, server=key.server),
                )
