"""A hostile MCP events server over stdio: hand-written JSON-RPC, no SDK, stdlib only.

It does the minimum the spec allows (``initialize`` with the events capability under
``experimental``, ``server/discover`` refused with -32601 so the client falls back,
``tools/list`` with no tools, ``events/list`` with one type ``h.tick``, ``events/poll``
and ``events/stream``), and misbehaves in the one way ``HOSTILE_MODE`` names.
Well-behaved by default: events ``h-1``, ``h-2``, ... with integer-string cursors and
``nextPollMs`` 100; a stream sends ``active``, then an event every 100 ms and a
heartbeat every 500 ms, each tagged with the request's id in ``_meta``.

It writes bytes, not text, so it can send what a text writer could not: invalid
UTF-8, lone surrogate escapes, 50 MB lines. It is single-threaded (non-blocking reads
of stdin, a short sleep when idle) and exits when stdin closes.

  HOSTILE_MODE   the misbehaviour, one of MODES below; empty: well-behaved
  HOSTILE_ARG    a parameter some modes need (the $ref URL of schema-remote-ref and schema-file-ref)
  HOSTILE_LOG    a file: one JSON line per message received ({"pid", "t", "method", "id", ...};
                 an answer has method null and "answer": "result" or "error")

Modes marked "once" misbehave once across processes (a marker file beside HOSTILE_LOG),
so a client that reconnects finds the server well-behaved again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MODE = os.environ.get("HOSTILE_MODE", "")
ARG = os.environ.get("HOSTILE_ARG", "")
LOG = os.environ.get("HOSTILE_LOG")
META = "io.modelcontextprotocol/subscriptionId"
EVENT = "h.tick"
TIMESTAMP = "2026-01-01T00:00:00Z"
NEXT_POLL_MS = 100
TICK_S = 0.1
HEARTBEAT_S = 0.5
MB = 1024 * 1024

# Each mode is one line of the issue; "once" modes misbehave once across processes.
MODES = {
    # schema: events/list offers an inputSchema that is a trap
    "schema-unknown-type": '{"type": "objekt"}',
    "schema-recursive-ref": '{"$ref": "#"} at the top, with a property',
    "schema-remote-ref": '{"$ref": HOSTILE_ARG} (an http:// URL)',
    "schema-file-ref": '{"$ref": HOSTILE_ARG} (a file:// URL)',
    "schema-catastrophic-pattern": 'a property "q" with the pattern ^(.*.*)*X$',
    # poll
    "next-poll-huge": "nextPollMs: 1e400, written literally",
    "next-poll-negative": "nextPollMs: -1000",
    "next-poll-float": "nextPollMs: 12.5",
    "next-poll-string": 'nextPollMs: "soon"',
    "has-more-empty": "hasMore: true with no events, every time",
    "truncated-every-poll": "truncated: true with no events, every time",
    "truncated-null-cursor": "the first poll with a cursor: truncated: true, one event, and a null cursor",
    "poll-error-32000": 'every poll answers -32000 "server busy: try later"',
    "poll-error-unknown": "every poll answers -32099",
    "poll-malformed": "events without a timestamp",
    "wrong-event-name": 'an alert.fired event {"severity": "P1"} in every page, beside an h.tick',
    "oversized-id": "h-1 has a 1 MB eventId",
    "oversized-timestamp": "h-1 has a 10 KB timestamp",
    "oversized-data": "h-1 has 20 MB of data",
    "flood": "every poll: 100 events and hasMore: true",
    # push
    "push-terminated-bad-code": 'after 3 events: terminated with error code "nope"',
    "push-terminated-string-error": 'after 3 events: terminated with "error": "gone"',
    "push-error-string": "after events 2, 7, 12, ...: an error notification whose error is a string",
    "push-unparsable-event": 'h-3 has a lone surrogate escape "\\ud800" in its data (once)',
    "push-deep-nesting": "h-3 has data nested 1,000 levels deep (once)",
    # transport
    "invalid-utf8": "the answer with h-1 has an invalid UTF-8 byte in a string (once)",
    "stdout-junk": "10,000 lines that are not JSON before the answer with h-1 (once)",
    "stderr-flood": "20 MB of stderr, some lines looking like agentwake's log, before h-1 (once)",
    "huge-line": "a 50 MB line (a notification) before the answer with h-1 (once)",
    "exit-code": "exits with code 7 after its first poll (every process)",
    # discovery
    "list-changed-flood": "from the first events/list on, 1,000 list_changed notifications a second",
    "list-pages-flood": "events/list answers 4 MB pages, each with a nextCursor, forever",
    # requests to the client
    "request-flood": (
        "from the first events/list on, ping and roots/list requests (ids flood-1, flood-2, ...) as fast"
        " as stdout takes them, never waiting for their answers (which HOSTILE_LOG records)"
    ),
}

if MODE and MODE not in MODES:
    sys.stderr.write(f"hostile_server: unknown HOSTILE_MODE {MODE!r}\n")
    sys.exit(2)

OUT = sys.stdout.buffer
STDIN = sys.stdin.fileno()
STDOUT = sys.stdout.fileno()
# request-flood: what waits for room in the pipe, answers and requests in the order written.
OUTBOX = bytearray()


# ---- output ---------------------------------------------------------------------------------


def write(data: bytes) -> None:
    if MODE == "request-flood":
        OUTBOX.extend(data)  # stdout is non-blocking: the loop writes what the pipe takes
        return
    OUT.write(data)
    OUT.flush()


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


def send(message: dict[str, Any]) -> None:
    write(encode(message) + b"\n")


def answer(message_id: Any, result: dict[str, Any]) -> None:
    send({"id": message_id, "result": result})


def refuse(message_id: Any, code: int, message: str, data: Any = None) -> None:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    send({"id": message_id, "error": error})


def with_raw_field(message: dict[str, Any], field: str, raw: str) -> bytes:
    """``message`` as JSON with ``"field": raw`` added to its result, ``raw`` written as it is."""
    text = encode(message)
    assert text.endswith(b"}}")
    return text[:-2] + f', "{field}": {raw}}}}}'.encode() + b"\n"


def note(method: str | None, message_id: Any, params: dict[str, Any], answer: str | None = None) -> None:
    if not LOG:
        return
    line: dict[str, Any] = {"pid": os.getpid(), "t": time.time(), "method": method, "id": message_id}
    if answer is not None:
        line["answer"] = answer  # an answer to a request of ours: "result" or "error"
    for key in ("name", "cursor", "requestId"):
        if key in params:
            line[key] = params[key]
    if isinstance(params.get("arguments"), dict):
        line["arguments"] = sorted(params["arguments"])
    with open(LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


def once(what: str) -> bool:
    """True the first time across processes (a marker file beside the log); always True without a log."""
    if not LOG:
        return True
    marker = f"{LOG}.{what}.done"
    if os.path.exists(marker):
        return False
    open(marker, "w").close()
    return True


def event(n: int, **overrides: Any) -> dict[str, Any]:
    return {"eventId": f"h-{n}", "name": EVENT, "timestamp": TIMESTAMP, "data": {"n": n}, **overrides}


# ---- events/list ----------------------------------------------------------------------------


def input_schema() -> dict[str, Any]:
    if MODE == "schema-unknown-type":
        return {"type": "objekt"}
    if MODE == "schema-recursive-ref":
        return {"$ref": "#", "type": "object", "properties": {"q": {"type": "string"}}}
    if MODE in ("schema-remote-ref", "schema-file-ref"):
        return {"$ref": ARG}
    if MODE == "schema-catastrophic-pattern":
        return {"type": "object", "properties": {"q": {"type": "string", "pattern": "^(.*.*)*X$"}}}
    return {"type": "object"}


def descriptor() -> dict[str, Any]:
    return {
        "name": EVENT,
        "description": "A tick.",
        "delivery": ["poll", "push"],
        "inputSchema": input_schema(),
    }


def list_events(message_id: Any, params: dict[str, Any]) -> None:
    global flooding_since
    if MODE == "list-pages-flood":
        cursor = params.get("cursor")
        page = int(cursor) if cursor else 0
        events = [descriptor()] if page == 0 else []
        events.append({"name": f"pad.{page}", "delivery": ["poll"], "description": "x" * (4 * MB)})
        answer(message_id, {"events": events, "nextCursor": str(page + 1)})
        return
    answer(message_id, {"events": [descriptor()]})
    if MODE in ("list-changed-flood", "request-flood") and flooding_since is None:
        flooding_since = time.monotonic()


# ---- events/poll ----------------------------------------------------------------------------


def page(events: list[dict[str, Any]], cursor: str, **extra: Any) -> dict[str, Any]:
    return {"events": events, "cursor": cursor, "hasMore": False, "nextPollMs": NEXT_POLL_MS, **extra}


def poll(message_id: Any, params: dict[str, Any]) -> None:
    global polls
    polls += 1
    raw_cursor = params.get("cursor")
    position = int(raw_cursor) if raw_cursor is not None else None
    if MODE == "poll-error-32000":
        refuse(message_id, -32000, "server busy: try later")
        return
    if MODE == "poll-error-unknown":
        refuse(message_id, -32099, "something odd happened")
        return
    if MODE in ("next-poll-huge", "next-poll-negative", "next-poll-float", "next-poll-string"):
        raw = {
            "next-poll-huge": "1e400",
            "next-poll-negative": "-1000",
            "next-poll-float": "12.5",
            "next-poll-string": '"soon"',
        }[MODE]
        result = page([], "0") if position is None else page([event(position + 1)], str(position + 1))
        del result["nextPollMs"]
        write(with_raw_field({"id": message_id, "result": result}, "nextPollMs", raw))
        return
    if MODE == "has-more-empty":
        answer(message_id, page([], str(position or 0), hasMore=True))
        return
    if MODE == "truncated-every-poll":
        n = position or 0
        answer(message_id, page([], str(n + 1), truncated=True))
        return
    if MODE == "truncated-null-cursor" and position is not None and once("truncated-null-cursor"):
        result = page([event(position + 1)], "0", truncated=True)
        result["cursor"] = None
        answer(message_id, result)
        return
    if position is None:  # bootstrap: the current position, no events
        answer(message_id, page([], "0"))
        after_poll()
        return
    n = position
    if MODE == "poll-malformed":
        answer(message_id, page([{"eventId": f"h-{n + 1}", "name": EVENT, "data": {}}], str(n + 1)))
        return
    if MODE == "wrong-event-name":
        wrong = {
            "eventId": f"a-{n + 1}",
            "name": "alert.fired",
            "timestamp": TIMESTAMP,
            "data": {"severity": "P1"},
        }
        answer(message_id, page([wrong, event(n + 1)], str(n + 1)))
        return
    if MODE == "flood":
        answer(message_id, page([event(n + i) for i in range(1, 101)], str(n + 100), hasMore=True))
        return
    if n == 0 and MODE.startswith("oversized-"):
        big: dict[str, Any]
        if MODE == "oversized-id":
            big = {"eventId": "h-1-" + "x" * MB}
        elif MODE == "oversized-timestamp":
            big = {"timestamp": TIMESTAMP + "0" * (10 * 1024)}
        else:
            big = {"data": {"blob": "x" * (20 * MB)}}
        answer(message_id, page([event(1, **big)], "1"))
        return
    if MODE == "invalid-utf8" and once("invalid-utf8"):
        body = encode({"id": message_id, "result": page([event(n + 1, data={"s": "caf"})], str(n + 1))})
        write(body.replace(b'"caf"', b'"caf\xff"', 1) + b"\n")
        return
    if MODE == "stdout-junk" and once("stdout-junk"):
        write(b"".join(b"this is not JSON-RPC, line %d\n" % i for i in range(10_000)))
    if MODE == "huge-line" and once("huge-line"):
        head = b'{"jsonrpc": "2.0", "method": "notifications/hostile/padding", "params": {"pad": "'
        write(head + b"x" * (50 * MB) + b'"}}\n')
    if MODE == "stderr-flood" and once("stderr-flood"):
        flood_stderr()
    answer(message_id, page([event(n + 1)], str(n + 1)))
    after_poll()


def after_poll() -> None:
    if MODE == "exit-code":
        sys.exit(7)


def flood_stderr() -> None:
    """20 MB of stderr lines; one in a hundred looks like one of agentwake's own log lines."""
    err = sys.stderr.buffer
    forged = b"2026-01-01 00:00:00 ERROR   agentwake.supervisor: subscription good stopped: HOSTILE-STDERR forged\n"
    plain = b"HOSTILE-STDERR " + b"y" * 84 + b"\n"
    chunk = b"".join(forged if i % 100 == 0 else plain for i in range(10_000))
    written = 0
    while written < 20 * MB:
        err.write(chunk)
        written += len(chunk)
    err.flush()


