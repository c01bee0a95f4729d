"""What every bridge shares: the MCP Events server over its log, the webhook listener, serving.

A bridge (``agentwake bridge NAME``) subclasses ``Bridge``: it names its event types,
registers its tools on the MCP server, and feeds the log from one or both ingress paths,
the upstream's native webhooks (``handle_webhook``, served on ``--listen``) and polling
the upstream's API (``poll_forever``, with ``--poll``). ``BridgeServer`` does the rest:

* every event type is a check function over the ``EventLog``, so poll, push and webhook
  delivery read one log with replayable cursors (the log position, as a decimal string);
  a null cursor starts at the head, a cursor the log never handed out (or one past its
  head, after the state dir was reset) restarts at the head with ``truncated``;
* ``accept`` commits to the log before the ingress answers its upstream, then wakes the
  push streams and webhook subscriptions of the types that got something new;
* the MCP server runs over stdio (the caller is the process that started the bridge, so
  a stdio caller is the principal ``stdio`` and may use webhook delivery) or Streamable
  HTTP (``--http``, with a bearer token from ``--mcp-token-env`` naming the principal; without
  one only on a loopback address and with ``--no-auth``, as anyone there may call the tools);
* webhook subscriptions made by agentwake are kept in the state dir (owner-only, 0700), so they
  outlive restarts.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
import ssl
import stat
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import anyio
from aiohttp import web
from mcp.server.mcpserver import MCPServer

from agentwake.bridges.log import DEFAULT_MAX_EVENTS, EventLog, NewEvent
from agentwake.clock import parse_iso
from agentwake.identity import ServerIdentity
from agentwake.server import (
    Event,
    EventContext,
    EventResult,
    EventsExtension,
    EventType,
    SqliteWebhookStore,
    WebhookSettings,
)

logger = logging.getLogger("agentwake.bridge")

STDIO_PRINCIPAL: Final = "stdio"
BRIDGE_PRINCIPAL: Final = "bridge-client"
# The longest native webhook body read: GitHub caps its payloads at 25 MB, but what a
# triage event needs is far smaller, and a body is held in memory while it is verified.
DEFAULT_MAX_BODY_BYTES: Final = 5 * 1024 * 1024
DEFAULT_EVENTS_WEBHOOK_TTL_MS: Final = 24 * 3600 * 1000
# BridgeServer.watched's name for "any event type".
ANY_TYPE: Final = "*"


@dataclass(frozen=True)
class BridgeEventType:
    """One event type a bridge emits: its schemas and its subscription filter."""

    name: str
    description: str
    payload_schema: dict[str, Any]
    input_schema: dict[str, Any]
    matches: Callable[[dict[str, Any], dict[str, Any]], bool]


def bridge_event_types(
    descriptions: Mapping[str, str],
    payload_schemas: Mapping[str, dict[str, Any]],
    input_schemas: Mapping[str, dict[str, Any]],
    matches: Callable[[dict[str, Any], dict[str, Any]], bool],
) -> tuple[BridgeEventType, ...]:
    """One ``BridgeEventType`` per name of ``descriptions``, in its order."""
    return tuple(
        BridgeEventType(
            name=name,
            description=description,
            payload_schema=payload_schemas[name],
            input_schema=input_schemas[name],
            matches=matches,
        )
        for name, description in descriptions.items()
    )


def check_optional_tools(allowed: Sequence[str], optional: Sequence[str]) -> None:
    """ValueError unless every tool of ``--allow-tool`` is one of the bridge's optional ones."""
    unknown = set(allowed) - set(optional)
    if unknown:
        raise ValueError(
            f"--allow-tool: {', '.join(sorted(unknown))} is not an optional tool"
            f" (the optional tools: {', '.join(optional)})"
        )


def refuse(status: int, reason: str) -> web.Response:
    """A webhook delivery's refusal, as every bridge answers it."""
    return web.json_response({"status": "refused", "error": reason}, status=status)


def short_age(age: timedelta) -> str:
    """An age as a log line or a refusal says it: seconds, or hours past one."""
    seconds = int(age.total_seconds())
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds} s"


