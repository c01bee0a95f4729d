"""The MCP SDK's "Session termination failed" warning, at each close of an HTTP connection whose
server is gone, is said once per server in agentwake's words; its other warnings pass untouched.

A real demo server over Streamable HTTP on loopback (conftest.running_demo_http), stopped while a
connection to it is open: closing the connection, the SDK's DELETE of the session cannot connect.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import running_demo_http

from agentwake.errors import DeliveryError
from agentwake.logs import CONNECTION_NAME, SDK_HTTP_LOGGER
from agentwake.mcp import ServerConnection

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def connect_then_lose(name: str, db: Path) -> None:
    """Open a handshake-era connection (it has a session) to a demo server, stop the server, close it."""
    async with running_demo_http(db) as demo:
        try:
            async with ServerConnection(name, demo.config(connect_timeout_s=10, protocol="legacy")):
                await demo.stop()
        except DeliveryError:
            pass  # how the close goes with the server gone is not what this test is about


async def test_a_failed_session_end_is_said_once_per_server_in_our_words(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    for _ in range(3):
        await connect_then_lose("web", tmp_path / "demo.db")
    await connect_then_lose("other", tmp_path / "other.db")
    said = [r for r in caplog.records if "could not end the MCP session" in r.getMessage()]
    assert [(r.name, r.levelno) for r in said] == [("agentwake.mcp", logging.INFO)] * 2, caplog.text
    first, other = (r.getMessage() for r in said)
    assert first.startswith("server web: could not end the MCP session on disconnect (")
    assert "harmless" in first and "not said again for this server" in first
    assert other.startswith("server other: ")
    assert "Session termination failed" not in caplog.text

    # A restarted server answers the DELETE 404: said in words too.
    named = CONNECTION_NAME.set("restarted")
    try:
        logging.getLogger(SDK_HTTP_LOGGER).warning("Session termination failed: 404")
    finally:
        CONNECTION_NAME.reset(named)
    assert "server restarted: could not end the MCP session on disconnect (HTTP 404: it no longer knows" in (
        caplog.text
    )

    # The SDK's other warnings from that logger are real problems: shown as they are.
    logging.getLogger(SDK_HTTP_LOGGER).warning("Unknown SSE event: odd")
    [odd] = [r for r in caplog.records if r.name == SDK_HTTP_LOGGER and "odd" in r.getMessage()]
    assert (odd.levelno, odd.getMessage()) == (logging.WARNING, "Unknown SSE event: odd")
