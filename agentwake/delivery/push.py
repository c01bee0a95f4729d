"""The push loop of one subscription: an events/stream request, its notifications stored in order.

Each event and each heartbeat carries a cursor; it is stored in the same transaction
as the events before it, so the stored cursor never gets ahead of a stored event and
never moves back. A stream that goes silent for more than twice the heartbeat
interval is dead; it is cancelled and opened again from the stored cursor, with
backoff and jitter. Notifications are stored in batches of what has queued up (at most
``BATCH`` a transaction). When they come faster than they are stored, past the route's
bound, the rest is lost: what came before is stored and the stream is opened again from
its cursor at once. ``terminated`` ends the subscription; ``error`` is logged and counted
and the stream goes on; a ``truncated`` active is a gap. Past ``[limits] max_undecided_events``
(``agentwake.delivery.backlog``) the stream is closed once what came is stored, and opened again
from the stored cursor when the agent has caught up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import anyio

from agentwake import metrics, protocol
from agentwake.backoff import backoff_s
from agentwake.config import LimitsConfig, SubscriptionConfig
from agentwake.delivery.admit import admit
from agentwake.delivery.backlog import Backlog
from agentwake.delivery.common import (
    CURSOR_SHOWN,
    MAX_CURSOR_CHARS,
    PROGRESS_EVERY,
    QUIET_WRITE_S,
    RETRY_INITIAL_S,
    RETRY_MAX_S,
    STALLED_AFTER_FAILURES,
    DeferredWrites,
    KnownEvents,
    QuietFlusher,
    Sleep,
    Summary,
    shown_cursor,
    subscription_key,
)
from agentwake.errors import DeliveryError, SubscriptionEnded, TransientEventsError
from agentwake.logs import event_fields
from agentwake.mcp import ServerConnection
from agentwake.store import IncomingEvent, RejectedEvent, Store, SubscriptionKey
from agentwake.streams import LOST_NOTIFICATION, StreamRoute
from agentwake.text import peer

logger = logging.getLogger(__name__)

# At most this many notifications a transaction: a backlog's drain pays fewer transactions and
# hand-overs to the store's thread (2,000 drained 9 % faster than 1,000; 3,000 and 4,000 no faster).
BATCH: Final = 2000
_EVENT: Final = protocol.NOTIFICATION_EVENT
# The routing id in an event notification's ``_meta`` is the transport's, not the event's.
_ROUTING_META: Final = protocol.SUBSCRIPTION_ID_META
# A stream is never called dead sooner than this, however fast its server heartbeats.
LIVENESS_FLOOR_S: Final = 1.0
# How many recent heartbeat intervals the inferred one is the longest of.
LIVENESS_SAMPLES: Final = 4


class StreamInterrupted(DeliveryError):
    """The stream stopped delivering (silence, lost notifications, a transient failure); open it again."""


class StreamOverrun(StreamInterrupted):
    """Notifications came faster than they were stored and some were lost; all before them is stored.

    Our own lag, not the server's fault: once what was queued is stored, the stream is opened
    again from the cursor at once, without the backoff a failing server gets.
    """


class StreamHeldBack(Exception):
    """The subscription holds as many undecided events as it may: the stream is closed (all it
    brought is stored) and opened again from the stored cursor once the agent has caught up."""


@dataclass
class _Pending:
    events: list[IncomingEvent] = field(default_factory=list)
    rejected: list[RejectedEvent] = field(default_factory=list)
    cursor: str | None = None
    truncated: bool = False

    def __bool__(self) -> bool:
        return bool(self.events) or bool(self.rejected) or self.cursor is not None or self.truncated


def usable_cursor(value: Any) -> bool:
    """A notification's cursor worth storing: a string of a sane length (else the position is kept)."""
    return isinstance(value, str) and len(value) <= MAX_CURSOR_CHARS


