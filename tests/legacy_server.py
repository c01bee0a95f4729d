"""A hand-written MCP server that speaks only the initialize handshake (no server/discover).

Plain JSON-RPC over stdio, no SDK, so it behaves like an older third-party server.
It serves one event type, "counter.tick", whose cursor is the tick number. The
first LEGACY_FAILURES polls answer -32603, to exercise the client's retry.
"""

from __future__ import annotations

import json
import os
import sys

FAILURES = int(os.environ.get("LEGACY_FAILURES", "0"))
TICKS = int(os.environ.get("LEGACY_TICKS", "5"))


def reply(message_id: object, result: object = None, error: object = None) -> None:
    body: dict[str, object] = {"jsonrpc": "2.0", "id": message_id}
    if error is not None:
        body["error"] = error
    else:
        body["result"] = result
    sys.stdout.write(json.dumps(body) + "\n")
    sys.stdout.flush()


def main() -> None:
    failures_left = FAILURES
    for line in sys.stdin:
        message = json.loads(line)
        method, message_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if message_id is None:
            continue  # notifications
        if method == "initialize":
            reply(
                message_id,
                {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"experimental": {"io.modelcontextprotocol/events": {}}},
                    "serverInfo": {"name": "legacy", "version": "1"},
                },
            )
        elif method == "events/list":
            reply(
                message_id,
                {
                    "events": [
                        {"name": "counter.tick", "delivery": ["poll"], "inputSchema": {"type": "object"}}
                    ]
                },
            )
        elif method == "events/poll":
            if failures_left > 0:
                failures_left -= 1
                reply(message_id, error={"code": -32603, "message": "upstream hiccup"})
                continue
            cursor = params.get("cursor")
            start = TICKS if cursor is None else int(cursor)
            events = [
                {
                    "eventId": f"tick-{n}",
                    "name": "counter.tick",
                    "timestamp": "2026-01-01T00:00:00Z",
                    "data": {"n": n},
                }
                for n in range(start + 1, TICKS + 1)
            ]
            reply(message_id, {"events": events, "cursor": str(TICKS), "nextPollMs": 1000})
        elif method == "ping":
            reply(message_id, {})
        else:
            reply(message_id, error={"code": -32601, "message": f"Method not found: {method}"})


if __name__ == "__main__":
    main()
