"""Open events/stream requests on one connection, and the routing of their notifications.

A connection hands every notification to ``StreamRoutes.intercept`` before the SDK sees it
(on agentwake's stdio transport, as the line is read). Stream notifications go to their
stream's ``StreamRoute`` in wire order; ``list_changed`` goes to the connection's callback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import anyio
from mcp_types import ErrorData

from agentwake import coarse_timers, protocol

logger = logging.getLogger("agentwake.mcp")

STREAM_NOTIFICATIONS: Final = (
    protocol.NOTIFICATION_ACTIVE,
    protocol.NOTIFICATION_EVENT,
    protocol.NOTIFICATION_HEARTBEAT,
    protocol.NOTIFICATION_ERROR,
    protocol.NOTIFICATION_TERMINATED,
)
STREAM_BUFFER: Final = 50_000
# Past this many queued notifications, a stream's reader waits for its loop to store some (pacing):
# reading far ahead of the store only fills memory, then loses what comes after STREAM_BUFFER.
# The push loop's batch: every store finds a full batch waiting, and fewer parsed notifications wait
# meanwhile for the collector to scan (5,000 drained 4 % slower; 3,000 beside a batch of 2,000, 5 %).
PACE_ABOVE: Final = 2_000
# How long the reader waits for that at most, each time, before it reads on regardless: the
# connection's other messages queue up behind a stream's, and a stuck loop is met by the overflow.
PACE_WAIT_S: Final = 0.25
PACE_STEP_S: Final = 0.002
# One stream notification: its method, its params, and when it was read (time.monotonic()).
StreamItem = tuple[str, dict[str, Any], float]
# Handed to every open stream, in wire order, when the transport could not parse a message:
# whatever it was may have been one of the stream's events, so the stream records a gap.
LOST_NOTIFICATION: Final = "agentwake/transport/unparsable"


class StreamRoute:
    """One events/stream's notifications, in wire order; ``overflowed`` says one was lost.

    A plain list bounded at ``capacity``, filled by ``offer`` on the reader's path and emptied by
    ``take`` in the stream's loop, which waits with ``wait``: one stream per subscription, so every
    byte an idle one holds counts ten thousand times, and every notification passes here.
    ``on_overflow`` is called once, at the loss, so the stream can be stopped at once: the
    server need not keep sending what would only be dropped until the queue is stored.
    ``answer`` is the request's own outcome once ``finish`` ends the route with it (over stdio,
    where the request is answered off the reader's path: the result, or the error).
    """

    __slots__ = ("_ready", "answer", "capacity", "ended", "items", "on_overflow", "overflowed", "request_id")

    def __init__(self, request_id: str, capacity: int = STREAM_BUFFER) -> None:
        self.request_id = request_id
        self.capacity = capacity
        # A list, not a deque: an idle stream's empty list is 56 bytes, a deque's block 600.
        self.items: list[StreamItem] = []
        self.overflowed = False
        self.on_overflow: Callable[[StreamRoute], None] | None = None
        self.ended = False
        self.answer: dict[str, Any] | ErrorData | None = None
        self._ready: asyncio.Future[bool] | None = None

    def offer(self, method: str, params: dict[str, Any]) -> None:
        if self.overflowed or self.ended:
            # Keep what is queued a gap-free prefix: nothing after a lost notification is taken.
            return
        items = self.items
        if len(items) < self.capacity:
            # Stamped as it comes off the wire: liveness measures the server's silences, not ours.
            items.append((method, params, time.monotonic()))
        else:
            # The loop fell this far behind: it stores the prefix and reconnects from its cursor.
            self.overflowed = True
            if self.on_overflow is not None:
                self.on_overflow(self)
        if self._ready is not None:
            _settle(self._ready, True)

    def take(self, limit: int) -> list[StreamItem]:
        """Up to ``limit`` queued notifications, oldest first; [] when none is queued."""
        items = self.items
        if len(items) <= limit:
            self.items = []
            return items
        taken = items[:limit]
        del items[:limit]
        return taken

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Until a notification is queued or the route is ended, without a checkpoint if one already is;
        False if ``timeout_s`` passed first.

        The wait is a bare future and its timeout a coarse timer (no cancel scope, no event; it
        fires at most a quarter second late): an idle stream's loop waits here once per heartbeat. Cancelling the caller cancels the wait as it
        would any other.
        """
        if self.ended or self.items:
            return True
        ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._ready = ready
        # A coarse timer: each heartbeat of each idle stream arms one, and a loop timer costs more.
        timer = (
            None
            if timeout_s is None
            else coarse_timers.for_running_loop().call_later(timeout_s, _settle, ready, False)
        )
        try:
            return await ready
        finally:
            self._ready = None
            if timer is not None:
                timer.cancel()

    def end(self) -> None:
        """No more notifications: the loop takes what is queued, then sees ``ended``."""
        self.ended = True
        if self._ready is not None:
            _settle(self._ready, True)

    def finish(self, answer: dict[str, Any] | ErrorData) -> None:
        """The request was answered (its result or its error): the stream is over once the queue is taken."""
        if self.answer is None:
            self.answer = answer
        self.end()

    @property
    def queued(self) -> int:
        """How many notifications wait for the loop."""
        return len(self.items)

    def close(self) -> None:
        self.end()
        self.items = []