@dataclass(frozen=True)
class BridgeOptions:
    """The options every bridge takes (``agentwake bridge NAME --help`` lists them)."""

    state_dir: Path
    http: str | None = None
    mcp_token: str | None = field(default=None, repr=False)
    # Serve --http without a token: only on a loopback address (see http_auth_problem).
    no_auth: bool = False
    listen: str | None = None
    webhook_path: str = "/webhook"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    poll: bool = False
    next_poll_ms: int = 2_000
    heartbeat_ms: int = 30_000
    max_events: int = DEFAULT_MAX_EVENTS
    retention: timedelta = timedelta(days=7)
    keep_raw: bool = True
    events_webhook_ttl_ms: int = DEFAULT_EVENTS_WEBHOOK_TTL_MS
    events_webhook_allow: tuple[str, ...] = ()
    events_webhook_ca: Path | None = None
    # Signs MCP webhook deliveries (v1a) and is published at /.well-known/mcp-webhook-jwks.json.
    identity: ServerIdentity | None = None
    # False for a short look (agentwake check, policy test): the MCP server with its tools and event
    # types, but no --listen, no polling (Socket Mode included) and no background work upstream.
    ingress: bool = True


def host_port(value: str, *, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) split, with a clear error."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} must be HOST:PORT, not {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as ``host_port`` returns it) is ``localhost`` or an address in 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another name: it may resolve to anything


def http_auth_problem(http: str | None, *, has_token: bool, no_auth: bool) -> str | None:
    """Why ``--http`` must not be served so (its tools would be open to whoever reaches it), or None."""
    if http is None:
        return (
            "--no-auth is for --http (over stdio the caller is whoever started the bridge)"
            if no_auth
            else None
        )
    if has_token:
        return "--no-auth and --mcp-token-env exclude each other: drop --no-auth" if no_auth else None
    host, _ = host_port(http, what="--http")
    if not is_loopback(host):
        return (
            f"--http {http} is not a loopback address, so it needs a bearer token:"
            " pass --mcp-token-env VAR (--no-auth is only for 127.0.0.1, ::1 or localhost)"
        )
    if not no_auth:
        return (
            "--http without --mcp-token-env would let anyone who reaches the port call the tools:"
            " pass --mcp-token-env VAR, or --no-auth to serve a loopback address without a token"
        )
    return None


def owner_only_dir(path: Path) -> None:
    """Create ``path`` mode 0700, or take group and other permissions off an existing one."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, mode & 0o700)
        logger.warning("the state dir %s was mode %04o; now %04o (owner only)", path, mode, mode & 0o700)


class Bridge:
    """An upstream's bridge. Subclasses set ``name``, ``description`` and ``event_types``."""

    name: str = ""
    description: str = ""
    event_types: Sequence[BridgeEventType] = ()
    # How long a webhook delivery id is remembered, to recognise a replay.
    delivery_memory: timedelta = timedelta(days=2)

    def __init__(self, options: BridgeOptions) -> None:
        self.options = options
        self.server: BridgeServer | None = None

    def register_tools(self, server: BridgeServer) -> None:
        """Declare the upstream's actions as tools on ``server.mcp``."""

    async def handle_webhook(self, request: web.Request) -> web.StreamResponse:
        """Verify and accept one native webhook delivery (POST on ``--listen``)."""
        raise web.HTTPNotFound(text="this bridge takes no webhooks")

    def routes(self) -> Sequence[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]]:
        """More (method, path, handler) routes for the ``--listen`` listener, beside the webhook's."""
        return ()

    async def poll_forever(self) -> None:
        """Poll the upstream's API into the log until cancelled (with ``--poll``)."""
        raise NotImplementedError(f"the {self.name} bridge cannot poll")

    async def background(self) -> None:
        """Work the bridge does while it serves, whatever its ingress (e.g. learn its own account)."""

    async def aclose(self) -> None:
        """Release what the bridge holds (its API client)."""

    async def accept(
        self,
        events: Sequence[NewEvent],
        *,
        source: str,
        delivery_id: str | None = None,
        gap_types: Sequence[str] = (),
    ) -> int:
        assert self.server is not None
        return await self.server.accept(events, source=source, delivery_id=delivery_id, gap_types=gap_types)

    def server_of(self) -> BridgeServer:
        assert self.server is not None
        return self.server


