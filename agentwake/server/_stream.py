"""Push delivery: ``events/stream``, one long-lived request per subscription.

A stream is the request handler itself. It reads with the same ``EventsExtension.read`` as
events/poll (the check function for check types, the ring buffer for emit-only
types) and writes notifications on the request's own channel, the server
session's ``related_request_id``: newline-delimited JSON on stdout over stdio,
``data:`` frames of the POST's SSE response over Streamable HTTP. A second task,
one timer per stream, sends a heartbeat every heartbeat interval whatever else
the stream carries, so its cursor (the position checked up to, which can be
ahead of the last matching event) reaches the client during steady traffic too.

Every send is awaited, one at a time, so a client that reads slowly slows the
stream down (pipe or TCP back-pressure) and nothing is queued per stream. For
emit-only types the ring buffer is the only buffer: a stream that falls behind
its retention gets a fresh ``active`` with ``truncated: true`` and goes on.

Order on the wire: ``active`` first, then ``event``s (with a fresh ``active``
``truncated: true`` before the events that follow a gap), a ``heartbeat`` every
interval between them, ``error`` for a failed read (the stream stays open and retries),
and ``terminated`` followed by the ``StreamEventsResult`` when the server ends
the subscription. A client cancels with ``notifications/cancelled`` (stdio) or
by closing the response (HTTP); the SDK then cancels the handler, and the
stream's ``on_unsubscribe`` hooks run shielded.

Over Streamable HTTP the SDK also writes SSE comment pings (``: ping``) on its
responses; the spec keeps that form off push streams (it carries no cursor), so
``WithoutPushStreamPings`` drops them from events/stream responses only.

A stream sees the extension only through ``StreamHost`` (a Protocol), so this
module never imports ``_extension``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import replace
from datetime import timedelta
from typing import Any, Final, Protocol, cast

import anyio
import anyio.lowlevel
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import RequestId
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from agentwake import protocol
from agentwake.server._leases import Lease
from agentwake.server._shared import (
    HOOK_TIMEOUT_S,
    TERMINAL_CODES,
    EventSource,
    EventType,
    error_object,
    idle_delay,
    retry_delay,
    start_cursor,
)
from agentwake.server._types import EventContext, EventResult

logger = logging.getLogger(__name__)

NOTIFICATION_ACTIVE: Final = "notifications/events/active"
NOTIFICATION_EVENT: Final = "notifications/events/event"
NOTIFICATION_HEARTBEAT: Final = "notifications/events/heartbeat"
NOTIFICATION_ERROR: Final = "notifications/events/error"
NOTIFICATION_TERMINATED: Final = "notifications/events/terminated"
STREAM_NOTIFICATIONS: Final = frozenset(
    {
        NOTIFICATION_ACTIVE,
        NOTIFICATION_EVENT,
        NOTIFICATION_HEARTBEAT,
        NOTIFICATION_ERROR,
        NOTIFICATION_TERMINATED,
    }
)

DEFAULT_HEARTBEAT_MS: Final = 30_000
MAX_HEARTBEAT_MS: Final = 30_000

# Set by a push stream in its HTTP request's ASGI scope: this response carries no comment pings.
PUSH_RESPONSE_SCOPE_KEY: Final = "agentwake.events_stream"

AsgiMessage = MutableMapping[str, Any]
AsgiReceive = Callable[[], Awaitable[AsgiMessage]]
AsgiSend = Callable[[AsgiMessage], Awaitable[None]]
AsgiApp = Callable[[MutableMapping[str, Any], AsgiReceive, AsgiSend], Awaitable[None]]


def stream_result() -> dict[str, Any]:
    """The StreamEventsResult: an empty typed result, the final frame of a stream the server ends."""
    return {"_meta": {}}


class StreamHost(EventSource, Protocol):
    """The parts of ``EventsExtension`` a push stream uses beyond reading."""

    @property
    def heartbeat_ms(self) -> int: ...

    def forget_stream(self, stream: PushStream) -> None: ...


class _Notification(BaseModel):
    """A notification the SDK's typed union does not know; ``send_notification`` only dumps it."""

    method: str
    params: dict[str, Any]


