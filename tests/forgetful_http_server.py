"""A minimal MCP Events server over Streamable HTTP that forgets its webhook subscriptions when it restarts.

Hand-written JSON-RPC on aiohttp (neither the MCP SDK nor agentwake.server): the stdio
``tests/minimal_server.py``'s model over HTTP, for webhook delivery only. It answers
``initialize`` (``server/discover`` is refused with -32601, so a client falls back to the
handshake), ``notifications/initialized``, ``ping``, ``events/list`` (one event type,
``f.tick``, delivered by webhook only), ``events/subscribe`` and ``events/unsubscribe``;
anything else is refused with -32601. It keeps no session (no ``Mcp-Session-Id``): a
fresh process answers the same client as the one before it did, so pings cannot tell
that it restarted. A GET (the optional SSE stream) is refused with 405.

Webhook subscriptions, as the spec lets a server that grants short TTLs keep them, live
in memory only: a new process has none. Yet it grants an hour whatever ``ttlMs`` asks,
so only a client that refreshes more often than its grant finds out. Every subscribe and
unsubscribe needs a principal: ``Authorization: Bearer <token>`` (else -32012 Forbidden).
A subscription's id is derived from (principal, url, name, arguments), so it is the same
in every process. Before the first delivery to a (principal, url), the endpoint must echo
a verification challenge (a signed ``{"type": "verification", "challenge": ...}`` POST);
the cache of verified endpoints is lost with the process too. A refresh of a subscription
this process holds is answered with its ``deliveryStatus``; a subscribe of one it does
not hold creates it, answered without one. ``f.tick`` has no replay: every cursor is null.

Events are delivered when a test asks: ``POST /control/emit`` sends the next tick to every
subscription this process holds, signed per Standard Webhooks (the ``standardwebhooks``
package) and headed with ``X-MCP-Subscription-Id``; its answer lists each POST's status.

One JSON line per message on stdout, for the test to follow: ``{"ready": port}`` once
listening, then ``{"method", "id", "held", "error", "t"}`` per request answered (``held``:
a subscribe of a subscription this process already held), ``{"post", "status"}`` per
delivery. The socket is bound with SO_REUSEPORT, so a fresh process can take over the
port before the old one is killed.

  python tests/forgetful_http_server.py --port PORT --token TOKEN --ca CA.pem
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import ssl
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web
from standardwebhooks import Webhook

EXTENSION = "io.modelcontextprotocol/events"
EVENT = "f.tick"
GRANT = timedelta(hours=1)
POST_TIMEOUT_S = 10.0

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
FORBIDDEN = -32012
NOT_FOUND = -32011
UNSUPPORTED = -32014
CALLBACK_ENDPOINT_ERROR = -32015


class Refusal(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def say(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"pid": os.getpid(), "t": time.time(), **line}) + "\n")
    sys.stdout.flush()


def now_iso(at: datetime | None = None) -> str:
    return (at or datetime.now(UTC)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Subscription:
    id: str
    url: str
    secret: str
    last_delivery_at: str | None = None
    last_error: str | None = None

    def status(self) -> dict[str, Any]:
        return {"active": True, "lastDeliveryAt": self.last_delivery_at, "lastError": self.last_error}


def error_category(status: int | None, exc: BaseException | None) -> str | None:
    """The spec's lastError category of one POST (never the endpoint's own words)."""
    if isinstance(exc, ssl.SSLError | aiohttp.ClientSSLError):
        return "tls_error"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timeout"
    if exc is not None:
        return "connection_refused"
    if status is None or 200 <= status < 300:
        return None
    return "http_4xx" if status < 500 else "http_5xx"


class Server:
    """This process's state: the subscriptions and verified endpoints it holds, in memory only."""

    def __init__(self, token: str, ca: str | None) -> None:
        self.token = token
        self.context = ssl.create_default_context(cafile=ca) if ca else None
        self.subs: dict[str, Subscription] = {}
        self.verified: set[tuple[str, str]] = set()
        self.ticks = 0
        self.http: aiohttp.ClientSession | None = None

    # ---- POSTs to callbacks -------------------------------------------------------------------

    async def post(
        self, sub: Subscription, msg_id: str, document: dict[str, Any]
    ) -> tuple[int | None, bytes]:
        """One signed POST of ``document`` to the subscription's url; (status or None, body)."""
        assert self.http is not None
        body = json.dumps(document)
        stamp = datetime.now(UTC)
        headers = {
            "Content-Type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(stamp.timestamp())),
            "webhook-signature": Webhook(sub.secret).sign(msg_id, stamp, body),
            "X-MCP-Subscription-Id": sub.id,
        }
        try:
            async with self.http.post(
                sub.url,
                data=body.encode(),
                headers=headers,
                ssl=self.context if self.context is not None else True,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S),
            ) as answer:
                status, text = answer.status, await answer.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            sub.last_error = error_category(None, exc)
            say({"post": msg_id, "status": None, "error": sub.last_error})
            return None, b""
        say({"post": msg_id, "status": status})
        return status, text

    async def verify(self, principal: str, sub: Subscription) -> None:
        """The spec's endpoint verification, once per (principal, url) in this process."""
        if (principal, sub.url) in self.verified:
            return
        challenge = secrets.token_urlsafe(24)
        status, body = await self.post(
            sub,
            f"msg_verification_{secrets.token_hex(8)}",
            {"type": "verification", "challenge": challenge},
        )
        if status is None:
            raise Refusal(CALLBACK_ENDPOINT_ERROR, "CallbackEndpointError", {"reason": sub.last_error})
        try:
            echoed = json.loads(body).get("challenge") if 200 <= status < 300 else None
        except (ValueError, AttributeError):
            echoed = None
        if not isinstance(echoed, str) or not hmac.compare_digest(echoed, challenge):
            reason = error_category(status, None) or "challenge_failed"
            raise Refusal(CALLBACK_ENDPOINT_ERROR, "CallbackEndpointError", {"reason": reason})
        self.verified.add((principal, sub.url))

    async def emit(self) -> list[dict[str, Any]]:
        """The next tick, POSTed to every subscription held."""
        self.ticks += 1
        sent = []
        for sub in list(self.subs.values()):
            event_id = f"tick-{os.getpid()}-{self.ticks}"
            event = {
                "eventId": event_id,
                "name": EVENT,
                "timestamp": now_iso(),
                "data": {"n": self.ticks, "pid": os.getpid()},
                "cursor": None,
            }
            status, _ = await self.post(sub, event_id, event)
            if status is not None:
                sub.last_error = error_category(status, None)
                if sub.last_error is None:
                    sub.last_delivery_at = now_iso()
            sent.append({"id": sub.id, "eventId": event_id, "status": status})
        return sent

    # ---- JSON-RPC -----------------------------------------------------------------------------

    def principal(self, request: web.Request) -> str:
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self.token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise Refusal(
                FORBIDDEN, "Forbidden", {"reason": "webhook delivery needs an authenticated principal"}
            )
        return hashlib.sha256(self.token.encode()).hexdigest()[:12]

    @staticmethod
    def delivery(params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if params.get("name") != EVENT:
            raise Refusal(NOT_FOUND, "NotFound", {"kind": "event"})
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise Refusal(INVALID_PARAMS, "Invalid params: arguments must be an object")
        delivery = params.get("delivery")
        if not isinstance(delivery, dict) or delivery.get("mode", "webhook") != "webhook":
            raise Refusal(INVALID_PARAMS, "Invalid params: delivery must be a webhook delivery")
        url = delivery.get("url")
        if not isinstance(url, str) or not url.startswith("https://"):
            raise Refusal(INVALID_PARAMS, "Invalid params: delivery.url must be an https URL")
        return url, arguments

    @staticmethod
    def sub_id(principal: str, url: str, arguments: dict[str, Any]) -> str:
        key = json.dumps([principal, url, EVENT, arguments], sort_keys=True, separators=(",", ":"))
        return "sub_" + hashlib.sha256(key.encode()).hexdigest()[:16]

    async def subscribe(self, request: web.Request, params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        principal = self.principal(request)
        url, arguments = self.delivery(params)
        secret = params["delivery"].get("secret")
        if not isinstance(secret, str) or not secret.startswith("whsec_"):
            raise Refusal(INVALID_PARAMS, "Invalid params: delivery.secret must be a whsec_ secret")
        sub_id = self.sub_id(principal, url, arguments)
        held = self.subs.get(sub_id)
        sub = Subscription(sub_id, url, secret)
        if held is not None:
            held.secret = secret  # replaced on refresh, as the spec says
            sub = held
        else:
            await self.verify(principal, sub)
            self.subs[sub_id] = sub
        result: dict[str, Any] = {
            "id": sub_id,
            "refreshBefore": now_iso(datetime.now(UTC) + GRANT),  # an hour, whatever was asked
            "cursor": None,  # no replay
            "truncated": False,
        }
        if held is not None:
            result["deliveryStatus"] = sub.status()
        return result, held is not None

    def unsubscribe(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        url, arguments = self.delivery(params)
        self.subs.pop(self.sub_id(self.principal(request), url, arguments), None)
        return {}

    async def answer(self, request: web.Request, method: str, params: dict[str, Any]) -> tuple[Any, bool]:
        if method == "initialize":
            return {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"extensions": {EXTENSION: {}}},
                "serverInfo": {"name": "forgetful", "version": "1"},
            }, False
        if method == "ping":
            return {}, False
        if method == "events/list":
            return {
                "events": [
                    {
                        "name": EVENT,
                        "description": "A tick, sent when a test asks.",
                        "delivery": ["webhook"],
                        "inputSchema": {"type": "object"},
                        "payloadSchema": {"type": "object"},
                    }
                ]
            }, False
        if method == "events/subscribe":
            return await self.subscribe(request, params)
        if method == "events/unsubscribe":
            return self.unsubscribe(request, params), False
        raise Refusal(METHOD_NOT_FOUND, f"Method not found: {method}")

    async def mcp(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405, headers={"Allow": "POST"})
        try:
            message = json.loads(await request.read())
        except ValueError:
            return web.json_response(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
            )
        method, message_id = message.get("method"), message.get("id")
        if method is None or message_id is None:
            return web.Response(status=202)  # a notification (initialized, cancelled) or an answer
        params = message.get("params") or {}
        try:
            result, held = await self.answer(request, method, params)
        except Refusal as refusal:
            say({"method": method, "id": message_id, "held": False, "error": refusal.code})
            error: dict[str, Any] = {"code": refusal.code, "message": refusal.message}
            if refusal.data is not None:
                error["data"] = refusal.data
            return web.json_response({"jsonrpc": "2.0", "id": message_id, "error": error})
        say({"method": method, "id": message_id, "held": held, "error": None})
        return web.json_response({"jsonrpc": "2.0", "id": message_id, "result": result})

    async def control_emit(self, request: web.Request) -> web.Response:
        return web.json_response({"sent": await self.emit()})


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--ca", help="the CA file that https callbacks are verified against")
    args = parser.parse_args()
    server = Server(args.token, args.ca)
    app = web.Application()
    app.router.add_route("*", "/mcp", server.mcp)
    app.router.add_post("/control/emit", server.control_emit)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    async with aiohttp.ClientSession() as http:
        server.http = http
        site = web.TCPSite(runner, "127.0.0.1", args.port, reuse_port=True)
        await site.start()
        say({"ready": args.port})
        try:
            await asyncio.Event().wait()  # until killed
        finally:
            await runner.cleanup()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
