"""Connections to MCP servers through the official SDK, and the events client calls.

One ``ServerConnection`` per configured server, over stdio or Streamable HTTP.
The SDK's errors are converted here, once, into agentwake's tree with the
server's name attached.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from importlib.metadata import PackageNotFoundError, version
from types import TracebackType
from typing import Any, Final, Literal, TypeVar, cast

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.client.stdio import get_default_environment
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    REQUEST_TIMEOUT,
    CallToolResult,
    Implementation,
    Request,
    RequestParams,
    Tool,
)
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from agentwake import protocol
from agentwake._compat import (
    InterceptingClient,
    connection_closed,
    http_client,
    send_raw_request,
    stamped_params,
)
from agentwake.config import LimitsConfig, ServerConfig
from agentwake.errors import (
    ConnectError,
    ConnectionLost,
    DeliveryError,
    EventsUnsupported,
    TransientEventsError,
    events_call_error,
)
from agentwake.jsontext import encode_json
from agentwake.logs import CONNECTION_NAME, adapt_sdk_logs
from agentwake.mcp_streams import EventStreams
from agentwake.ratelimit import ServerRequestLimit, limit_server_requests
from agentwake.stdio import (
    BoundedStdioClient,
    OversizedMessage,
    ServerExit,
    StdioLimits,
    UnparsableMessage,
    bounded_stdio_client,
)
from agentwake.streams import StreamRoutes
from agentwake.text import peer

logger = logging.getLogger(__name__)
# The SDK's warning at each HTTP close whose session DELETE fails: once per server, in our words.
adapt_sdk_logs()

T = TypeVar("T")
MAX_LIST_PAGES: Final = 1000
# Requests in a row that get no answer before the connection is given up and made again.
DEAD_AFTER_TIMEOUTS: Final = 3
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
    """Declares the events extension; its notifications are taken off the receive path by StreamRoutes."""

    identifier = protocol.EXTENSION_ID

    def notifications(self) -> list[NotificationBinding[Any]]:
        return []


def _real_stderr() -> Any:  # kept for callers passing no errlog: the server's stderr is ours
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
    name: str,
    config: ServerConfig,
    exc: BaseException,
    *,
    http_status: int | None = None,
    exit: ServerExit | None = None,
) -> str:
    exc = _unwrap(exc)
    if config.transport == "stdio":
        where = f"server {name!r} (command {config.command!r})"
        if isinstance(exc, FileNotFoundError):
            return f"{where}: command not found; check 'command' and PATH"
        if isinstance(exc, PermissionError):
            return f"{where}: command is not executable"
        if isinstance(exc, MCPError) and connection_closed(exc):
            how = f" ({exit.describe()})" if exit is not None else ""
            return f"{where}: the process exited before finishing the MCP handshake{how}; see its stderr"
    else:
        where = f"server {name!r} at {config.url}"
        if http_status in (401, 403):
            return f"{where}: the server refused our credentials (HTTP {http_status}); check 'headers'"
        if http_status is not None:
            return f"{where}: the server answered HTTP {http_status}; check 'url'"
        if isinstance(exc, MCPError) and connection_closed(exc):
            return f"{where}: the connection closed during the MCP handshake"
    if isinstance(exc, TimeoutError) or (isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT):
        return f"{where}: no answer to the MCP handshake within {config.connect_timeout_s:g}s"
    return f"{where}: cannot connect: {type(exc).__name__}: {exc}"


class ServerConnection(EventStreams):
    """An open MCP session to one server. Use as ``async with ServerConnection(...)``."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        *,
        on_list_changed: Callable[[], None] | None = None,
        on_tools_changed: Callable[[], Awaitable[None]] | None = None,
        errlog: Any = None,
        limits: LimitsConfig | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.limits = limits or LimitsConfig()
        self._timeouts = 0
        self._on_list_changed = on_list_changed
        self._on_tools_changed = on_tools_changed
        self._errlog = errlog if errlog is not None else _real_stderr()
        self._stack: AsyncExitStack | None = None
        self._client: Client | None = None
        self._streams = StreamRoutes(on_list_changed)
        # What the last events/list said, to notice a change where no list_changed can arrive.
        self.listed_events: list[dict[str, Any]] | None = None
        self.last_http_error: int | None = None
        self.stdio: BoundedStdioClient | None = None

    def _on_lost(self, exc: Exception) -> None:
        """A stdio message the transport dropped (too big, not JSON-RPC), in wire order: streams record a gap."""
        self._streams.lost({"reason": peer(f"{type(exc).__name__}: {exc}", 300)})

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            if isinstance(message, OversizedMessage | UnparsableMessage):
                return  # already told to the streams, in wire order, by _on_lost
            # A fault of another transport (HTTP): streams record a gap, later than on stdio.
            self._streams.lost({"reason": peer(f"{type(message).__name__}: {message}", 300)})
            return
        # Handshake-era servers announce tool changes as a plain notification.
        if getattr(message, "method", None) == TOOLS_LIST_CHANGED and self._on_tools_changed is not None:
            await self._on_tools_changed()

    def _closed_message(self) -> str:
        """Why the connection closed: how the server process ended, when it was one and it did."""
        exit = self.stdio.exit if self.stdio is not None else None
        if exit is not None:
            return f"server {self.name!r}: connection closed: {exit.describe()}"
        return f"server {self.name!r}: connection closed"

    async def _note_http_status(self, response: Any) -> None:
        # The SDK folds HTTP failures into a generic error; keep the status for the message.
        if response.status_code >= 400:
            self.last_http_error = response.status_code

    def _transport(self, stack: AsyncExitStack) -> Any:
        config = self.config
        if config.transport == "stdio":
            assert config.command is not None
            from agentwake.commands import resolve_command  # PATH, then this interpreter's scripts

            params = StdioServerParameters(
                command=resolve_command(config.command, config.env),
                args=list(config.args),
                env={**get_default_environment(), **config.env} if config.env else None,
                cwd=config.cwd,
            )
            self.stdio = bounded_stdio_client(
                params,
                name=self.name,
                limits=StdioLimits(
                    max_message_bytes=self.limits.max_message_bytes,
                    server_requests_per_s=self.limits.max_server_requests_per_s,
                ),
                errlog=self._errlog,
                on_lost=self._on_lost,
            )
            return self.stdio
        assert config.url is not None
        client = http_client(config.headers)
        client.event_hooks["response"].append(self._note_http_status)
        stack.push_async_callback(client.aclose)
        # The server's requests wait their turn in the session's read loop (back-pressure on the socket).
        limit = ServerRequestLimit(self.name, self.limits.max_server_requests_per_s)
        return limit_server_requests(streamable_http_client(config.url, http_client=client), limit)

    async def __aenter__(self) -> ServerConnection:
        CONNECTION_NAME.set(self.name)  # this task's and its transport tasks' SDK lines name us
        stack = AsyncExitStack()
        mode: Literal["auto", "legacy"] = self.config.protocol
        try:
            client = InterceptingClient(
                self._transport(stack),
                mode=mode,
                # The handshake's bound; every later request passes request_timeout_s itself.
                read_timeout_seconds=self.config.connect_timeout_s,
                client_info=Implementation(name="agentwake", version=_agentwake_version()),
                extensions=[_EventsClientExtension()],
                message_handler=self._on_message,
                intercept=self._streams.intercept,
                pace=self._streams.pace,
            )
            self._client = await stack.enter_async_context(client)
        except BaseException as exc:
            await stack.aclose()
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            message = describe_connect_failure(
                self.name,
                self.config,
                exc,
                http_status=self.last_http_error,
                exit=self.stdio.exit if self.stdio is not None else None,
            )
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
            named = CONNECTION_NAME.set(self.name)
            try:
                await stack.__aexit__(exc_type, exc, tb)
            except anyio.get_cancelled_exc_class():
                if self._cancelled_by_owner():
                    raise
                exc = exc or anyio.get_cancelled_exc_class()()
            except Exception as close_exc:  # a dead peer may fail its own shutdown
                logger.debug("closing %s: %s", self.name, close_exc)
            finally:
                CONNECTION_NAME.reset(named)
        # The SDK's HTTP transport ends a dead server's connection by cancelling the task it
        # runs in; that cancellation is not our owner's and must not pass for it.
        if isinstance(exc, anyio.get_cancelled_exc_class()) and not self._cancelled_by_owner():
            raise ConnectionLost(
                f"{self._closed_message()} (the transport shut down)", server=self.name
            ) from None

    @staticmethod
    def _cancelled_by_owner() -> bool:
        """Whether whoever runs this connection is stopping it: a cancelled scope around it (the
        SDK's own scopes are gone by now) or a plain asyncio cancel, such as the runner's on Ctrl-C."""
        if anyio.current_effective_deadline() == -math.inf:
            return True
        try:
            task = asyncio.current_task()
        except RuntimeError:  # not on asyncio
            return False
        return task is not None and task.cancelling() > 0

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
        """Whether the server declares MCP Events in its capabilities, in any of the three spellings.

        ``extensions["io.modelcontextprotocol/events"]`` (2026-era), ``capabilities.events``
        (the spec's own example) or ``experimental["io.modelcontextprotocol/events"]``
        (handshake-era servers). Read from the handshake's result as sent: the SDK's
        model keeps no unknown capability such as ``events``.
        """
        client = self.client
        raw = client.handshake_result if isinstance(client, InterceptingClient) else None
        declared = raw.get("capabilities") if isinstance(raw, dict) else None
        if isinstance(declared, dict):
            return any(
                isinstance(where, dict) and protocol.EXTENSION_ID in where
                for where in (declared.get("extensions"), declared.get("experimental"))
            ) or isinstance(declared.get("events"), dict)
        caps = client.server_capabilities
        return bool(
            (caps.extensions and protocol.EXTENSION_ID in caps.extensions)
            or (caps.experimental and protocol.EXTENSION_ID in caps.experimental)
        )

    @property
    def offers_tools(self) -> bool:
        """Whether the server declares the tools capability: one that does not is sent no tools/list."""
        return self.client.server_capabilities.tools is not None

    def require_events(self) -> None:
        """Raise EventsUnsupported unless the server declares MCP Events: no events/* request goes to it."""
        if not self.advertises_events:
            raise EventsUnsupported(
                f"server {self.name!r} does not implement MCP Events (no events extension in its capabilities)",
                server=self.name,
            )

    @property
    def handshake_era(self) -> bool:
        """A connection made by ``initialize`` (protocol before 2026-07-28), not ``server/discover``."""
        return self.client.session.initialize_result is not None

    async def watch(self, interval_s: float) -> None:
        """Raise ConnectionLost once the connection is found dead; until then, never return.

        A stdio server's exit is seen at once. Every ``interval_s`` a probe checks that the
        server still answers (``probe``). Meant for connections nothing else talks on for a
        while: webhook delivery between refreshes, a server kept only for its tools.
        """
        while True:
            if self.stdio is not None:
                with anyio.move_on_after(interval_s):
                    await self.stdio.wait_exit()
                    raise ConnectionLost(self._closed_message(), server=self.name)
            else:
                await anyio.sleep(interval_s)
            await self.probe()

    async def probe(self) -> None:
        """One liveness check; ConnectionLost if the server does not answer, or its events changed.

        ``ping`` on handshake-era connections. 2026-era ones have no ping: there the probe
        is ``events/list`` for a server with events (which also notices a changed list, that
        a 2026-era HTTP connection has no channel to announce) and ``server/discover`` for
        one without (which notices it now declares them). Any answer, an error included,
        means the server is alive.
        """
        timeout = self.config.request_timeout_s
        try:
            with anyio.fail_after(timeout):
                await self._probe_once()
        except TimeoutError:
            raise ConnectionLost(
                f"server {self.name!r}: no answer to a liveness probe within {timeout:g}s; reconnecting",
                server=self.name,
            ) from None
        except ConnectionLost:
            raise
        except TransientEventsError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise ConnectionLost(
                    f"server {self.name!r}: no answer to a liveness probe within {timeout:g}s; reconnecting",
                    server=self.name,
                ) from None
        except DeliveryError:
            return  # it answered, if not as it should: the loops that use the answers will say so
        except MCPError as exc:
            if connection_closed(exc) or exc.code == REQUEST_TIMEOUT:
                raise ConnectionLost(
                    f"{self._closed_message()} (noticed by the liveness probe)", server=self.name
                ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise ConnectionLost(
                f"server {self.name!r}: {type(exc).__name__}: {exc}", server=self.name
            ) from None

    async def _probe_once(self) -> None:
        if self.handshake_era:
            await self.client.session.send_ping()
            return
        if not self.advertises_events:
            await self.client.session.send_discover(self.protocol_version)
            if self.advertises_events:
                raise ConnectionLost(
                    f"server {self.name!r} now declares MCP Events; reconnecting to use them",
                    server=self.name,
                )
            return
        before = self.listed_events
        await self.list_events()
        if before is not None and self.listed_events != before and self._streams.on_list_changed:
            logger.info("server %s: its event types changed (seen by the liveness probe)", self.name)
            self._streams.on_list_changed()

    async def request(
        self,
        method: str,
        params: dict[str, Any],
        *,
        subscription: str | None = None,
        read_timeout_s: float | None = None,
        keep_nulls: bool = False,
        direct: bool = False,
    ) -> dict[str, Any]:
        """Send one events/* request; every failure comes back as a DeliveryError.

        The SDK drops null params; ``keep_nulls`` sends them as written, for fields
        where null differs from absent (events/subscribe's ``ttlMs: null`` asks for
        no expiry, absent for the server's default).

        ``direct``, over agentwake's own stdio transport, sends the request beside the
        session (``BoundedStdioClient.call``), stamped as the session stamps its own: the
        same request and the same outcomes, without the session's per-request machinery,
        which is most of a quiet poll's cost. Over HTTP it changes nothing.
        """
        timeout = read_timeout_s or self.config.request_timeout_s
        try:
            if direct and self.stdio is not None:
                session = self.client.session
                sent = dict(params) if keep_nulls else {k: v for k, v in params.items() if v is not None}
                answer = await self.stdio.call(
                    method, stamped_params(session, method, sent), timeout_s=timeout
                )
            elif keep_nulls:
                answer = await send_raw_request(self.client.session, method, params, timeout_s=timeout)
            else:
                request = _EventsRequest(method=method, params=_Params.model_validate(params))
                answer = await self.client.session.send_request(  # type: ignore[type-var]
                    request, _RESULT, request_read_timeout_seconds=timeout
                )
            self._timeouts = 0
            return answer
        except MCPError as exc:
            if connection_closed(exc):
                raise ConnectionLost(self._closed_message(), server=self.name) from None
            if exc.code == REQUEST_TIMEOUT:
                self._timeouts += 1
                if self._timeouts >= DEAD_AFTER_TIMEOUTS:
                    # Answers that never come (a reply the transport could not read, a wedged peer):
                    # the connection is not trusted any more; a new one starts clean.
                    raise ConnectionLost(
                        f"server {self.name!r}: no answer to {self._timeouts} requests in a row; reconnecting",
                        server=self.name,
                    ) from None
                raise TransientEventsError(
                    method, exc.code, "request timed out", server=self.name, subscription=subscription
                ) from None
            self._timeouts = 0
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
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(result)"
        return TransientEventsError(
            method,
            protocol.INTERNAL_ERROR,
            f"malformed result: {where}: {first['msg']}",
            server=self.name,
            subscription=subscription,
        )

    async def unsubscribe(
        self, event: str, arguments: dict[str, Any], url: str, *, subscription: str | None = None
    ) -> None:
        """events/unsubscribe by the subscription key (name, arguments, delivery.url).

        ``delivery`` carries the mode as on events/subscribe: a server may require it.
        """
        await self.request(
            protocol.METHOD_UNSUBSCRIBE,
            {"name": event, "arguments": arguments, "delivery": {"mode": "webhook", "url": url}},
            subscription=subscription,
        )

    async def _all_pages(
        self, what: str, fetch: Callable[[str | None], Awaitable[tuple[list[T], str | None, int]]]
    ) -> list[T]:
        """Every page of a paginated list, guarding against a server that loops, never ends, or
        sends more than ``max_list_bytes`` in all (``fetch`` says each page's size)."""
        items: list[T] = []
        cursor: str | None = None
        seen: set[str] = set()
        total = 0
        budget = self.limits.max_list_bytes
        for _ in range(MAX_LIST_PAGES):
            page, cursor, size = await fetch(cursor)
            total += size
            if total > budget:
                raise DeliveryError(
                    f"server {self.name!r}: {what} sent more than {budget} bytes ([limits] max_list_bytes)",
                    server=self.name,
                )
            items.extend(page)
            if not cursor:
                return items
            if cursor in seen:
                raise DeliveryError(
                    f"server {self.name!r}: {what} repeats the page cursor {peer(cursor, 80)}"
                )
            seen.add(cursor)
        raise DeliveryError(f"server {self.name!r}: {what} has more than {MAX_LIST_PAGES} pages")

    async def list_events(self) -> list[protocol.EventDescriptor]:
        """events/list, every page."""

        async def fetch(cursor: str | None) -> tuple[list[protocol.EventDescriptor], str | None, int]:
            raw = await self.request(protocol.METHOD_LIST, {"cursor": cursor} if cursor else {})
            size = len(encode_json(raw))
            try:
                page = protocol.ListEventsResult.model_validate(raw)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"]) or "(result)"
                raise DeliveryError(
                    f"server {self.name!r} sent a malformed events/list result: {where}: {first['msg']}"
                ) from None
            return page.events, page.next_cursor, size

        descriptors = await self._all_pages(protocol.METHOD_LIST, fetch)
        self.listed_events = [d.model_dump(by_alias=True, mode="json") for d in descriptors]
        return descriptors

    async def poll(self, params: dict[str, Any], *, subscription: str | None = None) -> dict[str, Any]:
        """events/poll with ``params`` in their wire form (``protocol.PollParams``, by alias, a null
        cursor left out, as the SDK's path always did); the result as sent (the poll loop reads it
        leniently, event by event). The hot path of quiet subscriptions: over stdio it is sent
        beside the session (``direct``).
        """
        return await self.request(protocol.METHOD_POLL, params, subscription=subscription, direct=True)

    async def list_tools(self) -> list[Tool]:
        """tools/list, every page."""

        async def fetch(cursor: str | None) -> tuple[list[Tool], str | None, int]:
            try:
                page = await self.client.list_tools(cursor=cursor, cache_mode="refresh")
            except MCPError as exc:
                if connection_closed(exc):
                    raise ConnectionLost(self._closed_message(), server=self.name) from None
                raise DeliveryError(f"server {self.name!r}: tools/list failed: {peer(exc.message)}") from None
            return list(page.tools), page.next_cursor, len(page.model_dump_json())

        return await self._all_pages("tools/list", fetch)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float, meta: dict[str, Any] | None = None
    ) -> CallToolResult:
        """tools/call through the SDK; protocol errors come back as MCPError, a dead peer as ConnectionLost."""
        try:
            return await self.client.call_tool(
                name, arguments, read_timeout_seconds=timeout_s, meta=cast(Any, meta)
            )
        except MCPError as exc:
            if connection_closed(exc):
                raise ConnectionLost(self._closed_message(), server=self.name) from None
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise ConnectionLost(
                f"server {self.name!r}: {type(exc).__name__}: {exc}", server=self.name
            ) from None
