"""MCP Events on the official SDK, as an ``mcp.server.extension.Extension``.

    events = EventsExtension()

    @events.event(name="ticket.created", input_schema={...}, payload_schema={...})
    async def check(ctx, arguments, cursor):
        ...
        return EventResult(events=[...], cursor=new_cursor)

    server = MCPServer("demo", extensions=[events])
    events.install(server)   # advertise the capability on every era; before streamable_http_app()

This module is the extension itself: declaring types, the request handlers,
emit, and the lifecycle hooks. events/list and events/poll are served here, push
(events/stream) by ``_stream`` and webhook (events/subscribe, events/unsubscribe;
only with ``webhook=WebhookSettings(...)``) by ``_webhook``. Every mode reads
through ``_read`` and the same match/transform and lifecycle-hook machinery; the
request params are in ``_params`` and ``EventType`` is in ``_shared``.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, Final, Literal, TypeVar, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
from mcp.server.connection import Connection
from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError

from agentwake import protocol
from agentwake._compat import connection_of
from agentwake.schemas import InvalidSchema, compile_schema
from agentwake.server._buffer import EmitBuffer, RingBuffer
from agentwake.server._errors import (
    forbidden,
    invalid_params,
    not_found,
    resource_exhausted,
    unsupported_mode,
)
from agentwake.server._jwks import add_jwks_route
from agentwake.server._leases import DEFAULT_POLL_LEASE_TTL, Lease, LeaseTable
from agentwake.server._params import (
    ListParams,
    PollParams,
    StreamParams,
    SubscribeParams,
    UnsubscribeParams,
    decode_page_cursor,
    encode_page_cursor,
)
from agentwake.server._read import maybe_await, read_events
from agentwake.server._shared import SERVED_MODES, UNCONFIGURED_MODES, EventType
from agentwake.server._stream import (
    DEFAULT_HEARTBEAT_MS,
    MAX_HEARTBEAT_MS,
    PushStream,
    WithoutPushStreamPings,
)
from agentwake.server._types import (
    CheckFunction,
    DeliveryModeName,
    Event,
    EventContext,
    EventResult,
    LifecycleHook,
    MatchHook,
    TransformHook,
    utc_now,
)
from agentwake.server._webhook import Webhooks
from agentwake.server._webhook_settings import WebhookSettings, check_delivery

logger = logging.getLogger(__name__)

DEFAULT_MAX_EVENTS: Final = 100
MAX_EVENTS_CEILING: Final = 10_000
DEFAULT_NEXT_POLL_MS: Final = 5_000
DEFAULT_LIST_PAGE_SIZE: Final = 100
LEASE_SWEEP_INTERVAL_S: Final = 5.0
T = TypeVar("T")


def _on_event_loop() -> bool:
    try:
        anyio.lowlevel.current_token()
    except RuntimeError:  # NoEventLoopError: a plain thread
        return False
    return True


def _current_principal() -> str | None:
    """The authenticated subject of this request, if the transport has auth."""
    from mcp.server.auth.middleware.auth_context import get_access_token

    token = get_access_token()
    if token is None:
        return None
    return token.subject or token.client_id


class EventsExtension(Extension):
    """The server side of MCP Events. See the module docstring for usage."""

    identifier = protocol.EXTENSION_ID

    def __init__(
        self,
        *,
        emit_buffer: EmitBuffer | None = None,
        poll_lease_ttl: timedelta = DEFAULT_POLL_LEASE_TTL,
        default_max_events: int = DEFAULT_MAX_EVENTS,
        default_next_poll_ms: int = DEFAULT_NEXT_POLL_MS,
        list_page_size: int = DEFAULT_LIST_PAGE_SIZE,
        heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
        max_streams: int | None = None,
        clock: Callable[[], float] | None = None,
        now: Callable[[], datetime] = utc_now,
        webhook: WebhookSettings | None = None,
        principal_of: Callable[[ServerRequestContext[Any, Any]], str | None] | None = None,
    ) -> None:
        """``heartbeat_ms`` is the interval between a push stream's heartbeats, sent however
        busy the stream is (1 to 30000, the spec's "at least every 30 seconds"). ``max_streams`` caps open
        push streams across all connections (-32013 beyond it); None means no cap.

        ``webhook`` turns on webhook delivery (events/subscribe, events/unsubscribe) and
        lists "webhook" in every type's delivery modes. ``principal_of(ctx)`` names the
        authenticated caller of a request; by default the SDK's bearer-auth context
        (``AccessToken.subject``, else ``client_id``), None when unauthenticated.
        """
        if not 1 <= default_max_events <= MAX_EVENTS_CEILING:
            raise ValueError(f"default_max_events must be between 1 and {MAX_EVENTS_CEILING}")
        if list_page_size < 1:
            raise ValueError("list_page_size must be at least 1")
        if not 1 <= heartbeat_ms <= MAX_HEARTBEAT_MS:
            raise ValueError(f"heartbeat_ms must be between 1 and {MAX_HEARTBEAT_MS}")
        if max_streams is not None and max_streams < 1:
            raise ValueError("max_streams must be at least 1 (or None for no cap)")
        self.emit_buffer = emit_buffer or EmitBuffer()
        self.default_max_events = default_max_events
        self.default_next_poll_ms = default_next_poll_ms
        self.list_page_size = list_page_size
        self.heartbeat_ms = heartbeat_ms
        self.max_streams = max_streams
        self._now = now
        self._principal_of = principal_of or (lambda ctx: _current_principal())
        self.served_modes: tuple[DeliveryModeName, ...] = SERVED_MODES if webhook else UNCONFIGURED_MODES
        self._webhooks = Webhooks(self, webhook) if webhook is not None else None
        self._types: dict[str, EventType] = {}
        self._leases = (
            LeaseTable(poll_lease_ttl) if clock is None else LeaseTable(poll_lease_ttl, clock=clock)
        )
        self._on_subscribe: dict[str, list[LifecycleHook]] = {}
        self._on_unsubscribe: dict[str, list[LifecycleHook]] = {}
        # The SDK's Connection objects, not ctx.session: a ServerSession is a per-request
        # proxy that is collected as soon as the request returns.
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        # Open push streams by event name; the serial makes each one's hook subscription id unique.
        self._streams: dict[str, set[PushStream]] = {}
        self._stream_serial = itertools.count(1)
        # The event loop the server runs on, so emit() from another thread can hop onto it.
        self._loop_token: anyio.lowlevel.EventLoopToken | None = None

    # ---- what the SDK consumes -------------------------------------------------

    def settings(self) -> dict[str, Any]:
        return {"listChanged": True}

    def methods(self) -> Sequence[MethodBinding]:
        bindings = [
            MethodBinding(method=protocol.METHOD_LIST, params_type=ListParams, handler=self._handle_list),
            MethodBinding(method=protocol.METHOD_POLL, params_type=PollParams, handler=self._handle_poll),
            MethodBinding(
                method=protocol.METHOD_STREAM, params_type=StreamParams, handler=self._handle_stream
            ),
        ]
        if self._webhooks is not None:
            bindings += [
                MethodBinding(
                    method=protocol.METHOD_SUBSCRIBE,
                    params_type=SubscribeParams,
                    handler=self._handle_subscribe,
                ),
                MethodBinding(
                    method=protocol.METHOD_UNSUBSCRIBE,
                    params_type=UnsubscribeParams,
                    handler=self._handle_unsubscribe,
                ),
            ]
        return tuple(bindings)

    def install(self, server: Any) -> None:
        """Wire the extension into ``server`` beyond what the SDK does with ``extensions=[...]``.

        The capability is advertised on every protocol era under each name a client may
        read it by: ``capabilities.extensions["io.modelcontextprotocol/events"]`` (the
        extensions mechanism; the SDK itself sends it only on 2026-era connections),
        ``capabilities.events`` (the design sketch's example) and
        ``capabilities.experimental["io.modelcontextprotocol/events"]`` (for handshake-era
        clients whose models keep only ``experimental``).

        Call it before ``server.streamable_http_app()``: the apps that builds drop the SDK's
        SSE comment pings from events/stream responses (``WithoutPushStreamPings``) and, with
        a webhook server identity, serve its JWKS (``_jwks``; outside the MCP endpoint's auth).
        """
        server.middleware.append(self._advertise_capability)
        build_app = getattr(server, "streamable_http_app", None)
        identity = self._webhooks.settings.identity if self._webhooks is not None else None
        if callable(build_app):

            def streamable_http_app(*args: Any, **kwargs: Any) -> Any:
                app = build_app(*args, **kwargs)
                app.add_middleware(WithoutPushStreamPings)
                if identity is not None:
                    add_jwks_route(app, identity, self._now)
                return app

            server.streamable_http_app = streamable_http_app

    async def _advertise_capability(
        self, ctx: ServerRequestContext[Any, Any], call_next: Any
    ) -> HandlerResult:
        result: HandlerResult = await call_next(ctx)
        if ctx.method in ("initialize", "server/discover") and isinstance(result, dict):
            capabilities = result.setdefault("capabilities", {})
            for spelling in ("extensions", "experimental"):
                declared = capabilities.get(spelling) or {}
                declared[protocol.EXTENSION_ID] = self.settings()
                capabilities[spelling] = declared
            capabilities["events"] = self.settings()
        return result

    # ---- declaring event types ---------------------------------------------------

    def event(
        self,
        *,
        name: str,
        description: str | None = None,
        input_schema: dict[str, Any] | None = None,
        payload_schema: dict[str, Any] | None = None,
        emit_only: bool = False,
        replay: bool = True,
        match: MatchHook | None = None,
        transform: TransformHook | None = None,
        delivery: Sequence[DeliveryModeName] | None = None,
        next_poll_ms: int | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Callable[[T], T]:
        """Declare an event type.

        Decorate a check function ``check(ctx, arguments, cursor) -> EventResult``,
        or, with ``emit_only=True``, a class that may carry static ``match`` and
        ``transform`` hooks. ``replay=False`` declares a type whose cursor is always
        null (no addressable history).
        """

        def register(target: T) -> T:
            check: CheckFunction | None = None
            match_hook, transform_hook = match, transform
            if inspect.isclass(target):
                match_hook = match_hook or getattr(target, "match", None)
                transform_hook = transform_hook or getattr(target, "transform", None)
                check = getattr(target, "check", None)
            elif callable(target):
                check = cast(CheckFunction, target)
            if emit_only and check is not None:
                raise ValueError(f"event {name!r}: emit_only types have no check function")
            if not emit_only and check is None:
                raise ValueError(f"event {name!r}: give a check function or set emit_only=True")
            self.add_event_type(
                EventType(
                    name=name,
                    description=description or (inspect.getdoc(target) if check is not None else None),
                    input_schema=input_schema or {"type": "object"},
                    payload_schema=payload_schema,
                    check=check,
                    emit_only=emit_only,
                    replay=replay,
                    match=match_hook,
                    transform=transform_hook,
                    delivery=tuple(delivery) if delivery is not None else None,
                    next_poll_ms=next_poll_ms,
                    meta=meta,
                )
            )
            return target

        return register

    def add_event_type(self, event_type: EventType) -> None:
        if event_type.name in self._types:
            raise ValueError(f"event type {event_type.name!r} is already declared")
        if event_type.delivery is not None:
            unknown = set(event_type.delivery) - set(protocol.DELIVERY_MODES)
            if unknown or not event_type.delivery:
                raise ValueError(
                    f"event {event_type.name!r}: delivery must be a non-empty subset of poll/push/webhook"
                )
        event_type.served = self.served_modes
        if not event_type.modes():
            raise ValueError(
                f"event {event_type.name!r}: none of its delivery modes {list(event_type.delivery or ())} "
                f"is served yet (this extension serves {', '.join(self.served_modes)};"
                " webhook needs EventsExtension(webhook=WebhookSettings(...)))"
            )
        try:
            # Every $ref must resolve inside the schema now: agentwake never fetches one later.
            event_type.validator = compile_schema(event_type.input_schema, check_references=True)
        except InvalidSchema as exc:
            raise ValueError(
                f"event {event_type.name!r}: inputSchema is not a valid JSON Schema: {exc}"
            ) from exc
        if event_type.emit_only:
            event_type.buffer = RingBuffer(self.emit_buffer, now=self._now)
        self._types[event_type.name] = event_type

    def remove_event_type(self, name: str) -> None:
        """Stop serving ``name``; its webhook subscriptions are terminated (NotFound)."""
        self._types.pop(name, None)
        if self._webhooks is not None:
            self._webhooks.terminate(name, not_found(name), None)

    def event_types(self) -> list[EventType]:
        return list(self._types.values())

    def on_subscribe(self, name: str) -> Callable[[T], T]:
        """Register ``hook(ctx, arguments, subscription_id)`` run when a subscription first appears."""

        def register(hook: T) -> T:
            self._on_subscribe.setdefault(name, []).append(cast(LifecycleHook, hook))
            return hook

        return register

    def on_unsubscribe(self, name: str) -> Callable[[T], T]:
        """Register ``hook(ctx, arguments, subscription_id)`` run when a subscription goes away."""

        def register(hook: T) -> T:
            self._on_unsubscribe.setdefault(name, []).append(cast(LifecycleHook, hook))
            return hook

        return register

    async def notify_list_changed(self) -> None:
        """Tell every connected client that has used events/* to re-list.

        On its connection's channel and, for a 2026-era connection (whose Streamable HTTP has
        no channel outside a request's own response), on one of its open events/streams.
        """
        for connection in list(self._connections):
            try:
                await connection.notify(protocol.NOTIFICATION_LIST_CHANGED, None)
            except Exception as exc:  # a closed connection must not stop the others
                logger.debug("list_changed not delivered: %s", exc)
        told: set[int] = set()
        for streams in list(self._streams.values()):
            for stream in list(streams):
                session = stream.request.session
                if id(session) in told or not stream.modern:
                    continue
                told.add(id(session))
                try:
                    await stream.notify_list_changed()
                except Exception as exc:
                    logger.debug("list_changed not delivered on a stream: %s", exc)

    def _remember_connection(self, ctx: ServerRequestContext[Any, Any]) -> None:
        if self._loop_token is None:
            self._loop_token = anyio.lowlevel.current_token()
        connection = connection_of(ctx)
        if connection is not None:
            self._connections.add(connection)

    # ---- emitting --------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Record an upstream occurrence for emit-only event types.

        The event goes into the type's ring buffer, and every open push stream of
        the type is woken to read it (with its own arguments through match and
        transform). Never waits for a stream: each sends at the pace its client reads.
        Called from a thread other than the server's event loop, it hands the event to
        the loop and returns once it is recorded.
        """
        event_type = self._types.get(event.name)
        if event_type is None:
            raise ValueError(f"emit: unknown event type {event.name!r}")
        if self._loop_token is not None and not _on_event_loop():
            try:
                anyio.from_thread.run_sync(self.emit, event, token=self._loop_token)
                return
            except RuntimeError:  # the loop has stopped: no stream is reading, just record it
                self._loop_token = None
        if event_type.buffer is not None:
            event_type.buffer.append(event)
            self.wake(event.name)

    # ---- push streams ----------------------------------------------------------

    def wake(self, name: str) -> None:
        """Make every open push stream and webhook subscription of ``name`` read again now.

        For a check-function type, call it when you know the upstream changed, so
        push and webhook clients see the change without waiting for the next poll interval.
        """
        for stream in list(self._streams.get(name, ())):
            stream.wake()
        if self._webhooks is not None:
            self._webhooks.wake(name)

    def open_streams(self, name: str | None = None) -> int:
        """How many push streams are open (for one event type, or all)."""
        if name is not None:
            return len(self._streams.get(name, ()))
        return sum(len(streams) for streams in self._streams.values())

    def close_streams(
        self,
        name: str | None = None,
        *,
        error: MCPError | None = None,
        where: Callable[[dict[str, Any], str | None], bool] | None = None,
    ) -> int:
        """End open push streams from the server side; returns how many were asked to close.

        With ``error`` (say ``forbidden("access revoked")``) each stream first sends
        ``notifications/events/terminated`` carrying it; then it ends with the
        StreamEventsResult. ``where(arguments, principal)`` picks the streams; by
        default every stream (of ``name``, if given).
        """
        chosen = [
            stream
            for key, streams in self._streams.items()
            if name is None or key == name
            for stream in streams
            if where is None or where(stream.arguments, stream.principal)
        ]
        for stream in chosen:
            stream.close(error)
        return len(chosen)

    def forget_stream(self, stream: PushStream) -> None:
        streams = self._streams.get(stream.event_type.name)
        if streams is not None:
            streams.discard(stream)
            if not streams:
                del self._streams[stream.event_type.name]

    # ---- webhook subscriptions ----------------------------------------------------------

    def webhook_subscriptions(self, name: str | None = None) -> int:
        """How many webhook subscriptions are live (for one event type, or all)."""
        return 0 if self._webhooks is None else self._webhooks.count(name)

    def terminate_webhooks(
        self,
        name: str | None = None,
        *,
        error: MCPError,
        where: Callable[[dict[str, Any], str | None], bool] | None = None,
    ) -> int:
        """End webhook subscriptions from the server side; returns how many.

        Deliveries stop at once; each endpoint then gets a signed ``terminated``
        envelope carrying ``error`` (say ``forbidden("access revoked")``) and
        on_unsubscribe runs. ``where(arguments, principal)`` picks the subscriptions;
        by default every one (of ``name``, if given). Call it while ``running()``.
        """
        if self._webhooks is None:
            return 0
        return self._webhooks.terminate(name, error, where)

    async def sweep_webhooks(self) -> int:
        """End expired webhook subscriptions now (running() does this every ``sweep_interval``)."""
        return 0 if self._webhooks is None else await self._webhooks.sweep()

    def serves(self, event_type: EventType) -> bool:
        """Whether ``event_type`` is still declared (it may have been removed at runtime)."""
        return self._types.get(event_type.name) is event_type

    def now(self) -> datetime:
        return self._now()

    # ---- lifecycle -------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run background work for the server's lifetime: expiring poll leases, and with
        webhook delivery configured the delivery tasks, TTL expiry and the durable store.
        """
        async with AsyncExitStack() as stack:
            if self._webhooks is not None:
                await stack.enter_async_context(self._webhooks.running())
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._sweep_forever)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()

    async def _sweep_forever(self) -> None:
        while True:
            await anyio.sleep(LEASE_SWEEP_INTERVAL_S)
            await self.sweep_leases()

    async def sweep_leases(self) -> int:
        """Expire unrenewed poll leases, firing on_unsubscribe; returns how many ended."""
        ended = self._leases.expired()
        for lease in ended:
            try:
                await self.fire_hooks("unsubscribe", lease, request=None)
            except Exception:  # one failed teardown must not skip the rest or stop the sweeper
                logger.exception("on_unsubscribe for %s failed", lease.name)
        return len(ended)

    async def fire_hooks(
        self,
        kind: Literal["subscribe", "unsubscribe"],
        lease: Lease,
        *,
        request: Any,
        mode: DeliveryModeName = "poll",
    ) -> None:
        """Run the on_subscribe or on_unsubscribe hooks of ``lease.name`` with ``(ctx, arguments, subscription_id)``."""
        hooks = self._on_subscribe if kind == "subscribe" else self._on_unsubscribe
        ctx = EventContext(lease.name, lease.principal, mode, self.default_max_events, request=request)
        for hook in hooks.get(lease.name, ()):
            await maybe_await(hook(ctx, lease.arguments, lease.subscription_id))

    # ---- request handlers ------------------------------------------------------

    async def _handle_list(self, ctx: ServerRequestContext[Any, Any], params: ListParams) -> dict[str, Any]:
        self._remember_connection(ctx)
        offset = decode_page_cursor(params.cursor)
        types = list(self._types.values())
        page = types[offset : offset + self.list_page_size]
        result: dict[str, Any] = {"events": [t.descriptor() for t in page]}
        if offset + self.list_page_size < len(types):
            result["nextCursor"] = encode_page_cursor(offset + self.list_page_size)
        return result

    def _resolve(self, name: str, arguments: dict[str, Any] | None, mode: DeliveryModeName) -> EventType:
        event_type = self._types.get(name)
        if event_type is None:
            raise not_found(name)
        if mode not in event_type.modes():
            raise unsupported_mode(mode)
        # Bounded in time and size, whatever the client sends (agentwake.schemas).
        errors = event_type.validator.errors(arguments or {})
        if errors:
            details = [{"path": error.path, "message": error.message} for error in errors]
            summary = "; ".join(f"{d['path']}: {d['message']}" for d in details)
            raise invalid_params(
                f"arguments do not match the inputSchema of {name!r}: {summary}", {"errors": details}
            )
        return event_type

    async def _handle_poll(self, ctx: ServerRequestContext[Any, Any], params: PollParams) -> dict[str, Any]:
        self._remember_connection(ctx)
        arguments = params.arguments or {}
        event_type = self._resolve(params.name, arguments, "poll")
        principal = self._principal_of(ctx)
        lease, is_new = self._leases.touch(principal, event_type.name, arguments)
        if is_new:
            try:
                await self.fire_hooks("subscribe", lease, request=ctx)
            except BaseException:
                self._leases.drop(principal, event_type.name, arguments)
                raise
        max_events = min(params.max_events or self.default_max_events, MAX_EVENTS_CEILING)
        not_before = None
        if params.max_age_ms is not None and params.cursor is not None:
            not_before = self._now() - timedelta(milliseconds=params.max_age_ms)
        event_ctx = EventContext(
            event_name=event_type.name,
            principal=principal,
            mode="poll",
            max_events=max_events,
            max_age_ms=params.max_age_ms,
            not_before=not_before,
            request=ctx,
        )
        result = await read_events(event_type, event_ctx, arguments, params.cursor, lease)
        return {
            "events": [event.to_wire() for event in result.events],
            "cursor": result.cursor if event_type.replay else None,
            "truncated": result.truncated if event_type.replay else False,
            "hasMore": result.has_more,
            "nextPollMs": next(
                ms
                for ms in (result.next_poll_ms, event_type.next_poll_ms, self.default_next_poll_ms)
                if ms is not None
            ),
        }

    async def _handle_stream(
        self, ctx: ServerRequestContext[Any, Any], params: StreamParams
    ) -> dict[str, Any]:
        """events/stream: validate like poll (errors come back at once, no stream), then stream."""
        self._remember_connection(ctx)
        arguments = params.arguments or {}
        event_type = self._resolve(params.name, arguments, "push")
        if ctx.request_id is None:  # a request always has one; the notifications are routed by it
            raise invalid_params("events/stream must be a request with an id")
        if self.max_streams is not None and self.open_streams() >= self.max_streams:
            raise resource_exhausted("streams", self.max_streams)
        stream = PushStream(
            self,
            event_type,
            ctx,
            subscription_id=ctx.request_id,
            arguments=arguments,
            principal=self._principal_of(ctx),
            cursor=params.cursor,
            max_age_ms=params.max_age_ms,
            serial=next(self._stream_serial),
        )
        # Registered before the opening read, so no emit between that read and the first wait is missed.
        self._streams.setdefault(event_type.name, set()).add(stream)
        try:
            return await stream.serve()
        finally:
            self.forget_stream(stream)

    def _authenticated(self, ctx: ServerRequestContext[Any, Any]) -> tuple[Webhooks, str]:
        assert self._webhooks is not None  # the methods are bound only with webhook configured
        principal = self._principal_of(ctx)
        if principal is None:
            raise forbidden("webhook delivery needs an authenticated principal")
        return self._webhooks, principal

    async def _handle_subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeParams
    ) -> dict[str, Any]:
        """events/subscribe: create or refresh the caller's webhook subscription for this key."""
        self._remember_connection(ctx)
        webhooks, principal = self._authenticated(ctx)
        url, secret, key = check_delivery(params.delivery)
        arguments = params.arguments or {}
        event_type = self._resolve(params.name, arguments, "webhook")
        return await webhooks.subscribe(
            ctx,
            event_type,
            principal=principal,
            url=url,
            secret=secret,
            key=key,
            arguments=arguments,
            cursor=params.cursor,
            max_age_ms=params.max_age_ms,
            ttl_ms=params.ttl_ms,
            ttl_given="ttl_ms" in params.model_fields_set,
        )

    async def _handle_unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeParams
    ) -> dict[str, Any]:
        """events/unsubscribe: by (the caller, name, arguments, delivery.url); never by id."""
        self._remember_connection(ctx)
        webhooks, principal = self._authenticated(ctx)
        delivery = params.delivery
        url = delivery.get("url") if isinstance(delivery, dict) else None
        if not isinstance(url, str) or not url:
            raise invalid_params("delivery.url is required: the URL the subscription delivers to")
        await webhooks.unsubscribe(
            principal=principal, name=params.name, arguments=params.arguments or {}, url=url
        )
        return {}

    async def read(
        self,
        event_type: EventType,
        ctx: EventContext,
        arguments: dict[str, Any],
        cursor: str | None,
        lease: Lease | None,
    ) -> EventResult:
        """One read, the same for every mode: the check function, or the ring buffer."""
        return await read_events(event_type, ctx, arguments, cursor, lease)
