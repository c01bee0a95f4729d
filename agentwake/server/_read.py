"""One read of an event type, the same for every delivery mode.

A check-function type calls the author's check function and then applies what
the SDK promises on top (a null cursor starts from now, ``maxAgeMs`` drops old
events, a batch over ``maxEvents`` is cut at an event cursor). An emit-only type
reads its ring buffer through the type's match and transform hooks; a type
without replay keeps its position in the caller's lease instead of a cursor.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, TypeVar, cast

from mcp.shared.exceptions import MCPError

from agentwake.server._buffer import RingBuffer
from agentwake.server._errors import internal_error
from agentwake.server._leases import Lease
from agentwake.server._shared import EventType
from agentwake.server._types import Event, EventContext, EventResult

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def maybe_await(value: T | Any) -> T:
    """``value``, awaited first if the author's function returned an awaitable."""
    if inspect.isawaitable(value):
        return cast(T, await value)
    return cast(T, value)


async def read_events(
    event_type: EventType,
    ctx: EventContext,
    arguments: dict[str, Any],
    cursor: str | None,
    lease: Lease | None,
) -> EventResult:
    """The events of ``event_type`` after ``cursor`` for a subscriber with these ``arguments``."""
    if event_type.buffer is not None:
        return _read_buffer(event_type, event_type.buffer, ctx, arguments, cursor, lease)
    assert event_type.check is not None
    try:
        result: EventResult = await maybe_await(event_type.check(ctx, arguments, cursor))
    except MCPError:
        raise
    except Exception as exc:
        logger.exception("check function for %s failed", event_type.name)
        raise internal_error("UpstreamError", type(exc).__name__) from exc
    if cursor is None:
        # Null cursor means "start from now": a fresh position and nothing else.
        return EventResult(events=[], cursor=result.cursor, next_poll_ms=result.next_poll_ms)
    events = list(result.events)
    truncated = result.truncated
    if ctx.not_before is not None:
        kept = [e for e in events if e.moment >= ctx.not_before]
        truncated = truncated or len(kept) < len(events)
        events = kept
    new_cursor, has_more = result.cursor, result.has_more
    if len(events) > ctx.max_events:
        cut = events[ctx.max_events - 1].cursor
        if cut is not None:
            events, new_cursor, has_more = events[: ctx.max_events], cut, True
    return EventResult(
        events, new_cursor, has_more=has_more, truncated=truncated, next_poll_ms=result.next_poll_ms
    )


def _read_buffer(
    event_type: EventType,
    buffer: RingBuffer,
    ctx: EventContext,
    arguments: dict[str, Any],
    cursor: str | None,
    lease: Lease | None,
) -> EventResult:
    def accept(event: Event) -> Event | None:
        if event_type.match is not None and not event_type.match(ctx, event, arguments):
            return None
        return event_type.transform(ctx, event, arguments) if event_type.transform is not None else event

    if not event_type.replay:
        # No cursor on the wire: the lease remembers where this poller is.
        if lease is None or lease.position is None:
            if lease is not None:
                lease.position = buffer.head
            return EventResult(events=[], cursor=None)
        read = buffer.read(lease.position, ctx.max_events, accept=accept)
        lease.position = read.position
        return EventResult(read.events, None, has_more=read.has_more)

    if cursor is None:
        return EventResult(events=[], cursor=buffer.cursor_for(buffer.head))
    position = buffer.parse_cursor(cursor)
    if position is None:
        # A cursor from another process lifetime: the events in between are gone.
        return EventResult(events=[], cursor=buffer.cursor_for(buffer.head), truncated=True)
    read = buffer.read(position, ctx.max_events, not_before=ctx.not_before, accept=accept)
    return EventResult(
        read.events, buffer.cursor_for(read.position), has_more=read.has_more, truncated=read.truncated
    )
