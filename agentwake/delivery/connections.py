"""Connections to the webhook receiver: the gate every one passes at accept, and aiohttp's handler.

Each connection passes ``ConnectionGate`` at accept, before a byte is read (and before TLS): at
most ``max_connections`` open, ``max_connections_per_client`` from one address (an IPv6 /64); one
over either is closed at once. A connection from a ``trusted_proxy`` is not held to the per-client
cap (it carries many clients; the receiver caps each forwarded client's requests instead). Whatever
the totals, a connection that has not sent a complete request head within HEADER_TIMEOUT_S (3 s,
TLS handshake included) is closed: one address holding hundreds of idle connections (a flood
from behind the same proxy or host as the senders) frees its places within seconds. Above half of
``max_connections``, a connection that has sent no byte of HTTP for 1 s is closed sooner.
Between requests on a kept-alive connection, the 15 s idle rule. At start the soft open-file limit is raised to the hard one, and
``max_connections`` kept below it, so that a flood of idle connections cannot run the process
out of descriptors (accept() would fail and asyncio stop accepting for a second at a time,
legitimate senders included).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from agentwake._compat import request_handler_arguments
from agentwake.config import WebhookConfig

logger = logging.getLogger(__name__)

# In place of aiohttp's default, which names the Python and aiohttp versions, on every refusal: a
# sender that cannot sign never learns them. The 204 of an accepted delivery (only a signer gets
# one) keeps the default: a header set per response measurably slows the hot path.
SERVER_HEADER: Final = {"Server": "agentwake"}

# After an answer given before the whole body was read (413, 408), aiohttp reads and drops what the
# sender still sends for this long, so that it reads the answer rather than a reset, then closes.
LINGER_S: Final = 2.0
# A connection that completes no request for this long is closed: one that sends nothing, or its
# headers too slowly, or idles between deliveries (senders open a new one when they need it).
IDLE_TIMEOUT_S: Final = 15.0
# A new connection must complete its first request head within this long of its accept (TLS
# handshake included), whatever the totals: a sender writes its request as soon as it connects.
HEADER_TIMEOUT_S: Final = 3.0
LISTEN_BACKLOG: Final = 1024
# Descriptors left to the rest of the process (the store, MCP servers' pipes, logs, the agent's tools)
# when max_connections is derived from the open-file limit.
FD_RESERVE: Final = 128
DEFAULT_MAX_CONNECTIONS: Final = 4096
# Above this share of max_connections, a connection that has sent no byte for SILENT_UNDER_PRESSURE_S
# is closed: a sender writes its request as soon as it connects; a flood holds connections silent.
PRESSURE_WATERMARK: Final = 0.5
SILENT_UNDER_PRESSURE_S: Final = 1.0


Refuse = Callable[[int, str], web.Response]


class QuietRequestHandler(RequestHandler):
    """aiohttp answers a request its parser refuses (a header over 8 KiB, a bad request line) with the
    parser's message, which quotes the sender's bytes, and logs a traceback at ERROR for each (a
    scanner could fill the log). Here such a request is counted and summarised with the receiver's
    other refusals, and answered with its status alone."""

    def __init__(self, manager: web.Server, refuse: Refuse, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.refuse = refuse
        # Set by the gate: gives back this connection's place in its counts.
        self.on_lost: Callable[[], None] | None = None
        # Set by the gate: told once, at the first complete request head.
        self.on_request: Callable[[], None] | None = None

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            crashed = super().handle_error(request, status, exc, None)
            crashed.headers.update(SERVER_HEADER)
            return crashed
        response = self.refuse(status, "unreadable HTTP request")
        response.force_close()
        return response


class QuietServer(web.Server):
    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        refuse: Refuse,
        idle_timeout_s: float,
    ) -> None:
        # aiohttp's keep-alive timeout also runs from the moment a connection opens, so it closes a
        # connection that sends nothing, or headers too slowly, as well as one idle between requests.
        async def first_request_noted(request: web.BaseRequest) -> web.StreamResponse:
            protocol = request.protocol
            if isinstance(protocol, QuietRequestHandler) and protocol.on_request is not None:
                on_request, protocol.on_request = protocol.on_request, None
                on_request()
            return await handler(request)

        super().__init__(
            first_request_noted, access_log=None, lingering_time=LINGER_S, keepalive_timeout=idle_timeout_s
        )
        self.refuse = refuse

    def __call__(self) -> QuietRequestHandler:
        loop, kwargs = request_handler_arguments(self)
        return QuietRequestHandler(self, self.refuse, loop=loop, **kwargs)


def raise_open_files_limit() -> int | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit, logging before and after; the soft limit now.

    None when it is unlimited or unknown. Never fails: a limit that cannot be raised is reported.
    """
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        logger.info("webhook receiver: open-file limit %s (already the hard limit)", _limit_text(soft))
        return None if soft == resource.RLIM_INFINITY else soft
    # An unlimited hard limit is not a value the soft one may take everywhere (macOS caps it at 10240).
    targets = [hard] if hard != resource.RLIM_INFINITY else [resource.RLIM_INFINITY, 1 << 20, 10240]
    error: Exception | None = None
    for target in targets:
        if soft != resource.RLIM_INFINITY and target != resource.RLIM_INFINITY and target <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            error = exc
            continue
        logger.info(
            "webhook receiver: open-file limit raised from %s to %s", _limit_text(soft), _limit_text(target)
        )
        return None if target == resource.RLIM_INFINITY else target
    logger.warning(
        "webhook receiver: open-file limit %s could not be raised to the hard limit %s (%s)",
        _limit_text(soft),
        _limit_text(hard),
        error or "no higher value accepted",
    )
    return None if soft == resource.RLIM_INFINITY else soft