def error_of(params: dict[str, Any]) -> tuple[int, str, Any]:
    """(code, message, data) of a stream's error or terminated notification, however the server wrote it."""
    error = params.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        return (
            code if isinstance(code, int) and not isinstance(code, bool) else protocol.INTERNAL_ERROR,
            message if isinstance(message, str) else peer(message),
            error.get("data"),
        )
    return protocol.INTERNAL_ERROR, peer(error) if error is not None else "no reason given", None


@dataclass(slots=True)
class Liveness:
    """How long one stream may stay silent before it is dead: the spec's "more than twice the
    heartbeat interval", with the interval inferred from the stream itself.

    A server need not say how often it heartbeats. The time from one heartbeat to the next (from
    the stream's start, for the first) is never shorter than its interval, whether the server
    heartbeats on a fixed clock or only after a quiet spell; once two were seen, the stream is
    dead after twice the longest recent one, but never sooner than ``floor_s`` and never later
    than ``ceiling_s`` (twice the configured ``heartbeat_s``, which alone applies until then).
    """

    ceiling_s: float
    floor_s: float = LIVENESS_FLOOR_S
    clock: Callable[[], float] = time.monotonic
    # The last LIVENESS_SAMPLES intervals, oldest first (a list: a deque's block is 600 bytes a stream).
    gaps: list[float] = field(default_factory=list)
    last_beat_at: float | None = None

    def __post_init__(self) -> None:
        self.last_beat_at = self.clock()

    def beat(self, at: float) -> None:
        """A heartbeat read (off the wire) at ``at``, on ``clock``'s scale."""
        if self.last_beat_at is not None:
            gaps = self.gaps
            gaps.append(max(0.0, at - self.last_beat_at))
            if len(gaps) > LIVENESS_SAMPLES:
                del gaps[0]
        self.last_beat_at = at

    @property
    def dead_after_s(self) -> float:
        if len(self.gaps) < 2:
            return self.ceiling_s
        return min(self.ceiling_s, max(self.floor_s, 2 * max(self.gaps)))

    @property
    def basis(self) -> str:
        if len(self.gaps) < 2:
            return "twice heartbeat_s: the server has not shown its heartbeat interval yet"
        return f"twice the heartbeat interval seen on this stream, about {max(self.gaps):.2g}s"