class PushStream:
    """One open events/stream. Built and served by ``EventsExtension``; not for direct use."""

    def __init__(
        self,
        extension: StreamHost,
        event_type: EventType,
        request: ServerRequestContext[Any, Any],
        *,
        subscription_id: RequestId,
        arguments: dict[str, Any],
        principal: str | None,
        cursor: str | None,
        max_age_ms: int | None,
        serial: int,
    ) -> None:
        self.extension = extension
        self.event_type = event_type
        self.request = request
        self.subscription_id = subscription_id
        self.arguments = arguments
        self.principal = principal
        # Types without replay have no position the client could hand back: start from now.
        self.requested_cursor = cursor if event_type.replay else None
        not_before = None
        if max_age_ms is not None and self.requested_cursor is not None:
            not_before = extension.now() - timedelta(milliseconds=max_age_ms)
        self.opening_ctx = EventContext(
            event_name=event_type.name,
            principal=principal,
            mode="push",
            max_events=extension.default_max_events,
            max_age_ms=max_age_ms if event_type.replay else None,
            not_before=not_before,
            request=request,
        )
        # maxAgeMs bounds the replay only; live reads take whatever is new.
        self.live_ctx = replace(self.opening_ctx, max_age_ms=None, not_before=None)
        # The lease carries the hooks' subscription id, and the position of a no-replay buffer read.
        self.lease = Lease(
            principal,
            event_type.name,
            dict(arguments),
            math.inf,
            subscription_id=f"push:{serial}:{subscription_id}",
        )
        self.cursor: str | None = None  # the position read up to (the check's cursor, even without replay)
        self._meta = {protocol.SUBSCRIPTION_ID_META: subscription_id}
        self._wake = anyio.Event()
        self._lock = anyio.Lock()
        self._close_requested = False
        self._close_error: MCPError | None = None

    # ---- called from outside the stream's task ------------------------------------

    def wake(self) -> None:
        """Read again now: an emit happened, or the author says the upstream changed."""
        self._wake.set()

    @property
    def modern(self) -> bool:
        """On a 2026-era connection, where this stream's response is the only way to the client."""
        return self.request.session.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def notify_list_changed(self) -> None:
        await self._send(protocol.NOTIFICATION_LIST_CHANGED, {})

    def close(self, error: MCPError | None) -> None:
        """End the stream from the server side: ``terminated`` (if ``error``), then the result."""
        self._close_requested = True
        self._close_error = error
        self._wake.set()

    # ---- the stream -------------------------------------------------------------------

    async def serve(self) -> dict[str, Any]:
        """Run the stream until the server ends it (returns the result) or the client cancels."""
        extension = self.extension
        mark_push_response(self.request)
        await extension.fire_hooks("subscribe", self.lease, request=self.request, mode="push")
        try:
            # A failure here is the request's JSON-RPC error: no stream was opened.
            self.cursor = self.requested_cursor
            first = await self._read(self.opening_ctx, self.requested_cursor)
            start = start_cursor(self.event_type, first, fallback=self.requested_cursor)
            await self._activate(start, truncated=first.truncated and self.event_type.replay)
            # If the heartbeat finds the client gone it cancels this group; the result is then
            # written nowhere (the transport drops it), which is all an abandoned stream needs.
            result = stream_result()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._heartbeats, tg.cancel_scope)
                result = await self._loop(first)
                tg.cancel_scope.cancel()
            return result
        finally:
            extension.forget_stream(self)
            with anyio.move_on_after(HOOK_TIMEOUT_S, shield=True) as scope:
                try:
                    await extension.fire_hooks("unsubscribe", self.lease, request=self.request, mode="push")
                except Exception:  # the stream is over either way
                    logger.exception("on_unsubscribe for %s failed", self.event_type.name)
            if scope.cancelled_caught:
                logger.warning("on_unsubscribe for %s took over %gs", self.event_type.name, HOOK_TIMEOUT_S)

    async def _loop(self, batch: EventResult | None) -> dict[str, Any]:
        failures = 0
        opening = True
        while True:
            if batch is not None:
                if batch.truncated and not opening and self.event_type.replay:
                    start = start_cursor(self.event_type, batch, fallback=self.cursor)
                    await self._activate(start, truncated=True)
                await self._deliver(batch)
                delay = 0.0 if batch.has_more else idle_delay(self.extension, self.event_type, batch)
            else:
                delay = retry_delay(self.extension, self.event_type, failures)
            opening = False
            if delay != 0.0:
                with anyio.move_on_after(math.inf if delay is None else delay):
                    await self._wake.wait()
            if self._close_requested:
                if self._close_error is not None:
                    await self._send(NOTIFICATION_TERMINATED, {"error": error_object(self._close_error)})
                return stream_result()
            if not self.extension.serves(self.event_type):
                # The type was removed (events/list_changed): this subscription cannot go on.
                exc = MCPError(
                    code=protocol.NOT_FOUND,
                    message="NotFound",
                    data={"kind": "event", "name": self.event_type.name},
                )
                await self._send(NOTIFICATION_TERMINATED, {"error": error_object(exc)})
                return stream_result()
            # A fresh event before reading: an emit during the read or the sends wakes the next wait.
            self._wake = anyio.Event()
            try:
                batch = await self._read(self.live_ctx, self.cursor)
                failures = 0
            except MCPError as exc:
                if exc.error.code in TERMINAL_CODES:
                    await self._send(NOTIFICATION_TERMINATED, {"error": error_object(exc)})
                    return stream_result()
                failures += 1
                batch = None
                await self._send(NOTIFICATION_ERROR, {"error": error_object(exc)})

    async def _read(self, ctx: EventContext, cursor: str | None) -> EventResult:
        try:
            return await self.extension.read(self.event_type, ctx, self.arguments, cursor, self.lease)
        except MCPError:
            raise
        except Exception as exc:  # a match/transform hook; _read already wraps check failures
            logger.exception("reading %s for a push stream failed", self.event_type.name)
            raise MCPError(
                code=protocol.INTERNAL_ERROR, message="UpstreamError", data={"reason": type(exc).__name__}
            ) from exc

    async def _deliver(self, batch: EventResult) -> None:
        events = batch.events
        last = len(events) - 1
        for index, event in enumerate(events):
            # An event without its own cursor gets a safe one: the batch's end for the last
            # event, else the position before the batch (persisting it replays, never skips).
            cursor = (
                event.cursor if event.cursor is not None else (batch.cursor if index == last else self.cursor)
            )
            params = event.to_wire()
            params["cursor"] = self._wire(cursor)
            async with self._lock:
                await self._send_locked(NOTIFICATION_EVENT, params)
                # Under the lock, so a heartbeat never sees the last event sent but not the batch's end.
                self.cursor = batch.cursor if index == last else cursor
        self.cursor = batch.cursor

    async def _activate(self, cursor: str | None, *, truncated: bool) -> None:
        """Send ``active``; heartbeats until the next event then carry its cursor, not an older one."""
        async with self._lock:
            await self._send_locked(
                NOTIFICATION_ACTIVE, {"cursor": self._wire(cursor), "truncated": truncated}
            )
            self.cursor = cursor

    async def _heartbeats(self, stream_scope: anyio.CancelScope) -> None:
        """A heartbeat every interval, however busy the stream (the spec's "at least every");
        before each, see if the client left."""
        interval = self.extension.heartbeat_ms / 1000
        due = anyio.current_time() + interval
        while True:
            await anyio.sleep_until(due)
            # The next one is due an interval after this one was, never in the past (no catch-up burst).
            due = max(due + interval, anyio.current_time())
            if await self._client_gone():
                logger.info("events/stream %s: the client closed the response", self.subscription_id)
                stream_scope.cancel()
                return
            async with self._lock:
                await self._send_locked(NOTIFICATION_HEARTBEAT, {"cursor": self._wire(self.cursor)})

    async def _client_gone(self) -> bool:
        """Whether a handshake-era Streamable HTTP client closed this request's response.

        On 2026-era HTTP and on stdio the SDK cancels the handler itself (disconnect,
        ``notifications/cancelled``). Handshake-era HTTP only drops what is written to a
        closed response, so the heartbeat asks the HTTP request.
        """
        if self.modern:
            return False
        is_disconnected = cast(
            "Callable[[], Awaitable[bool]] | None", getattr(self.request.request, "is_disconnected", None)
        )
        if is_disconnected is None:
            return False
        try:
            return await is_disconnected()
        except Exception:  # not the request object we expect; never fail the stream over this
            return False

    # ---- helpers -----------------------------------------------------------------------

    def _wire(self, cursor: str | None) -> str | None:
        return cursor if self.event_type.replay else None

    async def _send(self, method: str, params: dict[str, Any]) -> None:
        async with self._lock:
            await self._send_locked(method, params)

    async def _send_locked(self, method: str, params: dict[str, Any]) -> None:
        meta = params.get("_meta")
        params["_meta"] = {**meta, **self._meta} if isinstance(meta, dict) else self._meta
        notification = _Notification(method=method, params=params)
        await self.request.session.send_notification(
            cast(Any, notification), related_request_id=self.subscription_id
        )
        # The in-process dispatcher delivers without a checkpoint: let others run between frames.
        await anyio.lowlevel.checkpoint()


