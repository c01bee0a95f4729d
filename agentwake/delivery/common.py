"""What the delivery loops share: the subscription key, their retry pacing and progress cadence."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import anyio

from agentwake.config import SubscriptionConfig
from agentwake.errors import StoreError
from agentwake.store import IncomingEvent, Store, SubscriptionKey

# A failed request or a dropped stream is tried again after backoff_s(failures, RETRY_INITIAL_S, RETRY_MAX_S).
RETRY_INITIAL_S: Final = 0.5
RETRY_MAX_S: Final = 30.0
# A server's cursor in a log line, at most (it is stored and sent back whole).
CURSOR_SHOWN: Final = 120
# A cursor longer than this is not one: the page is malformed.
MAX_CURSOR_CHARS: Final = 4096
# A long backlog is reported every this many events.
PROGRESS_EVERY: Final = 10_000
# A quiet subscription (no events, the cursor unchanged) writes its "still active" at most this often.
QUIET_WRITE_S: Final = 120.0
# Events a process remembers as stored (see KnownEvents), and how many a loop may hold back.
KNOWN_EVENTS_KEPT: Final = 4096
HELD_EVENTS_MAX: Final = 256
# How long a stopping loop may take to write what it held back.
SAVE_ON_EXIT_S: Final = 5.0

Sleep = Callable[[float], Awaitable[None]]


def subscription_key(sub: SubscriptionConfig) -> SubscriptionKey:
    return SubscriptionKey(sub.name, sub.server, sub.event, dict(sub.arguments))


# A subscription whose requests keep failing is shown as stalled after this many failures in a row.
STALLED_AFTER_FAILURES: Final = 3
# A repeated warning (a gap per poll, a refused event per page) is logged at most this often.
SUMMARY_INTERVAL_S: Final = 60.0


@dataclass
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


@dataclass
class QuietWrites:
    """When a batch with nothing new (no event, the same cursor) is worth a store write.

    Such a write only says "still active" (status, last activity); on a thousand quiet
    subscriptions it was most of the idle cost. It is written at most every ``every_s``, and
    always the first time after a start or an error, so an error shown in ``status`` clears
    as soon as delivery works again. A batch with events, a gap or a new cursor always goes.
    """

    every_s: float = QUIET_WRITE_S
    clock: Callable[[], float] = time.monotonic
    _written_at: float | None = None

    def skip(self) -> bool:
        """True: a quiet batch need not be written now."""
        return self._written_at is not None and self.clock() - self._written_at < self.every_s

    def wrote(self) -> None:
        self._written_at = self.clock()

    def failed(self) -> None:
        """An error was recorded: the next batch is written, whatever it holds."""
        self._written_at = None


class KnownEvents:
    """The events this process has seen committed to its store, the KNOWN_EVENTS_KEPT most recent.

    Subscriptions that overlap all receive an event the inbox stores once. For the others, a
    batch made only of known events moves nothing but their cursor, so its write can wait like a
    quiet batch's: after a crash, replaying from the older stored cursor delivers only duplicates.
    One per store (a process may run several), shared by its loops.
    """

    def __init__(self, kept: int = KNOWN_EVENTS_KEPT) -> None:
        self.kept = kept
        self._keys: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def all_known(self, server: str, events: Sequence[IncomingEvent]) -> bool:
        return all((server, event.name, event.event_id) in self._keys for event in events)

    def remember(self, server: str, events: Sequence[IncomingEvent]) -> None:
        """Call only after the store committed ``events`` (stored now, or found stored)."""
        keys = self._keys
        for event in events:
            key = (server, event.name, event.event_id)
            keys[key] = None
            keys.move_to_end(key)
        while len(keys) > self.kept:
            keys.popitem(last=False)


@dataclass
class DeferredWrites:
    """Which batches a loop writes at once, and what it holds back until its next write.

    A batch with a new event, a gap or a refused event is written at once. One that brings
    nothing new (no event, or only events ``known`` to be stored) says only "still active"
    and moves the cursor, over events filtered out or stored already: it waits as a quiet batch
    does (``QuietWrites``), its cursor and known events going with the next write, which counts
    them as duplicates. Losing what waits loses nothing: from the older stored cursor the server
    delivers only duplicates again. A loop that ends (a stop, an error) saves it (``save``).
    """

    known: KnownEvents
    quiet: QuietWrites = field(default_factory=QuietWrites)
    events: list[IncomingEvent] = field(default_factory=list)
    cursor: str | None = None
    waiting: bool = False

    def can_wait(
        self, server: str, events: Sequence[IncomingEvent], cursor: str | None, *, gap: bool
    ) -> bool:
        """True: this batch is held back (``gap``: it made a gap or refused an event; never held)."""
        if gap or not self.quiet.skip():
            return False
        if events and (
            len(self.events) + len(events) > HELD_EVENTS_MAX or not self.known.all_known(server, events)
        ):
            return False
        self.events.extend(events)
        if cursor is not None:
            self.cursor = cursor
        self.waiting = True
        return True

    def with_held(self, events: Sequence[IncomingEvent]) -> list[IncomingEvent]:
        """The events of the next write: those held back, then the batch's own."""
        return [*self.events, *events] if self.events else list(events)

    def written(self, server: str, events: Sequence[IncomingEvent]) -> None:
        """The store committed ``events`` (those held back included) and the batch's cursor."""
        self.quiet.wrote()
        self.known.remember(server, events)
        self.reset()

    def reset(self) -> None:
        """Forget what waits: a loop that starts again reads from the stored cursor."""
        self.events = []
        self.cursor = None
        self.waiting = False

    async def save(
        self, store: Store, key: SubscriptionKey, logger: logging.Logger, *, fence: int | None
    ) -> None:
        """Write what waits, on the way out, even while cancelled (bounded by SAVE_ON_EXIT_S); under
        the loop's ``fence``, so a process that lost the subscription writes nothing."""
        if not self.waiting:
            return
        events, cursor = self.events, self.cursor
        self.reset()
        with anyio.CancelScope(shield=True), anyio.move_on_after(SAVE_ON_EXIT_S):
            try:
                await store.ingest(key, events, cursor, fence=fence)
                self.known.remember(key.server, events)
            except StoreError as exc:
                logger.debug("subscription %s: the cursor held back was not saved: %s", key.name, exc)
