"""An MCP Events server (our SDK) whose event types change once it is polled, over stdio or HTTP.

It offers ``a.one``. Right after answering the first ``events/poll`` it adds ``b.two`` and
sends ``notifications/events/list_changed`` to the connections it knows, the way a server
that loads a plugin would. Each ``events/list`` it answers is one line in LIST_LOG, so a
test sees the client list again.

  python tests/list_changed_server.py            stdio
  python tests/list_changed_server.py --http     Streamable HTTP on a free loopback port
                                                 (prints "listening on http://127.0.0.1:PORT/mcp")
  LIST_LOG   a file: one line per events/list answered
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

from agentwake.server import EventsExtension

LIST_LOG = os.environ.get("LIST_LOG")

events = EventsExtension()
events.event(name="a.one", description="always there", emit_only=True)(type("One", (), {}))
server = MCPServer("list-changed", extensions=[events])
events.install(server)
added = False


async def watch(ctx: Any, call_next: Any) -> Any:
    global added
    result = await call_next(ctx)
    if ctx.method == "events/list" and LIST_LOG:
        async with await anyio.open_file(LIST_LOG, "a") as log:
            await log.write("list\n")
    if ctx.method == "events/poll" and not added:
        added = True
        events.event(name="b.two", description="added at run time", emit_only=True)(type("Two", (), {}))
        await events.notify_list_changed()
    return result


server.middleware.append(watch)


async def serve_http() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    http = uvicorn.Server(config)
    sys.stderr.write(f"listening on http://127.0.0.1:{port}/mcp\n")
    sys.stderr.flush()
    await http.serve(sockets=[sock])


if __name__ == "__main__":
    if "--http" in sys.argv:
        anyio.run(serve_http)
    else:
        server.run()