# ---- no SSE comment pings on push responses ------------------------------------------------


def mark_push_response(request: ServerRequestContext[Any, Any]) -> None:
    """Mark this request's HTTP response as a push stream's, for ``WithoutPushStreamPings``.

    The handler's Starlette request shares its ASGI scope with the response the SDK
    writes; stdio has no HTTP request and nothing to mark.
    """
    scope = getattr(getattr(request, "request", None), "scope", None)
    if isinstance(scope, MutableMapping):
        scope[PUSH_RESPONSE_SCOPE_KEY] = True


def _only_comments(body: bytes) -> bool:
    """Whether an SSE chunk is nothing but comment lines (the SDK's ``: ping``)."""
    lines = [line for line in body.splitlines() if line]
    return bool(lines) and all(line.startswith(b":") for line in lines)


class WithoutPushStreamPings:
    """ASGI middleware: drop the SSE comment pings the SDK writes on events/stream responses.

    The SDK pings every SSE response (sse_starlette's ``ping`` on 2025-era POSTs, a
    15 s idle ping on 2026-era ones) with no per-response switch. A push stream's
    heartbeats are its keepalive, so on a response its handler marked
    (``mark_push_response``) comment-only chunks go nowhere; every other response,
    and every other chunk, is passed on untouched.
    """

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: AsgiReceive, send: AsgiSend) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return

        async def send_without_pings(message: AsgiMessage) -> None:
            if (
                message.get("type") == "http.response.body"
                and message.get("more_body", False)
                and scope.get(PUSH_RESPONSE_SCOPE_KEY)
                and _only_comments(bytes(message.get("body", b"")))
            ):
                return
            await send(message)

        await self.app(scope, receive, send_without_pings)
