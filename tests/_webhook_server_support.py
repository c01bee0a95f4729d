"""Real peers for the webhook sender's tests.

``Receiver`` is an HTTPS endpoint (aiohttp) on loopback with a certificate from
a throwaway ``trustme`` CA, valid for ``127.0.0.1``, ``hooks.test`` and ``localhost``. It
records every POST (raw body, headers, the TLS SNI it was reached under) and
answers through a replaceable ``respond`` function; by default it echoes a
verification challenge and acknowledges everything else with 200.

``DNS`` is the injectable resolve hook: names to addresses, changeable mid-test.
``Signals`` turns the sender's debug lines ("<msg> acknowledged|abandoned",
"suspended") into events a test can wait on, so nothing sleeps.
``Wire`` speaks events/* to an in-process ``MCPServer`` through the SDK's
``mcp.Client``, keeping explicit nulls (``ttlMs: null`` differs from absent).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import trustme
from aiohttp import web
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from standardwebhooks import Webhook

from agentwake import signing
from agentwake.server import Event, EventContext, EventResult, EventsExtension, WebhookSettings

WAIT = 10.0  # seconds any single expected thing may take
HOOK_NAMES = ("127.0.0.1", "hooks.test", "localhost")
# The registry and the per-subscription delivery task log under their own module names.
WEBHOOK_LOGGERS = ("agentwake.server._webhook", "agentwake.server._webhook_delivery")

INCIDENT_INPUT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": ["P1", "P2", "P3", "P4"]},
        "redact": {"type": "boolean", "default": False},
    },
    "additionalProperties": False,
}


# ---- the endpoint ------------------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    sni: str | None

    @property
    def document(self) -> Any:
        return json.loads(self.body)

    @property
    def kind(self) -> str:
        document = self.document
        return str(document["type"]) if "type" in document else "event"

    @property
    def msg_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def subscription(self) -> str:
        return self.headers["x-mcp-subscription-id"]

    def verify(self, secret: str) -> Any:
        """Check the signature with the standardwebhooks reference library; returns the parsed body."""
        return Webhook(secret).verify(self.body, self.headers)


# (status, document), or (status, document, headers) for a reply that also sets headers (Retry-After).
Reply = tuple[int, Any] | tuple[int, Any, dict[str, str]]
Responder = Callable[[Received], Reply | Awaitable[Reply]]


def echo(received: Received) -> Reply:
    """What a willing endpoint answers: the challenge back for a verification, 200 otherwise."""
    if received.kind == "verification":
        return 200, {"challenge": received.document["challenge"]}
    return 200, {}


class Receiver:
    """A real HTTPS webhook endpoint on loopback. Use as an async context manager."""

    def __init__(self, ca: trustme.CA, *, bind: Sequence[str] = ("127.0.0.1",)) -> None:
        self.ca = ca
        self.bind = tuple(bind)
        self.port = 0
        self.respond: Responder = echo
        self.received: list[Received] = []
        self._send: MemoryObjectSendStream[Received]
        self._arrivals: MemoryObjectReceiveStream[Received]
        self._send, self._arrivals = anyio.create_memory_object_stream[Received](math.inf)
        self._sni: dict[int, str | None] = {}
        self._runner: web.AppRunner | None = None

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}{path}"

    def _ssl(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert(*HOOK_NAMES).configure_cert(context)

        def remember(sock: Any, name: str | None, _ctx: ssl.SSLContext) -> None:
            self._sni[id(sock)] = name

        context.sni_callback = remember
        return context

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        received = Received(
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.read(),
            sni=self._sni.get(id(ssl_object)),
        )
        self.received.append(received)
        reply = self.respond(received)
        status, document, *extra = await reply if inspect.isawaitable(reply) else reply
        self._send.send_nowait(received)
        if document is None:
            return web.Response(status=status, headers=extra[0] if extra else None)
        if isinstance(document, bytes):
            return web.Response(status=status, body=document, content_type="application/json")
        if status in (301, 302, 303, 307, 308):
            return web.Response(status=status, headers={"Location": str(document)})
        return web.json_response(document, status=status)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = self._ssl()
        for address in self.bind:
            site = web.TCPSite(self._runner, address, self.port, ssl_context=context)
            await site.start()
            if self.port == 0:
                server = site._server
                assert server is not None
                self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            with anyio.CancelScope(shield=True):
                await self._runner.cleanup()
        self._send.close()
        self._arrivals.close()

    async def next(self, kind: str | None = None) -> Received:
        """The next POST (of ``kind``, skipping others), as soon as it has been answered."""
        with anyio.fail_after(WAIT):
            while True:
                received = await self._arrivals.receive()
                if kind is None or received.kind == kind:
                    return received

    def of(self, kind: str) -> list[Received]:
        return [r for r in self.received if r.kind == kind]

    def events(self) -> list[dict[str, Any]]:
        return [r.document for r in self.received if r.kind == "event"]


def client_trust(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


# ---- DNS, clocks, log signals ------------------------------------------------------------------


class DNS:
    """The resolve hook: ``answers[name]`` is a list of address lists, one used per lookup (the last repeats)."""

    def __init__(self, **answers: str | list[str]) -> None:
        self.answers: dict[str, list[list[str]]] = {}
        self.lookups: list[tuple[str, list[str]]] = []
        for name, addresses in answers.items():
            self.set(name.replace("_", "."), addresses)

    def set(self, name: str, *sequence: str | list[str]) -> None:
        self.answers[name] = [[a] if isinstance(a, str) else list(a) for a in sequence]

    async def __call__(self, host: str) -> list[str]:
        script = self.answers.get(host)
        if not script:
            raise OSError(f"unknown host {host}")
        answer = script.pop(0) if len(script) > 1 else script[0]
        self.lookups.append((host, answer))
        return answer


class FakeNow:
    """A wall clock that moves only when told, starting at the real time (receivers check freshness)."""

    def __init__(self) -> None:
        self.value = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.value

    def advance(self, **delta: float) -> None:
        self.value += timedelta(**delta)


class Changes:
    """For a test that waits on a condition: ``changed()`` after each change; ``until`` waits for it."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def changed(self) -> None:
        event, self._event = self._event, anyio.Event()
        event.set()

    async def until(self, predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(WAIT):
            while not predicate():
                await self._event.wait()


class Signals(logging.Handler):
    """Waits on what the sender says at debug level: a delivery finishing, a suspension."""

    _FINISHED = re.compile(
        r"webhook subscription (\S+): (\S+) (acknowledged|abandoned|superseded)(?: by a refresh)?; watermark (.*)$"
    )

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.finished: dict[str, str] = {}  # msg_id -> acknowledged | abandoned | superseded
        self.suspended: set[str] = set()
        self._changes = Changes()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        match = self._FINISHED.match(message)
        if match:
            self.finished[match.group(2)] = match.group(3)
        elif "suspended after sustained delivery failure" in message:
            self.suspended.add(message.split()[2].rstrip(":"))
        self._changes.changed()

    async def until(self, predicate: Callable[[], bool]) -> None:
        await self._changes.until(predicate)

    async def done(self, *msg_ids: str) -> list[str]:
        await self.until(lambda: all(m in self.finished for m in msg_ids))
        return [self.finished[m] for m in msg_ids]


@contextmanager
def watching() -> Iterator[Signals]:
    """Signals from the sender's logger for the duration (a test module wraps it in a fixture)."""
    handler = Signals()
    loggers = [logging.getLogger(name) for name in WEBHOOK_LOGGERS]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger, level in zip(loggers, previous, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


# ---- the MCP side ---------------------------------------------------------------------------------


@dataclass
class Caller:
    """``principal_of`` for the extension: whoever the test says is calling."""

    principal: str | None = "alice"

    def __call__(self, ctx: Any) -> str | None:
        return self.principal


@dataclass
class Wire:
    client: Client
    caller: Caller

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        # Raw, like the SDK's own listen driver: the typed path would drop explicit nulls.
        session: Any = self.client.session
        data: dict[str, Any] = {"method": method, "params": params}
        opts: dict[str, Any] = {}
        session._stamp(data, opts)
        return dict(await session._dispatcher.send_raw_request(method, data["params"], opts))

    async def subscribe(
        self,
        name: str,
        url: str,
        secret: str,
        arguments: dict[str, Any] | None = None,
        *,
        as_: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {
            "name": name,
            "delivery": {"mode": "webhook", "url": url, "secret": secret},
            **extra,
        }
        if arguments is not None:
            params["arguments"] = arguments
        return await self.as_principal(as_, "events/subscribe", params)

    async def unsubscribe(
        self, name: str, url: str, arguments: dict[str, Any] | None = None, *, as_: str | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "delivery": {"url": url}}
        if arguments is not None:
            params["arguments"] = arguments
        return await self.as_principal(as_, "events/unsubscribe", params)

    async def as_principal(
        self, principal: str | None, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        if principal is None:
            return await self.call(method, params)
        before, self.caller.principal = self.caller.principal, principal
        try:
            return await self.call(method, params)
        finally:
            self.caller.principal = before

    async def error(self, method: str, params: dict[str, Any]) -> MCPError:
        with pytest.raises(MCPError) as caught:
            await self.call(method, params)
        return caught.value

    async def subscribe_error(self, *args: Any, **kwargs: Any) -> MCPError:
        with pytest.raises(MCPError) as caught:
            await self.subscribe(*args, **kwargs)
        return caught.value


@asynccontextmanager
async def serving(events: EventsExtension, caller: Caller) -> AsyncIterator[Wire]:
    """The extension running inside an in-process MCPServer, and a client talking to it."""
    server = MCPServer("t", extensions=[events])
    events.install(server)
    async with events.running(), Client(server) as client:
        yield Wire(client, caller)


def webhook_settings(ca: trustme.CA, dns: DNS | None = None, **overrides: Any) -> WebhookSettings:
    """Small numbers for tests: 10 ms backoffs, loopback allowlisted, the test CA trusted."""
    values: dict[str, Any] = {
        "max_ttl": timedelta(minutes=10),
        "min_ttl": timedelta(seconds=1),
        "allow_networks": ["127.0.0.0/8"],
        "resolve": dns or DNS(hooks_test="127.0.0.1"),
        "ssl_context": client_trust(ca),
        "retry_initial": timedelta(milliseconds=10),
        "retry_max": timedelta(milliseconds=50),
        "attempt_timeout": timedelta(seconds=5),
    }
    values.update(overrides)
    return WebhookSettings(**values)


# ---- event types ------------------------------------------------------------------------------------


def incident(number: int, severity: str = "P1", **data: Any) -> Event:
    return Event(
        name="incident.created",
        event_id=f"inc-{number}",
        data={"incidentId": f"INC-{number}", "severity": severity, "reporter": "amy", **data},
    )


def declare_incidents(events: EventsExtension, **options: Any) -> None:
    """An emit-only type with match (by severity) and transform (redact) per subscription."""

    class IncidentCreated:
        @staticmethod
        def match(ctx: EventContext, event: Event, arguments: dict[str, Any]) -> bool:
            return arguments.get("severity") in (None, event.data["severity"])

        @staticmethod
        def transform(ctx: EventContext, event: Event, arguments: dict[str, Any]) -> Event:
            if arguments.get("redact"):
                return event.replace(data={**event.data, "reporter": None})
            return event

    events.event(name="incident.created", emit_only=True, input_schema=INCIDENT_INPUT, **options)(
        IncidentCreated
    )


@dataclass
class Tickets:
    """A durable upstream for a check-function type: the cursor is the ticket count."""

    titles: list[str] = field(default_factory=list)

    def add(self, *titles: str) -> None:
        self.titles.extend(titles)

    async def check(self, ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        head = len(self.titles)
        if cursor is None:
            return EventResult(events=[], cursor=str(head))
        start = int(cursor)
        events = [
            Event(
                name="ticket.created",
                event_id=f"t{n}",
                data={"n": n, "title": self.titles[n - 1]},
                cursor=str(n),
            )
            for n in range(start + 1, head + 1)
        ]
        return EventResult(events=events, cursor=str(head))


def declare_tickets(events: EventsExtension, tickets: Tickets, **options: Any) -> None:
    events.event(name="ticket.created", **options)(tickets.check)


def new_secret() -> str:
    return signing.generate_secret()
