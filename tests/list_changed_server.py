"""An MCP Events server (our SDK) whose event types change once it is polled, over stdio or HTTP.

It offers ``a.one``. Right after answering the first ``events/poll`` (or, with
LIST_CHANGE_ON=stream, once the first ``events/stream`` is open) it adds ``b.two`` and
sends ``notifications/events/list_changed`` to the clients it knows, the way a server
that loads a plugin would. Each ``events/list`` it answers is one line in LIST_LOG, so a
test sees the client list again.

  python tests/list_changed_server.py            stdio
  python tests/list_changed_server.py --http     Streamable HTTP on a free loopback port
                                                 (prints "listening on http://127.0.0.1:PORT/mcp")
  LIST_LOG        a file: one line per events/list answered
  LIST_CHANGE_ON  "poll" (default) or "stream": which request makes the list change
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
CHANGE_ON = "events/" + os.environ.get("LIST_CHANGE_ON", "poll")

events = EventsExtension()
events.event(name="a.one", description="always there", emit_only=True)(type("One", (), {}))
server = MCPServer("list-changed", extensions=[events])
events.install(server)
added = False


async def change_the_list() -> None:
    events.event(name="b.two", description="added at run time", emit_only=True)(type("Two", (), {}))
    await events.notify_list_changed()


async def change_once_a_stream_is_open() -> None:
    while not events.open_streams():  # noqa: ASYNC110 - the extension signals nothing
        await anyio.sleep(0.01)
    await change_the_list()


async def watch(ctx: Any, call_next: Any) -> Any:
    global added
    if ctx.method == "events/stream" == CHANGE_ON and not added:
        added = True
        async with anyio.create_task_group() as tg:
            tg.start_soon(change_once_a_stream_is_open)
            return await call_next(ctx)
    result = await call_next(ctx)
    if ctx.method == "events/list" and LIST_LOG:
        async with await anyio.open_file(LIST_LOG, "a") as log:
            await log.write("list\n")
    if ctx.method == "events/poll" == CHANGE_ON and not added:
        added = True
        await change_the_list()
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
