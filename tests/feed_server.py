"""A small stdio events server for poll-loop edge cases.

One replayable type, "feed.item", cursor = item number. Each poll returns up to
``maxEvents`` items after the cursor with ``hasMore`` until FEED_ITEMS is reached.
A poll whose cursor is at least FEED_REVOKE_AT answers -32012 (access revoked).
With FEED_CRASH_AT and FEED_CRASH_MARKER, the first process to be polled at or past that
cursor dies on the spot (the marker file makes it once), as a server crash mid-drain.
The tool ``unlock_extra`` adds a tool ``extra`` and announces that the tools changed.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

from agentwake.server import Event, EventContext, EventResult, EventsExtension, forbidden

ITEMS = int(os.environ.get("FEED_ITEMS", "10"))
REVOKE_AT = int(os.environ.get("FEED_REVOKE_AT", "0")) or None
CRASH_AT = int(os.environ.get("FEED_CRASH_AT", "0")) or None
CRASH_MARKER = os.environ.get("FEED_CRASH_MARKER")

events = EventsExtension()
server = MCPServer("feed", extensions=[events])
events.install(server)


@events.event(name="feed.item", description="An item in a numbered feed.")
def feed_item(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
    if cursor is None:
        return EventResult(events=[], cursor="0")
    start = int(cursor)
    if CRASH_AT is not None and CRASH_MARKER and start >= CRASH_AT and not os.path.exists(CRASH_MARKER):
        open(CRASH_MARKER, "w").close()
        os._exit(3)
    if REVOKE_AT is not None and start >= REVOKE_AT:
        raise forbidden("access revoked")
    end = min(start + ctx.max_events, ITEMS)
    items = [
        Event(name="feed.item", data={"n": n}, event_id=f"item-{n}", cursor=str(n))
        for n in range(start + 1, end + 1)
    ]
    return EventResult(items, cursor=str(end), has_more=end < ITEMS)


def extra() -> str:
    """A tool that exists only after unlock_extra."""
    return "extra"


@server.tool()
async def unlock_extra(ctx: Context) -> str:
    """Add the tool 'extra' and tell clients the tools changed."""
    server.add_tool(extra, name="extra")
    # 2026 clients hear it on subscriptions/listen, handshake-era ones as a notification.
    await ctx.notify_tools_changed()
    session: Any = ctx.request_context.session
    try:
        await session.send_tool_list_changed()
    except Exception:  # not deliverable on this protocol generation
        return "unlocked"
    return "unlocked"


async def main() -> None:
    async with events.running():
        await server.run_stdio_async()


if __name__ == "__main__":
    anyio.run(main)