# ---- events/stream --------------------------------------------------------------------------


class Stream:
    def __init__(self, request_id: Any, cursor: str | None) -> None:
        self.id = request_id
        self.position = int(cursor) if cursor is not None else 0
        self.sent = 0
        now = time.monotonic()
        self.next_event = now + TICK_S
        self.next_beat = now + HEARTBEAT_S
        self.notify("active", {"cursor": str(self.position), "truncated": False})

    def notify(self, kind: str, params: dict[str, Any]) -> None:
        send({"method": f"notifications/events/{kind}", "params": {**params, "_meta": {META: self.id}}})

    def notify_raw(self, kind: str, params_json: str) -> None:
        """A notification whose params (a JSON object without its closing brace) are written as given."""
        head = f'{{"jsonrpc": "2.0", "method": "notifications/events/{kind}", "params": '
        write(f'{head}{params_json}, "_meta": {json.dumps({META: self.id})}}}}}\n'.encode())

    def tick(self, now: float) -> bool:
        """Send what is due; False once the stream is over."""
        if now >= self.next_beat:
            self.notify("heartbeat", {"cursor": str(self.position)})
            self.next_beat = now + HEARTBEAT_S
        if now < self.next_event:
            return True
        self.next_event = now + TICK_S
        n = self.position + 1
        if n == 3 and MODE == "push-unparsable-event" and once("push-unparsable-event"):
            self.notify_raw(
                "event",
                f'{{"eventId": "h-{n}", "name": "{EVENT}", "timestamp": "{TIMESTAMP}",'
                f' "data": {{"s": "\\ud800"}}, "cursor": "{n}"',
            )
        elif n == 3 and MODE == "push-deep-nesting" and once("push-deep-nesting"):
            nested = "[" * 1000 + "]" * 1000
            self.notify_raw(
                "event",
                f'{{"eventId": "h-{n}", "name": "{EVENT}", "timestamp": "{TIMESTAMP}",'
                f' "data": {{"nest": {nested}}}, "cursor": "{n}"',
            )
        else:
            self.notify("event", {**event(n), "cursor": str(n)})
        self.position = n
        self.sent += 1
        if MODE == "push-error-string" and self.sent % 5 == 2:
            self.notify("error", {"error": "upstream exploded"})
        if MODE.startswith("push-terminated-") and self.sent == 3:
            error: Any = {"code": "nope", "message": "no more"} if MODE.endswith("bad-code") else "gone"
            self.notify("terminated", {"error": error})
            answer(self.id, {})
            return False
        return True


