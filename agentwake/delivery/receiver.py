"""The webhook receiver: an aiohttp server inside `agentwake run` that accepts MCP Events deliveries.

Order of checks for each request, cheapest first, so a flood costs little:

    POST only (405) -> Content-Length over the limit (413) -> JSON only (415)
    -> the four headers present and sane, webhook-timestamp within 5 minutes (401)
    -> X-MCP-Subscription-Id known (else 410 if we unsubscribed it, 503 while a subscribe
       is in flight, 404; while one is in flight the body is read first, as it may be that
       subscribe's verification, even under an id we retired: the key may be back)
    -> Expect: 100-continue answered now (else 417)
    -> body read up to the limit (413), within 10 s of the headers (408); a connection that
       completes no request for 15 s is closed
    -> Standard Webhooks signature over the raw bytes, under any secret of that subscription (401)
    -> for a server with webhook_identity, its v1a under a key its origin publishes (401;
       agentwake.delivery.identity)
    -> JSON parse and shape (400)
    -> the subscription under [limits] max_undecided_events (else 503 with Retry-After: the
       server keeps the event and sends it again) -> durable accept

Before any of that, each connection passes the gate (``ConnectionGate``) at accept, before a
byte is read (and before TLS): at most ``max_connections`` open, ``max_connections_per_client``
from one address (an IPv6 /64); one over either is closed at once. A connection that completes no
request head within 3 s of its accept (TLS handshake included) is closed whatever the totals;
above half of ``max_connections``, one that has sent no byte for 1 s. Connections from a
``[webhook] trusted_proxy`` are not held to the per-client cap; instead, the client its
X-Forwarded-For names (the rightmost address not itself a trusted proxy) may have at most
``max_connections_per_client`` requests in progress (more: 429). At start the soft
open-file limit is raised to the hard one, and ``max_connections`` kept below it, so that a
flood of idle connections cannot run the process out of descriptors (accept() would fail and
asyncio stop accepting for a second at a time, legitimate senders included).

Durable accept: an event (and the cursor it carries) is committed to the inbox before
the 2xx goes out; concurrent deliveries share one transaction (group commit). A
duplicate is answered 2xx without a second row. The agent runs later, never in the
request. Error responses carry a status and its reason phrase only.

Control envelopes: ``verification`` echoes the challenge (the server's endpoint check,
which arrives while our subscribe is still in flight: the subscription is then
recognised by which in-flight secret verifies); ``gap`` stores the fresh cursor and
records a gap; ``terminated`` ends the subscription with the server's reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
from aiohttp import HttpVersion11, web
from pydantic import TypeAdapter, ValidationError

from agentwake import metrics, protocol, signing
from agentwake.config import LimitsConfig, WebhookConfig
from agentwake.delivery.admit import admit
from agentwake.delivery.backlog import RETRY_AFTER_S as HELD_BACK_RETRY_AFTER_S
from agentwake.delivery.backlog import Backlog
from agentwake.delivery.common import MAX_CURSOR_CHARS, shown_cursor
from agentwake.delivery.connections import (
    HEADER_TIMEOUT_S,
    IDLE_TIMEOUT_S,
    LISTEN_BACKLOG,
    PRESSURE_WATERMARK,
    SERVER_HEADER,
    SILENT_UNDER_PRESSURE_S,
    ConnectionGate,
    QuietServer,
    client_of,
    is_trusted,
    max_connections,
    peer_host,
    raise_open_files_limit,
    trusted_networks,
)
from agentwake.delivery.group_commit import GroupCommit
from agentwake.delivery.identity import IdentityChecks
from agentwake.delivery.routes import Route, WebhookRoutes
from agentwake.errors import ConfigError, StoreError
from agentwake.faults import crash_point
from agentwake.logs import event_fields
from agentwake.store import IncomingEvent, IngestResult, Store, SubscriptionKey, WebhookDelivery

logger = logging.getLogger(__name__)

MAX_HEADER_VALUE: Final = 256
READ_CHUNK: Final = 64 * 1024
# Deliveries waiting for a commit before new ones are told to come back later (503).
MAX_PENDING_COMMITS: Final = 10_000
REJECT_LOG_INTERVAL_S: Final = 60.0
SHUTDOWN_TIMEOUT_S: Final = 2.0
# How long the rest of a body may take once its headers are in (senders time out at about 5 s).
BODY_TIMEOUT_S: Final = 10.0

# Terminated envelopes handled, remembered per process: a retry racing its id's retirement ends nothing twice.
SEEN_CONTROL_IDS: Final = 4096
IDENTITY_REFUSALS: Final = {
    "invalid": "a v1a signature that verifies under none of the keys the server publishes",
    "missing": "no v1a signature, and the server's webhook_identity is require",
    "no_keys": "a v1a signature, but the server's identity keys could not be fetched",
}

# pydantic-core's validator itself, without the adapter's Python wrapper around each call.
_EVENT_VALIDATOR: Final = TypeAdapter(protocol.PollEvent).validator
_JSON_TYPES: Final = frozenset({"application/json"})
# A \uD800-\uDFFF escape: the only way JSON text can carry a lone surrogate (valid syntax, invalid Unicode).
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def listen_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 host in brackets (``https://[::1]:8791``)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{shown}:{port}"


class BadBody(ValueError):
    """A signed body that is not a JSON object in UTF-8 made of valid Unicode."""


def parse_body(body: bytes) -> dict[str, Any]:
    """The JSON object of a delivery; BadBody for anything else (RFC 8259: UTF-8, valid Unicode)."""
    try:
        document = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadBody("body is not JSON in UTF-8") from None
    if not isinstance(document, dict):
        raise BadBody("body is not a JSON object")
    if _SURROGATE_ESCAPE.search(body):
        # Rare: escapes of a proper pair are fine, a lone half cannot be stored or shown.
        try:
            json.dumps(document, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadBody("body holds a lone UTF-16 surrogate") from None
    return document


OnTerminated = Callable[[str, dict[str, Any]], Awaitable[None]]


def _no_content() -> web.StreamResponse:
    """204: the bare StreamResponse, lighter to build and send than a Response with no body."""
    return web.StreamResponse(status=204)


def _status(code: int) -> web.Response:
    """A response with no detail: the reason phrase is all a sender (or an attacker) learns."""
    return web.Response(status=code, headers=SERVER_HEADER)


def server_tls_context(
    cert: Path | str | None, key: Path | str | None, section: str
) -> ssl.SSLContext | None:
    """A server-side TLS context from a config section's tls_cert and tls_key; None without them."""
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[{section}] tls_cert {cert} / tls_key {key} cannot be loaded: {exc}") from None
    return context


