"""The chaos test's tools server over stdio: tests/journal_tools_server.py's ``post_note``, answered
only ``$ANSWER_AFTER_S`` seconds after the call is written down to ``$CALLS_FILE``, so that a kill of
the calling process lands between a call's send and its result now and then (its outcome is then
unknown to agentwake, and the event waits for a person).
"""

from __future__ import annotations

import os
from typing import Any

import anyio
from journal_tools_server import IDEMPOTENCY_KEY_META, _write_down
from mcp.server.mcpserver import Context, MCPServer

mcp = MCPServer("chaos-tools")


@mcp.tool()
async def post_note(text: str, ctx: Context) -> str:
    """Post a note (a side effect the agent must not repeat)."""
    meta: Any = ctx.request_context.meta or {}
    if hasattr(meta, "model_dump"):
        meta = meta.model_dump(by_alias=True)
    await anyio.to_thread.run_sync(_write_down, text, meta.get(IDEMPOTENCY_KEY_META))
    await anyio.sleep(float(os.environ["ANSWER_AFTER_S"]))  # a slow side effect, not a wait for something
    return f"note posted: {text}"


if __name__ == "__main__":
    mcp.run("stdio")