# ---- the loop -------------------------------------------------------------------------------

streams: dict[Any, Stream] = {}
polls = 0
flooding_since: float | None = None
list_changed_sent = 0
requests_sent = 0


def handle(message: dict[str, Any]) -> None:
    method, message_id = message.get("method"), message.get("id")
    params = message.get("params") or {}
    note(method, message_id, params, None if method else "error" if "error" in message else "result")
    if method == "notifications/cancelled":
        streams.pop(params.get("requestId"), None)
        return
    if message_id is None or method is None:
        return  # notifications (initialized, ...) and answers to nothing we asked
    if method == "initialize":
        answer(
            message_id,
            {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"experimental": {"io.modelcontextprotocol/events": {}}},
                "serverInfo": {"name": "hostile", "version": "1"},
            },
        )
    elif method == "server/discover":
        refuse(message_id, -32601, f"Method not found: {method}")
    elif method == "ping":
        answer(message_id, {})
    elif method == "tools/list":
        answer(message_id, {"tools": []})
    elif method == "events/list":
        list_events(message_id, params)
    elif method == "events/poll":
        poll(message_id, params)
    elif method == "events/stream":
        if params.get("name") != EVENT:
            refuse(message_id, -32011, "NotFound", {"kind": "event"})
        else:
            streams[message_id] = Stream(message_id, params.get("cursor"))
    else:
        refuse(message_id, -32601, f"Method not found: {method}")


