"""The private attributes of mcp and aiohttp that agentwake relies on are all still there.

Each check names the attribute, so an upgrade that removes one fails here, with its
name, rather than somewhere in a delivery loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest
from aiohttp import web
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer

from agentwake import _compat
from agentwake._compat import PRIVATE_ATTRIBUTES, InterceptingClient, missing_attributes

pytestmark = pytest.mark.anyio


def test_every_private_attribute_is_listed_once_with_its_module() -> None:
    labels = [attribute.label for attribute in PRIVATE_ATTRIBUTES]
    assert len(labels) == len(set(labels))
    assert all(attribute.name.startswith("_") or "._" in attribute.module for attribute in PRIVATE_ATTRIBUTES)


def test_class_level_private_attributes_exist_in_the_installed_packages() -> None:
    missing = missing_attributes()
    assert not missing, f"an upgrade removed private attribute(s) agentwake relies on: {', '.join(missing)}"


def test_a_missing_attribute_is_reported_by_its_full_name() -> None:
    assert missing_attributes({"ServerSession": object()}) == ["mcp.server.session.ServerSession._connection"]


async def test_instance_private_attributes_exist_on_live_sdk_objects() -> None:
    """A real client session against a real in-memory server, a real server-side request, a real web.Server."""
    seen: dict[str, object] = {}
    connections: list[object] = []
    server = MCPServer("compat")

    @server.tool()
    async def probe(ctx: Context) -> str:
        seen["ServerSession"] = ctx.request_context.session
        connections.append(_compat.connection_of(ctx.request_context))
        return "ok"

    async with Client(server) as client:
        seen["ClientSession"] = client.session
        await client.call_tool("probe", {})
    seen["Server"] = web.Server(lambda request: web.Response())
    seen["Draft202012Validator"] = Draft202012Validator({"type": "object"})
    missing = missing_attributes(seen)
    assert set(seen) == {"ClientSession", "ServerSession", "Server", "Draft202012Validator"}
    assert connections and connections[0] is not None
    assert not missing, f"an upgrade removed private attribute(s) agentwake relies on: {', '.join(missing)}"


async def test_the_intercepting_client_sees_notifications_first_and_may_pass_them_on() -> None:
    server = MCPServer("compat")
    seen: list[str] = []

    @server.tool()
    async def announce(ctx: Context) -> str:
        await ctx.request_context.session.send_tool_list_changed()
        return "ok"

    def intercept(method: str, params: Mapping[str, Any] | None) -> bool:
        seen.append(method)
        return False  # the SDK handles it as usual

    handled = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            handled.set()

    async with InterceptingClient(
        server, mode="legacy", intercept=intercept, message_handler=on_message
    ) as client:
        with anyio.fail_after(10):
            result = await client.call_tool("announce", {})
            await handled.wait()
    assert not result.is_error
    assert "notifications/tools/list_changed" in seen


async def test_a_raw_request_keeps_null_params() -> None:
    server = MCPServer("compat")
    received: list[dict[str, Any]] = []

    @server.tool()
    async def echo(value: int | None = 1) -> str:
        received.append({"value": value})
        return "ok"

    async with Client(server) as client:
        with anyio.fail_after(10):
            raw = await _compat.send_raw_request(
                client.session, "tools/call", {"name": "echo", "arguments": {"value": None}}, timeout_s=5
            )
    assert received == [{"value": None}]
    assert raw["content"][0]["text"] == "ok"


def test_the_modern_sse_ping_interval_is_shortened_within_the_block_and_restored() -> None:
    """``mcp.server._streamable_http_modern._SSE_PING_INTERVAL``, a module-level float the SDK reads at each wait."""
    from mcp.server import _streamable_http_modern as modern

    before = modern._SSE_PING_INTERVAL
    assert isinstance(before, float)
    with _compat.modern_sse_ping_interval(0.25) as previous:
        inside = modern._SSE_PING_INTERVAL
    after = modern._SSE_PING_INTERVAL
    assert (previous, inside, after) == (before, 0.25, before)


def test_a_validator_follows_a_reference_from_the_resolver_it_is_given() -> None:
    schema = {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}}
    validator = Draft202012Validator(schema)
    resolved = _compat.schema_resolver(validator).lookup("#/$defs/n")
    inner = _compat.with_resolver(validator, resolved.contents, resolved.resolver)
    assert inner.is_valid(3) and not inner.is_valid("three")
