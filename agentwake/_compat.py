"""Every private attribute of the ``mcp`` SDK and of aiohttp that agentwake relies on, in one place.

Each use is here, typed, with the reason it is needed; nothing else in agentwake
touches a private name of a dependency. ``PRIVATE_ATTRIBUTES`` lists them, and
``tests/test_compat.py`` checks every one against the installed versions, failing
with the attribute's name when an upgrade removes it. ``mcp`` is pinned to the
minor release that test passes on.

    mcp.client.Client._build_session            the session a Client builds, before it is entered
    mcp.client.ClientSession._intercept_notification
                                                the dispatcher's synchronous, wire-order look at each
                                                notification; the public bindings queue per method,
                                                drop the oldest on overflow and may reorder
    mcp.client.ClientSession._stamp             protocol-era headers (and, 2026-era, ``_meta``) on a
                                                request we send raw, or beside the session (polls
                                                over agentwake.stdio)
    mcp.client.ClientSession._dispatcher        sending a request raw: with nulls kept in its params
                                                (the SDK's models drop them) and with our own id; and
                                                reading the handshake's result as sent (the SDK's
                                                model drops ``capabilities.events``)
    mcp.shared._httpx_utils.create_mcp_http_client
                                                the SDK's HTTP client defaults (timeouts, redirects)
    mcp.server.session.ServerSession._connection
                                                the connection behind a request, to notify it later
    mcp.server._streamable_http_modern._SSE_PING_INTERVAL
                                                how long a 2026-era SSE response may be silent before
                                                the SDK writes ``: ping``; tests shorten it to see the
                                                pings (and their absence on events/stream) in seconds
    aiohttp.web.Server._loop, ._kwargs          building our own RequestHandler subclass as
                                                web.Server.__call__ does
    jsonschema Validator._resolver (and evolve's ``_resolver``)
                                                following a $ref the way jsonschema's own keywords do,
                                                in the keywords agentwake.schemas replaces
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from mcp import Client, ClientSession
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

if TYPE_CHECKING:
    import httpx2
    from aiohttp import web
    from mcp.server.connection import Connection
    from mcp.server.context import ServerRequestContext
    from mcp.shared.dispatcher import CallOptions

Intercept = Callable[[str, Mapping[str, Any] | None], bool]


@runtime_checkable
class ClaimingTransport(Protocol):
    """A transport that shows notifications to ``claim`` as it reads them (agentwake.stdio's)."""

    claim: Intercept | None
    pace: Callable[[], Awaitable[None]] | None


HANDSHAKE_METHODS: Final = frozenset({"initialize", "server/discover"})
# How the SDK words the -32000 errors it makes up itself when an HTTP response stream breaks.
SDK_STREAM_FAILURES: Final = ("SSE stream failed", "SSE stream ended")


def connection_closed(exc: MCPError) -> bool:
    """The SDK's own "connection closed", not a server's error that happens to use -32000.

    The SDK reports a closed connection or a broken HTTP response stream as code -32000 with a
    message of its own ("Connection closed", "SSE stream failed: ...", "SSE stream ended ...")
    and no data; a server's -32000 (say "server busy") is its answer, and its message counts.
    """
    if exc.code != CONNECTION_CLOSED or exc.data is not None:
        return False
    return exc.message == "Connection closed" or exc.message.startswith(SDK_STREAM_FAILURES)


@dataclass(frozen=True, slots=True)
class PrivateAttribute:
    """``owner.name`` in ``module``; ``on_instance`` when only an instance has it (set in __init__)."""

    module: str
    owner: str | None
    name: str
    on_instance: bool = False

    @property
    def label(self) -> str:
        return f"{self.module}.{self.owner + '.' if self.owner else ''}{self.name}"


PRIVATE_ATTRIBUTES: Final = (
    PrivateAttribute("mcp.client.client", "Client", "_build_session"),
    PrivateAttribute("mcp.client.session", "ClientSession", "_intercept_notification"),
    PrivateAttribute("mcp.client.session", "ClientSession", "_stamp", on_instance=True),
    PrivateAttribute("mcp.client.session", "ClientSession", "_dispatcher", on_instance=True),
    PrivateAttribute("mcp.shared._httpx_utils", None, "create_mcp_http_client"),
    PrivateAttribute("mcp.server.session", "ServerSession", "_connection", on_instance=True),
    PrivateAttribute("mcp.server._streamable_http_modern", None, "_SSE_PING_INTERVAL"),
    PrivateAttribute("aiohttp.web_server", "Server", "_loop", on_instance=True),
    PrivateAttribute("aiohttp.web_server", "Server", "_kwargs", on_instance=True),
    PrivateAttribute("jsonschema.validators", "Draft202012Validator", "_resolver", on_instance=True),
)


def missing_attributes(instances: Mapping[str, object] | None = None) -> list[str]:
    """The labels of PRIVATE_ATTRIBUTES the installed packages lack.

    Class-level names are checked on the class; instance names on the object given
    for the owner's name in ``instances`` (skipped when none is given).
    """
    missing: list[str] = []
    for attribute in PRIVATE_ATTRIBUTES:
        try:
            holder: object = importlib.import_module(attribute.module)
        except ImportError:
            missing.append(attribute.label)
            continue
        if attribute.owner is not None:
            holder = getattr(holder, attribute.owner, None)
            if holder is None:
                missing.append(attribute.label)
                continue
            if attribute.on_instance:
                if instances is None or attribute.owner not in instances:
                    continue
                holder = instances[attribute.owner]
        if not hasattr(holder, attribute.name):
            missing.append(attribute.label)
    return missing


# ---- mcp, client side ---------------------------------------------------------------


@dataclass
class InterceptingClient(Client):
    """A Client whose session shows every notification to ``intercept`` first, on the receive path.

    ``intercept`` returns True to consume the notification (the SDK never sees it),
    False to hand it on to the SDK's own handling. Over agentwake's own stdio transport it is
    also the transport's ``claim``: a notification is then shown to it as the line is read,
    before the SDK parses it (most of a fast stream's cost), in the same wire order; what it
    declines is shown to it once more on the session's path, so declining must have no effect.
    ``pace``, if given, is awaited by such a transport between reads, so the streams it feeds
    can hold the reader back (``StreamRoutes.pace``).
    """

    intercept: Intercept | None = None
    pace: Callable[[], Awaitable[None]] | None = None
    handshake_result: dict[str, Any] | None = None
    """The last ``initialize`` or ``server/discover`` result, as the server sent it."""

    async def _build_session(self, exit_stack: AsyncExitStack) -> ClientSession:
        if self.intercept is not None and isinstance(self.server, ClaimingTransport):
            self.server.claim = self.intercept
            self.server.pace = self.pace
        session = await super()._build_session(exit_stack)
        dispatcher = session._dispatcher
        send_raw = dispatcher.send_raw_request

        async def keeping_handshake(method: str, params: Any, opts: Any = None) -> dict[str, Any]:
            result = await send_raw(method, params, opts)
            if method in HANDSHAKE_METHODS and isinstance(result, dict):
                self.handshake_result = result
            return result

        dispatcher.send_raw_request = keeping_handshake  # type: ignore[method-assign]
        intercept = self.intercept
        if intercept is not None:
            original: Intercept = session._intercept_notification

            def chained(method: str, params: Mapping[str, Any] | None) -> bool:
                return intercept(method, params) or bool(original(method, params))

            session._intercept_notification = chained  # type: ignore[method-assign]
        return session


async def send_raw_request(
    session: ClientSession,
    method: str,
    params: dict[str, Any],
    *,
    timeout_s: float | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """Send a request as written: null params stay null, and ``request_id`` names it if given.

    The session stamps it (protocol-era headers) as it stamps its own requests.
    """
    opts: CallOptions = {}
    if timeout_s is not None:
        opts["timeout"] = timeout_s
    if request_id is not None:
        opts["request_id"] = request_id
    session._stamp({"method": method, "params": params}, opts)
    return dict(await session._dispatcher.send_raw_request(method, params, opts))


def stamped_params(session: ClientSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as the session would send them (2026-era: with its ``_meta``), for a request sent
    without it. ``params`` itself is stamped; the headers the stamp also sets are for HTTP only."""
    data: dict[str, Any] = {"method": method, "params": params}
    session._stamp(data, {})
    stamped: dict[str, Any] = data["params"]
    if "_meta" in stamped and not stamped["_meta"]:
        del stamped["_meta"]  # as the SDK's dispatcher leaves out an empty one
    return stamped


def http_client(headers: Mapping[str, str] | None) -> httpx2.AsyncClient:
    """An HTTP client with the SDK's own defaults for MCP transports."""
    return create_mcp_http_client(headers=dict(headers) if headers else None)


# ---- mcp, server side -----------------------------------------------------------------


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection | None:
    """The connection a request came on: a ServerSession is a per-request proxy, collected when
    the request returns, so notifying a client later needs the connection itself."""
    connection: Connection | None = getattr(ctx.session, "_connection", None)
    return connection


@contextmanager
def modern_sse_ping_interval(seconds: float) -> Iterator[float]:
    """Within the block, the SDK pings a 2026-era SSE response after ``seconds`` of silence
    (15 by default); yields the interval it replaced. Process-wide, read at each wait."""
    from mcp.server import _streamable_http_modern as modern

    previous: float = modern._SSE_PING_INTERVAL
    modern._SSE_PING_INTERVAL = seconds
    try:
        yield previous
    finally:
        modern._SSE_PING_INTERVAL = previous


# ---- aiohttp ------------------------------------------------------------------------------


def request_handler_arguments(server: web.Server) -> tuple[asyncio.AbstractEventLoop, dict[str, Any]]:
    """What ``web.Server.__call__`` passes to each RequestHandler it builds (loop, keyword arguments)."""
    loop: asyncio.AbstractEventLoop = server._loop
    kwargs: dict[str, Any] = server._kwargs
    return loop, kwargs


# ---- jsonschema ---------------------------------------------------------------------------


def schema_resolver(validator: Any) -> Any:
    """The ``referencing`` resolver a jsonschema validator follows ``$ref`` with (registry, base URI)."""
    return validator._resolver


def with_resolver(validator: Any, schema: Any, resolver: Any) -> Any:
    """``validator`` for ``schema``, resolving references from where ``resolver`` stands, as jsonschema's
    own ``$ref`` keyword does."""
    return validator.evolve(schema=schema, _resolver=resolver)