def _settle(ready: asyncio.Future[bool], woken: bool) -> None:
    if not ready.done():
        ready.set_result(woken)


class StreamRoutes:
    """Open events/stream requests by id; their notifications are taken off the receive path here.

    The SDK's own notification bindings go through a per-method queue that drops the
    oldest on overflow and may reorder across methods; a stream's cursor must never get
    ahead of an event not yet stored, so stream notifications are routed here instead,
    in wire order, the way the SDK routes its own subscriptions/listen streams.
    """

    def __init__(self, on_list_changed: Callable[[], None] | None = None) -> None:
        self.routes: dict[Any, StreamRoute] = {}
        self.on_list_changed = on_list_changed
        # What pace() looks at: routes offered something since it last looked, and those it found
        # behind then. A queue only grows by offers, so no other route can be behind: each read
        # costs O(routes that got something), not O(open streams) (a thousand idle ones).
        self._offered: dict[str, StreamRoute] = {}
        self._lagging: dict[str, StreamRoute] = {}

    def intercept(self, method: str, params: Mapping[str, Any] | None) -> bool:
        if method == protocol.NOTIFICATION_LIST_CHANGED:
            # Taken here on every protocol era and whichever channel carried it (the connection's,
            # or an events/stream response on 2026-era HTTP, where no other channel exists).
            if self.on_list_changed is not None:
                self.on_list_changed()
            return True
        if method == LOST_NOTIFICATION:
            self.lost(dict(params or {}))
            return True
        # type() first: isinstance against an ABC costs more than the rest of this, once per event.
        if method not in STREAM_NOTIFICATIONS or not (type(params) is dict or isinstance(params, Mapping)):
            return False
        meta = params.get("_meta")
        if type(meta) is dict or isinstance(meta, Mapping):
            request_id = meta.get(protocol.SUBSCRIPTION_ID_META)
        else:
            request_id = None
        # Our ids are strings; a peer's id may be anything, even unhashable.
        route = self.routes.get(request_id) if isinstance(request_id, str) else None
        if route is not None:
            # A plain dict is the parsed message's own, consumed here: no copy needed.
            route.offer(method, params if type(params) is dict else dict(params))
            self._offered[route.request_id] = route
        else:
            logger.debug("%s for no open stream (%r): dropped", method, request_id)
        return True

    async def pace(self) -> None:
        """Wait, a bounded while, until no open stream has more than PACE_ABOVE notifications queued.

        Called by the transport between reads: while a loop stores a backlog, the reader idles
        instead of parsing far ahead (which only fills memory, takes the GIL from the store's
        thread, and ends in an overflow). Past PACE_WAIT_S it reads on: overflow then bounds it.
        """
        candidates = self._offered | self._lagging
        self._offered = {}
        self._lagging = {rid: r for rid, r in candidates.items() if self._behind(r)}
        if not self._lagging:
            return
        behind = list(self._lagging.values())
        with anyio.move_on_after(PACE_WAIT_S):
            # Polled: a receive sets off nothing, and the point is an idle loop (the store's thread runs).
            while any(self._behind(r) for r in behind):  # noqa: ASYNC110
                await anyio.sleep(PACE_STEP_S)

    def _behind(self, route: StreamRoute) -> bool:
        """Still open, nothing lost yet, and more than PACE_ABOVE notifications waiting for its loop."""
        return (
            self.routes.get(route.request_id) is route and not route.overflowed and route.queued > PACE_ABOVE
        )

    def lost(self, params: dict[str, Any]) -> None:
        """A message the transport could not parse may have been any stream's: every one records a gap."""
        for route in list(self.routes.values()):
            route.offer(LOST_NOTIFICATION, params)
            self._offered[route.request_id] = route


__all__ = [
    "LOST_NOTIFICATION",
    "STREAM_BUFFER",
    "STREAM_NOTIFICATIONS",
    "StreamItem",
    "StreamRoute",
    "StreamRoutes",
]
