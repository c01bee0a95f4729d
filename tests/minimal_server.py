"""A minimal MCP server over stdio: hand-written JSON-RPC, no SDK, stdlib only.

It does the least the MCP Events design sketch allows, so tests can see what agentwake
sends a peer that offers nothing more: ``initialize`` (``server/discover`` is refused
with -32601, so the client falls back to the handshake), ``ping``, one tool (``echo``),
and, when it declares the events extension, one event type ``m.tick`` with ``events/list``,
``events/poll`` (one event per poll, integer-string cursors, ``nextPollMs`` 100),
``events/subscribe`` and ``events/unsubscribe`` (webhook). ``events/stream`` is not
offered: any method it does not know is refused with -32601. Every request is logged
before it is answered, with the error code the answer carries.

The feed: events ``m-1`` .. ``m-MINIMAL_EVENTS``. A webhook subscription's cursor is
``w-<pid>-<n>``: opaque, and naming the process that gave it, so a test can tell a
cursor persisted from an earlier process from one this process made up.

  MINIMAL_CAPABILITY   where the events extension is declared: "extensions" (default),
                       "events" (``capabilities.events``), "experimental", or "none"
                       (tools only: every events/* request is refused with -32601)
  MINIMAL_TOOLS        "echo" (default): the tools capability and the tool ``echo``;
                       "none": no tools capability (events only), tools/list is refused
                       with -32601; "refuse": the capability, but tools/list is refused
  MINIMAL_DELIVERY     the delivery modes of m.tick, comma-separated (default "poll")
  MINIMAL_EVENTS       how many events the feed holds (default 3)
  MINIMAL_STRICT       "1": require every field a server may require (delivery.mode on
                       events/unsubscribe included); a request without one is refused
                       with -32602 Invalid params, naming the field
  MINIMAL_UNSUBSCRIBE_ERROR
                       an error code: every events/unsubscribe is refused with it
  MINIMAL_LOG          a file: one JSON line per request ({"pid", "method", "id",
                       "params", "error"}; "error" is the code answered, or null)
  MINIMAL_PID_FILE     a file: this process appends its pid to it when it starts
  MINIMAL_POST_TRIGGER a file: once it exists, the next feed event is POSTed (signed,
                       Standard Webhooks) to each webhook subscription, then the file is
                       removed; the POST's answer status is logged as a "post" line
  MINIMAL_POST_CA      the CA file that HTTPS callbacks are verified against
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import select
import ssl
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

EXTENSION = "io.modelcontextprotocol/events"
EVENT = "m.tick"
TIMESTAMP = "2026-01-01T00:00:00Z"
NEXT_POLL_MS = 100
DEFAULT_TTL_MS = 60_000

CAPABILITY = os.environ.get("MINIMAL_CAPABILITY", "extensions")
TOOLS = os.environ.get("MINIMAL_TOOLS", "echo")
DELIVERY = [mode for mode in os.environ.get("MINIMAL_DELIVERY", "poll").split(",") if mode]
TOTAL = int(os.environ.get("MINIMAL_EVENTS", "3"))
STRICT = os.environ.get("MINIMAL_STRICT") == "1"
UNSUBSCRIBE_ERROR = (
    int(os.environ["MINIMAL_UNSUBSCRIBE_ERROR"]) if "MINIMAL_UNSUBSCRIBE_ERROR" in os.environ else None
)
LOG = os.environ.get("MINIMAL_LOG")
PID_FILE = os.environ.get("MINIMAL_PID_FILE")
POST_TRIGGER = os.environ.get("MINIMAL_POST_TRIGGER")
POST_CA = os.environ.get("MINIMAL_POST_CA")

if CAPABILITY not in ("extensions", "events", "experimental", "none"):
    sys.stderr.write(f"minimal_server: unknown MINIMAL_CAPABILITY {CAPABILITY!r}\n")
    sys.exit(2)
if TOOLS not in ("echo", "none", "refuse"):
    sys.stderr.write(f"minimal_server: unknown MINIMAL_TOOLS {TOOLS!r}\n")
    sys.exit(2)

INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
NOT_FOUND = -32011


class Refusal(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


# ---- output and log -------------------------------------------------------------------------------


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def log(line: dict[str, Any]) -> None:
    if LOG:
        with open(LOG, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "t": time.time(), **line}) + "\n")


# ---- checks ---------------------------------------------------------------------------------------


def invalid(field: str, why: str) -> Refusal:
    return Refusal(INVALID_PARAMS, f"Invalid params: {field} {why}", {"field": field})


def need_name(params: dict[str, Any]) -> None:
    name = params.get("name")
    if not isinstance(name, str):
        raise invalid("name", "is required (a string)")
    if name != EVENT:
        raise Refusal(NOT_FOUND, "NotFound", {"kind": "event"})


def check_arguments(params: dict[str, Any]) -> dict[str, Any]:
    """``arguments``: an object; the strict server wants it sent, even empty."""
    if "arguments" not in params or params["arguments"] is None:
        if STRICT:
            raise invalid("arguments", "is required (an object)")
        return {}
    arguments = params["arguments"]
    if not isinstance(arguments, dict):
        raise invalid("arguments", "must be an object")
    return arguments


def check_optional(params: dict[str, Any], field: str, kind: type[str] | type[int]) -> None:
    """An optional field: absent or null, else a string, or a non-negative integer (not a boolean)."""
    value = params.get(field)
    if value is None:
        return
    if kind is str and not isinstance(value, str):
        raise invalid(field, "must be a string or null")
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise invalid(field, "must be a non-negative integer or null")


def check_delivery(params: dict[str, Any], *, secret: bool) -> dict[str, Any]:
    delivery = params.get("delivery")
    if not isinstance(delivery, dict):
        raise invalid("delivery", "is required (an object)")
    mode = delivery.get("mode")
    if mode is None and STRICT:
        raise invalid("delivery.mode", "is required")
    if mode is not None and mode != "webhook":
        raise Refusal(-32014, "Unsupported", {"feature": "deliveryMode", "value": mode})
    url = delivery.get("url")
    if not isinstance(url, str) or not re.match(r"^https://[^/\s?#]+(/\S*)?$", url):
        raise invalid("delivery.url", "must be an https URL")
    if secret:
        value = delivery.get("secret")
        if not isinstance(value, str) or not value.startswith("whsec_"):
            raise invalid("delivery.secret", "must be a whsec_ secret")
        try:
            key = base64.b64decode(value[len("whsec_") :], validate=True)
        except (binascii.Error, ValueError):
            raise invalid("delivery.secret", "is not base64 after whsec_") from None
        if not 24 <= len(key) <= 64:
            raise invalid("delivery.secret", "must decode to 24 to 64 bytes")
    return delivery


# ---- events ---------------------------------------------------------------------------------------


def occurrence(n: int, **extra: Any) -> dict[str, Any]:
    return {"eventId": f"m-{n}", "name": EVENT, "timestamp": TIMESTAMP, "data": {"n": n}, **extra}


def list_events(params: dict[str, Any]) -> dict[str, Any]:
    check_optional(params, "cursor", str)
    return {
        "events": [
            {
                "name": EVENT,
                "description": "A tick.",
                "delivery": DELIVERY,
                "inputSchema": {"type": "object"},
                "payloadSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            }
        ]
    }


def poll(params: dict[str, Any]) -> dict[str, Any]:
    if "poll" not in DELIVERY:
        raise Refusal(-32014, "Unsupported", {"feature": "deliveryMode", "value": "poll"})
    need_name(params)
    check_arguments(params)
    check_optional(params, "cursor", str)
    check_optional(params, "maxAgeMs", int)
    check_optional(params, "maxEvents", int)
    cursor = params.get("cursor")
    if cursor is None:  # "start from now": the current position, no events
        return {"events": [], "cursor": "0", "truncated": False, "hasMore": False, "nextPollMs": NEXT_POLL_MS}
    if not cursor.isdigit() or int(cursor) > TOTAL:
        raise invalid("cursor", "is not a cursor of this server")
    position = int(cursor)
    limit = params.get("maxEvents") or 1
    last = min(TOTAL, position + min(limit, 1))
    events = [occurrence(n) for n in range(position + 1, last + 1)]
    return {
        "events": events,
        "cursor": str(last),
        "truncated": False,
        "hasMore": last < TOTAL,
        "nextPollMs": NEXT_POLL_MS,
    }


class Webhooks:
    """This process's webhook subscriptions, keyed on (url, name, arguments): in memory, as the spec allows."""

    def __init__(self) -> None:
        self.subs: dict[str, dict[str, Any]] = {}
        self.cursors = 0
        self.posted = 0

    def cursor(self) -> str:
        self.cursors += 1
        return f"w-{os.getpid()}-{self.cursors}"

    @staticmethod
    def key(url: str, arguments: dict[str, Any]) -> str:
        canonical = json.dumps([url, EVENT, arguments], sort_keys=True, separators=(",", ":"))
        return "sub_" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def subscribe(self, params: dict[str, Any]) -> dict[str, Any]:
        if "webhook" not in DELIVERY:
            raise Refusal(-32014, "Unsupported", {"feature": "deliveryMode", "value": "webhook"})
        need_name(params)
        arguments = check_arguments(params)
        delivery = check_delivery(params, secret=True)
        check_optional(params, "cursor", str)
        check_optional(params, "maxAgeMs", int)
        check_optional(params, "ttlMs", int)
        if STRICT and "ttlMs" in params and params["ttlMs"] is not None and params["ttlMs"] < 1:
            raise invalid("ttlMs", "must be positive")
        ttl = params.get("ttlMs", DEFAULT_TTL_MS)
        refresh_before = None
        if ttl is not None:
            end = datetime.now(UTC) + timedelta(milliseconds=min(ttl, DEFAULT_TTL_MS))
            refresh_before = end.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        sub_id = self.key(delivery["url"], arguments)
        self.subs[sub_id] = {"url": delivery["url"], "secret": delivery["secret"]}
        return {"id": sub_id, "refreshBefore": refresh_before, "cursor": self.cursor(), "truncated": False}

    def unsubscribe(self, params: dict[str, Any]) -> dict[str, Any]:
        if UNSUBSCRIBE_ERROR is not None:
            raise Refusal(UNSUBSCRIBE_ERROR, "this server never lets a subscription go")
        need_name(params)
        arguments = check_arguments(params)
        delivery = check_delivery(params, secret=False)
        # This process may not hold it (subscriptions are soft state): dropping nothing is fine.
        self.subs.pop(self.key(delivery["url"], arguments), None)
        return {}

    def post_next(self) -> None:
        """POST the next feed event to every subscription, signed per Standard Webhooks."""
        self.posted += 1
        context = ssl.create_default_context(cafile=POST_CA) if POST_CA else None
        for sub_id, sub in self.subs.items():
            event = occurrence(self.posted, cursor=self.cursor())
            body = json.dumps(event).encode()
            stamp = str(int(time.time()))
            key = base64.b64decode(sub["secret"][len("whsec_") :])
            digest = hmac.new(key, f"{event['eventId']}.{stamp}.".encode() + body, hashlib.sha256).digest()
            headers = {
                "Content-Type": "application/json",
                "webhook-id": event["eventId"],
                "webhook-timestamp": stamp,
                "webhook-signature": "v1," + base64.b64encode(digest).decode(),
                "X-MCP-Subscription-Id": sub_id,
            }
            request = urllib.request.Request(sub["url"], data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10, context=context) as answer:
                    status = answer.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError as exc:
                status = -1
                sys.stderr.write(f"minimal_server: POST to {sub['url']} failed: {exc}\n")
            log(
                {
                    "method": "post",
                    "id": None,
                    "params": {"id": sub_id, "event": event},
                    "error": None,
                    "status": status,
                }
            )


