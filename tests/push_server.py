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
  PUSH_TERMINATE_AT   after this item, send terminated (-32012) and the final result
  PUSH_SKIPPED        heartbeats report this many more items checked (filtered out) than sent
  PUSH_CRASH_AT       after this item, the process dies (once per marker file)
  PUSH_MARKER         a file: conditions marked "once" fire only while it does not exist
  PUSH_LOG            a file: one line per stream opened ("open <cursor>") and cancelled ("cancel <id>")
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

ITEMS = int(os.environ.get("PUSH_ITEMS", "5"))
HEARTBEAT_S = int(os.environ.get("PUSH_HEARTBEAT_MS", "100")) / 1000
SILENT_AT = int(os.environ.get("PUSH_SILENT_AT", "0")) or None
ERROR_AT = int(os.environ.get("PUSH_ERROR_AT", "0")) or None
GAP_AT = int(os.environ.get("PUSH_GAP_AT", "0")) or None
TERMINATE_AT = int(os.environ.get("PUSH_TERMINATE_AT", "0")) or None
SKIPPED = int(os.environ.get("PUSH_SKIPPED", "0"))
CRASH_AT = int(os.environ.get("PUSH_CRASH_AT", "0")) or None
MARKER = os.environ.get("PUSH_MARKER")
LOG = os.environ.get("PUSH_LOG")
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

    def notify(kind: str, params: dict[str, Any]) -> None:
        send({"method": f"notifications/events/{kind}", "params": {**params, "_meta": {META: request_id}}})

    notify("active", {"cursor": str(position), "truncated": False})
    silent = False
    for n in range(position + 1, ITEMS + 1):
        if stop.is_set():
            return
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
        if n == ERROR_AT:
            notify(
                "error", {"error": {"code": -32603, "message": "UpstreamError", "data": {"reason": "503"}}}
            )
        if n == GAP_AT:
            position = n + 100  # the server skipped ahead
            notify("active", {"cursor": str(position), "truncated": True})
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
    while not stop.wait(HEARTBEAT_S):
        if not silent:
            notify("heartbeat", {"cursor": str(position + SKIPPED)})


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        method, message_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "notifications/cancelled":
            request_id = params.get("requestId")
            note(f"cancel {request_id}")
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
