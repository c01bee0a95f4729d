"""The demo MCP server: its settings, events, tools, background generators and command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import secrets
import socket
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from agentwake.demo.store import FIRST_TICKET, PRIORITIES, QUEUES, SERVICES, TicketStore, random_ticket
from agentwake.identity import (
    DEFAULT_OVERLAP,
    IDENTITY_KEY_ENV,
    IdentityError,
    ServerIdentity,
    keys_from_sources,
)
from agentwake.server import (
    MAX_HEARTBEAT_MS,
    EmitBuffer,
    Event,
    EventContext,
    EventResult,
    EventsExtension,
    SqliteWebhookStore,
    WebhookSettings,
    isoformat,
)

logger = logging.getLogger("agentwake.demo")
DESCRIPTION = "A demo MCP Events server: a small help desk with tickets, alerts and a load gauge."


DEFAULT_WEBHOOK_MIN_TTL_MS = 1000
DEFAULT_WEBHOOK_RETRY_S = 1.0
DEMO_PRINCIPAL = "demo-user"
DEMO_CLIENT_ID = "demo-client"
# Required by the SDK's AuthSettings; nothing is fetched from it (the demo issues no tokens).
DEMO_ISSUER_URL = "https://auth.demo.invalid/"


@dataclass(frozen=True)
class DemoSettings:
    db: Path = Path("demo.db")
    rate: float = 0.5
    backlog: int = 0
    alert_interval: float = 5.0
    load_interval: float = 3.0
    next_poll_ms: int = 1000
    heartbeat_ms: int = MAX_HEARTBEAT_MS
    token: str | None = None
    webhook_ttl_ms: int | None = None
    webhook_min_ttl_ms: int = DEFAULT_WEBHOOK_MIN_TTL_MS
    webhook_allow: tuple[str, ...] = ()
    webhook_ca: Path | None = None
    webhook_retry_s: float = DEFAULT_WEBHOOK_RETRY_S
    webhook_store: Path | None = None
    cursor_log: Path | None = None
    # Signs webhook deliveries (v1a) and is published at /.well-known/mcp-webhook-jwks.json.
    identity: ServerIdentity | None = None

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] | None = None) -> DemoSettings:
        env = os.environ if env is None else env
        ttl = env.get("DEMO_WEBHOOK_TTL_MS")
        ca = env.get("DEMO_WEBHOOK_CA")
        store = env.get("DEMO_WEBHOOK_STORE")
        cursor_log = env.get("DEMO_CURSOR_LOG")
        return cls(
            db=Path(env.get("DEMO_DB", "demo.db")),
            rate=float(env.get("DEMO_RATE", "0.5")),
            backlog=int(env.get("DEMO_BACKLOG", "0")),
            alert_interval=float(env.get("DEMO_ALERT_INTERVAL", "5")),
            load_interval=float(env.get("DEMO_LOAD_INTERVAL", "3")),
            next_poll_ms=int(env.get("DEMO_NEXT_POLL_MS", "1000")),
            heartbeat_ms=heartbeat_ms(env.get("DEMO_HEARTBEAT_MS", str(MAX_HEARTBEAT_MS))),
            token=env.get("DEMO_TOKEN") or None,
            webhook_ttl_ms=int(ttl) if ttl else None,
            webhook_min_ttl_ms=int(env.get("DEMO_WEBHOOK_MIN_TTL_MS", str(DEFAULT_WEBHOOK_MIN_TTL_MS))),
            webhook_allow=cidr_list(env.get("DEMO_WEBHOOK_ALLOW", "")),
            webhook_ca=Path(ca) if ca else None,
            webhook_retry_s=float(env.get("DEMO_WEBHOOK_RETRY_S", str(DEFAULT_WEBHOOK_RETRY_S))),
            webhook_store=Path(store) if store else None,
            cursor_log=Path(cursor_log) if cursor_log else None,
        )


def cidr_list(value: str) -> tuple[str, ...]:
    """Comma-separated CIDR blocks, blanks ignored."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def heartbeat_ms(value: str) -> int:
    """A heartbeat interval in ms: a positive integer, capped at the spec's 30 seconds."""
    interval = int(value)
    if interval < 1:
        raise ValueError(f"the heartbeat interval must be at least 1 ms, not {interval}")
    return min(interval, MAX_HEARTBEAT_MS)