# ---- the loop -------------------------------------------------------------------------------------

webhooks = Webhooks()


def initialize(params: dict[str, Any]) -> dict[str, Any]:
    capabilities: dict[str, Any] = {} if TOOLS == "none" else {"tools": {}}
    if CAPABILITY == "events":
        capabilities["events"] = {}
    elif CAPABILITY != "none":
        capabilities[CAPABILITY] = {EXTENSION: {}}
    return {
        "protocolVersion": params.get("protocolVersion", "2025-06-18"),
        "capabilities": capabilities,
        "serverInfo": {"name": "minimal", "version": "1"},
    }


def tools_list(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "tools": [
            {
                "name": "echo",
                "description": "Returns its text.",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
            }
        ]
    }


def tools_call(params: dict[str, Any]) -> dict[str, Any]:
    if params.get("name") != "echo":
        raise invalid("name", "is not a tool of this server")
    text = str((params.get("arguments") or {}).get("text", ""))
    return {"content": [{"type": "text", "text": text}], "isError": False}


HANDLERS = {
    "initialize": initialize,
    "ping": lambda params: {},
    "tools/list": tools_list,
    "tools/call": tools_call,
}
EVENT_HANDLERS = {
    "events/list": list_events,
    "events/poll": poll,
    "events/subscribe": webhooks.subscribe,
    "events/unsubscribe": webhooks.unsubscribe,
}
if CAPABILITY != "none":
    HANDLERS.update(EVENT_HANDLERS)