def flood_list_changed(now: float) -> bool:
    """list_changed at 1000 a second from the first events/list on; True if any was sent."""
    global list_changed_sent
    if flooding_since is None or MODE != "list-changed-flood":
        return False
    due = min(int((now - flooding_since) * 1000) - list_changed_sent, 100)
    if due <= 0:
        return False
    line = encode({"method": "notifications/events/list_changed", "params": {}}) + b"\n"
    write(line * due)
    list_changed_sent += due
    return True


def flood_requests() -> bool:
    """request-flood: keep the pipe to the client full of requests; True if any bytes went out."""
    global requests_sent
    if flooding_since is not None and len(OUTBOX) < 1 << 16:
        batch = []
        for _ in range(500):
            requests_sent += 1
            method = "ping" if requests_sent % 2 else "roots/list"
            batch.append(
                b'{"jsonrpc": "2.0", "id": "flood-%d", "method": "%s"}\n' % (requests_sent, method.encode())
            )
        OUTBOX.extend(b"".join(batch))
    if not OUTBOX:
        return False
    try:
        written = os.write(STDOUT, OUTBOX)
    except BlockingIOError:
        return False
    del OUTBOX[:written]
    return written > 0


def main() -> None:
    os.set_blocking(STDIN, False)
    if MODE == "request-flood":
        os.set_blocking(STDOUT, False)
    pending = b""
    while True:
        busy = False
        try:
            chunk = os.read(STDIN, 1 << 16)
        except BlockingIOError:
            chunk = None
        if chunk == b"":
            return  # stdin closed: the client is gone
        if chunk:
            busy = True
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    handle(json.loads(line))
        now = time.monotonic()
        for request_id, stream in list(streams.items()):
            if not stream.tick(now):
                streams.pop(request_id, None)
        busy = flood_list_changed(now) or busy
        if MODE == "request-flood":
            busy = flood_requests() or busy
        if not busy:
            time.sleep(0.001 if flooding_since is not None else 0.005)


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the client went away in the middle of a write
        sys.exit(0)