@dataclass(slots=True)
class PushLoop:
    subscription: SubscriptionConfig
    connection: ServerConnection
    store: Store
    on_new_events: Callable[[int], None] = lambda count: None
    # After each batch, with the subscription's stored cursor (just written, or already there).
    on_stored: Callable[[str | None], None] = lambda cursor: None
    sleep: Sleep = anyio.sleep
    retry_initial_s: float = RETRY_INITIAL_S
    retry_max_s: float = RETRY_MAX_S
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # Shared by the loops of one store (the supervisor's); a loop alone knows what it stored itself.
    known: KnownEvents = field(default_factory=KnownEvents)
    # Writes what the loops of one store held back (the supervisor's); a loop alone runs its own,
    # every quiet_write_s (0: nothing is held back).
    flusher: QuietFlusher | None = None
    quiet_write_s: float = QUIET_WRITE_S
    clock: Callable[[], float] = time.monotonic
    # The lease this process drives the subscription under (agentwake.ownership); None: unfenced.
    fence: int | None = None
    # The bound on undecided events (the supervisor's, shared by its loops); None: unbounded.
    backlog: Backlog | None = None
    streams: int = field(default=0, init=False)
    errors: int = field(default=0, init=False)
    received: int = field(default=0, init=False)
    _since_quiet: int = field(default=0, init=False)
    _since_heartbeat: int = field(default=0, init=False)
    _lost: Summary = field(default_factory=Summary, init=False)
    _errors: Summary = field(default_factory=Summary, init=False)
    _writes: DeferredWrites = field(init=False)

    def __post_init__(self) -> None:
        flusher = self.flusher or QuietFlusher(self.store, self.quiet_write_s)
        self._writes = DeferredWrites(self.known, flusher)

    @property
    def dead_after_s(self) -> float:
        """The longest silence a stream may keep: twice ``heartbeat_s``, the upper bound."""
        return 2 * self.subscription.heartbeat_s

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Stream until cancelled. SubscriptionEnded and ConnectionLost propagate to the caller."""
        sub = self.subscription
        key = subscription_key(sub)
        cursor = await self.store.register(key, fence=self.fence)
        await self.store.set_state(sub.name, status="active", mode="push")
        logger.info(
            "subscription %s: streaming %s on %s from %s",
            sub.name,
            sub.event,
            sub.server,
            f"cursor {peer(cursor, CURSOR_SHOWN)}" if cursor is not None else "now",
            extra=event_fields(subscription=sub.name, server=sub.server),
        )
        task_status.started()
        resuming = cursor is not None
        failures = 0
        while True:
            at_once = False
            try:
                if self.backlog is not None:
                    await self.backlog.wait_for_room(sub.name)
                await self._one_stream(key, cursor, resuming=resuming)
                failures = 0
                logger.info(
                    "subscription %s: the server closed the stream; opening it again",
                    sub.name,
                    extra=event_fields(subscription=sub.name, server=sub.server),
                )
            except StreamHeldBack:
                # Not the server's fault: open it again, without backoff, once there is room.
                failures, at_once = 0, True
            except StreamInterrupted as exc:
                self._errors.note(logger, f"subscription {sub.name}: {exc}")
                # Backoff grows only while streams deliver nothing; one that made progress starts it over.
                progressed = await self.store.cursor(sub.name) != cursor
                failures = 1 if progressed else failures + 1
                # An overrun that stored its prefix is our lag, not the server failing: no wait.
                at_once = progressed and isinstance(exc, StreamOverrun)
                self._writes.quiet.failed()
                if failures >= STALLED_AFTER_FAILURES:
                    await self.store.set_state(sub.name, status="stalled", error=str(exc))
                else:
                    await self.store.record_error(sub.name, str(exc))
            cursor = await self.store.cursor(sub.name)
            resuming = cursor is not None
            if not at_once:
                await self.sleep(self._backoff(failures))

    def _backoff(self, failures: int) -> float:
        return backoff_s(failures, initial_s=self.retry_initial_s, max_s=self.retry_max_s)

    async def _one_stream(self, key: SubscriptionKey, cursor: str | None, *, resuming: bool) -> None:
        sub = self.subscription
        # arguments always, {} when none: the spec's request shape has it, and a server may require it.
        params: dict[str, Any] = {"name": sub.event, "arguments": dict(sub.arguments), "cursor": cursor}
        if resuming and sub.max_age_ms is not None:
            params["maxAgeMs"] = sub.max_age_ms
        connection = self.connection
        route = connection.open_stream_route()
        self.streams += 1
        if connection.streams_beside_session:
            # stdio: the request is written beside the session and its answer ends the route, so
            # no task waits for it (an idle stream is a loop waiting on its route, nothing more).
            try:
                try:
                    await connection.send_stream(route, params, subscription=sub.name)
                except TransientEventsError as exc:
                    raise StreamInterrupted(str(exc), server=sub.server) from None
                await self._consume(route, key, cursor)
            finally:
                await connection.end_stream(route)
            try:
                connection.stream_ended(route, subscription=sub.name)
            except TransientEventsError as exc:
                raise StreamInterrupted(str(exc), server=sub.server) from None
            return
        request_error: BaseException | None = None
        consume_error: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:

                async def request() -> None:
                    nonlocal request_error
                    try:
                        with anyio.CancelScope() as overrun:
                            # Notifications are being lost: the server is told to stop at once (the
                            # request is cancelled) rather than send what would be dropped.
                            route.on_overflow = lambda _: overrun.cancel()
                            await connection.stream(route, params, subscription=sub.name)
                    except TransientEventsError as exc:
                        request_error = StreamInterrupted(str(exc), server=sub.server)
                    except Exception as exc:  # handed over below, after what came before it is stored
                        request_error = exc
                    finally:
                        route.end()

                tg.start_soon(request)
                try:
                    await self._consume(route, key, cursor)
                except Exception as exc:  # re-raised outside the task group, unwrapped
                    consume_error = exc
                # Leaving: cancel the request if it is still open (the server stops streaming).
                tg.cancel_scope.cancel()
        finally:
            connection.close_stream_route(route)
        if consume_error is not None:
            raise consume_error
        if request_error is not None:
            raise request_error

    async def _consume(self, route: StreamRoute, key: SubscriptionKey, cursor: str | None) -> None:
        self._writes.reset()
        try:
            if self.flusher is None:
                await self._writes.flusher.alongside(partial(self._consume_stream, route, key, cursor))
            else:
                await self._consume_stream(route, key, cursor)
        finally:
            await self._writes.save(self.store, key, logger, fence=self.fence)

    async def _consume_stream(self, route: StreamRoute, key: SubscriptionKey, cursor: str | None) -> None:
        sub = self.subscription
        event_name, limits = sub.event, self.limits
        stored = cursor
        liveness = Liveness(ceiling_s=self.dead_after_s, clock=self.clock)
        while True:
            batch = route.take(BATCH)
            if not batch:
                if route.overflowed:
                    # All queued before the loss is stored: what came after it was dropped.
                    raise StreamOverrun(
                        f"stream notifications arrived faster than they were stored and some were lost;"
                        f" reconnecting from cursor {peer(stored, CURSOR_SHOWN)}"
                    )
                if route.ended:
                    return
                silence_s = liveness.dead_after_s
                if not await route.wait(silence_s):
                    raise StreamInterrupted(
                        f"no event or heartbeat for {silence_s:g}s ({liveness.basis}); the stream is"
                        f" dead, reconnecting from cursor {peer(stored, CURSOR_SHOWN)}"
                    )
                continue
            pending = _Pending()
            # Events since the last flush into the counters _note_heartbeat reads (kept local: a
            # backlog is thousands of events a batch, and a slot write each costs).
            seen = 0
            for method, params, read_at in batch:
                if method == _EVENT:  # the common case first: a backlog is thousands of these
                    admitted = admit(params, event_name, limits, routing_key=_ROUTING_META)
                    if type(admitted) is IncomingEvent:
                        pending.events.append(admitted)
                    else:
                        assert isinstance(admitted, RejectedEvent)
                        pending.rejected.append(admitted)
                        self._lost.note(
                            logger,
                            f"subscription {sub.name}: event {peer(admitted.event_id, 80)} rejected"
                            f" ({admitted.reason}); stored as a 'rejected' summary, with a gap",
                        )
                    cursor_sent = params.get("cursor")
                    # usable_cursor, inline
                    if type(cursor_sent) is str and len(cursor_sent) <= MAX_CURSOR_CHARS:
                        pending.cursor = cursor_sent
                    seen += 1
                    continue
                if seen:
                    self._since_quiet += seen
                    self._since_heartbeat += seen
                    seen = 0
                if method == protocol.NOTIFICATION_HEARTBEAT:
                    liveness.beat(read_at)
                if method == LOST_NOTIFICATION:
                    # A notification the transport could not parse: whatever it was, record the gap.
                    pending.truncated = True
                    self._lost.note(
                        logger,
                        f"subscription {sub.name}: a stream notification could not be parsed"
                        f" ({peer(params.get('reason'), 200)}); recording a gap",
                    )
                elif method in (protocol.NOTIFICATION_ACTIVE, protocol.NOTIFICATION_HEARTBEAT):
                    if method == protocol.NOTIFICATION_HEARTBEAT:
                        self._note_heartbeat()
                    if method == protocol.NOTIFICATION_ACTIVE and params.get("truncated"):
                        stored = await self._store(key, pending, stored)
                        pending = _Pending(truncated=True)
                        logger.warning(
                            "subscription %s: gap: the server kept no history back to cursor %s (it"
                            " restarted without a durable log, or the events aged out), so events in"
                            " between may be missing; resumed at %s",
                            sub.name,
                            peer(stored, CURSOR_SHOWN),
                            shown_cursor(params.get("cursor")),
                            extra=event_fields(subscription=sub.name, server=sub.server),
                        )
                    if usable_cursor(params.get("cursor")):
                        pending.cursor = params["cursor"]
                elif method == protocol.NOTIFICATION_ERROR:
                    stored = await self._store(key, pending, stored)
                    pending = _Pending()
                    self.errors += 1
                    code, message, _ = error_of(params)
                    text = f"server reported an error on the stream: {peer(message)} ({code})"
                    self._errors.note(logger, f"subscription {sub.name}: {text}")
                    await self.store.count_stream_error(sub.name, text)
                    self._writes.quiet.failed()
                    metrics.observe_stream_error(sub.name)
                elif method == protocol.NOTIFICATION_TERMINATED:
                    await self._store(key, pending, stored)
                    code, message, data = error_of(params)
                    raise SubscriptionEnded(
                        protocol.NOTIFICATION_TERMINATED,
                        code,
                        f"the server ended the subscription: {peer(message)}",
                        None if data is None else peer(data),
                        server=sub.server,
                        subscription=sub.name,
                    )
            if seen:
                self._since_quiet += seen
                self._since_heartbeat += seen
            stored = await self._store(key, pending, stored)
            if self.backlog is not None and await self.backlog.over(sub.name):
                raise StreamHeldBack

    def _note_heartbeat(self) -> None:
        """Caught up at the first heartbeat with no event since the one before: a server heartbeats
        on a clock, busy or not, so a heartbeat between events says nothing of the backlog."""
        quiet, self._since_heartbeat = self._since_heartbeat == 0, 0
        if not (quiet and self._since_quiet):
            return
        # Worth an INFO line only after a backlog, not after every few events of steady traffic.
        level = logging.INFO if self._since_quiet >= PROGRESS_EVERY else logging.DEBUG
        logger.log(
            level,
            "subscription %s: stream caught up after %d events",
            self.subscription.name,
            self._since_quiet,
        )
        self._since_quiet = 0

    async def _store(self, key: SubscriptionKey, pending: _Pending, stored: str | None) -> str | None:
        if not pending:
            return stored
        sub, writes = self.subscription, self._writes
        gap = pending.truncated or bool(pending.rejected)
        if writes.can_wait(key, pending.events, pending.cursor, gap=gap, fence=self.fence):
            metrics.observe_ingest(sub.name, "push", 0, len(pending.events), gap=False)
            self.on_stored(stored)  # nothing new: the stored cursor stays for now
            return stored
        events, held_cursor, held = await writes.take(pending.events)
        cursor = pending.cursor if pending.cursor is not None else held_cursor
        result = await self.store.ingest(
            key,
            events,
            cursor,
            truncated=pending.truncated,
            cursor_before=stored,
            rejected=pending.rejected,
            fence=self.fence,
        )
        writes.written(sub.server, events)
        metrics.observe_ingest(sub.name, "push", result.inserted, result.duplicates - held, gap=gap)
        if self.backlog is not None:
            self.backlog.stored(sub.name, result.inserted)
        if result.duplicates:
            logger.info(
                "subscription %s: %d duplicate event(s) ignored",
                self.subscription.name,
                result.duplicates,
                extra=event_fields(subscription=self.subscription.name, server=self.subscription.server),
            )
        if result.inserted:
            self.on_new_events(result.inserted)
        before, self.received = self.received, self.received + len(pending.events)
        if self.received // PROGRESS_EVERY > before // PROGRESS_EVERY:
            logger.info(
                "subscription %s: streamed %d events so far",
                self.subscription.name,
                self.received,
                extra=event_fields(subscription=self.subscription.name, server=self.subscription.server),
            )
        stored = cursor if cursor is not None else stored
        self.on_stored(stored)
        return stored