if TOOLS != "echo":
    del HANDLERS["tools/list"], HANDLERS["tools/call"]


def handle(message: dict[str, Any]) -> None:
    method, message_id = message.get("method"), message.get("id")
    params = message.get("params") or {}
    if message_id is None or method is None:
        return  # notifications (initialized, cancelled) and answers to nothing we asked
    handler = HANDLERS.get(method)
    try:
        if handler is None:
            raise Refusal(METHOD_NOT_FOUND, f"Method not found: {method}")
        result = handler(params)
    except Refusal as refusal:
        log({"method": method, "id": message_id, "params": params, "error": refusal.code})
        error: dict[str, Any] = {"code": refusal.code, "message": refusal.message}
        if refusal.data is not None:
            error["data"] = refusal.data
        send({"id": message_id, "error": error})
        return
    log({"method": method, "id": message_id, "params": params, "error": None})
    send({"id": message_id, "result": result})


def main() -> None:
    if PID_FILE:
        with open(PID_FILE, "a") as out:
            out.write(f"{os.getpid()}\n")
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.02 if POST_TRIGGER else None)
        if POST_TRIGGER and os.path.exists(POST_TRIGGER):
            os.remove(POST_TRIGGER)
            webhooks.post_next()
        if not readable:
            continue
        chunk = os.read(stdin, 1 << 16)
        if not chunk:
            return  # stdin closed: the client is gone
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                handle(json.loads(line))


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the client went away in the middle of a write
        sys.exit(0)