TICKET_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "queue": {"type": "string", "enum": list(QUEUES), "description": "Only tickets in this queue"},
        "priority": {
            "type": "string",
            "enum": list(PRIORITIES),
            "description": "Only tickets of this priority",
        },
    },
    "additionalProperties": False,
}
TICKET_PAYLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "ticketId": {"type": "string"},
        "queue": {"type": "string"},
        "priority": {"type": "string"},
        "title": {"type": "string"},
        "reporter": {"type": "string"},
    },
}


class CursorLog:
    """DEMO_CURSOR_LOG: one JSON line per cursor a client asks ticket.created from (each events/poll,
    the opening read of each events/stream and of each new webhook subscription), for tests that
    check that cursors never go back. Appended in one write per line: several servers may share it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._streams: set[tuple[int, Any]] = set()  # push streams whose opening read is logged

    def asked(
        self, ctx: EventContext, arguments: dict[str, Any], cursor: str | None, client_pid: int | None
    ) -> None:
        request = ctx.request
        if request is None:
            return  # a webhook subscription's own reads after its opening one
        if ctx.mode == "push":
            stream = (id(request.session), request.request_id)
            if stream in self._streams:
                return  # a live read of a stream whose opening read is logged
            self._streams.add(stream)
        line = {
            "at": time.time(),
            "server_pid": os.getpid(),
            "client_pid": client_pid,
            "mode": ctx.mode,
            "arguments": arguments,
            "cursor": cursor,
        }
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


ALERT_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": list(PRIORITIES)},
        "service": {"type": "string", "enum": list(SERVICES)},
        "include_summary": {"type": "boolean", "default": True},
    },
    "additionalProperties": False,
}


class DemoServer:
    """The MCP server, its events and its background generators."""

    def __init__(self, settings: DemoSettings) -> None:
        self.settings = settings
        self.store = TicketStore(settings.db)
        self.rng = random.Random()
        self.alerts: dict[str, dict[str, Any]] = {}
        self.cursor_log = CursorLog(settings.cursor_log) if settings.cursor_log is not None else None
        self.client_pid: int | None = None  # over stdio: the process that started this server
        self.webhook_store = (
            SqliteWebhookStore(settings.webhook_store) if settings.webhook_store is not None else None
        )
        self.events = EventsExtension(
            emit_buffer=EmitBuffer(max_events=10_000),
            default_next_poll_ms=settings.next_poll_ms,
            heartbeat_ms=settings.heartbeat_ms,
            webhook=webhook_settings(settings, self.webhook_store),
        )
        self._declare_events()
        auth: dict[str, Any] = {}
        if settings.token:
            auth = {
                "token_verifier": DemoTokenVerifier(settings.token),
                "auth": AuthSettings(issuer_url=DEMO_ISSUER_URL, resource_server_url=None),  # type: ignore[arg-type]
            }
        self.mcp: MCPServer[Any] = MCPServer(
            "agentwake-demo",
            instructions="A demo help desk: tickets, alerts and a load gauge.",
            extensions=[self.events],
            log_level="WARNING",
            **auth,
        )
        self.events.install(self.mcp)
        self._declare_tools()

    def _declare_events(self) -> None:
        store = self.store
        demo = self

        @self.events.event(
            name="ticket.created",
            description="A ticket was opened in the help desk.",
            input_schema=TICKET_INPUT_SCHEMA,
            payload_schema=TICKET_PAYLOAD_SCHEMA,
        )
        async def ticket_created(
            ctx: EventContext, arguments: dict[str, Any], cursor: str | None
        ) -> EventResult:
            if demo.cursor_log is not None:
                demo.cursor_log.asked(ctx, arguments, cursor, demo.client_pid)
            head = await anyio.to_thread.run_sync(store.head)
            if cursor is None:
                return EventResult(events=[], cursor=str(head))
            if not cursor.isdigit() or int(cursor) > head:
                # Not a position this store ever handed out (or the store was reset).
                return EventResult(events=[], cursor=str(head), truncated=True)
            not_before = isoformat(ctx.not_before) if ctx.not_before else None
            rows, skipped = await anyio.to_thread.run_sync(
                store.after,
                int(cursor),
                head,
                ctx.max_events + 1,
                arguments.get("queue"),
                arguments.get("priority"),
                not_before,
            )
            events = [
                Event(
                    name="ticket.created",
                    event_id=ticket_id,
                    timestamp=created,  # stored in wire form by isoformat()
                    data={"ticketId": ticket_id, "queue": q, "priority": p, "title": t, "reporter": r},
                    cursor=str(seq),
                )
                for seq, ticket_id, q, p, t, r, created in rows
            ]
            if len(events) > ctx.max_events:
                events = events[: ctx.max_events]
                return EventResult(events, cursor=events[-1].cursor, has_more=True, truncated=skipped)
            return EventResult(events, cursor=str(head), truncated=skipped)

        class AlertFired:
            """An alert fired on one of the monitored services."""

            @staticmethod
            def match(ctx: EventContext, event: Event, arguments: dict[str, Any]) -> bool:
                return all(arguments.get(key) in (None, event.data[key]) for key in ("severity", "service"))

            @staticmethod
            def transform(ctx: EventContext, event: Event, arguments: dict[str, Any]) -> Event:
                if arguments.get("include_summary", True):
                    return event
                return event.replace(data={k: v for k, v in event.data.items() if k != "summary"})

        self.events.event(
            name="alert.fired",
            description="An alert fired on a monitored service (emit-only, kept for ten minutes).",
            emit_only=True,
            input_schema=ALERT_INPUT_SCHEMA,
            payload_schema={
                "type": "object",
                "properties": {
                    "alertId": {"type": "string"},
                    "severity": {"type": "string"},
                    "service": {"type": "string"},
                    "summary": {"type": "string"},
                },
            },
        )(AlertFired)

        class SystemLoad:
            """A load sample; there is no history to replay, so the cursor is always null."""

        self.events.event(
            name="system.load",
            description="A periodic load sample of the help desk (no replay: cursor is always null).",
            emit_only=True,
            replay=False,
            payload_schema={
                "type": "object",
                "properties": {"load1": {"type": "number"}, "openTickets": {"type": "integer"}},
            },
        )(SystemLoad)

    def _declare_tools(self) -> None:
        # ToolError: the message reaches the caller; any other exception is reported as a crash.
        store, alerts, events = self.store, self.alerts, self.events

        @self.mcp.tool()
        def list_tickets(
            queue: str | None = None, status: str | None = None, limit: int = 20
        ) -> list[dict[str, Any]]:
            """List recent tickets, newest first, optionally by queue and status."""
            return store.list(queue, status, max(1, min(limit, 200)))

        @self.mcp.tool()
        def get_ticket(ticket_id: str) -> dict[str, Any]:
            """Read one ticket with its body and comments."""
            ticket = store.get(ticket_id)
            if ticket is None:
                raise ToolError(f"no ticket {ticket_id!r}")
            return ticket

        @self.mcp.tool()
        def create_ticket(
            queue: str, priority: str, title: str, body: str = "", reporter: str = "agent"
        ) -> str:
            """Open a ticket; returns its id. This fires ticket.created."""
            if queue not in QUEUES or priority not in PRIORITIES:
                raise ToolError(f"queue must be one of {QUEUES} and priority one of {PRIORITIES}")
            ticket_id = store.create([(queue, priority, title, body, reporter)])[0]
            events.wake("ticket.created")  # push and webhook subscribers read now, not at the next poll
            return ticket_id

        @self.mcp.tool()
        def add_comment(ticket_id: str, body: str) -> str:
            """Add a comment to a ticket."""
            if store.get(ticket_id) is None:
                raise ToolError(f"no ticket {ticket_id!r}")
            store.comment(ticket_id, body)
            # Said on stderr so `make run` shows the agent's effect on the help desk.
            logger.info("%s: comment added: %s", ticket_id, body[:100])
            return f"comment added to {ticket_id}"

        @self.mcp.tool()
        def close_ticket(ticket_id: str) -> str:
            """Mark a ticket closed."""
            if not store.set_status(ticket_id, "closed"):
                raise ToolError(f"no ticket {ticket_id!r}")
            logger.info("%s: closed", ticket_id)
            return f"{ticket_id} closed"

        @self.mcp.tool()
        def get_alert(alert_id: str) -> dict[str, Any]:
            """Read an alert and whether it has been acknowledged."""
            alert = alerts.get(alert_id)
            if alert is None:
                raise ToolError(f"no recent alert {alert_id!r}")
            return {**alert, "acknowledged": store.acked(alert_id)}

        @self.mcp.tool()
        def acknowledge_alert(alert_id: str, note: str | None = None) -> str:
            """Acknowledge an alert so nobody else is paged for it."""
            if alert_id not in alerts:
                raise ToolError(f"no recent alert {alert_id!r}")
            if not store.ack(alert_id, note):
                return f"{alert_id} was already acknowledged"
            logger.info("%s: acknowledged: %s", alert_id, (note or "")[:100])
            return f"{alert_id} acknowledged"

    # ---- background generators -------------------------------------------------

    def seed_backlog(self) -> None:
        """Top the store up to ``backlog`` tickets, so a restart does not add another backlog."""
        remaining = self.settings.backlog - self.store.head()
        while remaining > 0:
            batch = min(remaining, 10_000)
            self.store.create([random_ticket(self.rng) for _ in range(batch)])
            remaining -= batch

    def fire_alert(self) -> Event:
        alert_id = f"A-{secrets.token_hex(4)}"
        data = {
            "alertId": alert_id,
            "severity": self.rng.choice(PRIORITIES),
            "service": self.rng.choice(SERVICES),
            "summary": f"{self.rng.choice(('latency', 'error rate', 'saturation'))} above threshold",
        }
        self.alerts[alert_id] = data
        while len(self.alerts) > 10_000:
            self.alerts.pop(next(iter(self.alerts)))
        event = Event(name="alert.fired", event_id=alert_id, data=data)
        self.events.emit(event)
        return event

    def sample_load(self) -> None:
        open_tickets = len(self.store.list(None, "open", 200))
        self.events.emit(
            Event(
                name="system.load",
                data={"load1": round(self.rng.uniform(0.1, 4.0), 2), "openTickets": open_tickets},
            )
        )

    async def _every(self, interval: float, action: Callable[[], Any]) -> None:
        while True:
            await anyio.sleep(interval)
            result = action()
            if isinstance(result, Awaitable):
                await result

    def new_ticket(self) -> None:
        self.store.create([FIRST_TICKET if self.store.head() == 0 else random_ticket(self.rng)])
        self.events.wake("ticket.created")

    async def _tickets_forever(self) -> None:
        await self._every(1.0 / self.settings.rate, self.new_ticket)

    async def serve(self, run_transport: Callable[[], Awaitable[None]]) -> None:
        self.seed_backlog()
        async with anyio.create_task_group() as tg, self.events.running():
            if self.settings.rate > 0:
                tg.start_soon(self._tickets_forever)
            if self.settings.alert_interval > 0:
                tg.start_soon(self._every, self.settings.alert_interval, self.fire_alert)
            if self.settings.load_interval > 0:
                tg.start_soon(self._every, self.settings.load_interval, self.sample_load)
            await run_transport()
            tg.cancel_scope.cancel()

    async def serve_stdio(self) -> None:
        self.client_pid = os.getppid()
        await self.serve(self.mcp.run_stdio_async)

    async def serve_http(self, host: str, port: int) -> None:
        import uvicorn

        # With DEMO_TOKEN the SDK's bearer auth answers 401 to a missing or wrong token.
        app: Any = self.mcp.streamable_http_app()
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        # Bind first, so port 0 works and the address can be announced before serving.
        sock = socket.create_server((host, port), backlog=128)
        bound_host, bound_port = sock.getsockname()[:2]
        # Read by callers (tests, examples/webhook_demo.py) to learn the port.
        sys.stderr.write(f"demo_server: listening on http://{bound_host}:{bound_port}/mcp\n")
        sys.stderr.flush()
        await self.serve(lambda: server.serve(sockets=[sock]))


class DemoTokenVerifier:
    """The SDK's TokenVerifier for one static token: the caller is the principal "demo-user"."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def verify_token(self, token: str) -> AccessToken | None:
        if not secrets.compare_digest(token.encode(), self._token.encode()):
            return None
        return AccessToken(token=token, client_id=DEMO_CLIENT_ID, scopes=[], subject=DEMO_PRINCIPAL)