class BridgeServer:
    """The MCP Events server of one bridge over its log, with its ingress paths."""

    def __init__(self, bridge: Bridge) -> None:
        options = bridge.options
        problem = http_auth_problem(options.http, has_token=bool(options.mcp_token), no_auth=options.no_auth)
        if problem is not None:
            raise ValueError(problem)
        self.bridge = bridge
        self.options = options
        owner_only_dir(options.state_dir)
        self.log = EventLog(
            options.state_dir / "events.db",
            max_events=options.max_events,
            retention=options.retention,
            keep_raw=options.keep_raw,
            delivery_memory=bridge.delivery_memory,
        )
        self.webhook_store = SqliteWebhookStore(options.state_dir / "webhooks.db")
        self.events = EventsExtension(
            default_next_poll_ms=options.next_poll_ms,
            heartbeat_ms=options.heartbeat_ms,
            webhook=self._webhook_settings(),
            principal_of=self._principal_of,
        )
        for event_type in bridge.event_types:
            self._declare(event_type)
        auth: dict[str, Any] = {}
        if options.http and options.mcp_token:
            from mcp.server.auth.settings import AuthSettings

            auth = {
                "token_verifier": StaticTokenVerifier(options.mcp_token),
                # Required by the SDK; nothing is fetched from it (the bridge issues no tokens).
                "auth": AuthSettings(issuer_url="https://auth.bridge.invalid/", resource_server_url=None),  # type: ignore[arg-type]
            }
        self.mcp: MCPServer[Any] = MCPServer(
            f"agentwake-{bridge.name}",
            instructions=bridge.description,
            extensions=[self.events],
            log_level="WARNING",
            **auth,
        )
        self.events.install(self.mcp)
        bridge.server = self
        bridge.register_tools(self)
        self.webhook_address: tuple[str, int] | None = None
        self._watched: dict[str, anyio.Event] = {}

    def watched(self, name: str) -> anyio.Event:
        """Set once a client has read events of type ``name`` (of any type: ``ANY_TYPE``): from then
        on, what the log takes reaches that subscription (the playground sends its first event then)."""
        event = self._watched.get(name)
        if event is None:
            event = self._watched[name] = anyio.Event()
        return event

    def _principal_of(self, ctx: Any) -> str | None:
        if not self.options.http:
            return STDIO_PRINCIPAL
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        return None if token is None else (token.subject or token.client_id)

    def _webhook_settings(self) -> WebhookSettings:
        options = self.options
        trust = ssl.create_default_context()
        if options.events_webhook_ca is not None:
            trust.load_verify_locations(cafile=options.events_webhook_ca)
        return WebhookSettings(
            max_ttl=timedelta(milliseconds=options.events_webhook_ttl_ms),
            store=self.webhook_store,
            allow_networks=options.events_webhook_allow,
            ssl_context=trust,
            identity=options.identity,
        )

    def _declare(self, spec: BridgeEventType) -> None:
        log = self.log
        watched = self.watched

        async def check(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
            head = await anyio.to_thread.run_sync(log.head)
            watched(spec.name).set()
            watched(ANY_TYPE).set()
            if cursor is None:
                return EventResult(events=[], cursor=str(head))
            position = _position(cursor)
            if position is None or position > head:
                return EventResult(events=[], cursor=str(head), truncated=True)
            read = await anyio.to_thread.run_sync(log.read, spec.name, position, ctx.max_events)
            events = [
                Event(
                    name=spec.name,
                    event_id=logged.event_id,
                    timestamp=logged.occurred_at,
                    data=logged.data,
                    cursor=str(logged.seq),
                )
                for logged in read.events
                if spec.matches(arguments, logged.data) and _not_before(ctx, logged.occurred_at)
            ]
            return EventResult(
                events, cursor=str(read.position), has_more=read.has_more, truncated=read.truncated
            )

        self.events.add_event_type(
            EventType(
                name=spec.name,
                description=spec.description,
                input_schema=spec.input_schema,
                payload_schema=spec.payload_schema,
                check=check,
            )
        )

    async def accept(
        self,
        events: Sequence[NewEvent],
        *,
        source: str,
        delivery_id: str | None = None,
        gap_types: Sequence[str] = (),
    ) -> int:
        """Commit events to the log, then wake their readers; how many were new.

        ``gap_types`` records, before these events, that events of those types were lost upstream
        (their readers are told ``truncated`` once)."""
        added = await anyio.to_thread.run_sync(
            lambda: self.log.append(events, source=source, delivery_id=delivery_id, gap_types=gap_types)
        )
        for name in dict.fromkeys(added):
            self.events.wake(name)
        return len(added)

    async def seen_delivery(self, delivery_id: str) -> bool:
        return await anyio.to_thread.run_sync(self.log.seen_delivery, delivery_id)

    # ---- serving ---------------------------------------------------------------

    async def serve(self) -> None:
        """Serve MCP (stdio or HTTP), the webhook listener and the poller until cancelled or stdin ends;
        without ``ingress``, MCP alone."""
        try:
            async with anyio.create_task_group() as tg, self.events.running():
                if self.options.ingress:
                    tg.start_soon(self.bridge.background)
                    if self.options.listen:
                        await self._start_webhook_listener(tg)
                    if self.options.poll:
                        tg.start_soon(self._poll_forever)
                else:
                    logger.info("no ingress (a short look): no webhook listener, no polling, no Socket Mode")
                if self.options.http:
                    host, port = host_port(self.options.http, what="--http")
                    await self._serve_http(host, port)
                else:
                    await self.mcp.run_stdio_async()
                tg.cancel_scope.cancel()
        finally:
            await self.bridge.aclose()
            self.log.close()
            self.webhook_store.close()

    async def _poll_forever(self) -> None:
        await self.bridge.poll_forever()

    async def _start_webhook_listener(self, tg: anyio.abc.TaskGroup) -> None:
        assert self.options.listen is not None
        host, port = host_port(self.options.listen, what="--listen")
        app = web.Application(client_max_size=self.options.max_body_bytes)
        app.router.add_post(self.options.webhook_path, self.bridge.handle_webhook)
        for method, path, handler in self.bridge.routes():
            app.router.add_route(method, path, handler)
        app.router.add_get("/healthz", _healthz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, backlog=128)
        await site.start()
        bound = runner.addresses[0]
        self.webhook_address = (bound[0], bound[1])
        # Callers (tests, the offline walkthrough) read this line to learn the port.
        announce(f"webhooks on http://{_url_host(bound[0])}:{bound[1]}{self.options.webhook_path}")

        async def cleanup_at_exit() -> None:
            try:
                await anyio.sleep_forever()
            finally:
                with anyio.CancelScope(shield=True):
                    await runner.cleanup()

        tg.start_soon(cleanup_at_exit)

    async def _serve_http(self, host: str, port: int) -> None:
        import uvicorn

        app: Any = self.mcp.streamable_http_app()
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        sock = socket.create_server((host, port), backlog=128)
        bound_host, bound_port = sock.getsockname()[:2]
        announce(f"MCP on http://{_url_host(bound_host)}:{bound_port}/mcp")
        await server.serve(sockets=[sock])


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def announce(line: str) -> None:
    """One line on stderr for whoever started the bridge (stdout is the MCP channel over stdio)."""
    sys.stderr.write(f"bridge: {line}\n")
    sys.stderr.flush()


def _position(cursor: str) -> int | None:
    """The log position a cursor names, or None for one the log never handed out."""
    # str.isdigit alone lets "²" through, and int() refuses more than 4300 digits.
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 19):
        return None
    return int(cursor)


def _not_before(ctx: EventContext, occurred_at: str) -> bool:
    if ctx.not_before is None:
        return True
    moment = parse_iso(occurred_at)
    return moment is None or moment >= ctx.not_before


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


class StaticTokenVerifier:
    """The SDK's TokenVerifier for one static bearer token (``--mcp-token-env``)."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def verify_token(self, token: str) -> Any:
        from mcp.server.auth.provider import AccessToken

        if not secrets.compare_digest(token.encode(), self._token.encode()):
            return None
        return AccessToken(token=token, client_id=BRIDGE_PRINCIPAL, scopes=[], subject=BRIDGE_PRINCIPAL)