def _limit_text(value: int) -> str:
    import resource

    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def max_connections(config: WebhookConfig, open_files: int | None) -> int:
    """The connection cap: the configured one, or DEFAULT_MAX_CONNECTIONS; below the open-file limit either way."""
    room = None if open_files is None else max(1, open_files - FD_RESERVE)
    wanted = DEFAULT_MAX_CONNECTIONS if config.max_connections is None else config.max_connections
    if room is None or wanted <= room:
        return wanted
    if config.max_connections is not None:
        logger.warning(
            "webhook receiver: [webhook] max_connections %d is more than the open-file limit %d allows"
            " (keeping %d for the rest): using %d; raise the limit (ulimit -n, systemd LimitNOFILE)",
            wanted,
            open_files,
            FD_RESERVE,
            room,
        )
    return room


def peer_host(peer: Any) -> str:
    """The address of a peername tuple ('' for anything else)."""
    return peer[0] if isinstance(peer, tuple) and peer and isinstance(peer[0], str) else ""


Networks = tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]


def trusted_networks(entries: list[str]) -> Networks:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def is_trusted(host: str, networks: Networks) -> bool:
    """Whether ``host`` (an IPv4-mapped IPv6 address counts as its IPv4 one) is in ``networks``."""
    if not networks or not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


def client_of(peer: Any) -> str:
    """Whom a connection counts against: its IP address; for IPv6 its /64 (one host may own all of it)."""
    host = peer[0] if isinstance(peer, tuple) and peer and isinstance(peer[0], str) else ""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host)
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))


RefuseConnections = Callable[[str, str, int], None]