def webhook_settings(settings: DemoSettings, store: SqliteWebhookStore | None) -> WebhookSettings | None:
    """Webhook delivery from the DEMO_WEBHOOK_* settings; None (no webhook) without a TTL."""
    if settings.webhook_ttl_ms is None:
        return None
    trust = ssl.create_default_context()
    if settings.webhook_ca is not None:
        trust.load_verify_locations(cafile=settings.webhook_ca)
    return WebhookSettings(
        max_ttl=timedelta(milliseconds=settings.webhook_ttl_ms),
        min_ttl=timedelta(milliseconds=settings.webhook_min_ttl_ms),
        store=store,
        allow_networks=settings.webhook_allow,
        ssl_context=trust,
        retry_initial=timedelta(seconds=settings.webhook_retry_s),
        identity=settings.identity,
    )


def overlap_hours(value: str) -> float:
    """--identity-overlap-hours: a number of hours, 0 or more (and short of forever)."""
    try:
        hours = float(value)
        timedelta(hours=hours)
    except (ValueError, OverflowError):
        hours = -1.0
    if not hours >= 0:
        raise argparse.ArgumentTypeError(f"the overlap is a number of hours, 0 or more, not {value!r}")
    return hours


def load_identity(paths: list[Path], overlap: timedelta) -> ServerIdentity | None:
    """The keys of the --identity-key files, else of $AGENTWAKE_IDENTITY_KEY; None without either.
    IdentityError (naming the file, never quoting a key) for one that is not a usable key."""
    keys = keys_from_sources(paths)
    return ServerIdentity(tuple(keys), overlap) if keys else None


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, DemoSettings]:
    env = DemoSettings.from_env()
    parser = argparse.ArgumentParser(prog="agentwake-demo", description=DESCRIPTION)
    parser.add_argument("--http", metavar="HOST:PORT", help="serve Streamable HTTP at http://HOST:PORT/mcp")
    parser.add_argument("--db", type=Path, default=env.db, help="SQLite file for tickets")
    parser.add_argument("--rate", type=float, default=env.rate, help="new tickets per second (0 = none)")
    parser.add_argument(
        "--backlog",
        type=int,
        default=env.backlog,
        help="create tickets at start-up until the store holds this many",
    )
    parser.add_argument(
        "--alert-interval", type=float, default=env.alert_interval, help="seconds between alerts"
    )
    parser.add_argument(
        "--load-interval", type=float, default=env.load_interval, help="seconds between load samples"
    )
    parser.add_argument(
        "--next-poll-ms", type=int, default=env.next_poll_ms, help="recommended poll interval"
    )
    parser.add_argument(
        "--heartbeat-ms",
        type=heartbeat_ms,
        default=env.heartbeat_ms,
        help=f"push stream heartbeat interval in ms (at most {MAX_HEARTBEAT_MS})",
    )
    parser.add_argument(
        "--webhook-ttl-ms",
        type=int,
        default=env.webhook_ttl_ms,
        help="the longest webhook subscription TTL granted, in ms; turns webhook delivery on",
    )
    parser.add_argument(
        "--webhook-min-ttl-ms",
        type=int,
        default=env.webhook_min_ttl_ms,
        help="the shortest webhook subscription TTL granted, in ms",
    )
    parser.add_argument(
        "--webhook-allow",
        type=cidr_list,
        default=env.webhook_allow,
        help="comma-separated CIDR blocks webhook callbacks may reach despite the SSRF guard",
    )
    parser.add_argument(
        "--webhook-ca", type=Path, default=env.webhook_ca, help="PEM CA bundle trusted for callback TLS"
    )
    parser.add_argument(
        "--webhook-retry-s",
        type=float,
        default=env.webhook_retry_s,
        help="first retry backoff of a failed webhook delivery, in seconds",
    )
    parser.add_argument(
        "--webhook-store",
        type=Path,
        default=env.webhook_store,
        help="SQLite file for webhook subscriptions (survive restarts; allows no-expiry grants)",
    )
    parser.add_argument(
        "--identity-key",
        metavar="FILE",
        type=Path,
        action="append",
        default=[],
        help="a server identity key (agentwake keygen): webhook deliveries are signed with it (v1a) and its"
        " public key is served at /.well-known/mcp-webhook-jwks.json; repeat to rotate (the newest signs)."
        f" Without the flag, ${IDENTITY_KEY_ENV} may hold the key (one private JWK or a JSON list)",
    )
    parser.add_argument(
        "--identity-overlap-hours",
        metavar="H",
        type=overlap_hours,
        default=DEFAULT_OVERLAP / timedelta(hours=1),
        help="how long after the newest identity key was made the older ones stay published"
        " (default: %(default)g)",
    )
    args = parser.parse_args(argv)
    try:
        identity = load_identity(args.identity_key, timedelta(hours=args.identity_overlap_hours))
    except IdentityError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    settings = DemoSettings(
        db=args.db,
        rate=args.rate,
        backlog=args.backlog,
        alert_interval=args.alert_interval,
        load_interval=args.load_interval,
        next_poll_ms=args.next_poll_ms,
        heartbeat_ms=args.heartbeat_ms,
        token=env.token,
        webhook_ttl_ms=args.webhook_ttl_ms,
        webhook_min_ttl_ms=args.webhook_min_ttl_ms,
        webhook_allow=args.webhook_allow,
        webhook_ca=args.webhook_ca,
        webhook_retry_s=args.webhook_retry_s,
        webhook_store=args.webhook_store,
        cursor_log=env.cursor_log,
        identity=identity,
    )
    return args, settings


def main(argv: list[str] | None = None) -> None:
    args, settings = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="demo_server %(levelname)s %(message)s"
    )
    logger.setLevel(logging.INFO)  # its own lines: what callers changed
    demo = DemoServer(settings)
    if settings.webhook_ttl_ms is not None and not (args.http and settings.token):
        logger.warning(
            "webhook delivery needs an authenticated caller: events/subscribe answers Forbidden"
            " unless serving --http with DEMO_TOKEN set"
        )
    if settings.identity is not None and settings.webhook_ttl_ms is None:
        logger.warning(
            "an identity key signs webhook deliveries: without --webhook-ttl-ms there are none,"
            " and no JWKS is served"
        )
    try:
        if args.http:
            host, _, port = args.http.rpartition(":")
            anyio.run(demo.serve_http, host or "127.0.0.1", int(port))
        else:
            anyio.run(demo.serve_stdio)
    except KeyboardInterrupt:
        pass
    finally:
        demo.store.close()
        if demo.webhook_store is not None:
            demo.webhook_store.close()
