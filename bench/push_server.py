"""A fast hand-written events server over stdio for bench/push_latency.py (stdlib only, no SDK).

It is written so that the server is not what a benchmark measures: a backlog is pre-encoded
and written to stdout in large chunks. One type, "feed.item", cursor = item number, with
both delivery modes:

* ``events/stream`` from cursor c (null = the end of the backlog) sends ``active``, the backlog
  items c+1..BENCH_BACKLOG, a heartbeat, then the live items (if any) one at a time at
  BENCH_RATE a second, then a heartbeat every BENCH_HEARTBEAT_MS;
* ``events/poll`` returns up to ``maxEvents`` items after the cursor: the backlog, and the
  live items whose time has come (the live clock starts at the first events/* read).

Each live item carries ``data.emitted``: ``time.time()`` when it was written (push) or when it
became available (poll), so the client can measure emit -> committed.

  BENCH_BACKLOG        items available at once (default 100000)
  BENCH_LIVE           live items after the backlog (default 0)
  BENCH_RATE           live items a second (default 100)
  BENCH_HEARTBEAT_MS   heartbeat interval when idle (default 1000)
  BENCH_REPORT         a file: once the backlog is written, {"backlog_write_s": ...} goes there
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Final

BACKLOG: Final = int(os.environ.get("BENCH_BACKLOG", "100000"))
LIVE: Final = int(os.environ.get("BENCH_LIVE", "0"))
RATE: Final = float(os.environ.get("BENCH_RATE", "100"))
HEARTBEAT_S: Final = int(os.environ.get("BENCH_HEARTBEAT_MS", "1000")) / 1000
REPORT: Final = os.environ.get("BENCH_REPORT")
META: Final = "io.modelcontextprotocol/subscriptionId"
CHUNK: Final = 500
NAME: Final = "feed.item"
# A payload of a realistic size (a support ticket, as the demo server's), the same for every item.
PAYLOAD: Final = (
    '"queue":"billing","priority":"high","title":"Refund not received",'
    '"body":"Customer reports: refund not received.","requester":"user42@example.com"'
)

DATA: Final = json.loads("{" + PAYLOAD + "}")

out = sys.stdout.buffer
write_lock = threading.Lock()
cancelled: dict[Any, threading.Event] = {}
live_started: float | None = None


def send_bytes(data: bytes) -> None:
    with write_lock:
        out.write(data)
        out.flush()


def send(message: dict[str, Any]) -> None:
    send_bytes((json.dumps({"jsonrpc": "2.0", **message}, separators=(",", ":")) + "\n").encode())


def live_clock() -> float:
    global live_started
    with write_lock:
        if live_started is None:
            live_started = time.time()
        return live_started


def item(n: int, emitted: float | None) -> str:
    """One item as JSON text (its params' event fields, no _meta)."""
    stamp = "null" if emitted is None else repr(emitted)
    return (
        f'{{"eventId":"item-{n}","name":"{NAME}","timestamp":"2026-01-01T00:00:00Z",'
        f'"data":{{"n":{n},"emitted":{stamp},{PAYLOAD}}},"cursor":"{n}"'
    )


def stream(request_id: Any, cursor: str | None) -> None:
    stop = cancelled[request_id]
    meta = json.dumps({META: request_id})
    position = BACKLOG if cursor is None else int(cursor)
    line = '{{"jsonrpc":"2.0","method":"notifications/events/{kind}","params":{{{body},"_meta":{meta}}}}}\n'
    active = f'"cursor":"{position}","truncated":false'
    send_bytes(line.format(kind="active", body=active, meta=meta).encode())
    started = time.perf_counter()
    for first in range(position + 1, BACKLOG + 1, CHUNK):
        if stop.is_set():
            return
        last = min(first + CHUNK, BACKLOG + 1)
        chunk = "".join(
            line.format(kind="event", body=item(n, None)[1:], meta=meta) for n in range(first, last)
        )
        send_bytes(chunk.encode())
    position = max(position, BACKLOG)
    send_bytes(line.format(kind="heartbeat", body=f'"cursor":"{position}"', meta=meta).encode())
    if REPORT:
        with open(REPORT, "w") as report:
            json.dump({"backlog_write_s": time.perf_counter() - started, "items": BACKLOG}, report)
    if LIVE:
        start = live_clock()
        for n in range(max(position, BACKLOG) + 1, BACKLOG + LIVE + 1):
            due = start + (n - BACKLOG) / RATE
            if stop.wait(max(0.0, due - time.time())):
                return
            send_bytes(line.format(kind="event", body=item(n, time.time())[1:], meta=meta).encode())
            position = n
    while not stop.wait(HEARTBEAT_S):
        send_bytes(line.format(kind="heartbeat", body=f'"cursor":"{position}"', meta=meta).encode())


def poll(params: dict[str, Any]) -> dict[str, Any]:
    cursor = params.get("cursor")
    if cursor is None:
        return {"events": [], "cursor": str(BACKLOG), "hasMore": False, "nextPollMs": 0}
    start = int(cursor)
    available = BACKLOG
    if LIVE:
        began = live_clock()
        available += min(LIVE, int((time.time() - began) * RATE))
    end = min(start + int(params.get("maxEvents") or 100), available)
    began = live_clock() if LIVE else 0.0
    events = [
        {
            "eventId": f"item-{n}",
            "name": NAME,
            "timestamp": "2026-01-01T00:00:00Z",
            "data": {"n": n, "emitted": None if n <= BACKLOG else began + (n - BACKLOG) / RATE, **DATA},
            "cursor": str(n),
        }
        for n in range(start + 1, end + 1)
    ]
    return {"events": events, "cursor": str(max(start, end)), "hasMore": end < available, "nextPollMs": 0}


def main() -> None:
    for raw in sys.stdin:
        message = json.loads(raw)
        method, message_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "notifications/cancelled":
            request_id = params.get("requestId")
            if request_id in cancelled:
                cancelled[request_id].set()
            continue
        if message_id is None:
            continue
        if method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"experimental": {"io.modelcontextprotocol/events": {}}},
                "serverInfo": {"name": "bench-push", "version": "1"},
            }
            send({"id": message_id, "result": result})
        elif method == "events/list":
            descriptor = {"name": NAME, "delivery": ["poll", "push"], "inputSchema": {"type": "object"}}
            send({"id": message_id, "result": {"events": [descriptor]}})
        elif method == "events/poll":
            send({"id": message_id, "result": poll(params)})
        elif method == "events/stream":
            cancelled[message_id] = threading.Event()
            threading.Thread(target=stream, args=(message_id, params.get("cursor")), daemon=True).start()
        elif method == "ping":
            send({"id": message_id, "result": {}})
        else:
            send({"id": message_id, "error": {"code": -32601, "message": f"Method not found: {method}"}})


if __name__ == "__main__":
    main()
