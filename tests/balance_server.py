"""A stdio events server with many independent streams, for spreading subscriptions over processes.

One type, "stream.item", with the argument ``stream``: each stream's items are numbered from 1,
event id ``<stream>-<n>``, cursor = n. They appear over time, the same on every copy of this
server (each `agentwake run` process starts its own): item n of every stream exists from
BALANCE_START (a Unix time) + n * BALANCE_PERIOD_MS, up to BALANCE_ITEMS. So a subscription keeps
delivering while the processes hand it over, and a copy asked from a cursor it has not reached
yet answers nothing new, as a copy that is behind would.

With BALANCE_DIE_FILE, the server is out of reach while that file exists: it exits at its start,
and a running one exits once the file appears. With BALANCE_GATE_FILE, no item exists before that
file does (bench/scale_out.py opens it once the subscriptions are spread).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

from agentwake.server import Event, EventContext, EventResult, EventsExtension

ITEMS = int(os.environ.get("BALANCE_ITEMS", "20"))
START = float(os.environ.get("BALANCE_START", "0"))
PERIOD_S = int(os.environ.get("BALANCE_PERIOD_MS", "100")) / 1000
NEXT_POLL_MS = int(os.environ.get("BALANCE_NEXT_POLL_MS", "100"))
DIE_FILE = os.environ.get("BALANCE_DIE_FILE")
GATE_FILE = os.environ.get("BALANCE_GATE_FILE")

events = EventsExtension()
server = MCPServer("balance", extensions=[events])
events.install(server)


@events.event(
    name="stream.item",
    description="An item of a numbered stream.",
    input_schema={"type": "object", "properties": {"stream": {"type": "string"}}, "required": ["stream"]},
)
def stream_item(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
    if cursor is None:
        return EventResult(events=[], cursor="0", next_poll_ms=NEXT_POLL_MS)
    stream = str(arguments["stream"])
    start = int(cursor)
    available = min(ITEMS, int((time.time() - START) / PERIOD_S)) if PERIOD_S > 0 else ITEMS
    if GATE_FILE is not None and not os.path.exists(GATE_FILE):
        available = 0
    end = max(start, min(start + ctx.max_events, available))
    items = [
        Event(name="stream.item", data={"stream": stream, "n": n}, event_id=f"{stream}-{n}", cursor=str(n))
        for n in range(start + 1, end + 1)
    ]
    return EventResult(items, cursor=str(end), has_more=end < available, next_poll_ms=NEXT_POLL_MS)


def told_to_die() -> bool:
    return DIE_FILE is not None and os.path.exists(DIE_FILE)


async def die_when_told() -> None:
    while DIE_FILE is not None:
        if told_to_die():
            os._exit(1)
        await anyio.sleep(0.1)


async def main() -> None:
    if told_to_die():
        sys.exit(1)
    async with events.running(), anyio.create_task_group() as tg:
        tg.start_soon(die_when_told)
        await server.run_stdio_async()
        tg.cancel_scope.cancel()


if __name__ == "__main__":
    anyio.run(main)
