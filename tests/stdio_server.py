"""A real MCP server over stdio whose tools misbehave on the wire, for tests/test_stdio.py.

The SDK's stdio server points fd 1 at stderr while it serves, so that stray prints miss the
wire; the tools write their garbage through a duplicate of the real stdout taken first.
Each tool writes its garbage before it returns, so the garbage precedes its answer on the wire.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

WIRE = os.dup(1)

server = MCPServer("hostile")


def _write(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(WIRE, view) :]


@server.tool()
def echo(text: str) -> str:
    """Answer with the text."""
    return text


@server.tool()
def flood(size: int) -> str:
    """Write one line of `size` bytes that is not JSON."""
    block = b"x" * (1 << 20)
    left = size
    while left > 0:
        _write(block[: min(left, len(block))])
        left -= len(block)
    _write(b"\n")
    return "flooded"


@server.tool()
def junk(count: int) -> str:
    """Write `count` lines that are not JSON-RPC messages."""
    _write(b"".join(b"junk line %d: this is not JSON-RPC\n" % n for n in range(count)))
    return "junked"


@server.tool()
def bad_bytes() -> str:
    """Write an invalid UTF-8 line, then a valid notification with an invalid byte in a string."""
    _write(b"\xff\xfe\xc3\x28 not utf-8 at all\n")
    params = b'{"level":"info","data":"bad \xff byte"}'
    _write(b'{"jsonrpc":"2.0","method":"notifications/message","params":%s}\n' % params)
    return "bad bytes sent"


@server.tool()
def shout(count: int) -> str:
    """Write `count` lines to stderr."""
    sys.stderr.write("".join(f"shout {n}\n" for n in range(count)))
    sys.stderr.flush()
    return "shouted"


@server.tool()
def die(code: int) -> str:
    """Exit at once with `code`."""
    os._exit(code)


if __name__ == "__main__":
    server.run("stdio")