def tls_context(config: WebhookConfig) -> ssl.SSLContext | None:
    return server_tls_context(config.tls_cert, config.tls_key, "webhook")


class Receiver:
    """The aiohttp app. ``await tg.start(receiver.serve)`` returns once it listens."""

    idle_timeout_s: float = IDLE_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    pressure_watermark: float = PRESSURE_WATERMARK
    silent_under_pressure_s: float = SILENT_UNDER_PRESSURE_S

    def __init__(
        self,
        config: WebhookConfig,
        store: Store,
        routes: WebhookRoutes,
        *,
        on_new_events: Callable[[int], None] = lambda count: None,
        on_terminated: OnTerminated | None = None,
        clock: Callable[[], float] = time.time,
        limits: LimitsConfig | None = None,
        backlog: Backlog | None = None,
        identities: IdentityChecks | None = None,
    ) -> None:
        self.config = config
        self.identities = identities or IdentityChecks()
        self._identity_noted_at: dict[tuple[str, str], float] = {}
        self.backlog = backlog
        self.limits = limits or LimitsConfig()
        self.store = store
        self.routes = routes
        self.on_new_events = on_new_events
        self.on_terminated = on_terminated
        self.clock = clock
        self.port: int | None = None
        self.counts: Counter[str] = Counter()
        self._commit = GroupCommit(store, self._committed)
        self._rejected: Counter[str] = Counter()
        self._rejects_logged_at = 0.0
        self._control_ids: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.connections: ConnectionGate | None = None  # set by serve
        self._trusted = trusted_networks(config.trusted_proxy)
        # Requests in progress per client named by a trusted proxy's X-Forwarded-For.
        self._forwarded: dict[str, int] = {}
        self._per_client = config.max_connections_per_client

    def server(self) -> QuietServer:
        """aiohttp's low-level server: one handler for every path, with no router or middleware layer
        (about a tenth of a delivery's cost). Subscriptions are told apart by X-MCP-Subscription-Id."""
        handler = self._handle_forwarded if self._trusted else self._handle_counted
        return QuietServer(handler, self._refuse_counted, self.idle_timeout_s)

    def connection_gate(self, server: QuietServer, context: ssl.SSLContext | None) -> ConnectionGate:
        """The connection gate, its caps sized to the open-file limit (raised first, as far as allowed)."""
        limit = max_connections(self.config, raise_open_files_limit())
        per_client = self._per_client = min(self.config.max_connections_per_client, limit)
        logger.info(
            "webhook receiver: at most %d connection(s), %d per client; above %d, silent ones closed after %g s",
            limit,
            per_client,
            int(limit * self.pressure_watermark),
            self.silent_under_pressure_s,
        )
        return ConnectionGate(
            server,
            self._refuse_connections,
            limit=limit,
            per_client=per_client,
            watermark=int(limit * self.pressure_watermark),
            silent_s=self.silent_under_pressure_s,
            handshake_timeout_s=self.idle_timeout_s,
            tls=context,
            header_timeout_s=self.header_timeout_s,
            trusted=self._trusted,
        )

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        host, port = self.config.address
        context = tls_context(self.config)
        server = self.server()
        # The runner only shuts the handlers down; we listen ourselves, so that each connection meets
        # the gate at accept (before TLS), where aiohttp has no hook.
        runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        gate = self.connections = self.connection_gate(server, context)
        listener: asyncio.Server | None = None
        try:
            try:
                listener = await asyncio.get_running_loop().create_server(
                    gate, host, port, backlog=LISTEN_BACKLOG
                )
            except OSError as exc:
                raise ConfigError(
                    f"the webhook receiver cannot listen on {self.config.listen}: {exc.strerror or exc};"
                    " check [webhook] listen"
                ) from None
            sockets = listener.sockets
            self.port = int(sockets[0].getsockname()[1]) if sockets else port
            async with anyio.create_task_group() as tg:
                # Requests that come before the committer runs are answered 503 and retried.
                await tg.start(self._commit.run)
                logger.info(
                    "webhook receiver listening on %s (servers deliver to %s/<subscription>)",
                    listen_url("https" if context else "http", host, self.port),
                    self.config.public_url,
                )
                task_status.started()
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._stop(listener, gate, runner)
        finally:
            with anyio.CancelScope(shield=True):
                await self._stop(listener, gate, runner)

    @staticmethod
    async def _stop(listener: asyncio.Server | None, gate: ConnectionGate, runner: web.ServerRunner) -> None:
        if listener is not None:
            listener.close()
        gate.close()
        await runner.cleanup()

    # ---- one request ------------------------------------------------------------------

    async def _handle_counted(self, request: web.BaseRequest) -> web.StreamResponse:
        """``handle``, with the status it answers counted in the metrics."""
        try:
            response = await self.handle(request)
        except ConnectionError:  # the sender went away: nothing is answered
            raise
        except Exception:
            metrics.observe_webhook_delivery(500)  # what aiohttp answers for it
            raise
        metrics.observe_webhook_delivery(response.status)
        return response

    def forwarded_client(self, request: web.BaseRequest) -> str | None:
        """Whom a request from a trusted proxy counts against: the rightmost X-Forwarded-For address
        that is not a trusted proxy (an IPv6 /64), else the proxy; None for a direct connection."""
        transport = request.transport
        host = peer_host(transport.get_extra_info("peername") if transport is not None else None)
        if not is_trusted(host, self._trusted):
            return None
        forwarded = ",".join(request.headers.getall("X-Forwarded-For", []))
        for hop in reversed([h.strip() for h in forwarded.split(",") if h.strip()]):
            if not is_trusted(hop, self._trusted):
                return client_of((hop,))
        return host

    async def _handle_forwarded(self, request: web.BaseRequest) -> web.StreamResponse:
        """``_handle_counted``, with the requests in progress of each forwarded client capped."""
        client = self.forwarded_client(request)
        if client is None:
            return await self._handle_counted(request)
        held = self._forwarded.get(client, 0)
        if held >= self._per_client:
            metrics.observe_webhook_delivery(429)
            return self._reject(429, "requests over max_connections_per_client from one forwarded client")
        self._forwarded[client] = held + 1
        try:
            return await self._handle_counted(request)
        finally:
            left = self._forwarded[client] - 1
            if left:
                self._forwarded[client] = left
            else:
                del self._forwarded[client]

    def _refuse_counted(self, code: int, why: str) -> web.Response:
        """``_reject`` for a request too broken to reach ``handle``, counted in the metrics."""
        metrics.observe_webhook_delivery(code)
        return self._reject(code, why)

    def _reject(self, code: int, why: str) -> web.Response:
        self.counts[f"rejected_{code}"] += 1
        logger.debug("webhook receiver: %d: %s", code, why)
        self._summarise(why, 1)
        return _status(code)

    def _refuse_connections(self, counter: str, why: str, count: int) -> None:
        self.counts[counter] += count
        logger.debug("webhook receiver: %d %s", count, why)
        self._summarise(why, count)

    def _summarise(self, why: str, count: int) -> None:
        """Tally a refusal; the tally is logged at the first and then at most once a minute."""
        self._rejected[why] += count
        now = self.clock()
        if now - self._rejects_logged_at >= REJECT_LOG_INTERVAL_S:
            summary = ", ".join(f"{n} {reason}" for reason, n in self._rejected.most_common())
            logger.warning(
                "webhook receiver refused request(s) or connection(s) since the last report: %s", summary
            )
            self._rejected.clear()
            self._rejects_logged_at = now

    async def _read_body(self, request: web.BaseRequest) -> bytes | None:
        """The body, or None once it passes the limit (nothing beyond the limit is read)."""
        limit = self.config.max_body_bytes
        content = request.content
        if request.content_length is not None:  # already checked against the limit
            try:
                return await content.readexactly(request.content_length)
            except asyncio.IncompleteReadError as short:
                return short.partial
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await content.read(min(READ_CHUNK, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method != "POST":
            response = self._reject(405, "not a POST")
            response.headers["Allow"] = "POST"
            return response
        length = request.content_length
        if length is not None and length > self.config.max_body_bytes:
            return self._reject(413, "body over the limit")
        headers = request.headers
        # The exact header is the common case; anything else (parameters, case) goes through the parser.
        if headers.get("Content-Type") != "application/json" and request.content_type not in _JSON_TYPES:
            return self._reject(415, "not application/json")
        msg_id = headers.get(signing.HEADER_ID, "")
        stamp = headers.get(signing.HEADER_TIMESTAMP, "")
        header = headers.get(signing.HEADER_SIGNATURE, "")
        webhook_id = headers.get(signing.HEADER_SUBSCRIPTION, "")
        if not (msg_id and stamp and header and webhook_id):
            return self._reject(401, "missing webhook headers")
        if len(msg_id) > MAX_HEADER_VALUE or len(webhook_id) > MAX_HEADER_VALUE:
            return self._reject(401, "oversized webhook headers")
        if not (msg_id.isascii() and webhook_id.isascii() and header.isascii()):
            return self._reject(401, "webhook headers that are not ASCII")
        now = self.clock()
        stale = signing.timestamp_error(stamp, now)
        if stale is not None:
            return self._reject(401, f"webhook-timestamp {stale}")
        route = self.routes.lookup(webhook_id)
        if route is None and not self.routes.subscribing:
            if self.routes.is_retired(webhook_id):
                return self._reject(410, "unsubscribed subscription id")
            return self._reject(404, "unknown subscription id")
        expect = headers.get("Expect")
        if expect is not None and request.version == HttpVersion11:
            # Answered only now, after the header checks, so a refused sender never uploads its body.
            if expect.lower() != "100-continue":
                return self._reject(417, "an Expect other than 100-continue")
            if not request.content.is_eof():
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                request.writer.output_size = 0  # the response proper has not started
        content = request.content
        if length is not None and content.is_eof():
            body: bytes | None = content.read_nowait()  # all of it came with the headers: the usual case
        else:
            try:
                with anyio.fail_after(self.body_timeout_s):
                    body = await self._read_body(request)
            except TimeoutError:
                # A sender that trickles its body would hold the connection (and its buffer) forever.
                slow = self._reject(408, "body not received in time")
                slow.force_close()
                return slow
        if body is None:
            return self._reject(413, "body over the limit")
        if route is None:
            return await self._unrouted(webhook_id, msg_id, stamp, header, body)
        if signing.verify(route.keys(now), msg_id, stamp, header, body) is None:
            return self._reject(401, "bad signature")
        if route.key.server in self.identities.servers:
            refused = await self._identity_refused(route.key, msg_id, stamp, header, body)
            if refused is not None:
                return refused
        try:
            # One pass over the bytes: strict UTF-8 JSON (no lone surrogates, bounded depth) and the shape.
            event = _EVENT_VALIDATOR.validate_json(body)
        except ValidationError as exc:
            try:
                document = parse_body(body)
            except BadBody as bad:
                return self._reject(400, str(bad))
            if "type" in document:
                return await self._control(route, msg_id, document)
            return self._reject(400, f"not an EventOccurrence ({exc.errors()[0]['msg']})")
        if "type" in event:  # a control envelope that happens to look like an event
            return await self._control(route, msg_id, parse_body(body))
        return await self._event(route, event)

    async def _unrouted(
        self, webhook_id: str, msg_id: str, stamp: str, header: str, body: bytes
    ) -> web.StreamResponse:
        """An id we do not know yet while a subscribe is in flight: only its verification can come now."""
        matched = self.routes.match_in_flight(msg_id, stamp, header, body)
        if matched is not None:
            try:
                document: dict[str, Any] | None = parse_body(body)
            except BadBody:
                document = None
            if document is not None and document.get("type") == "verification":
                key, _secret = matched
                if key.server in self.identities.servers:
                    refused = await self._identity_refused(key, msg_id, stamp, header, body)
                    if refused is not None:
                        return refused
                return self._verification(key.name, webhook_id, document)
        if matched is None and self.routes.is_retired(webhook_id):
            return self._reject(410, "unsubscribed subscription id")
        # The subscribe response has not reached us yet: the sender retries after its backoff.
        return self._reject(503, "subscription id not known yet (subscribe in flight)")

    async def _identity_refused(
        self, key: SubscriptionKey, msg_id: str, stamp: str, header: str, body: bytes
    ) -> web.Response | None:
        """None if the request's server identity (v1a) is as its server's webhook_identity wants, else
        the 401; the subscription's recent errors note each reason, at most once a minute."""
        checked = await self.identities.check(key.server, msg_id, stamp, header, body)
        if checked.refused is None:
            return None
        self.counts[f"identity_{checked.refused}"] += 1
        why = IDENTITY_REFUSALS[checked.refused]
        now = self.clock()
        noted = (key.name, checked.refused)
        if now - self._identity_noted_at.get(noted, -REJECT_LOG_INTERVAL_S) >= REJECT_LOG_INTERVAL_S:
            self._identity_noted_at[noted] = now
            logger.warning(
                "subscription %s: webhook request refused: %s",
                key.name,
                why,
                extra=event_fields(subscription=key.name),
            )
            try:
                await self.store.record_error(key.name, f"webhook identity: {why}")
            except StoreError as exc:
                logger.warning("subscription %s: refusal not recorded: %s", key.name, exc)
        return self._reject(401, f"server identity: {why}")

    def _verification(self, name: str, webhook_id: str, document: dict[str, Any]) -> web.StreamResponse:
        challenge = document.get("challenge")
        if not isinstance(challenge, str) or not challenge or len(challenge) > MAX_HEADER_VALUE:
            return self._reject(400, "verification without a challenge")
        self.counts["verifications"] += 1
        logger.info(
            "subscription %s: webhook endpoint verification answered (id %s)",
            name,
            webhook_id,
            extra=event_fields(subscription=name),
        )
        return web.json_response({"challenge": challenge}, headers=SERVER_HEADER)

    def _remember_control(self, webhook_id: str, msg_id: str) -> None:
        """Remember a handled terminated envelope, so a retry of it ends nothing twice."""
        self._control_ids[(webhook_id, msg_id)] = None
        while len(self._control_ids) > SEEN_CONTROL_IDS:
            self._control_ids.popitem(last=False)

    async def _control(self, route: Route, msg_id: str, document: dict[str, Any]) -> web.StreamResponse:
        kind = document.get("type")
        name = route.key.name
        if kind == "verification":
            return self._verification(name, route.webhook_id, document)
        if kind == "gap":
            cursor = document.get("cursor")
            if cursor is not None and not isinstance(cursor, str):
                return self._reject(400, "gap with a non-string cursor")
            # The store recognises a retried gap by its webhook-id, across restarts too.
            gap = WebhookDelivery(route.key, None, cursor, truncated=True, control_id=msg_id)
            result = await self._commit.submit(gap)
            if result is None:
                return self._reject(503, "not stored")
            if result.duplicates:
                return _no_content()
            self.counts["gaps"] += 1
            logger.warning(
                "subscription %s: gap: the server skipped events (webhook gap); now at %s",
                name,
                shown_cursor(cursor),
                extra=event_fields(subscription=name),
            )
            return _no_content()
        if kind == "terminated":
            if (route.webhook_id, msg_id) in self._control_ids:
                return _no_content()  # a retry that came before its id was retired
            error = document.get("error")
            error = error if isinstance(error, dict) else {}
            if self.on_terminated is not None:
                try:
                    await self.on_terminated(name, error)
                except Exception:  # e.g. the store is locked: the sender retries, and it ends then
                    logger.exception(
                        "subscription %s: ending it on a terminated envelope failed",
                        name,
                        extra=event_fields(subscription=name),
                    )
                    return self._reject(503, "terminated envelope not handled")
            self._remember_control(route.webhook_id, msg_id)
            self.counts["terminated"] += 1
            return _no_content()
        logger.info(
            "subscription %s: webhook control envelope of unknown type %r ignored",
            name,
            str(kind)[:40],
            extra=event_fields(subscription=name),
        )
        return _no_content()

    def _committed(self, results: list[IngestResult]) -> None:
        """Tally a committed batch, and wake the agent once for all of its new events."""
        inserted = duplicates = 0
        for result in results:
            inserted += result.inserted
            duplicates += result.duplicates
        if duplicates:
            self.counts["duplicates"] += duplicates
        if inserted:
            self.counts["accepted"] += inserted
            self.on_new_events(inserted)

    async def _event(self, route: Route, event: protocol.PollEvent) -> web.StreamResponse:
        cursor = event.get("cursor")
        if cursor is not None and len(cursor) > MAX_CURSOR_CHARS:
            return self._reject(400, "cursor too long")
        # Signed by the server, still not trusted: another type's name, an oversized id or data
        # becomes a 'rejected' record (answered 2xx: a retry would bring the same).
        admitted = admit(event, route.key.event, self.limits)
        if isinstance(admitted, IncomingEvent):
            delivery = WebhookDelivery(route.key, admitted, cursor)
        else:
            self.counts["rejected_events"] += 1
            delivery = WebhookDelivery(route.key, None, cursor, rejected=admitted)
        crash_point("webhook_accept")
        if self._commit.backlog >= MAX_PENDING_COMMITS:
            return self._reject(503, "too many deliveries waiting to be stored")
        if self.backlog is not None and await self.backlog.over(route.key.name):
            # The server keeps it and sends it again later: nothing is lost while the agent catches up.
            self._reject(503, "subscription held back (max_undecided_events)")
            return web.Response(
                status=503, headers={**SERVER_HEADER, "Retry-After": str(HELD_BACK_RETRY_AFTER_S)}
            )
        result = await self._commit.submit(delivery)
        if result is None:
            return self._reject(503, "not stored")
        if self.backlog is not None:
            self.backlog.stored(route.key.name, result.inserted)
        return _no_content()


# Route, WebhookRoutes and LISTEN_BACKLOG live in routes.py and connections.py; named here too.
__all__ = [
    "LISTEN_BACKLOG",
    "BadBody",
    "OnTerminated",
    "Receiver",
    "Route",
    "WebhookRoutes",
    "parse_body",
    "tls_context",
]