class _Connection(asyncio.Protocol):
    """One accepted connection until its first byte, when it hands the transport to aiohttp's handler.

    Until then it stands between the transport and the handler (TLS: between the TLS layer and the
    handler) so the gate learns of the first byte; after, it is out of the data path: nothing is
    added to a delivery's cost but one object per connection.
    """

    __slots__ = ("admitted", "client", "early", "eof", "gate", "handler", "stream", "task", "transport")

    def __init__(self, gate: ConnectionGate) -> None:
        self.gate = gate
        self.admitted = False
        self.client = ""
        self.eof = False
        self.early: list[bytes] | None = None
        self.handler: QuietRequestHandler | None = None
        self.stream: asyncio.Transport | None = None  # what the handler writes to (the TLS transport)
        self.task: asyncio.Task[None] | None = None
        self.transport: asyncio.Transport | None = None  # the socket's own

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        raw = self.transport = cast(asyncio.Transport, transport)
        gate = self.gate
        if not gate.admit(self, raw.get_extra_info("peername")):
            raw.abort()  # unread: a refused connection costs one accept and one close
            return
        if gate.tls is None:
            self._attach(raw)
        else:
            self.task = gate.loop.create_task(self._handshake(raw, gate.tls))

    async def _handshake(self, raw: asyncio.Transport, context: ssl.SSLContext) -> None:
        stream: asyncio.Transport | None = None
        try:
            stream = await self.gate.loop.start_tls(
                raw, self, context, server_side=True, ssl_handshake_timeout=self.gate.handshake_timeout_s
            )
        except Exception:  # a failed, timed-out or abandoned handshake: routine on an open port
            pass
        finally:
            self.task = None
            if stream is None:
                # Lost during the handshake: the TLS layer tells us nothing more.
                self.release()
        if stream is not None and not stream.is_closing():
            self._attach(stream)

    def _attach(self, stream: asyncio.Transport) -> None:
        self.gate.attached(self)
        handler = self.gate.new_handler()
        handler.on_lost = self.release
        handler.on_request = self.served
        self.handler, self.stream = handler, stream
        # Started now, aiohttp's keep-alive timer closes a connection that sends nothing (IDLE_TIMEOUT_S).
        handler.connection_made(stream)
        early, self.early = self.early, None
        if early is not None:
            stream.set_protocol(handler)
            for chunk in early:
                handler.data_received(chunk)
        if self.eof:
            handler.eof_received()

    def data_received(self, data: bytes) -> None:
        self.gate.spoke(self)
        handler, stream = self.handler, self.stream
        if handler is None or stream is None:
            # TLS: bytes right behind the handshake, before start_tls returned; handed on at _attach.
            if self.early is None:
                self.early = []
            self.early.append(data)
            return
        stream.set_protocol(handler)
        handler.data_received(data)

    def eof_received(self) -> None:
        if self.handler is not None:
            self.handler.eof_received()
        else:
            self.eof = True

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.handler is not None:
            self.handler.connection_lost(exc)  # its on_lost releases
        else:
            self.release()

    def served(self) -> None:
        self.gate.served(self)

    def release(self) -> None:
        if self.admitted:
            self.admitted = False
            self.gate.release(self)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self.transport is not None:
            self.transport.abort()


