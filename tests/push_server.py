"""A hand-written events/stream server over stdio (initialize handshake only, no SDK).

It plays a third-party push server so the client's push loop can be tested on its own,
including the failure modes a well-behaved server never shows. One type, "feed.item",
cursor = item number. A stream from cursor c (null = now = 0) sends active, then the
items c+1..PUSH_ITEMS, then a heartbeat every PUSH_HEARTBEAT_MS with the current cursor.

  PUSH_ITEMS          items in the feed (default 5)
  PUSH_HEARTBEAT_MS   heartbeat interval (default 100)
  PUSH_SILENT_AT      after sending this item, go silent (no heartbeats), once per marker file
  PUSH_ERROR_AT       after this item, send one notifications/events/error
  PUSH_GAP_AT         after this item, send a fresh active with truncated: true
  PUSH_NULL_GAP       "1": that active carries a null cursor (the server's head has none to give)
  PUSH_TERMINATE_AT   after this item, send terminated (-32012) and the final result
  PUSH_SKIPPED        heartbeats report this many more items checked (filtered out) than sent
  PUSH_CRASH_AT       after this item, the process dies (once per marker file)
  PUSH_MARKER         a file: conditions marked "once" fire only while it does not exist
  PUSH_SILENT_AFTER_BEATS  after this many heartbeats on a stream, go silent, once per marker file
  PUSH_EVENTS_BETWEEN_BEATS  heartbeats keep a fixed clock; an event (the next item) goes out
                      PUSH_EVENT_LEAD_MS (default 50) before each of the first this many heartbeats
  PUSH_NULL_HEARTBEAT  while a stream has sent no event, its active and heartbeats carry a null cursor
  PUSH_STRICT         "1": events/stream without an ``arguments`` object is refused (-32602)
  PUSH_LOG            a file: one line per stream opened ("open <cursor>") and cancelled ("cancel <id>")
  PUSH_TRACE          a file: "<monotonic seconds> <kind> <request id> [<cursor>]" per stream opened
                      ("open"), heartbeat sent ("heartbeat"), silence begun ("silent") and
                      cancel received ("cancel"); time.monotonic is one clock for every process
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

ITEMS = int(os.environ.get("PUSH_ITEMS", "5"))
HEARTBEAT_S = int(os.environ.get("PUSH_HEARTBEAT_MS", "100")) / 1000
SILENT_AT = int(os.environ.get("PUSH_SILENT_AT", "0")) or None
ERROR_AT = int(os.environ.get("PUSH_ERROR_AT", "0")) or None
GAP_AT = int(os.environ.get("PUSH_GAP_AT", "0")) or None
NULL_GAP = os.environ.get("PUSH_NULL_GAP") == "1"
TERMINATE_AT = int(os.environ.get("PUSH_TERMINATE_AT", "0")) or None
SKIPPED = int(os.environ.get("PUSH_SKIPPED", "0"))
CRASH_AT = int(os.environ.get("PUSH_CRASH_AT", "0")) or None
SILENT_AFTER_BEATS = int(os.environ.get("PUSH_SILENT_AFTER_BEATS", "0")) or None
EVENTS_BETWEEN_BEATS = int(os.environ.get("PUSH_EVENTS_BETWEEN_BEATS", "0"))
EVENT_LEAD_S = int(os.environ.get("PUSH_EVENT_LEAD_MS", "50")) / 1000
NULL_HEARTBEAT = os.environ.get("PUSH_NULL_HEARTBEAT") == "1"
MARKER = os.environ.get("PUSH_MARKER")
LOG = os.environ.get("PUSH_LOG")
STRICT = os.environ.get("PUSH_STRICT") == "1"
TRACE = os.environ.get("PUSH_TRACE")
META = "io.modelcontextprotocol/subscriptionId"

write_lock = threading.Lock()
cancelled: dict[Any, threading.Event] = {}


def send(message: dict[str, Any]) -> None:
    with write_lock:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        sys.stdout.flush()


def note(line: str) -> None:
    if LOG:
        with write_lock, open(LOG, "a") as log:
            log.write(line + "\n")


def trace(kind: str, request_id: Any, *rest: Any) -> None:
    if TRACE:
        with write_lock, open(TRACE, "a") as log:
            log.write(" ".join([f"{time.monotonic():.6f}", kind, str(request_id), *map(str, rest)]) + "\n")


def once() -> bool:
    """True the first time (per marker file)."""
    if not MARKER or os.path.exists(MARKER):
        return False
    open(MARKER, "w").close()
    return True


def stream(request_id: Any, cursor: str | None, prefix: str) -> None:
    stop = cancelled[request_id]
    position = 0 if cursor is None else int(cursor)
    note(f"open {cursor}")
    trace("open", request_id, cursor)
    sent_event = False

    def notify(kind: str, params: dict[str, Any]) -> None:
        send({"method": f"notifications/events/{kind}", "params": {**params, "_meta": {META: request_id}}})

    def item(n: int) -> None:
        nonlocal position, sent_event
        notify(
            "event",
            {
                "eventId": f"{prefix}-{n}",
                "name": "feed.item",
                "timestamp": "2026-01-01T00:00:00Z",
                "data": {"n": n},
                "cursor": str(n),
            },
        )
        position = n
        sent_event = True

    def current(at: int) -> str | None:
        return None if NULL_HEARTBEAT and not sent_event else str(at)

    notify("active", {"cursor": current(position), "truncated": False})
    silent = False
    for n in range(position + 1, ITEMS + 1):
        if stop.is_set():
            return
        item(n)
        if n == ERROR_AT:
            notify(
                "error", {"error": {"code": -32603, "message": "UpstreamError", "data": {"reason": "503"}}}
            )
        if n == GAP_AT:
            position = n + 100  # the server skipped ahead
            notify("active", {"cursor": None if NULL_GAP else str(position), "truncated": True})
            break
        if n == TERMINATE_AT:
            notify(
                "terminated",
                {"error": {"code": -32012, "message": "Forbidden", "data": {"reason": "revoked"}}},
            )
            send({"id": request_id, "result": {"_meta": {}}})
            return
        if n == SILENT_AT and once():
            silent = True
            break
        if n == CRASH_AT and once():
            os._exit(3)
    beats = 0
    while True:
        if beats < EVENTS_BETWEEN_BEATS and not silent:
            if stop.wait(HEARTBEAT_S - EVENT_LEAD_S):
                break
            item(position + 1)
            trace("event", request_id, position)
            if stop.wait(EVENT_LEAD_S):
                break
        elif stop.wait(HEARTBEAT_S):
            break
        if silent:
            continue
        cursor_now = current(position + SKIPPED)
        notify("heartbeat", {"cursor": cursor_now})
        trace("heartbeat", request_id, cursor_now)
        beats += 1
        if beats == SILENT_AFTER_BEATS and once():
            silent = True
            trace("silent", request_id)
    trace("closed", request_id)


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, message_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "notifications/cancelled":
            request_id = params.get("requestId")
            note(f"cancel {request_id}")
            trace("cancel", request_id)
            if request_id in cancelled:
                cancelled[request_id].set()
            continue
        if message_id is None:
            continue
        if method == "initialize":
            send(
                {
                    "id": message_id,
                    "result": {
                        "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                        "capabilities": {"experimental": {"io.modelcontextprotocol/events": {}}},
                        "serverInfo": {"name": "push", "version": "1"},
                    },
                }
            )
        elif method == "events/list":
            send(
                {
                    "id": message_id,
                    "result": {
                        "events": [
                            {"name": "feed.item", "delivery": ["push"], "inputSchema": {"type": "object"}}
                        ]
                    },
                }
            )
        elif method == "events/stream":
            if STRICT and not isinstance(params.get("arguments"), dict):
                send({"id": message_id, "error": {"code": -32602, "message": "arguments is required"}})
                continue
            if params.get("name") != "feed.item":
                send(
                    {
                        "id": message_id,
                        "error": {"code": -32011, "message": "NotFound", "data": {"kind": "event"}},
                    }
                )
                continue
            cancelled[message_id] = threading.Event()
            prefix = str((params.get("arguments") or {}).get("prefix", "item"))
            thread = threading.Thread(
                target=stream, args=(message_id, params.get("cursor"), prefix), daemon=True
            )
            thread.start()
        elif method == "ping":
            send({"id": message_id, "result": {}})
        else:
            send({"id": message_id, "error": {"code": -32601, "message": f"Method not found: {method}"}})


if __name__ == "__main__":
    main()
