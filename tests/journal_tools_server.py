"""A tools-only MCP server over stdio that writes down every call it gets, for the tool-call journal tests.

``post_note(text)`` appends one JSON line to ``$CALLS_FILE`` with the text and the idempotency key
the caller put in the request's ``_meta``, *before* answering. While ``$BLOCK_FILE`` exists it then
never answers: the call has reached the server, its caller never learns the outcome.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

IDEMPOTENCY_KEY_META = "io.agentwake/idempotency-key"

mcp = MCPServer("journal-tools")


def _write_down(text: str, key: object) -> None:
    with Path(os.environ["CALLS_FILE"]).open("a") as calls:
        calls.write(json.dumps({"text": text, "key": key}) + "\n")


@mcp.tool()
async def post_note(text: str, ctx: Context) -> str:
    """Post a note (a side effect the agent must not repeat)."""
    meta: Any = ctx.request_context.meta or {}
    if hasattr(meta, "model_dump"):
        meta = meta.model_dump(by_alias=True)
    await anyio.to_thread.run_sync(_write_down, text, meta.get(IDEMPOTENCY_KEY_META))
    if await anyio.Path(os.environ["BLOCK_FILE"]).exists():
        await anyio.sleep_forever()
    return f"note posted: {text}"


if __name__ == "__main__":
    mcp.run("stdio")