class ConnectionGate:
    """Every connection of the receiver from accept to close: the caps, and the silent ones under pressure.

    ``limit`` open connections at most, ``per_client`` from one client (``client_of``); one over
    either is closed at once, unread. While more than ``watermark`` are open, one that has sent no
    byte for ``silent_s`` is closed. Refusals and closes go to ``refuse`` (counted, summarised).
    """

    def __init__(
        self,
        new_handler: Callable[[], QuietRequestHandler],
        refuse: RefuseConnections,
        *,
        limit: int,
        per_client: int,
        watermark: int,
        silent_s: float,
        handshake_timeout_s: float,
        tls: ssl.SSLContext | None,
        header_timeout_s: float = HEADER_TIMEOUT_S,
        trusted: Networks = (),
    ) -> None:
        self.new_handler = new_handler
        self.refuse = refuse
        self.limit = limit
        self.per_client = per_client
        self.watermark = watermark
        self.silent_s = silent_s
        self.handshake_timeout_s = handshake_timeout_s
        self.tls = tls
        self.header_timeout_s = header_timeout_s
        self.trusted = trusted
        self.loop = asyncio.get_running_loop()
        self.open = 0
        self.clients: dict[str, int] = {}
        # Admitted connections that have sent nothing yet, oldest first, with their accept time.
        self._silent: dict[_Connection, float] = {}
        # Admitted connections that have not completed a request head yet, oldest first.
        self._waiting: dict[_Connection, float] = {}
        self._pending: set[_Connection] = set()  # admitted, not yet handed to a handler (TLS)
        self._timer: asyncio.TimerHandle | None = None

    def __call__(self) -> _Connection:
        """The protocol factory for ``loop.create_server``."""
        return _Connection(self)

    def admit(self, connection: _Connection, peer: Any) -> bool:
        if self.open >= self.limit:
            self.refuse("refused_connections", "connection(s) over max_connections (closed unread)", 1)
            return False
        host = peer_host(peer)
        proxy = is_trusted(host, self.trusted)
        client = host if proxy else client_of(peer)
        held = self.clients.get(client, 0)
        if held >= self.per_client and not proxy:
            self.refuse(
                "refused_connections_per_client",
                "connection(s) over max_connections_per_client (closed unread)",
                1,
            )
            return False
        self.clients[client] = held + 1
        self.open += 1
        connection.admitted = True
        connection.client = client
        self._silent[connection] = self._waiting[connection] = self.loop.time()
        if self.tls is not None:
            self._pending.add(connection)
        if self._timer is not None and self.open > self.watermark:
            # Above the watermark the silent ones are due sooner than the header wait it was set for.
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._schedule()
        return True

    def attached(self, connection: _Connection) -> None:
        self._pending.discard(connection)

    def spoke(self, connection: _Connection) -> None:
        self._silent.pop(connection, None)

    def served(self, connection: _Connection) -> None:
        self._waiting.pop(connection, None)

    def release(self, connection: _Connection) -> None:
        self.open -= 1
        held = self.clients[connection.client] - 1
        if held:
            self.clients[connection.client] = held
        else:
            del self.clients[connection.client]
        self._silent.pop(connection, None)
        self._waiting.pop(connection, None)
        self._pending.discard(connection)

    def _schedule(self) -> None:
        due: float | None = None
        if self._waiting:
            due = next(iter(self._waiting.values())) + self.header_timeout_s
        if self._silent and self.open > self.watermark:
            silent_due = next(iter(self._silent.values())) + self.silent_s
            due = silent_due if due is None else min(due, silent_due)
        if due is not None:
            self._timer = self.loop.call_at(due, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.sweep(self.loop.time())

    def _close(self, connection: _Connection) -> None:
        self._waiting.pop(connection, None)
        self._silent.pop(connection, None)
        connection.close()
        connection.release()  # now: its descriptor is freed within this loop iteration

    def sweep(self, now: float) -> int:
        """Close the connections without a request head since ``now - header_timeout_s`` and, above
        the watermark, those silent since ``now - silent_s``; how many were."""
        idle = 0
        cutoff = now - self.header_timeout_s
        while self._waiting:
            connection, since = next(iter(self._waiting.items()))
            if since > cutoff:
                break
            self._close(connection)
            idle += 1
        if idle:
            self.refuse(
                "closed_idle_connections",
                "connection(s) without a request within the header timeout closed",
                idle,
            )
        closed = 0
        if self.open > self.watermark:
            cutoff = now - self.silent_s
            while self._silent:
                connection, since = next(iter(self._silent.items()))
                if since > cutoff:
                    break
                self._close(connection)
                closed += 1
            if closed:
                self.refuse("closed_silent_connections", "silent connection(s) closed under load", closed)
        if self._timer is None:
            self._schedule()
        return idle + closed

    def close(self) -> None:
        """At shutdown: what aiohttp does not know of yet (TLS handshakes under way) is closed here."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for connection in list(self._pending):
            connection.close()
