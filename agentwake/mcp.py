"""Connections to MCP servers through the official SDK, and the events client calls.

One ``ServerConnection`` per configured server, over stdio or Streamable HTTP.
The SDK's errors are converted here, once, into agentwake's tree with the
server's name attached.
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any, Final, Literal, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    Implementation,
    Request,
    RequestParams,
    Tool,
)
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from agentwake import protocol
from agentwake._compat import InterceptingClient, http_client, send_raw_request
from agentwake.config import ServerConfig
from agentwake.errors import (
    ConnectError,
    ConnectionLost,
    DeliveryError,
    TransientEventsError,
    events_call_error,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
MAX_LIST_PAGES: Final = 1000
TOOLS_LIST_CHANGED: Final = "notifications/tools/list_changed"
_RESULT: Final = TypeAdapter(dict[str, Any])


def _agentwake_version() -> str:
    try:
        return version("agentwake")
    except PackageNotFoundError:
        return "0"


class _Params(RequestParams):
    model_config = ConfigDict(extra="allow")


class _EventsRequest(Request[_Params, str]):
    """Any events/* request: the method and params are set per call."""


class _AnyParams(BaseModel):
    model_config = ConfigDict(extra="allow")


class _EventsClientExtension(ClientExtension):
    identifier = protocol.EXTENSION_ID

    def __init__(self, on_list_changed: Callable[[], Awaitable[None]] | None) -> None:
        self._on_list_changed = on_list_changed

    def notifications(self) -> list[NotificationBinding[Any]]:
        if self._on_list_changed is None:
            return []
        callback = self._on_list_changed

        async def handle(_params: _AnyParams) -> None:
            await callback()

        return [
            NotificationBinding(
                method=protocol.NOTIFICATION_LIST_CHANGED, params_type=_AnyParams, handler=handle
            )
        ]


def _real_stderr() -> Any:
    """Where a stdio server's stderr goes: ours, unless it was swapped for a stream without a file."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__
    return sys.stderr


def _unwrap(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def describe_connect_failure(
    name: str, config: ServerConfig, exc: BaseException, *, http_status: int | None = None
) -> str:
    exc = _unwrap(exc)
    if config.transport == "stdio":
        where = f"server {name!r} (command {config.command!r})"
        if isinstance(exc, FileNotFoundError):
            return f"{where}: command not found; check 'command' and PATH"
        if isinstance(exc, PermissionError):
            return f"{where}: command is not executable"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
            return f"{where}: the process exited before finishing the MCP handshake (see its stderr above)"
    else:
        where = f"server {name!r} at {config.url}"
        if http_status in (401, 403):
            return f"{where}: the server refused our credentials (HTTP {http_status}); check 'headers'"
        if http_status is not None:
            return f"{where}: the server answered HTTP {http_status}; check 'url'"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
            return f"{where}: the connection closed during the MCP handshake"
    if isinstance(exc, TimeoutError) or (isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT):
        return f"{where}: no answer to the MCP handshake within {config.connect_timeout_s:g}s"
    return f"{where}: cannot connect: {type(exc).__name__}: {exc}"


STREAM_NOTIFICATIONS: Final = (
    protocol.NOTIFICATION_ACTIVE,
    protocol.NOTIFICATION_EVENT,
    protocol.NOTIFICATION_HEARTBEAT,
    protocol.NOTIFICATION_ERROR,
    protocol.NOTIFICATION_TERMINATED,
)
STREAM_BUFFER: Final = 50_000
_stream_ids = itertools.count(1)


@dataclass
class StreamRoute:
    """One events/stream's notifications, in wire order; ``overflowed`` says one was lost."""

    request_id: str
    send: MemoryObjectSendStream[tuple[str, dict[str, Any]]]
    receive: MemoryObjectReceiveStream[tuple[str, dict[str, Any]]]
    overflowed: bool = False

    def offer(self, method: str, params: dict[str, Any]) -> None:
        if self.overflowed:
            # Keep what is queued a gap-free prefix: nothing after a lost notification is taken.
            return
        try:
            self.send.send_nowait((method, params))
        except anyio.WouldBlock:
            # The loop fell this far behind: it stores the prefix and reconnects from its cursor.
            self.overflowed = True
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    def close(self) -> None:
        self.send.close()
        self.receive.close()


class StreamRoutes:
    """Open events/stream requests by id; their notifications are taken off the receive path here.

    The SDK's own notification bindings go through a per-method queue that drops the
    oldest on overflow and may reorder across methods; a stream's cursor must never get
    ahead of an event not yet stored, so stream notifications are routed here instead,
    in wire order, the way the SDK routes its own subscriptions/listen streams.
    """

    def __init__(self) -> None:
        self.routes: dict[Any, StreamRoute] = {}

    def intercept(self, method: str, params: Mapping[str, Any] | None) -> bool:
        if method not in STREAM_NOTIFICATIONS or not isinstance(params, Mapping):
            return False
        meta = params.get("_meta")
        request_id = meta.get(protocol.SUBSCRIPTION_ID_META) if isinstance(meta, Mapping) else None
        route = self.routes.get(request_id)
        if route is not None:
            route.offer(method, dict(params))
        else:
            logger.debug("%s for no open stream (%r): dropped", method, request_id)
        return True


class ServerConnection:
    """An open MCP session to one server. Use as ``async with ServerConnection(...)``."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        *,
        on_list_changed: Callable[[], Awaitable[None]] | None = None,
        on_tools_changed: Callable[[], Awaitable[None]] | None = None,
        errlog: Any = None,
    ) -> None:
        self.name = name
        self.config = config
        self._on_list_changed = on_list_changed
        self._on_tools_changed = on_tools_changed
        self._errlog = errlog if errlog is not None else _real_stderr()
        self._stack: AsyncExitStack | None = None
        self._client: Client | None = None
        self._streams = StreamRoutes()
        self.last_http_error: int | None = None

    async def _on_message(self, message: Any) -> None:
        # Handshake-era servers announce tool changes as a plain notification.
        if getattr(message, "method", None) == TOOLS_LIST_CHANGED and self._on_tools_changed is not None:
            await self._on_tools_changed()

    async def _note_http_status(self, response: Any) -> None:
        # The SDK folds HTTP failures into a generic error; keep the status for the message.
        if response.status_code >= 400:
            self.last_http_error = response.status_code

    def _transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if config.transport == "stdio":
            assert config.command is not None
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env={**get_default_environment(), **config.env} if config.env else None,
                cwd=config.cwd,
            )
            return stdio_client(params, errlog=self._errlog)
        assert config.url is not None
        client = http_client(config.headers)
        client.event_hooks["response"].append(self._note_http_status)
        stack.push_async_callback(client.aclose)
        return streamable_http_client(config.url, http_client=client)

    async def __aenter__(self) -> ServerConnection:
        stack = AsyncExitStack()
        mode: Literal["auto", "legacy"] = self.config.protocol
        try:
            client = InterceptingClient(
                self._transport(stack),
                mode=mode,
                # The handshake's bound; every later request passes request_timeout_s itself.
                read_timeout_seconds=self.config.connect_timeout_s,
                client_info=Implementation(name="agentwake", version=_agentwake_version()),
                extensions=[_EventsClientExtension(self._on_list_changed)],
                message_handler=self._on_message,
                intercept=self._streams.intercept,
            )
            self._client = await stack.enter_async_context(client)
        except BaseException as exc:
            await stack.aclose()
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            message = describe_connect_failure(self.name, self.config, exc, http_status=self.last_http_error)
            raise ConnectError(message, server=self.name) from None
        self._stack = stack
        logger.info(
            "connected to %s over %s (protocol %s)",
            self.name,
            self.config.transport,
            self._client.protocol_version,
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            # Not shielded here: the SDK's task groups must exit in the scope they were entered in.
            try:
                await stack.__aexit__(exc_type, exc, tb)
            except Exception as close_exc:  # a dead peer may fail its own shutdown
                logger.debug("closing %s: %s", self.name, close_exc)

    @property
    def client(self) -> Client:
        if self._client is None:
            raise ConnectionLost(f"server {self.name!r} is not connected", server=self.name)
        return self._client

    @property
    def protocol_version(self) -> str:
        return self.client.protocol_version

    @property
    def advertises_events(self) -> bool:
        """Whether the server advertised the events capability (either spelling we can see)."""
        caps = self.client.server_capabilities
        return bool(
            (caps.extensions and protocol.EXTENSION_ID in caps.extensions)
            or (caps.experimental and protocol.EXTENSION_ID in caps.experimental)
        )

    async def request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        subscription: str | None = None,
        read_timeout_s: float | None = None,
        keep_nulls: bool = False,
    ) -> dict[str, Any]:
        """Send one events/* request; every failure comes back as a DeliveryError.

        The SDK drops null params; ``keep_nulls`` sends them as written, for fields
        where null differs from absent (events/subscribe's ``ttlMs: null`` asks for
        no expiry, absent for the server's default).
        """
        timeout = read_timeout_s or self.config.request_timeout_s
        try:
            if keep_nulls:
                return await send_raw_request(self.client.session, method, params, timeout_s=timeout)
            request = _EventsRequest(method=method, params=_Params.model_validate(params))
            return await self.client.session.send_request(  # type: ignore[type-var]
                request, _RESULT, request_read_timeout_seconds=timeout
            )
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise ConnectionLost(f"server {self.name!r}: connection closed", server=self.name) from None
            if exc.code == REQUEST_TIMEOUT:
                raise TransientEventsError(
                    method, exc.code, "request timed out", server=self.name, subscription=subscription
                ) from None
            raise events_call_error(
                method, exc.code, exc.message, exc.data, server=self.name, subscription=subscription
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise ConnectionLost(
                f"server {self.name!r}: {type(exc).__name__}: {exc}", server=self.name
            ) from None

    async def subscribe(
        self, params: dict[str, Any], *, subscription: str | None = None
    ) -> protocol.SubscribeResult:
        """events/subscribe (webhook); a malformed result is a transient error, as for poll."""
        raw = await self.request(
            protocol.METHOD_SUBSCRIBE, params, subscription=subscription, keep_nulls=True
        )
        try:
            return protocol.SubscribeResult.model_validate(raw)
        except ValidationError as exc:
            raise self._malformed(protocol.METHOD_SUBSCRIBE, exc, subscription) from None

    def _malformed(self, method: str, exc: ValidationError, subscription: str | None) -> TransientEventsError:
        """A result that does not validate: transient, the server may answer better next time."""
        return TransientEventsError(
            method,
            protocol.INTERNAL_ERROR,
            f"malformed result: {exc.errors()[0]['msg']}",
            server=self.name,
            subscription=subscription,
        )

    async def unsubscribe(
        self, event: str, arguments: dict[str, Any], url: str, *, subscription: str | None = None
    ) -> None:
        """events/unsubscribe by the subscription key (name, arguments, delivery.url)."""
        await self.request(
            protocol.METHOD_UNSUBSCRIBE,
            {"name": event, "arguments": arguments, "delivery": {"url": url}},
            subscription=subscription,
        )

    async def _all_pages(
        self, what: str, fetch: Callable[[str | None], Awaitable[tuple[list[T], str | None]]]
    ) -> list[T]:
        """Every page of a paginated list, guarding against a server that loops or never ends."""
        items: list[T] = []
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(MAX_LIST_PAGES):
            page, cursor = await fetch(cursor)
            items.extend(page)
            if not cursor:
                return items
            if cursor in seen:
                raise DeliveryError(f"server {self.name!r}: {what} repeats the page cursor {cursor!r}")
            seen.add(cursor)
        raise DeliveryError(f"server {self.name!r}: {what} has more than {MAX_LIST_PAGES} pages")

    async def list_events(self) -> list[protocol.EventDescriptor]:
        """events/list, every page."""

        async def fetch(cursor: str | None) -> tuple[list[protocol.EventDescriptor], str | None]:
            raw = await self.request(protocol.METHOD_LIST, {"cursor": cursor} if cursor else {})
            try:
                page = protocol.ListEventsResult.model_validate(raw)
            except ValidationError as exc:
                raise DeliveryError(
                    f"server {self.name!r} sent a malformed events/list result: {exc}"
                ) from None
            return page.events, page.next_cursor

        return await self._all_pages(protocol.METHOD_LIST, fetch)

    async def poll(
        self, params: protocol.PollParams, *, subscription: str | None = None
    ) -> protocol.PollPage:
        body = params.model_dump(by_alias=True, exclude_none=True)
        body.setdefault("cursor", None)  # an explicit null reads better in server logs
        raw = await self.request(protocol.METHOD_POLL, body, subscription=subscription)
        try:
            return protocol.PollPage.validate(raw)
        except ValidationError as exc:
            raise self._malformed(protocol.METHOD_POLL, exc, subscription) from None

    def open_stream_route(self) -> StreamRoute:
        """A route for a new events/stream; register it before sending the request."""
        _ = self.client  # raises ConnectionLost when not connected
        send, receive = anyio.create_memory_object_stream[tuple[str, dict[str, Any]]](STREAM_BUFFER)
        route = StreamRoute(f"agentwake-stream-{next(_stream_ids)}", send, receive)
        self._streams.routes[route.request_id] = route
        return route

    def close_stream_route(self, route: StreamRoute) -> None:
        self._streams.routes.pop(route.request_id, None)
        route.close()

    async def stream(
        self, route: StreamRoute, params: dict[str, Any], *, subscription: str | None = None
    ) -> None:
        """Send events/stream under the route's id and wait for its final frame (the server closed it).

        No read timeout: the heartbeat is the liveness signal. Cancelling this (the
        caller's scope) cancels the request: notifications/cancelled on stdio, the POST
        stream aborted on HTTP, as the SDK does for any abandoned request.
        """
        session = self.client.session
        try:
            await send_raw_request(session, protocol.METHOD_STREAM, params, request_id=route.request_id)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise ConnectionLost(f"server {self.name!r}: connection closed", server=self.name) from None
            raise events_call_error(
                protocol.METHOD_STREAM,
                exc.code,
                exc.message,
                exc.data,
                server=self.name,
                subscription=subscription,
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise ConnectionLost(
                f"server {self.name!r}: {type(exc).__name__}: {exc}", server=self.name
            ) from None

    async def list_tools(self) -> list[Tool]:
        """tools/list, every page."""

        async def fetch(cursor: str | None) -> tuple[list[Tool], str | None]:
            try:
                page = await self.client.list_tools(cursor=cursor, cache_mode="refresh")
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    raise ConnectionLost(
                        f"server {self.name!r}: connection closed", server=self.name
                    ) from None
                raise DeliveryError(f"server {self.name!r}: tools/list failed: {exc.message}") from None
            return list(page.tools), page.next_cursor

        return await self._all_pages("tools/list", fetch)

    async def call_tool(self, name: str, arguments: dict[str, Any], *, timeout_s: float) -> CallToolResult:
        """tools/call through the SDK; protocol errors come back as MCPError, a dead peer as ConnectionLost."""
        try:
            return await self.client.call_tool(name, arguments, read_timeout_seconds=timeout_s)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                raise ConnectionLost(f"server {self.name!r}: connection closed", server=self.name) from None
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise ConnectionLost(
                f"server {self.name!r}: {type(exc).__name__}: {exc}", server=self.name
            ) from None
